"""The checks that refuse a file which is not a usable KB, and the sentences a KB's failures are said in.

Every KB is opened through `advisor.kb.open`: writers through `open_for_writing`, which applies the
migrations (`advisor.kb.migrations`); the answer side through `connect_kb_readonly` (stdlib sqlite3 only).
The checks serve both.
"""

from __future__ import annotations

import os
import sqlite3
from functools import cache
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import migrations
from advisor.places import shipped_kb_path

BUSY_TIMEOUT_MS = 30_000
KNOWN_MIGRATIONS = list(migrations.MIGRATIONS)
READ_TIMEOUT_S = 60.0  # the longest stretch of work a read may take ($ADVISOR_READ_TIMEOUT_S changes it)
HOSTILE = ("view", "trigger")  # schema objects advisor never creates: a KB holding one is not ours
INTERNAL = ("sqlite_autoindex_", "sqlite_stat", "sqlite_sequence")  # SQLite's own objects, allowed


def read_timeout() -> float:
    try:
        return float(os.environ.get("ADVISOR_READ_TIMEOUT_S") or READ_TIMEOUT_S)
    except ValueError:
        return READ_TIMEOUT_S


TIMED_OUT = "interrupted"  # what SQLite says when the progress handler stops a query
DISK_FULL = ("database or disk is full", "disk i/o error")


def timed_out(path, e: Exception) -> KBError:
    """A read stopped by its time bound, as a sentence (`path`: one KB, or the KBs a command read)."""
    check = "`advisor kb check" + ("" if " and " in str(path) else f" --db {path}")
    return KBError(
        f"reading {path} took longer than {read_timeout():g} s and was stopped ({e}): a KB that hostile or "
        f"that large is not read; run {check}`, or move it aside."
    )


def disk_full(path, e: Exception) -> KBError:
    return KBError(
        f"cannot write {path}: the disk is full ({e}). What was written before is intact: free some space, "
        "or pass --db with a knowledge base on another disk."
    )


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
    # judged on the bytes read, never on a second look at its size: a KB another process is creating grows
    # between the two (an empty file, or the start of SQLite's header, is one being created)
    if not b"SQLite format 3\x00".startswith(header):
        raise KBError(f"{path} is not an SQLite file, so not a knowledge base. Pass --db with an advisor KB.")


def corrupt_error(path: Path, e: Exception) -> KBError:
    if TIMED_OUT in str(e):
        return timed_out(path, e)
    said = " ".join(str(e).split())  # one line, whatever SQLite reported
    return KBError(
        f"{path} is corrupt or truncated ({said}), so nothing is read from it: `advisor kb check --db {path}` "
        "says what is damaged; move it aside, or restore it from a copy (or rebuild it with `advisor kb build`)."
    )


# --- the schema: exactly ours, nothing more -------------------------------------------------------------


@cache
def reference_schema() -> tuple[frozenset, dict]:
    """What the migrations create in an empty database: the (type, name) of every table and index, and
    each table's columns as table_xinfo gives them (name, type, not null, key, hidden). Read from the shipped
    KB where it records exactly these migrations (package data that `advisor kb build --shipped` makes by
    them, and tests/kb/test_kb.py checks against them): migrating an empty database costs 8-12 ms of SQLite's
    schema statements, a tenth of an answer. Else made that way."""
    return _shipped_schema() or _migrated_schema()


def _shipped_schema() -> tuple[frozenset, dict] | None:
    """The shipped KB's schema, where it is at exactly the known migrations (None: absent, unreadable, or
    at others, as while a build with a new migration runs)."""
    try:
        conn = sqlite3.connect(f"{shipped_kb_path().resolve().as_uri()}?mode=ro", uri=True)
    except (sqlite3.Error, OSError):
        return None
    try:
        conn.execute("PRAGMA trusted_schema = OFF")
        if migrations.applied(conn) != KNOWN_MIGRATIONS:
            return None
        return _schema_of(conn, "main")
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _migrated_schema() -> tuple[frozenset, dict]:
    conn = sqlite3.connect(":memory:")
    migrations.migrate(conn)
    objects, tables = _schema_of(conn, "main")
    conn.close()
    return objects, tables


def _schema_of(conn: sqlite3.Connection, db: str) -> tuple[frozenset, dict]:
    objects = frozenset(
        (kind, name)
        for kind, name in conn.execute(f"SELECT type, name FROM {db}.sqlite_master")
        if not name.startswith(INTERNAL)
    )
    tables = {
        name: [
            (c[1], str(c[2]).upper(), c[3], c[5], c[6])
            for c in conn.execute(f"PRAGMA {db}.table_xinfo({name})")
        ]
        for kind, name in objects
        if kind == "table"
    }
    return objects, tables


def refuse_hostile(conn: sqlite3.Connection, path, db: str = "main") -> None:
    """Refuse a file whose schema holds what advisor never creates: a view, a trigger, a virtual table (its
    SQL would run as the KB is read or written). Reads only sqlite_master: nothing of them runs."""
    try:
        rows = conn.execute(f"SELECT type, name, sql FROM {db}.sqlite_master").fetchall()
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    for kind, name, sql in rows:
        virtual = kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL")
        if kind in HOSTILE or virtual:
            what = "a virtual table" if virtual else f"a {kind}"
            raise KBError(
                f"{path} is not an advisor KB: it holds {what} named {name!r:.60}, which advisor never creates, "
                "so nothing is read from it. Move it aside, or pass --db with an advisor KB."
            )


def refuse_unless_current(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file that is not an advisor KB at this schema: a view, trigger or virtual table, a newer or an
    older schema, none recorded, tables or columns not exactly ours (what `connect_kb_readonly` checks)."""
    refuse_hostile(conn, path)
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
    check_schema(conn, path)


def check_schema(conn: sqlite3.Connection, path, db: str = "main") -> None:
    """Refuse a KB at the current schema whose tables, indexes or columns are not exactly what the
    migrations create (a table swapped for a view, a column added or made generated)."""
    refuse_hostile(conn, path, db)
    try:
        objects, tables = _schema_of(conn, db)
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    ref_objects, ref_tables = reference_schema()
    odd = sorted(objects ^ ref_objects) or sorted(t for t in ref_tables if tables.get(t) != ref_tables[t])
    if odd:
        shown = odd[0] if isinstance(odd[0], str) else f"{odd[0][0]} {odd[0][1]}"
        raise KBError(
            f"{path} is not an advisor KB at this schema ({shown!r:.80} differs from what advisor creates), "
            "so nothing is read from it. Move it aside, or pass --db with an advisor KB."
        )


def integrity_problems(conn: sqlite3.Connection, db: str = "main", full: bool = False) -> list[str]:
    """SQLite's own check of every page (quick_check; integrity_check where `full`): [] when whole."""
    pragma = "integrity_check" if full else "quick_check"
    rows = [r[0] for r in conn.execute(f"PRAGMA {db}.{pragma}(20)")]
    lines = [line for r in rows for line in str(r).splitlines() if not line.startswith("***")]
    return [] if rows == ["ok"] else lines or rows


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
