"""Feeding files into a KB: `advisor kb import` (one file into any KB) and `advisor kb build` (the shipped
KB from its versioned sources, atomically). Parsing is `advisor.ingest`'s, writing `advisor.store`'s."""

from __future__ import annotations

import os
import tempfile
import tomllib
from importlib import resources
from pathlib import Path

from advisor import store
from advisor.ingest import read_export, read_figures, read_file


def sources_dir() -> Path:
    return Path(str(resources.files("advisor.shipped.kb"))) / "sources"


def import_file(db_path: Path, path: Path, setup_path: Path | None = None) -> tuple[int, int]:
    """Import a figures CSV (with its setup.toml) or a runs JSON file into the KB at db_path, in one
    transaction. Returns (added, skipped as already stored)."""
    runs, validations = read_file(path, setup_path)
    conn = store.open_kb(db_path)
    try:
        return store.write_runs(conn, runs, validations)
    finally:
        conn.close()


def build_kb(out_path: Path, src: Path | None = None) -> dict:
    """Build a KB from the versioned sources (every sub-folder's setup.toml + figures, every *.json), atomically."""
    src = Path(src) if src else sources_dir()
    out_path = Path(out_path)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".sqlite", dir=out_path.parent)
    os.close(fd)
    os.unlink(tmp)
    counts = {}
    try:
        conn = store.open_kb(tmp)
        for setup_path in sorted(src.glob("*/setup.toml")):
            setup = tomllib.loads(setup_path.read_text())
            runs = read_figures(setup_path.parent / setup["figures"], setup)
            counts[setup_path.parent.name] = store.write_runs(conn, runs)[0]
        for runs_path in sorted(src.glob("*.json")):
            counts[runs_path.name] = store.write_runs(conn, *read_export(runs_path))[0]
        conn.execute(
            "PRAGMA journal_mode = DELETE"
        )  # one self-contained file, readable from a read-only folder
        conn.execute("VACUUM")
        conn.close()
        os.replace(tmp, out_path)
    finally:
        for leftover in (tmp, tmp + "-wal", tmp + "-shm"):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return counts
