"""Feeding files into a KB: `advisor kb import` (one file into any KB) and `advisor kb build` (the shipped
KB from its versioned inputs, atomically) and `advisor kb merge` (other KBs into one). Parsing is `advisor.kb.ingest`'s, writing `advisor.kb.store`'s."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import admission, lease, store
from advisor.kb.identity import run_uid
from advisor.kb.ingest import read_export, read_figures, read_file, read_setup
from advisor.kb.open import (
    connect_file_readonly,
    connect_kb_readonly,
    open_source,
    open_to_compact,
    process_exists,
    writing,
)
from advisor.kb.queries.for_report import export_validations, iter_runs
from advisor.kb.queries.groups import sources
from advisor.kb.schema import applied_migrations, columns, corrupt_error
from advisor.places import shipped_inputs_dir, shipped_kb_path
from advisor.rules import Rules, load_rules


def import_file(db_path: Path, path: Path, rules: Rules, setup_path: Path | None = None) -> tuple[int, int]:
    """Import a figures CSV (with its setup.toml) or a runs JSON file into the KB at db_path, in one
    transaction. Returns (added, skipped as already stored)."""
    runs, validations = read_file(path, rules, setup_path)
    Published.read().refuse(runs, f"{path}: ", "imported")
    with writing(db_path) as conn:
        return store.write_runs(conn, runs, validations)


@dataclass
class Merged:
    """What `advisor kb merge` did: runs added, runs already there, and conflicts left as they were."""

    added: int = 0
    skipped: int = 0
    conflicts: list[str] = field(default_factory=list)  # 'uid …: status ok here, crashed in FILE'
    repeats: int = 0  # runs of a cell, seed and hardware that already has an outcome: a repeat, not a seed
    crashed: int = 0  # runs `running` in a source: copied as crashed, never as a claim


MERGE_BATCH = 500  # runs read from a source at a time: a merge holds a batch, never a whole KB


def merge_kbs(db_path: Path, files: list[Path]) -> Merged:
    """Unite KBs into the one at db_path by run identity (uid), in one transaction: runs it lacks are added
    with their provenance; runs it holds are skipped, and those that differ (status, figures) are reported
    as conflicts, never overwritten. A run of a cell, seed and hardware that already ended (ok, oom, ...)
    is a repeat, left out as `measure` would skip it: the same seed twice is not two seeds. A run still
    `running` in a source is copied as `crashed`, its origin said (a merge copies no claim). Every run is
    checked against advisor's rules (advisor.kb.admission) before the target is opened: one that breaks
    them refuses the whole merge, and the target is left byte for byte as it was. Sources are streamed,
    MERGE_BATCH runs at a time. Merging the same files twice changes nothing the second time, and costs
    little: the runs the target already holds exactly are found in one query per source (`held_alike`),
    and are neither read, checked nor staged."""
    db_path = Path(db_path)
    sources = []
    try:
        for path in files:
            sources.append((path, open_source(path)))  # each an advisor KB, whole, or a sentence
        _refuse_bad_runs(sources, db_path)
        out = Merged()
        with writing(db_path) as conn:
            staging = store.Staging(conn)
            try:
                validations = _stage_sources(conn, staging, sources, db_path, out)
                out.added, skipped = staging.commit(validations)
                out.skipped += skipped
            finally:
                staging.drop()
        return out
    finally:
        for _, src in sources:
            src.close()


HELD_TABLES = (("runs", "id"), ("metrics", "run_id"), ("epochs", "run_id"))  # a run's rows, by its id


def held_alike(src: sqlite3.Connection, target: Path) -> set[str]:
    """The uids of a source's runs that the KB at target holds exactly as they are: every column but its
    local numbering, every figure and every epoch. Writing them would change nothing, and checking them
    would learn nothing, so a merge neither reads, checks nor stages them. One query, the target attached
    read-only to the source's connection; none where the target is no current advisor KB (yet) or cannot be
    read, and then every run takes the long way."""
    try:
        connect_kb_readonly(target).close()  # checked as every KB read is: ours, at this schema, no trigger
        src.execute("ATTACH DATABASE ? AS kb", [f"{target.resolve().as_uri()}?mode=ro"])
    except (KBError, sqlite3.Error):
        return set()
    try:
        return {uid for (uid,) in src.execute(_held_alike_sql())}
    except sqlite3.Error:
        return set()
    finally:
        with contextlib.suppress(sqlite3.Error):
            src.execute("DETACH DATABASE kb")


@cache
def _held_alike_sql() -> str:
    """The runs of the source (main, run s) that the attached KB (kb, run t) holds alike. A source's
    `running` run never is: a merge copies it changed (crashed), so it takes the long way."""
    alike = " AND ".join(_rows_alike(table, key) for table, key in HELD_TABLES)
    return (
        "SELECT s.uid FROM main.runs s JOIN kb.runs t ON t.uid = s.uid "
        f"WHERE s.status != 'running' AND {alike}"
    )


def _rows_alike(table: str, key: str) -> str:
    """SQL: run s's rows of table in the source are run t's in the KB, as many, column for column."""
    cols = ", ".join(c for c in columns(table) if c not in ("id", "grp", "run_id"))  # local numbering
    mine, theirs = (
        f"SELECT {cols} FROM {db}.{table} WHERE {key} = {r}.id" for db, r in (("main", "s"), ("kb", "t"))
    )
    as_many = f"(SELECT count(*) FROM ({mine})) = (SELECT count(*) FROM ({theirs}))"
    return f"{as_many} AND NOT EXISTS ({mine} EXCEPT {theirs})"


def _source_batches(path: Path, src: sqlite3.Connection, out: Merged, held: set[str]) -> Iterator[list[dict]]:
    """A source's runs, MERGE_BATCH at a time, less those the target holds alike (`held`: a source it holds
    whole is not read), `running` ones as crashed; damage met said in a sentence."""
    try:
        if held and len(held) == src.execute("SELECT count(*) FROM runs").fetchone()[0]:
            return
        for batch in iter_runs(src, batch=MERGE_BATCH):
            yield [_unclaimed(run, path, out) for run in batch if run.get("uid") not in held]
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e


def _refuse_bad_runs(sources, target: Path) -> None:
    """Read every source once, before the target is opened for writing: a run that breaks the rules
    refuses the merge (BadRuns, naming the first few), and the target is never touched. Runs the target
    holds alike are not read: they will not be written."""
    rules, problems, total, published = load_rules(), [], 0, Published.read()
    for path, src in sources:
        for batch in _source_batches(path, src, Merged(), held_alike(src, target)):
            published.refuse(batch, f"{path}: ", "merged")
            for run in batch:  # as stored: a KB's protocol column is never a legacy file's settings
                problem = admission.run_problem(run, rules)
                if problem:
                    total += 1
                    if len(problems) < admission.MAX_REPORTED:
                        problems.append(f"{path}: {admission.identity(run)}: {problem}")
        try:
            bad = [p for v in export_validations(src) if (p := admission.validation_problem(v))]
        except sqlite3.DatabaseError as e:
            raise corrupt_error(path, e) from e
        if bad:
            raise KBError(f"{path}: a validation breaks advisor's rules ({bad[0]}), so nothing was merged.")
    if total:
        raise store.BadRuns(problems, total, where="kb merge: ")


def _stage_sources(conn, staging: store.Staging, sources, target: Path, out: Merged) -> list[dict]:
    """Stage every source's new runs, batch by batch; those the target holds alike are counted as already
    there. Returns the sources' validations."""
    seen: dict[str, tuple[str, str]] = {}  # uid -> (digest hash, where) of the runs staged so far
    ended = lease.ended_cells(conn)
    validations = []
    for path, src in sources:
        held = held_alike(src, target)  # again, now that the target is open: it may have changed since
        out.skipped += len(held)
        for batch in _source_batches(path, src, out, held):
            staging.add(_new_runs(conn, batch, path, seen, ended, out))
        validations += export_validations(src)
    return validations


