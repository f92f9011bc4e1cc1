"""Every way a knowledge base is opened, one function per mode; nothing else in advisor opens a KB file.

- one KB read alone, read-only and checked (an advisor KB at this schema): `connect_kb_readonly`; any SQLite
  file read-only and unchecked (a writer's look before it writes, `kb build`'s target): `connect_file_readonly`
- the KB answers come from: `open_for_reading` (--db or $ADVISOR_DB alone; else the shipped KB, with the
  user's read beside it, `read_together`, each checked as `check_read` says); the files it reads: `kbs_read`
- a KB merged from, read-only with every page checked: `open_source`
- a KB written: `open_for_writing` (created whole if missing, migrations applied, WAL), `writing` (then
  `release`), and `whole_before_migrating` (what `kb migrate` may upgrade)
- a second writing connection beside a writer's (the heartbeat renewing leases): `open_beside_writer`
- a KB just built, compacted: `open_to_compact`

Every read-only connection trusts nothing in the file's schema and has a time bound (`guarded`). The checks
that refuse a file which is not a usable KB are advisor.kb.schema's; what a write does inside its
transactions is advisor.kb.store's (imported by the write modes only, off the answer path).
"""

from __future__ import annotations

import errno
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import migrations
from advisor.kb.queries.groups import USER_ID_OFFSET
from advisor.kb.schema import (
    BUSY_TIMEOUT_MS,
    DISK_FULL,
    KNOWN_MIGRATIONS,
    applied_migrations,
    check_readable,
    check_schema,
    corrupt_error,
    disk_full,
    integrity_problems,
    read_timeout,
    refuse_hostile,
    refuse_newer,
    refuse_unless_current,
)
from advisor.places import exists, resolve_db_path, shipped_kb_path, user_kb_path

PROGRESS_EVERY = 20_000  # SQLite instructions between two looks at the clock (about a millisecond)

# --- reading ----------------------------------------------------------------------------------------------


def connect_kb_readonly(path: str | Path) -> sqlite3.Connection:
    """Open a KB read-only with stdlib sqlite3 and check it is an advisor KB at this schema (what a reader
    answers from; `connect_file_readonly` opens any SQLite file, unchecked)."""
    path = Path(path)
    check_readable(path)
    if path.stat().st_size == 0:
        raise KBError(
            f"{path} is empty, not a knowledge base. Pass --db with an advisor KB, or build one with `advisor kb build -o`."
        )
    conn = connect_file_readonly(path)
    try:
        refuse_unless_current(conn, path)
    except BaseException:
        conn.close()
        raise
    conn.row_factory = sqlite3.Row
    return conn


