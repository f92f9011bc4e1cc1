"""Claims of grid cells: which cells already have an outcome, which are held by a live owner (a lease
its heartbeat renews), and which were abandoned by an owner that died (they become `crashed`). Every
write goes through `advisor.kb.store`'s transactions.

A claimed cell holds a lease of LEASE_S that its owner's heartbeat renews every LEASE_S / 4, from a thread
with its own connection: a killed process (a dead node, container or array task) stops renewing, and its
runs' leases expire on every host. On the owner's own host a dead pid frees the cell at once.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import store
from advisor.kb.open import open_beside_writer
from advisor.kb.store import FINAL, later, now, transaction

LEASE_S = 120  # a running run's lease; its owner's heartbeat renews it every LEASE_S / 4
LEGACY_RUNNING_S = 24 * 3600  # a running run from before leases, on another host, counts as alive this long
MAX_LEASE_AHEAD_S = 3600  # no owner sets a lease further ahead (LEASE_S, clocks apart): one that does is void


def is_alive(
    owner: str | None, lease_until: str | None, started_at: str | None, pid_alive: Callable[[str], bool]
) -> bool:
    """Whether a running run's owner still holds it. An expired lease means no: whichever host ran it (its
    heartbeat stopped). On this host a dead pid means no at once. A run from before leases counts as alive
    on another host for LEGACY_RUNNING_S after it started."""
    stamp = now()
    if lease_until is not None and (lease_until <= stamp or lease_until > later(MAX_LEASE_AHEAD_S)):
        return False  # expired, or further ahead than any owner sets one (a lease until 2999 is forged)
    if owner and ":" in owner and owner.rsplit(":", 1)[0] == socket.gethostname():
        return pid_alive(owner)
    if lease_until is not None:
        return True
    return (
        bool(started_at)
        and started_at > (datetime.now(UTC) - timedelta(seconds=LEGACY_RUNNING_S)).isoformat()
    )


# A --tune-lr run is read for its held-out loss alone, which reproduces across CPUs: of 496 runs measured on
# an AMD EPYC and an Intel Xeon at the same cell, seed and rate, half agree to 6e-7, 448 within 1 %, a few
# chaotic ones up to 23 % (bench/results/cross-host-cpu.json): one that trained on another host is not
# repeated here. Whether it ran out of memory is the host's own, and a grid run's times are too.
PORTABLE_SOURCES = ("measured:tuning",)
PORTABLE = ("ok", "diverged", "untrained")
ON_THIS_HARDWARE = (  # SQL, one parameter (this host's hardware): the runs that stand for this host's cells
    f"(hardware = ? OR (source IN ({', '.join(repr(s) for s in PORTABLE_SOURCES)}) "
    f"AND status IN ({', '.join(repr(s) for s in PORTABLE)})))"
)


def claim_run(
    conn: sqlite3.Connection, run: dict, pid_alive: Callable[[str], bool]
) -> tuple[int | None, str | None]:
    """Insert `run` as `running`, with a lease, unless its cell (source, cell key, seed, hardware) already
    has a final outcome or a live owner (a portable source's cell: one that trained on any hardware).
    Returns (run id, None), or (None, the status that makes the cell done or taken)."""
    with transaction(conn):
        taken = conn.execute(
            "SELECT status, owner, lease_until, started_at FROM runs WHERE source = ? AND cell_key = ? AND "
            f"seed = ? AND {ON_THIS_HARDWARE} "
            f"AND status IN ('running', {', '.join(repr(s) for s in FINAL)})",
            [run["source"], run["cell_key"], run["seed"], run["hardware"]],
        ).fetchall()
        for status, owner, lease, started in taken:
            if status in FINAL or is_alive(owner, lease, started, pid_alive):
                return None, status
        row = {
            **run,
            "status": "running",
            "started_at": now(),
            "lease_until": later(LEASE_S),
            "uid": uuid.uuid4().hex,
        }
        return store.insert_run(conn, row), None


def cell_of(run: dict) -> tuple | None:
    """(source, cell key, seed, hardware) of a run that ended with an outcome a re-run would repeat."""
    if run.get("status") not in FINAL or not run.get("cell_key") or run.get("seed") is None:
        return None
    return (run["source"], run["cell_key"], run["seed"], run["hardware"])


def ended_cells(conn: sqlite3.Connection) -> set[tuple]:
    """cell_of every run of a KB: the cells, seeds and hardware that already have an outcome."""
    marks = ", ".join("?" * len(FINAL))
    rows = conn.execute(
        "SELECT source, cell_key, seed, hardware FROM runs WHERE cell_key IS NOT NULL AND seed IS NOT NULL "
        f"AND status IN ({marks})",
        FINAL,
    )
    return {tuple(row) for row in rows}


def cells_ended_here(conn: sqlite3.Connection, hardware: str) -> set[tuple[str, int]]:
    """(cell key, seed) of the runs that ended with an outcome a re-run would repeat and stand for
    `hardware`'s cells (ON_THIS_HARDWARE): what a grid on that hardware would skip."""
    rows = conn.execute(
        f"SELECT cell_key, seed FROM runs WHERE status IN ({','.join('?' * len(FINAL))}) AND {ON_THIS_HARDWARE}",
        [*FINAL, hardware],
    ).fetchall()
    return {tuple(row) for row in rows}  # sqlite3.Row compares to no tuple


def cell_outcome(
    conn: sqlite3.Connection, source: str, cell_key: str, seed: int, hardware: str
) -> tuple[str, float | None] | None:
    """(status, held-out loss) of the ended run that stands for a cell on `hardware` (an ok one first, then
    this host's, then the latest; one that trained elsewhere: PORTABLE), None where none: a tuning rate's."""
    row = conn.execute(
        "SELECT r.status, (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.name = 'eval_loss') "
        f"FROM runs r WHERE r.source = ? AND r.cell_key = ? AND r.seed = ? AND {ON_THIS_HARDWARE} "
        "AND r.status != 'running' ORDER BY r.status = 'ok' DESC, r.hardware = ? DESC, r.id DESC LIMIT 1",
        [source, cell_key, seed, hardware, hardware],
    ).fetchone()
    return None if row is None else (row[0], row[1])


def mark_crashed(conn: sqlite3.Connection, pid_alive: Callable[[str], bool]) -> int:
    """Runs left `running` by an owner that no longer holds them become `crashed`. Returns how many."""
    with transaction(conn):
        stale = [
            (rid, owner, lease)
            for rid, owner, lease, started in conn.execute(
                "SELECT id, owner, lease_until, started_at FROM runs WHERE status = 'running'"
            )
            if not is_alive(owner, lease, started, pid_alive)
        ]
        ended = {
            run_id: f"its owner ({owner}) stopped renewing its lease (expired {lease})"
            if lease and lease <= now()
            else f"the process that ran it ({owner}) ended before the run did"
            for run_id, owner, lease in stale
        }
        store.end_runs(conn, ended, "crashed")
    return len(stale)


def pid_alive_here(owner: str) -> bool:
    """Whether the process of an owner ('host:pid') on this host still exists (readers' check: they may not
    import the measuring side's)."""
    pid = owner.rsplit(":", 1)[-1]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def abandoned(owner: str | None, lease_until: str | None, started_at: str | None) -> str | None:
    """Why a `running` run is in truth abandoned (its owner dead or its lease expired), for readers, which
    never write: they show it as crashed, and the next writer (measure, the Trainer callback) marks it."""
    if is_alive(owner, lease_until, started_at, pid_alive_here):
        return None
    return (
        f"its owner ({owner}) no longer holds it (lease {lease_until or 'none'}); shown as crashed, "
        "and the next run written to this KB marks it"
    )


class Heartbeat:
    """Renews the leases of the runs this process holds, every LEASE_S / 4 from a thread with its own
    connection, for as long as the process lives: a killed process stops renewing, and its runs' leases
    expire on every host."""

    def __init__(self, path: str | Path, interval: float = LEASE_S / 4):
        self.path, self.interval = Path(path), interval
        self.held: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="advisor-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def hold(self, run_id: int) -> None:
        self.held.add(run_id)

    def let_go(self, run_id: int) -> None:
        self.held.discard(run_id)

    def _run(self) -> None:
        conn = open_beside_writer(self.path)
        try:
            while not self._stop.wait(self.interval):
                self.renew(conn)
        finally:
            conn.close()

    def renew(self, conn: sqlite3.Connection) -> None:
        held = sorted(self.held)
        if not held:
            return
        try:
            with transaction(conn):
                conn.execute(
                    f"UPDATE runs SET lease_until = ? WHERE status = 'running' AND id IN ({','.join('?' * len(held))})",
                    [later(LEASE_S), *held],
                )
        except (sqlite3.Error, KBError):
            pass  # a busy or full disk: the next beat tries again, well within the lease