def _unclaimed(run: dict, path: Path, out: Merged) -> dict:
    """A run `running` in a source becomes `crashed`: its owner's claim (lease) holds only in that KB."""
    if run.get("status") != "running":
        return run
    out.crashed += 1
    return {
        **run,
        "status": "crashed",
        "lease_until": None,
        "error": f"was running in {path.name} (owner {run.get('owner')}, lease until {run.get('lease_until')}) "
        "when merged: a merge copies no claim",
    }


def _new_runs(conn, batch: list[dict], path: Path, seen: dict, ended: set, out: Merged) -> list[dict]:
    """The runs of a batch to stage: not one the target holds with the same digest (counted as already
    there, neither checked nor staged), not a conflict with the target or an earlier source, not a repeat."""
    mine = dict(store.run_digests(conn, [r["uid"] for r in batch if isinstance(r.get("uid"), str)]))
    digests = [store.run_digest(run) for run in batch]
    fresh = [(run, d) for run, d in zip(batch, digests, strict=True) if mine.get(run.get("uid")) != d]
    out.skipped += len(batch) - len(fresh)
    broken = [run for run, _ in fresh if admission.run_problem(store.normalized(run))]
    if broken:
        raise store.BadRuns(
            [f"{admission.identity(r)}: {admission.run_problem(store.normalized(r))}" for r in broken]
        )
    keep = []
    for run, digest in fresh:
        digest, uid = _hashed(digest), run.get("uid")
        known = (_hashed(mine[uid]), "here") if uid in mine else seen.get(uid)
        if known and known[0] != digest:
            out.conflicts.append(
                f"run {uid} ({run['status']} in {path}) differs from the one {known[1]}: kept"
            )
            continue
        cell = lease.cell_of(run)
        if not known and cell in ended:  # as claim_run: one outcome per cell and seed
            out.repeats += 1
            continue
        if cell is not None:
            ended.add(cell)
        if uid:
            seen.setdefault(uid, (digest, f"in {path}"))
        keep.append(run)
    return keep