def connect_file_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection to any SQLite file (mode=ro, else immutable), unchecked: it has read the schema
    page (so a corrupt file fails here, with a sentence), nothing more (`connect_kb_readonly` checks a KB)."""
    uri = path.resolve().as_uri()
    try:
        conn = guarded(sqlite3.connect(f"{uri}?mode=ro", uri=True))
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
    conn = guarded(sqlite3.connect(f"{uri}?immutable=1", uri=True))
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    return conn


def guarded(conn: sqlite3.Connection) -> sqlite3.Connection:
    """A connection that trusts nothing in a file's schema (`trusted_schema=OFF`: no function with side
    effects runs from a view, trigger or index) and whose reads have a time bound (`TimeBound`)."""
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.set_progress_handler(TimeBound(read_timeout()), PROGRESS_EVERY)
    return conn


class TimeBound:
    """SQLite's progress handler: interrupts a stretch of work longer than `seconds` (SQLite then raises
    'interrupted'). A stretch is work with no pause of IDLE_S between two calls: one query, or a command's
    queries one after another; a connection held idle (the Python API's) starts a new stretch."""

    IDLE_S = 1.0

    def __init__(self, seconds: float):
        self.seconds, self.start, self.last = seconds, 0.0, -1e9

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self.last > self.IDLE_S:
            self.start = now
        self.last = now
        return int(now - self.start > self.seconds)


def open_for_reading(db: str | os.PathLike | None) -> sqlite3.Connection:
    """The KB to answer from, read-only (raises KBError with a sentence to act on): --db or $ADVISOR_DB
    alone; else the shipped KB and, when it exists, the user's, read together (`read_together`)."""
    if db or os.environ.get("ADVISOR_DB"):
        path = resolve_db_path(db)
        READING[:] = [str(path)]
        conn = connect_kb_readonly(path)
        try:
            check_read(conn, Path(path), "main", full=False)
        except BaseException:
            conn.close()
            raise
        return conn
    READING[:] = [str(shipped_kb_path())] + ([str(user_kb_path())] if exists(user_kb_path()) else [])
    conn = connect_kb_readonly(shipped_kb_path())
    if exists(user_kb_path()):
        try:
            read_together(conn, user_kb_path())
        except BaseException:
            conn.close()
            raise
    return conn


READING: list[str] = []  # the KB files the latest open_for_reading read: what an error met later names
MAX_CHECKED_BYTES = 1 << 30  # a user KB up to 1 GiB has every page checked as it is read (0.2 s per 130 MB)
MAX_CHECKED_BYTES_ALONE = 64 << 20  # a KB read alone (--db) has its pages checked up to this size


_ID_COLUMNS = ("id", "run_id", "grp")


def read_together(conn: sqlite3.Connection, user_path: Path) -> None:
    """ATTACH the user's KB to a read-only connection of the shipped one, and shadow each table with a TEMP
    view of both (temp comes first in SQLite's name lookup): every query sees the two KBs as one, each run
    keeping its provenance, and nothing is copied or written. Tables the user's KB lacks stay the shipped
    KB's own."""
    try:
        connect_kb_readonly(user_path).close()  # an advisor KB at this schema, or a sentence
    except KBError as e:
        raise KBError(
            f"{str(e).rstrip('.')}; it is your own KB, read beside the shipped one: move it aside "
            f"(mv {user_path} {user_path}.bad) and the shipped KB answers alone."
        ) from e
    from advisor.kb import checks as remembered  # the file SQLite opens, told by its descriptors

    resolved = Path(user_path).resolve()  # once: what is opened, checked and remembered is this file
    before = remembered.descriptors()
    conn.execute("ATTACH DATABASE ? AS user", [f"{resolved.as_uri()}?mode=ro"])
    conn.execute(
        "SELECT count(*) FROM user.sqlite_master"
    ).fetchone()  # SQLite opens the file on a first read
    check_read(conn, resolved, "user", full=True, opened=remembered.opened_since(before, resolved))
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM main.sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' "
            "AND name NOT LIKE '\\_%' ESCAPE '\\' AND name IN (SELECT name FROM user.sqlite_master)"
        )
    ]
    for table in tables:
        cols = [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})")]
        if cols != [r[1] for r in conn.execute(f"PRAGMA user.table_info({table})")]:
            continue
        shifted = ", ".join(f"{c} + {USER_ID_OFFSET} AS {c}" if c in _ID_COLUMNS else c for c in cols)
        conn.execute(
            f"CREATE TEMP VIEW {table} AS SELECT {', '.join(cols)} FROM main.{table} "
            f"UNION ALL SELECT {shifted} FROM user.{table}"
        )


def check_read(
    conn: sqlite3.Connection, path: Path, db: str, full: bool, opened: dict[str, str] | None = None
) -> None:
    """Refuse a KB unless it is whole and keeps the rules: its schema exactly ours, its pages sound (SQLite's
    quick_check), its rows within advisor.kb.admission's rules. `full` (the user's KB read beside the
    shipped one, whose answers say "your KB"): every page and every row, once per version of the file (a
    pass is remembered: advisor.kb.checks); the exact schema on every read, so a file swapped in is caught
    whatever was remembered. Else (a KB read alone, --db, which may hold a million runs and must answer in a
    second): the summaries answers are computed from, and the pages of a file up to
    MAX_CHECKED_BYTES_ALONE. An answer is never computed over a KB known to be damaged or forged; `advisor
    kb check` checks everything of any KB. `opened`: the descriptors of the file SQLite opened
    (advisor.kb.checks.opened_since), what a pass is keyed on; without them nothing is remembered."""
    try:
        check_schema(conn, path, db)
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    if not full:
        _check_pages_and_rows(conn, path, db, full)
        return
    from advisor.kb import checks as remembered  # only a user's KB is remembered (its hashing, its file)

    version = remembered.file_version(path, opened) if opened else None
    if version is not None and remembered.passed(version):
        return
    _check_pages_and_rows(conn, path, db, full)
    if version is not None and remembered.file_version(path, opened) == version:  # unchanged while checked
        remembered.remember_passed(version)


