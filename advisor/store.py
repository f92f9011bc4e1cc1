"""Every write into a knowledge base goes through here: opening it for writing (migrations, WAL, busy
timeout), the transaction helper, and runs with their metrics and epochs, claims of cells, validations.

Connections are autocommit (`isolation_level=None`); each write is one short `BEGIN IMMEDIATE`
transaction, so several processes can share a KB (the write lock is taken up front, and waits for the
busy timeout instead of failing on a read-then-write race), and a process killed mid-run leaves no
partial row behind.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from advisor.schema import (
    BUSY_TIMEOUT_MS,
    MIGRATION_SET,
    MIGRATIONS,
    KBError,
    cell_key,
    check_readable,
    connect_ro,
    corrupt_error,
    refuse_newer,
    statements,
)

FINAL = ("ok", "oom", "diverged")  # outcomes a re-run would repeat; `failed` and `crashed` are run again
JSON_COLUMNS = ("software", "config")  # run columns stored as JSON text


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def open_kb(path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) a KB for writing: migrations applied, WAL, busy timeout, autocommit."""
    path = Path(path)
    if path.exists():
        check_readable(path)
        ro = connect_ro(path)  # refuse a newer KB before any pragma writes to it
        try:
            refuse_newer(ro, path)
        finally:
            ro.close()
    elif not path.parent.exists():
        raise KBError(f"cannot create {path}: folder {path.parent} does not exist.")
    try:
        conn = sqlite3.connect(
            path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _use_wal(conn)
        conn.execute("PRAGMA foreign_keys = ON")
        refuse_newer(conn, path)
        _migrate(conn)
    except sqlite3.OperationalError as e:
        raise KBError(f"cannot write the knowledge base {path}: {e}. Pass --db with a writable path.") from e
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL (persistent), retrying: SQLite answers a concurrent switch with 'database is locked' at
    once, without waiting for the busy timeout, when another process is opening the same new file."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply pending migrations (sqlite-utils `Migrations`) holding the write lock, so that two processes
    opening a new KB at once do not both create its tables: the second waits, then finds nothing pending."""
    from sqlite_utils import Database
    from sqlite_utils.migrations import Migrations

    db = Database(conn)
    migrations = Migrations(MIGRATION_SET)
    for name, sql in MIGRATIONS:
        migrations(name=name)(_sql_migration(sql))
    if migrations.pending(db):
        with transaction(conn):
            migrations.apply(db)  # nested: sqlite-utils uses savepoints inside an open transaction


def _sql_migration(sql: str):
    def migrate(db) -> None:
        for statement in statements(sql):
            db.execute(statement)

    return migrate


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE takes the write lock up front: no 'database is locked' on a read-then-write race."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


_COLUMNS: dict[str, tuple[str, ...]] = {}


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """A table's columns, read from the schema itself: the one list of them. Cached per table: every
    connection open_kb hands out is at the current schema."""
    if table not in _COLUMNS:
        _COLUMNS[table] = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
    return _COLUMNS[table]


def _insert(conn: sqlite3.Connection, table: str, row: dict) -> int:
    """One row, its keys checked against the table's columns (a key never reaches the SQL text unchecked)."""
    unknown = [k for k in row if k not in _columns(conn, table)]
    if unknown:
        raise KBError(f"cannot store {', '.join(map(repr, unknown))}: not a column of {table}.")
    cur = conn.execute(
        f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )
    return cur.lastrowid


def insert_run(conn: sqlite3.Connection, run: dict) -> int:
    """Insert one run row plus its metrics and epochs (the caller owns the transaction)."""
    row = {k: v for k, v in run.items() if k not in ("metrics", "epochs", "id")}
    for key in JSON_COLUMNS:
        if not isinstance(row.get(key), str):
            row[key] = json.dumps(row.get(key) or {}, sort_keys=True)
    if not row.get("cell_key"):
        row["cell_key"] = cell_key(json.loads(row["config"]) | {"source": row["source"]})
    run_id = _insert(conn, "runs", row)
    for m in run.get("metrics", []):
        _insert(
            conn,
            "metrics",
            dict(
                run_id=run_id,
                name=m["name"],
                value=m["value"],
                unit=m["unit"],
                certainty=m.get("certainty") or "measured",
                note=m.get("note"),
            ),
        )
    for e in run.get("epochs", []):
        add_epoch_row(conn, run_id, e)
    return run_id


def add_epoch_row(conn: sqlite3.Connection, run_id: int, row: dict) -> None:
    _insert(conn, "epochs", {"run_id": run_id, **{k: v for k, v in row.items() if k != "run_id"}})


def is_stored(conn: sqlite3.Connection, run: dict) -> bool:
    """Whether the KB already holds this run (same source, cell, seed, hardware, start and config)."""
    row = conn.execute(
        "SELECT 1 FROM runs WHERE source = ? AND model = ? AND optimizer = ? AND strategy = ? AND preset = ? "
        "AND hardware = ? AND seed IS ? AND started_at IS ? AND config = ?",
        [
            run["source"],
            run["model"],
            run["optimizer"],
            run["strategy"],
            run["preset"],
            run["hardware"],
            run.get("seed"),
            run.get("started_at"),
            json.dumps(run.get("config") or {}, sort_keys=True),
        ],
    ).fetchone()
    return row is not None


def write_runs(conn: sqlite3.Connection, runs: list[dict], validations: list[dict] = ()) -> tuple[int, int]:
    """Insert runs (with metrics and epochs) and validations in one transaction; skip exact repeats.
    Returns (runs added, runs skipped)."""
    added = skipped = 0
    with transaction(conn):
        for run in runs:
            if is_stored(conn, run):
                skipped += 1
                continue
            insert_run(conn, run)
            added += 1
        for row in validations:
            _insert_validation(conn, row)
    return added, skipped


def _insert_validation(conn: sqlite3.Connection, row: dict) -> None:
    """One validation row, unless the KB has it (same hardware, check, model and time)."""
    row = {k: v for k, v in row.items() if k != "id"}
    if not isinstance(row.get("software", "{}"), str):
        row["software"] = json.dumps(row["software"], sort_keys=True)
    same = conn.execute(
        "SELECT 1 FROM validations WHERE hardware = ? AND name = ? AND model IS ? AND created_at = ?",
        [row["hardware"], row["name"], row.get("model"), row["created_at"]],
    ).fetchone()
    if same is None:
        _insert(conn, "validations", row)


def claim_run(
    conn: sqlite3.Connection, run: dict, alive: Callable[[str | None], bool]
) -> tuple[int | None, str | None]:
    """Insert `run` as `running` unless its cell (source, cell key, seed, hardware) already has a final
    outcome or a live owner. Returns (run id, None), or (None, the status that makes the cell done or taken)."""
    with transaction(conn):
        taken = conn.execute(
            "SELECT status, owner FROM runs WHERE source = ? AND cell_key = ? AND seed = ? AND hardware = ? "
            f"AND status IN ('running', {', '.join(repr(s) for s in FINAL)})",
            [run["source"], run["cell_key"], run["seed"], run["hardware"]],
        ).fetchall()
        for status, tag in taken:
            if status in FINAL or alive(tag):
                return None, status
        return insert_run(conn, {**run, "status": "running", "started_at": now()}), None


def update_run(conn: sqlite3.Connection, run_id: int, **fields) -> None:
    unknown = [k for k in fields if k not in _columns(conn, "runs")]
    if unknown:
        raise KBError(f"cannot update {', '.join(map(repr, unknown))}: not a column of runs.")
    fields = {k: json.dumps(v, sort_keys=True) if k in JSON_COLUMNS else v for k, v in fields.items()}
    with transaction(conn):
        sets = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE runs SET {sets} WHERE id = ?", [*fields.values(), run_id])


def add_epoch(conn: sqlite3.Connection, run_id: int, row: dict) -> None:
    """One epoch's row, committed as the epoch ends (a crash later keeps it)."""
    with transaction(conn):
        add_epoch_row(conn, run_id, row)


def finish_run(
    conn: sqlite3.Connection,
    run_id: int,
    status: str,
    error: str | None,
    metrics: list[tuple[str, float, str]],
) -> None:
    """The run's summary figures and final status, in one transaction."""
    with transaction(conn):
        for name, value, unit in metrics:
            conn.execute(
                "INSERT OR REPLACE INTO metrics (run_id, name, value, unit, certainty) "
                "VALUES (?, ?, ?, ?, 'measured')",
                [run_id, name, value, unit],
            )
        conn.execute(
            "UPDATE runs SET status = ?, error = ?, finished_at = ? WHERE id = ?",
            [status, error, now(), run_id],
        )


def mark_crashed(conn: sqlite3.Connection, alive: Callable[[str | None], bool]) -> int:
    """Runs left `running` by an owner that is no longer alive become `crashed`. Returns how many."""
    with transaction(conn):
        stale = [
            (rid, tag)
            for rid, tag in conn.execute("SELECT id, owner FROM runs WHERE status = 'running'")
            if not alive(tag)
        ]
        for run_id, tag in stale:
            conn.execute(
                "UPDATE runs SET status = 'crashed', error = ?, finished_at = ? WHERE id = ?",
                [f"the process that ran it ({tag}) ended before the run did", now(), run_id],
            )
    return len(stale)


def add_predictions(conn: sqlite3.Connection, rows: list[dict]) -> None:
    """`advisor fit`'s predictions (replacing one with the same key), in one transaction."""
    stamp = now()
    with transaction(conn):
        for row in rows:
            row = {**row, "created_at": stamp}
            for key in ("software", "payload"):
                row[key] = json.dumps(row[key], sort_keys=True)
            conn.execute("DELETE FROM predictions WHERE key = ?", [row["key"]])
            _insert(conn, "predictions", row)


@dataclass
class Check:
    """One check of `advisor validate` (or of bench/fit_accuracy.py), as the validations table holds it."""

    name: str
    model: str | None
    passed: bool
    value: float
    tolerance: float
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def add_validations(conn: sqlite3.Connection, machine: dict, preset: str, checks) -> None:
    """The results of `advisor validate`, so that answers can say what was validated on this hardware."""
    stamp = now()
    with transaction(conn):
        for c in checks:
            _insert(
                conn,
                "validations",
                dict(
                    hardware=machine["hardware"],
                    device=machine["device"],
                    model=c.model,
                    preset=preset if c.model else None,
                    name=c.name,
                    passed=int(c.passed),
                    value=c.value if c.value != float("inf") else None,
                    tolerance=c.tolerance,
                    detail=c.detail,
                    software=json.dumps(machine["software"], sort_keys=True),
                    created_at=stamp,
                ),
            )