def _hashed(digest: str) -> str:
    """A run's digest kept short: a merge remembers one per run it has staged."""
    return hashlib.blake2b(digest.encode(), digest_size=12).hexdigest()


# The sources advisor's own writers give runs (`measure`, its tuning, the Trainer callback): anyone's to write
OWN_SOURCES = ("measured", "measured:tuning", "trainer")
DESCRIBED = ("family", "protocol", "settings", "data", "device", "status")  # what a run says it is, besides


@dataclass
class Published:
    """The shipped KB's published sources (each of its sources but OWN_SOURCES: `paper:2608.08961`...) and
    their runs, each as `_as_held` gives it. An import or a merge may bring a run under one of those names
    only as the shipped KB holds it (a copy of the published evidence changes nothing); any other would put
    words in a paper's mouth, read beside the paper's own runs."""

    names: frozenset[str] = frozenset()
    runs: dict[str, str] = field(default_factory=dict)  # uid -> the run as held

    @classmethod
    def read(cls) -> Published:
        """The shipped KB's; none where it cannot be read (every command reading it says so)."""
        try:
            conn = connect_kb_readonly(shipped_kb_path())
        except KBError:
            return cls()
        try:
            names = frozenset(s for s in sources(conn) if s not in OWN_SOURCES)
            runs = {_uid(r): _as_held(r) for name in names for batch in iter_runs(conn, name) for r in batch}
        finally:
            conn.close()
        return cls(names, runs)

    def refuse(self, runs: list[dict], where: str, done: str) -> None:
        """KBError naming the first run that claims a published source without being one of its runs."""
        claims = [run for run in runs if self.claims(run)]
        if claims:
            first, more = claims[0], f" (and {len(claims) - 1} more)" if len(claims) > 1 else ""
            raise KBError(
                f"{where}{admission.identity(first)}{more} is under {first['source']!r}, a source the shipped "
                f"KB publishes, and is not one of its runs as published, so nothing was {done}: give your runs "
                "a source of their own (e.g. import:yours)."
            )

    def claims(self, run: dict) -> bool:
        """Whether `run` is under a published source and not one of its runs exactly as the shipped KB has it."""
        if run.get("source") not in self.names:
            return False
        run = store.normalized(run)
        return self.runs.get(_uid(run)) != _as_held(run)


def _uid(run: dict) -> str:
    """A run's identity as the store gives it: its own uid, else the hash of its provenance."""
    return run.get("uid") or run_uid(run)


def _as_held(run: dict) -> str:
    """A run as one comparable value: its uid, its provenance (the uid's fields, rehashed: a copied uid over
    other provenance differs), what it says it is, and its outcome."""
    described = {k: str(run.get(k)) for k in DESCRIBED}
    return json.dumps([_uid(run), run_uid(run), described, store.run_digest(run)], sort_keys=True)


def build_kb(out_path: Path, rules: Rules, src: Path | None = None) -> dict:
    """Build a KB from the versioned inputs (every sub-folder's setup.toml + figures, every *.json), into a
    temporary file beside the output, then move it in place: a build killed at any moment leaves the old
    KB whole. Temporary files of builds killed earlier are removed."""
    src = Path(src) if src else shipped_inputs_dir()
    out_path = Path(out_path)
    check_target(out_path)
    _remove_stale_builds(out_path.parent)
    tmp = out_path.parent / f".build-{os.getpid()}-{uuid.uuid4().hex[:8]}.sqlite"
    counts = {}
    try:
        with writing(tmp) as conn:
            for item in build_order(src):
                if item.is_dir():
                    setup = read_setup(item / "setup.toml")
                    runs = read_figures(item / setup["figures"], setup, rules)
                    counts[item.name] = store.write_runs(conn, runs)[0]
                else:
                    counts[item.name] = store.write_runs(conn, *read_export(item, rules))[0]
        with open_to_compact(tmp) as conn:  # one self-contained, compact file
            conn.execute("VACUUM")
        conn.close()
        os.replace(tmp, out_path)
    finally:
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            leftover.unlink(missing_ok=True)
    return counts


ORDER_FILE = "ORDER"  # kb/inputs/ORDER: the inputs in the order their groups are numbered


def build_order(src: Path) -> list[Path]:
    """The inputs (folders with a setup.toml, runs JSON files) in the order a build reads them: as ORDER
    lists them, then any it does not list (folders, then files, each in name order). Groups are numbered in
    that order, and people type those numbers (--group 7): a new input is appended to ORDER, never inserted."""
    found = [p.parent for p in sorted(src.glob("*/setup.toml"))] + sorted(src.glob("*.json"))
    order_file = src / ORDER_FILE
    listed = order_file.read_text().split() if order_file.is_file() else []
    by_name = {p.name: p for p in found}
    first = [by_name[name] for name in listed if name in by_name]
    return first + [p for p in found if p.name not in listed]


def check_target(out: Path) -> None:
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
        conn = connect_file_readonly(path)
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
        if pid.isdigit() and not process_exists(int(pid)):
            leftover.unlink(missing_ok=True)