def _check_pages_and_rows(conn: sqlite3.Connection, path: Path, db: str, full: bool) -> None:
    """check_read's costly part: SQLite's quick_check of the pages, and every row (the summaries, where
    not `full`) held to the rules."""
    from advisor.kb.queries import audit  # off the answer path when the check is remembered (a few ms)

    try:
        size = path.stat().st_size
        if size <= (MAX_CHECKED_BYTES if full else MAX_CHECKED_BYTES_ALONE):
            damage = integrity_problems(conn, db)
            if damage:
                raise corrupt_error(path, ValueError(f"integrity check: {'; '.join(damage[:2])}"))
        broken = audit.stored_problems(conn, db, tables=None if full else audit.SUMMARIES)
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    if broken:
        raise KBError(
            f"{path} holds rows that break advisor's rules ({'; '.join(broken[:3])}), so nothing is read from "
            f"it: `advisor kb check --db {path}` lists them; move it aside (mv {path} {path}.bad)"
            + (" and the shipped KB answers alone." if full else ".")
        )


def check_kb(path: Path) -> list[str]:
    """Everything `advisor kb check` finds wrong with a KB file, as sentences ([] when it is whole): not an
    advisor KB at this schema, pages SQLite's integrity check finds damaged, rows that break the rules."""
    from advisor.kb import admission  # off the answer path (see _check_pages_and_rows)
    from advisor.kb.queries import audit

    try:
        conn = connect_kb_readonly(path)
    except KBError as e:
        return [str(e)]
    try:
        damage = integrity_problems(conn, full=True)
        if damage:
            return [f"SQLite's integrity check: {d}" for d in damage]
        broken = audit.stored_problems(conn)
        return broken + audit.speed_problems(conn, admission.MAX_REPORTED - len(broken))
    except sqlite3.DatabaseError as e:
        return [str(corrupt_error(path, e))]
    finally:
        conn.close()


def kbs_read() -> list[Path]:
    """The KB files a read command reads by default: the shipped KB, and the user's where it exists."""
    return [shipped_kb_path()] + ([user_kb_path()] if exists(user_kb_path()) else [])


def open_source(path: Path) -> sqlite3.Connection:
    """A KB to merge from, read-only: an advisor KB at this schema (no views, triggers or virtual tables),
    every page sound, or a sentence."""
    conn = connect_kb_readonly(path)
    try:
        damage = integrity_problems(conn)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise corrupt_error(path, e) from e
    if damage:
        conn.close()
        raise corrupt_error(path, ValueError(f"integrity check: {damage[0]}"))
    return conn


# --- writing ----------------------------------------------------------------------------------------------


def refuse_empty(path: Path) -> None:
    """One rule for every writer (`kb migrate`, `calibrate`, `measure`, `kb import`, `fit`'s cache...): an
    empty file is not a KB, and is never made one; KBError with what to do.

    Refusing is the safer of the two rules (`calibrate` used to turn one into a KB, `kb migrate` to refuse
    it): an empty file where a KB was named is a KB lost (truncated by a crash, a full disk, `> kb.sqlite`)
    or another file than the user meant, and writing a new KB into it would hide both. advisor leaves none
    of its own (`_create` makes a KB whole beside its name, then links it in), so this refuses no file of
    advisor's, and what to do is one command."""
    if path.is_file() and path.stat().st_size == 0:
        raise KBError(
            f"{path} is an empty file, not a knowledge base, and advisor makes a KB only where no file is: "
            f"remove it (rm {path}) and run the command again, or pass --db with the KB you meant."
        )


def whole_before_migrating(path: Path) -> None:
    """A KB `advisor kb migrate` may upgrade: not an empty file (refuse_empty: the rule of every writer) and
    not damaged (a migration written over a corrupt page spreads it): KBError with what to do otherwise."""
    refuse_empty(path)
    check_readable(path)
    ro = connect_file_readonly(path)
    try:
        problems = integrity_problems(ro, full=True)
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    finally:
        ro.close()
    if problems:
        raise corrupt_error(path, sqlite3.DatabaseError("; ".join(problems[:3])))


def open_for_writing(path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) a KB for writing: migrations applied, WAL, busy timeout, autocommit.

    Refuses what is not an advisor KB: a folder, a device or pipe, a newer schema, and another
    application's SQLite database (advisor never adds its tables to one)."""
    path = Path(path)
    if path.exists():
        check_readable(path)
        refuse_empty(path)
        ro = connect_file_readonly(path)  # refuse before any pragma writes to it
        try:
            refuse_hostile(ro, path)  # a trigger would run as we write
            refuse_newer(ro, path)
            _refuse_foreign(ro, path)
            if applied_migrations(ro) == KNOWN_MIGRATIONS:
                check_schema(ro, path)
        finally:
            ro.close()
    elif path.parent.exists() and not path.parent.is_dir():
        raise KBError(
            f"cannot create {path}: {path.parent} is a file, not a folder. Pass --db with a writable path."
        )
    elif not path.parent.exists():
        raise KBError(f"cannot create {path}: folder {path.parent} does not exist.")
    else:
        _create(path)
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA trusted_schema = OFF")
        _use_wal(conn)
        refuse_newer(conn, path)
        _migrate(conn)  # foreign keys off: a migration that rebuilds `runs` must not cascade its drop
        conn.execute("PRAGMA foreign_keys = ON")
    except sqlite3.OperationalError as e:
        raise _write_error(path, e) from e
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    return conn


