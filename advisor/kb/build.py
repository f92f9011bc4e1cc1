"""Feeding files into a KB: `advisor kb import` (one file into any KB) and `advisor kb build` (the shipped
KB from its versioned inputs, atomically) and `advisor kb merge` (other KBs into one). Parsing is `advisor.kb.ingest`'s, writing `advisor.kb.store`'s."""

from __future__ import annotations

import os
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import lease, store
from advisor.kb.ingest import read_export, read_figures, read_file, read_setup
from advisor.kb.reader import export_runs, export_validations
from advisor.kb.schema import applied_migrations, connect_readonly, connect_ro
from advisor.places import shipped_inputs_dir
from advisor.rules import Rules


def import_file(db_path: Path, path: Path, rules: Rules, setup_path: Path | None = None) -> tuple[int, int]:
    """Import a figures CSV (with its setup.toml) or a runs JSON file into the KB at db_path, in one
    transaction. Returns (added, skipped as already stored)."""
    runs, validations = read_file(path, rules, setup_path)
    with store.writing(db_path) as conn:
        return store.write_runs(conn, runs, validations)


@dataclass
class Merged:
    """What `advisor kb merge` did: runs added, runs already there, and conflicts left as they were."""

    added: int = 0
    skipped: int = 0
    conflicts: list[str] = field(default_factory=list)  # 'uid …: status ok here, crashed in FILE'
    repeats: int = 0  # runs of a cell, seed and hardware that already has an outcome: a repeat, not a seed


def merge_kbs(db_path: Path, files: list[Path]) -> Merged:
    """Unite KBs into the one at db_path by run identity (uid), in one transaction: runs it lacks are added
    with their provenance; runs it holds are skipped, and those that differ (status, figures) are reported
    as conflicts, never overwritten. A run of a cell, seed and hardware that already ended (ok, oom, ...)
    is a repeat, left out as `measure` would skip it: the same seed twice is not two seeds. Merging the same
    files twice changes nothing the second time."""
    loaded = []
    for path in files:
        conn = connect_readonly(path)  # an advisor KB at this schema, or a sentence
        try:
            loaded.append((path, export_runs(conn), export_validations(conn)))
        finally:
            conn.close()
    out = Merged()
    with store.writing(db_path) as conn:
        uids = [r["uid"] for _, file_runs, _ in loaded for r in file_runs]
        mine = {uid: (digest, "here") for uid, digest in store.run_digests(conn, uids)}
        ended = lease.ended_cells(conn)
        runs, validations = [], []
        for path, file_runs, file_validations in loaded:
            for run in file_runs:
                digest = store.run_digest(run)
                if run["uid"] in mine and mine[run["uid"]][0] != digest:
                    where = mine[run["uid"]][1]
                    out.conflicts.append(
                        f"run {run['uid']} ({run['status']} in {path}) differs from the one {where}: kept"
                    )
                    continue
                cell = lease.cell_of(run)
                if run["uid"] not in mine and cell in ended:  # as claim_run: one outcome per cell and seed
                    out.repeats += 1
                    continue
                if cell is not None:
                    ended.add(cell)
                mine.setdefault(run["uid"], (digest, f"in {path}"))
                runs.append(run)
            validations += file_validations
        out.added, out.skipped = store.write_runs(conn, runs, validations)
    return out


def build_kb(out_path: Path, rules: Rules, src: Path | None = None) -> dict:
    """Build a KB from the versioned inputs (every sub-folder's setup.toml + figures, every *.json), into a
    temporary file beside the output, then move it in place: a build killed at any moment leaves the old
    KB whole. Temporary files of builds killed earlier are removed."""
    src = Path(src) if src else shipped_inputs_dir()
    out_path = Path(out_path)
    _check_target(out_path)
    _remove_stale_builds(out_path.parent)
    tmp = out_path.parent / f".build-{os.getpid()}-{uuid.uuid4().hex[:8]}.sqlite"
    counts = {}
    try:
        with store.writing(tmp) as conn:
            for setup_path in sorted(src.glob("*/setup.toml")):
                setup = read_setup(setup_path)
                runs = read_figures(setup_path.parent / setup["figures"], setup, rules)
                counts[setup_path.parent.name] = store.write_runs(conn, runs)[0]
            for runs_path in sorted(src.glob("*.json")):
                counts[runs_path.name] = store.write_runs(conn, *read_export(runs_path, rules))[0]
        with sqlite3.connect(tmp, isolation_level=None) as conn:  # one self-contained, compact file
            conn.execute("VACUUM")
        conn.close()
        os.replace(tmp, out_path)
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            leftover.unlink(missing_ok=True)
    return counts


def _check_target(out: Path) -> None:
    """kb build replaces an advisor KB or writes a new file; never a device, a folder or another file."""
    if not out.parent.is_dir():
        raise KBError(f"cannot write {out}: folder {out.parent} does not exist.")
    if not out.exists():
        return
    if not out.is_file():
        raise KBError(
            f"{out} is not a regular file (a folder, a device or a pipe): kb build will not replace it."
        )
    if out.stat().st_size:
        with open(out, "rb") as f:
            sqlite = f.read(16) == b"SQLite format 3\x00"
        if not sqlite or not _is_advisor_kb(out):
            raise KBError(
                f"{out} is not an advisor knowledge base: kb build replaces only a KB. Pass -o with a new file."
            )


def _is_advisor_kb(path: Path) -> bool:
    try:
        conn = connect_ro(path)
    except KBError:
        return False
    try:
        return bool(applied_migrations(conn))
    except KBError:
        return False
    finally:
        conn.close()


def _remove_stale_builds(folder: Path) -> None:
    """Temporary files of builds whose process no longer exists (killed mid-build)."""
    for leftover in folder.glob(".build-*.sqlite*"):
        pid = leftover.name.split("-")[1]
        if pid.isdigit() and not _process_exists(int(pid)):
            leftover.unlink(missing_ok=True)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
