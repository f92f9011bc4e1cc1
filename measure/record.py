"""Writing measured runs into the KB as they happen: claim a cell, commit each epoch, finish the run.

Every write is one short `BEGIN IMMEDIATE` transaction (WAL, busy timeout), so several `advisor measure`
processes can share a KB: a cell is claimed by exactly one of them, and a process killed mid-cell leaves
its run `running` with the epochs it finished; the next process marks that run `crashed` and runs the
cell again.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from advisor.schema import BUSY_TIMEOUT_MS, open_kb
from measure.hardware import owner, owner_alive

SOURCE = "measured"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def connect(path: Path) -> sqlite3.Connection:
    """A KB connection for the measurement side: migrated, WAL, autocommit with explicit transactions."""
    open_kb(path).close()  # creates or migrates, refuses a newer schema
    conn = sqlite3.connect(
        path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


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


def mark_crashed(conn: sqlite3.Connection) -> int:
    """Runs left `running` by a process that no longer exists become `crashed`. Returns how many."""
    with transaction(conn):
        stale = [
            (rid, tag)
            for rid, tag in conn.execute("SELECT id, owner FROM runs WHERE status = 'running'")
            if not owner_alive(tag)
        ]
        for run_id, tag in stale:
            conn.execute(
                "UPDATE runs SET status = 'crashed', error = ?, finished_at = ? WHERE id = ?",
                [f"the process that ran it ({tag}) ended before the run did", now(), run_id],
            )
    return len(stale)


FINAL = ("ok", "oom", "diverged")  # outcomes a re-run would repeat; `failed` and `crashed` are run again


def claim(conn: sqlite3.Connection, key: str, seed: int, run: dict) -> tuple[int | None, str | None]:
    """Insert a `running` run for (cell key, seed, hardware) unless one has a final status or is running.

    Returns (run id, None), or (None, the status that makes this cell done or taken)."""
    with transaction(conn):
        taken = conn.execute(
            "SELECT status, owner FROM runs WHERE source = ? AND cell_key = ? AND seed = ? AND hardware = ? "
            f"AND status IN ('running', {', '.join(repr(s) for s in FINAL)})",
            [SOURCE, key, seed, run["hardware"]],
        ).fetchall()
        for status, tag in taken:
            if status in FINAL or owner_alive(tag):
                return None, status
        row = {
            **run,
            "cell_key": key,
            "seed": seed,
            "source": SOURCE,
            "status": "running",
            "owner": owner(),
            "started_at": now(),
            "software": json.dumps(run["software"], sort_keys=True),
            "config": json.dumps(run["config"], sort_keys=True),
        }
        cur = conn.execute(
            f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )
        return cur.lastrowid, None


def update_run(conn: sqlite3.Connection, run_id: int, **fields) -> None:
    with transaction(conn):
        sets = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE runs SET {sets} WHERE id = ?", [*fields.values(), run_id])


def add_epoch(conn: sqlite3.Connection, run_id: int, row: dict) -> None:
    with transaction(conn):
        conn.execute(
            f"INSERT INTO epochs (run_id, {', '.join(row)}) VALUES (?, {', '.join('?' * len(row))})",
            [run_id, *row.values()],
        )


def finish(
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


def add_validations(conn: sqlite3.Connection, machine: dict, preset: str, checks) -> None:
    """The results of `advisor validate`, so that answers can say what was validated on this hardware."""
    stamp = now()
    with transaction(conn):
        for c in checks:
            conn.execute(
                "INSERT INTO validations (hardware, device, model, preset, name, passed, value, tolerance, detail, "
                "software, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    machine["hardware"],
                    machine["device"],
                    c.model,
                    preset if c.model else None,
                    c.name,
                    int(c.passed),
                    c.value if c.value != float("inf") else None,
                    c.tolerance,
                    c.detail,
                    json.dumps(machine["software"], sort_keys=True),
                    stamp,
                ],
            )