def _create(path: Path) -> None:
    """A new KB at `path`, made whole (every migration applied) in a temporary file beside it, then linked
    into place: a process killed while creating it leaves no empty or schema-less file at `path`, which every
    reader refuses, only a temporary file that the next creation removes. Two processes creating one KB at
    once: the first link wins, and the other opens that KB."""
    _remove_stale_creations(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}{CREATING}")
    try:
        conn = sqlite3.connect(temp, isolation_level=None)
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            _migrate(conn)
        finally:
            conn.close()
        _link_into_place(temp, path)
    except sqlite3.OperationalError as e:
        raise _write_error(path, e) from e
    except OSError as e:
        raise KBError(f"cannot create {path}: {e.strerror or e}. Pass --db with a writable path.") from e
    finally:
        for leftover in (temp, temp.with_name(f"{temp.name}-journal")):
            leftover.unlink(missing_ok=True)


CREATING = ".creating"  # the suffix of a KB being made beside its name: .NAME.PID-RANDOM.creating


def _link_into_place(temp: Path, path: Path) -> None:
    """`temp` at `path` too, never over a file there (a KB another process made first is kept, and used).
    Where the file system has no hard links, a rename once no file is there (the narrow race is theirs)."""
    try:
        os.link(temp, path)
    except FileExistsError:
        pass
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS):
            raise
        if not path.exists():
            os.replace(temp, path)


def _remove_stale_creations(path: Path) -> None:
    """Temporary files of KBs being created at `path` whose process no longer exists (killed mid-creation)."""
    import glob  # 2 ms: a writer's, never an answer's

    for leftover in path.parent.glob(f".{glob.escape(path.name)}.*{CREATING}*"):
        pid = leftover.name[len(path.name) + 2 :].split("-")[0]
        if pid.isdigit() and not process_exists(int(pid)):
            leftover.unlink(missing_ok=True)


def process_exists(pid: int) -> bool:
    """Whether a process with this id is running (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refuse_foreign(conn: sqlite3.Connection, path: Path) -> None:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    if tables and not applied_migrations(conn):
        shown = ", ".join(tables[:5]) + ("…" if len(tables) > 5 else "")
        raise KBError(
            f"{path} is another application's SQLite database (tables: {shown}): advisor writes only its own "
            "knowledge bases. Pass --db with a new file or an advisor KB."
        )


def _write_error(path: Path, e: sqlite3.OperationalError) -> KBError:
    if any(s in str(e).lower() for s in DISK_FULL):
        return disk_full(path, e)
    return KBError(f"cannot write the knowledge base {path}: {e}. Pass --db with a writable path.")


@contextmanager
def writing(path: str | Path) -> Iterator[sqlite3.Connection]:
    """open_for_writing, then `release` however the block ends."""
    conn = open_for_writing(path)
    try:
        yield conn
    finally:
        release(conn)


def release(conn: sqlite3.Connection) -> None:
    """Checkpoint, switch back to rollback journaling if no other connection has the KB open (then no -wal
    or -shm file is needed to read it, from a read-only folder too), and close."""
    try:
        conn.execute("PRAGMA busy_timeout = 0")  # another process has it open: leave WAL to it, at once
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
    except sqlite3.Error:
        pass
    conn.close()


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, retrying: SQLite answers a concurrent switch with 'database is locked' at once,
    without waiting for the busy timeout, when another process is opening or releasing the same file."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply pending migrations holding the write lock, so that two processes opening a new KB at once do
    not both create its tables: the second waits, then finds nothing pending."""
    from advisor.kb.store import transaction  # the store's write lock; off the answer path

    if migrations.pending(conn):
        with transaction(conn):
            migrations.migrate(conn)


def open_beside_writer(path: str | Path) -> sqlite3.Connection:
    """A second writing connection to a KB a writer holds open (`open_for_writing` made it, at this
    schema): autocommit, waiting for the busy timeout. The heartbeat renews its leases through one."""
    return sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)


def open_to_compact(path: str | Path) -> sqlite3.Connection:
    """An autocommit connection to a KB just built and let go (`writing`), to VACUUM it into one
    self-contained, compact file."""
    return sqlite3.connect(path, isolation_level=None)
