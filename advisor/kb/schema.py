"""Opening a KB for reading, and the checks that refuse a file which is not a usable KB.

Writers open a KB through `advisor.kb.store.open_for_writing`, which applies the migrations (`advisor.kb.migrations`);
the answer side reads through `connect_readonly` (stdlib sqlite3 only). The checks serve both.
"""

from __future__ import annotations

import os
import sqlite3
from functools import cache
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import migrations

BUSY_TIMEOUT_MS = 30_000
KNOWN_MIGRATIONS = list(migrations.MIGRATIONS)


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """Open a KB read-only with stdlib sqlite3 and check it is an advisor KB at this schema."""
    path = Path(path)
    check_readable(path)
    if path.stat().st_size == 0:
        raise KBError(
            f"{path} is empty, not a knowledge base. Pass --db with an advisor KB, or build one with `advisor kb build -o`."
        )
    conn = connect_ro(path)
    refuse_newer(conn, path)
    applied = applied_migrations(conn)
    if not applied:
        raise KBError(f"{path} is an SQLite file but not an advisor knowledge base (no schema recorded).")
    missing = [m for m in KNOWN_MIGRATIONS if m not in applied]
    if missing:
        raise KBError(
            f"{path} was written by an older advisor (schema lacks {', '.join(missing)}). "
            f"Run `advisor kb migrate --db {path}` to upgrade it."
        )
    conn.row_factory = sqlite3.Row
    return conn


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection that has read the schema page (so a corrupt file fails here, with a sentence)."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as e:
        if not any(s in str(e).lower() for s in ("unable to open", "readonly", "read-only")):
            raise KBError(f"cannot read {path}: {e}.") from e
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    # A WAL-mode file in a folder we cannot write (an installed package, a read-only mount): SQLite can
    # neither create the -shm file ("unable to open") nor write it ("attempt to write a readonly
    # database"). Read the file as immutable instead: writers leave a KB they let go checkpointed.
    conn = sqlite3.connect(f"{uri}?immutable=1", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    return conn


def check_readable(path: Path) -> None:
    """Refuse, with a sentence, a path that is missing, a folder, unreadable or not an SQLite file."""
    if not path.exists():
        raise KBError(
            f"no knowledge base at {path}. Pass --db with an existing file, or build one with `advisor kb build`."
        )
    if path.is_dir():
        raise KBError(f"{path} is a folder, not a knowledge base file. Pass --db with an .sqlite file.")
    if not path.is_file():
        raise KBError(
            f"{path} is not a regular file (a device or a pipe), so not a knowledge base. Pass --db with an .sqlite file."
        )
    if not os.access(path, os.R_OK):
        raise KBError(f"cannot read {path}: permission denied.")
    with open(path, "rb") as f:
        header = f.read(16)
    if path.stat().st_size and header != b"SQLite format 3\x00":
        raise KBError(f"{path} is not an SQLite file, so not a knowledge base. Pass --db with an advisor KB.")


def corrupt_error(path: Path, e: Exception) -> KBError:
    return KBError(
        f"{path} is corrupt or truncated ({e}). Rebuild it with `advisor kb build`, or restore it from a copy."
    )


def refuse_newer(conn: sqlite3.Connection, path: Path) -> None:
    unknown = [m for m in applied_migrations(conn) if m not in KNOWN_MIGRATIONS]
    if unknown:
        raise KBError(
            f"{path} was written by a newer advisor (schema has {', '.join(unknown)}). "
            "Upgrade advisor (pip install -U advisor) to read it; nothing was changed."
        )


def schema_sql(conn: sqlite3.Connection) -> list[str]:
    """The schema of a KB as sorted CREATE statements, for comparing two KBs."""
    rows = conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name")
    return [" ".join(r[0].split()) for r in rows]


def applied_migrations(conn: sqlite3.Connection) -> list[str]:
    """The names of the advisor migrations a KB has, in order ([] for a file that is not an advisor KB)."""
    try:
        return migrations.applied(conn)
    except sqlite3.DatabaseError as e:
        raise KBError(f"cannot read the schema of the knowledge base: {e}.") from e


@cache
def columns(table: str) -> dict[str, tuple[str, bool]]:
    """A table's columns at the current schema: name -> (SQL type, required), from the migrations applied
    to an empty in-memory database. What an import may hold is derived from this, never listed twice."""
    conn = sqlite3.connect(":memory:")
    migrations.migrate(conn)
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    conn.close()
    return {
        name: (kind.upper(), bool(notnull) and default is None and not pk)
        for _, name, kind, notnull, default, pk in rows
    }
