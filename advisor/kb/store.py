"""Every write into a knowledge base goes through here: the transaction helper, runs with their metrics and
epochs (one at a time, or a whole file in bulk), validations and predictions. Opening a KB for writing
(migrations, WAL, busy timeout) and letting it go are `advisor.kb.open`'s (`open_for_writing`, `writing`,
`release`). Claims of cells, their leases and heartbeat are `advisor.kb.lease`'s, written through this
module's transactions.

Connections are autocommit (`isolation_level=None`); each write is one short `BEGIN IMMEDIATE`
transaction, so several processes can share a KB (the write lock is taken up front, and waits for the
busy timeout instead of failing on a read-then-write race), and a process killed mid-run leaves no
partial row behind. A KB is left in rollback-journal mode when its last writer lets go (`release`), so a
copy handed out or a read-only mount can be read without a `-shm` file.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from advisor.errors import KBError
from advisor.kb import admission, summaries
from advisor.kb.identity import cell_key, run_uid
from advisor.kb.migrations import PROTOCOLS
from advisor.kb.schema import DISK_FULL, disk_full

FINAL = (
    "ok",
    "oom",
    "diverged",
    "untrained",
)  # outcomes a re-run would repeat; `failed`, `crashed` run again
JSON_COLUMNS = ("software", "config")  # run columns stored as JSON text


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="seconds")


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE takes the write lock up front: no 'database is locked' on a read-then-write race.
    A full disk becomes a KBError with a sentence; the transaction is rolled back, the KB intact."""
    with full_disk_said(conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise


@contextmanager
def full_disk_said(conn: sqlite3.Connection) -> Iterator[None]:
    """SQLite's 'database or disk is full' (or the disk I/O error a write past a size limit gives) as a
    KBError that says what happened and what to do."""
    try:
        yield
    except sqlite3.OperationalError as e:
        if any(s in str(e).lower() for s in DISK_FULL):
            raise disk_full(_file_of(conn), e) from e
        raise


def _file_of(conn: sqlite3.Connection) -> str:
    return next((r[2] for r in conn.execute("PRAGMA database_list") if r[1] == "main"), "the knowledge base")


# --- runs ---------------------------------------------------------------------------------------------

_COLUMNS: dict[str, tuple[str, ...]] = {}


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    """A table's columns, read from the schema itself: the one list of them. Cached per table: every
    connection open_for_writing hands out is at the current schema."""
    if table not in _COLUMNS:
        _COLUMNS[table] = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
    return _COLUMNS[table]


def _checked(conn: sqlite3.Connection, table: str, row: dict) -> dict:
    """A row whose keys are all columns of the table (a key never reaches the SQL text unchecked)."""
    unknown = [k for k in row if k not in _columns(conn, table)]
    if unknown:
        raise KBError(f"cannot store {', '.join(map(repr, unknown))}: not a column of {table}.")
    return row


def _insert(conn: sqlite3.Connection, table: str, row: dict) -> int:
    row = _checked(conn, table, row)
    cur = conn.execute(
        f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
    )
    return cur.lastrowid


def normalized(run: dict) -> dict:
    """A run dict as the rules check it: files written before 0008 named the settings `protocol`; a run
    that names no protocol is the paper's."""
    run = dict(run)
    if run.get("protocol") not in (None, *PROTOCOLS) and run.get("settings") is None:
        run["settings"] = run.pop("protocol")
    run["protocol"] = run.get("protocol") or "paper"
    return run


def checked_run(run: dict) -> dict:
    """The run normalized, or a KBError that names it and says what breaks the rules (advisor.kb.admission).
    Names are checked leniently: this is the path of advisor's own writers (measure's claims, the Trainer
    callback), whose rules may name families or optimizers these do not (admission.Name)."""
    run = normalized(run)
    problem = admission.run_problem(run, lenient=True)
    if problem:
        raise BadRuns([f"{admission.identity(run)}: {problem}"])
    return run


class BadRuns(KBError):
    """Runs that break the rules (advisor.kb.admission); nothing of them was written."""

    def __init__(self, problems: list[str], total: int | None = None, where: str = ""):
        self.problems, self.total = problems, total or len(problems)
        shown = "; ".join(problems[: admission.MAX_REPORTED])
        more = (
            f" (and {self.total - admission.MAX_REPORTED} more)"
            if self.total > admission.MAX_REPORTED
            else ""
        )
        super().__init__(
            f"{where}{self.total} run(s) break advisor's rules, so nothing was written: {shown}{more}. "
            "Fix or drop them at their source, then try again."
        )


def _run_row(run: dict) -> dict:
    """A checked run as its `runs` row: JSON columns serialized, a cell key and an identity given if missing
    (derived from its provenance, so that importing the same file twice adds it once)."""
    row = {k: v for k, v in run.items() if k not in ("metrics", "epochs", "id", "grp")}
    for key in JSON_COLUMNS:
        if not isinstance(row.get(key), str):
            row[key] = json.dumps(row.get(key) or {}, sort_keys=True)
    if not row.get("cell_key"):
        row["cell_key"] = cell_key(json.loads(row["config"]) | {"source": row["source"]})
    row["uid"] = row.get("uid") or run_uid(row)
    return row


def _metric_row(run_id: int, m: dict) -> dict:
    return dict(
        run_id=run_id,
        name=m["name"],
        value=m["value"],
        unit=m["unit"],
        certainty=m.get("certainty") or "measured",
        note=m.get("note"),
    )


def insert_run(conn: sqlite3.Connection, run: dict) -> int:
    """Insert one run row plus its metrics and epochs, and summarise it (the caller owns the transaction).
    A run that breaks the rules is refused with a KBError that names it (the Trainer callback's and
    measure's claims come through here)."""
    run = checked_run(run)
    run_id = _insert(conn, "runs", _run_row(run))
    for m in run.get("metrics", []):
        _insert(conn, "metrics", _metric_row(run_id, m))
    for e in run.get("epochs", []):
        add_epoch_row(conn, run_id, e)
    summaries.add(conn, [run_id])
    return run_id


def add_epoch_row(conn: sqlite3.Connection, run_id: int, row: dict) -> None:
    _insert(conn, "epochs", {"run_id": run_id, **{k: v for k, v in row.items() if k != "run_id"}})


def write_runs(conn: sqlite3.Connection, runs: list[dict], validations: list[dict] = ()) -> tuple[int, int]:
    """Insert runs (with metrics and epochs) and validations; runs the KB already holds are skipped.
    Returns (runs added, runs skipped). Every run is checked against the rules first (advisor.kb.admission):
    one that breaks them refuses the whole write (BadRuns), and nothing is written.

    Atomic, and short for other writers: every row is staged in temporary tables first (they take no lock
    on the KB), then one transaction copies what is new in SQL. A 20,000-run import holds the write lock
    for a fraction of a second, not the minute a row-by-row insert takes."""
    staging = Staging(conn)
    try:
        staging.add(runs)
        return staging.commit(validations)
    finally:
        staging.drop()


class Staging:
    """Runs staged in temporary tables shaped like the KB's (they take no lock on it, and spill to disk),
    batch by batch, then copied in one transaction: what `write_runs` does at once and `kb merge` streams."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn, self.count = conn, 0
        with full_disk_said(conn):
            for table in ("runs", "metrics", "epochs"):
                conn.execute(f"DROP TABLE IF EXISTS temp.staged_{table}")
                conn.execute(f"CREATE TEMP TABLE staged_{table} AS SELECT * FROM main.{table} WHERE 0")
            conn.execute("CREATE INDEX temp.staged_runs_uid ON staged_runs (uid, id)")  # the copy's lookups

    def add(self, runs: list[dict]) -> None:
        """Stage a batch of runs, all checked first: one that breaks the rules stages none (BadRuns)."""
        checked, problems, rules = [], [], admission.load_rules()  # the rules, read once for the batch
        for run in runs:
            run = normalized(run)
            problem = admission.run_problem(run, rules)
            if problem:
                problems.append(f"{admission.identity(run)}: {problem}")
            checked.append(run)
        if problems:
            raise BadRuns(problems)
        rows, metrics, epochs = [], [], []
        for i, run in enumerate(checked, start=self.count + 1):
            rows.append({"id": i, **_checked(self.conn, "runs", _run_row(run))})
            metrics += [_checked(self.conn, "metrics", _metric_row(i, m)) for m in run.get("metrics", [])]
            epochs += [_checked(self.conn, "epochs", {**e, "run_id": i}) for e in run.get("epochs", [])]
        with full_disk_said(self.conn):  # staging spills temporary tables to disk too
            for table, staged in (("runs", rows), ("metrics", metrics), ("epochs", epochs)):
                cols = _columns(self.conn, table)
                self.conn.executemany(
                    f"INSERT INTO temp.staged_{table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [[r.get(c) for c in cols] for r in staged],
                )
        self.count += len(checked)

    def commit(self, validations: list[dict] = ()) -> tuple[int, int]:
        """Copy what the KB lacks in one transaction. Returns (runs added, runs skipped)."""
        problems = [
            f"validation {i}: {p}"
            for i, v in enumerate(validations)
            if (p := admission.validation_problem(v))
        ]
        if problems:
            raise KBError(
                f"{len(problems)} validation(s) break advisor's rules, so nothing was written: {problems[0]}."
            )
        conn = self.conn
        with transaction(conn):
            base = conn.execute("SELECT coalesce(max(id), 0) FROM runs").fetchone()[0]
            run_cols = ", ".join(c for c in _columns(conn, "runs") if c != "id")
            conn.execute(
                f"INSERT INTO runs (id, {run_cols}) SELECT id + ?, {run_cols} FROM temp.staged_runs s "
                "WHERE NOT EXISTS (SELECT 1 FROM runs r WHERE r.uid = s.uid) "
                "AND s.id = (SELECT min(t.id) FROM temp.staged_runs t WHERE t.uid = s.uid)",
                [base],
            )
            added = conn.execute("SELECT changes()").fetchone()[0]
            for table in ("metrics", "epochs"):
                cols = [c for c in _columns(conn, table) if c != "run_id"]
                conn.execute(
                    f"INSERT INTO {table} (run_id, {', '.join(cols)}) SELECT run_id + ?, {', '.join(cols)} "
                    f"FROM temp.staged_{table} WHERE run_id + ? IN (SELECT id FROM runs WHERE id > ?)",
                    [base, base, base],
                )
            summaries.add(conn, "SELECT id FROM runs WHERE id > ?", [base])
            for row in validations:
                _insert_validation(conn, row)
        return added, self.count - added

    def drop(self) -> None:
        """The staging tables gone; best effort, so that a failure in dropping them (the full disk that
        ended the write) never hides the error that said why."""
        for table in ("runs", "metrics", "epochs"):
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute(f"DROP TABLE IF EXISTS temp.staged_{table}")


def _insert_validation(conn: sqlite3.Connection, row: dict) -> None:
    """One validation row, unless the KB has it (same hardware, check, model and time)."""
    row = {k: v for k, v in row.items() if k != "id"}
    problem = admission.validation_problem(row)
    if problem:
        raise KBError(f"cannot store the validation {row.get('name')!r:.40}: {problem}.")
    if not isinstance(row.get("software", "{}"), str):
        row["software"] = json.dumps(row["software"], sort_keys=True)
    same = conn.execute(
        "SELECT 1 FROM validations WHERE hardware = ? AND name = ? AND model IS ? AND created_at = ?",
        [row["hardware"], row["name"], row.get("model"), row["created_at"]],
    ).fetchone()
    if same is None:
        _insert(conn, "validations", row)


def run_digest(run: dict) -> str:
    """A run's outcome as one string (status and its run-level figures): two copies of one run (one uid)
    that differ here are a conflict, not a duplicate."""
    figures = sorted((str(m.get("name")), _rounded(m.get("value"))) for m in run.get("metrics", []))
    return json.dumps([run.get("status"), figures])


def _rounded(value) -> float | str:
    """A figure as a digest holds it: rounded, or its repr where it is no number (a run the rules refuse)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return round(float(value), 9)
    return repr(value)


def run_digests(conn: sqlite3.Connection, uids: list[str]) -> list[tuple[str, str]]:
    """(uid, run_digest) of the runs the KB holds among uids: one query, the uids passed as one JSON array."""
    held: dict[str, dict] = {}
    rows = conn.execute(
        "SELECT r.uid, r.status, m.name, m.value FROM runs r LEFT JOIN metrics m ON m.run_id = r.id "
        "WHERE r.uid IN (SELECT value FROM json_each(?))",
        [json.dumps(uids)],
    )
    for uid, status, name, value in rows:
        run = held.setdefault(uid, {"status": status, "metrics": []})
        if name is not None:
            run["metrics"].append({"name": name, "value": value})
    return [(uid, run_digest(run)) for uid, run in held.items()]


def rebuild_summaries(conn: sqlite3.Connection) -> None:
    """Recompute every summary from the runs, in one transaction: after a KB was edited by hand in SQL."""
    with transaction(conn):
        summaries.rebuild(conn)


def update_run(conn: sqlite3.Connection, run_id: int, **fields) -> None:
    """Change columns of one run, each checked against its rule (a run's error is cleaned, not refused)."""
    if "error" in fields:
        fields["error"] = admission.clean(fields["error"])
    _check_fields(conn, run_id, fields)
    fields = _checked(
        conn,
        "runs",
        {k: json.dumps(v, sort_keys=True) if k in JSON_COLUMNS else v for k, v in fields.items()},
    )
    if "grp" in fields:
        raise KBError("a run's group is the store's to set, from its provenance.")
    with transaction(conn):
        summaries.remove(conn, [run_id])
        sets = ", ".join(f"{k} = ?" for k in fields)
        conn.execute(f"UPDATE runs SET {sets} WHERE id = ?", [*fields.values(), run_id])
        if summaries.GROUP_KEY & set(fields):
            conn.execute("UPDATE runs SET grp = NULL WHERE id = ?", [run_id])
        summaries.add(conn, [run_id])


def _check_fields(conn: sqlite3.Connection, run_id: int, fields: dict) -> None:
    """Refuse new values of a run's columns that break their rules (advisor.kb.admission)."""
    rules = admission.run_rules()
    row = conn.execute("SELECT protocol FROM runs WHERE id = ?", [run_id]).fetchone()
    context = {"protocol": row[0] if row else None, **fields}
    for key, value in fields.items():
        rule = rules.get(key)
        if isinstance(rule, admission.Name):
            problem = rule.problem(value, context, lenient=True)  # advisor's own writer (measure)
        else:
            problem = rule.problem(value, context) if rule else None
        if problem:
            raise KBError(f"cannot store run {run_id}'s {key}: {problem}.")


def end_runs(conn: sqlite3.Connection, ended: dict[int, str], status: str) -> None:
    """Runs ended with a status and, each, the sentence why (the caller owns the transaction)."""
    summaries.remove(conn, list(ended))
    for run_id, why in ended.items():
        conn.execute(
            "UPDATE runs SET status = ?, error = ?, finished_at = ? WHERE id = ?",
            [status, admission.clean(why), now(), run_id],
        )
    summaries.add(conn, list(ended))


def add_epoch(conn: sqlite3.Connection, run_id: int, row: dict) -> None:
    """One epoch's row, committed as the epoch ends (a crash later keeps it). A figure that breaks its
    rule (a NaN loss, a negative time) is stored as NULL, "not measured", rather than stop a live run."""
    kept = {}
    for key, value in row.items():
        rule = admission.epoch_rule(key)
        kept[key] = value if key == "run_id" or rule.required or rule.problem(value) is None else None
    problem = admission.epoch_problem(kept)
    if problem:
        raise KBError(f"cannot store an epoch of run {run_id}: {problem}.")
    with transaction(conn):
        add_epoch_row(conn, run_id, kept)


def finish_run(
    conn: sqlite3.Connection,
    run_id: int,
    status: str,
    error: str | None,
    metrics: list[tuple[str, float, str]],
) -> None:
    """The run's summary figures and final status, in one transaction. A figure that breaks its rule (not
    finite, out of its physical bounds) is left out and said in the run's error, rather than lose the run."""
    if admission.Choice(admission.STATUSES).problem(status):
        raise KBError(f"cannot end run {run_id} as {status!r}: not a status.")
    kept, dropped = _figures_kept(conn, run_id, metrics)
    if dropped:
        error = "; ".join(([error] if error else []) + dropped)
    error = admission.clean(error)
    with transaction(conn):
        summaries.remove(conn, [run_id])
        for name, value, unit in kept:
            conn.execute(
                "INSERT OR REPLACE INTO metrics (run_id, name, value, unit, certainty) "
                "VALUES (?, ?, ?, ?, 'measured')",
                [run_id, name, value, unit],
            )
        conn.execute(
            "UPDATE runs SET status = ?, error = ?, finished_at = ? WHERE id = ?",
            [status, error, now(), run_id],
        )
        summaries.add(conn, [run_id])


def _figures_kept(conn: sqlite3.Connection, run_id: int, metrics) -> tuple[list, list[str]]:
    """The figures of a finishing run that keep their rules, and a phrase for each left out."""
    row = conn.execute("SELECT protocol FROM runs WHERE id = ?", [run_id]).fetchone()
    run = {"protocol": row[0] if row else None}
    kept, dropped = [], []
    for name, value, unit in metrics:
        problem = admission.figure_problem({"name": name, "value": value, "unit": unit}, run, lenient=True)
        if problem:
            dropped.append(f"figure {name!r:.40} left out: {problem}")
        else:
            kept.append((name, value, unit))
    return kept, dropped


# --- a run read back by its writer ----------------------------------------------------------------------


def run_group(conn: sqlite3.Connection, run_id: int) -> int | None:
    """The evidence group the store gave a run (None where there is no such run): what its line names."""
    row = conn.execute("SELECT grp FROM runs WHERE id = ?", [run_id]).fetchone()
    return row[0] if row else None


def run_ending(conn: sqlite3.Connection, run_id: int) -> tuple[str, str | None] | None:
    """A run's (status, error), None where there is no such run: how a cell whose process died had ended."""
    row = conn.execute("SELECT status, error FROM runs WHERE id = ?", [run_id]).fetchone()
    return None if row is None else (row[0], row[1])


def run_config(conn: sqlite3.Connection, run_id: int) -> dict | None:
    """A run's stored config ({} where it holds none), None where there is no such run: what an update adds to."""
    row = conn.execute("SELECT config FROM runs WHERE id = ?", [run_id]).fetchone()
    return None if row is None else json.loads(row[0] or "{}")


def trained_seconds(conn: sqlite3.Connection) -> float:
    """The training time of every epoch a KB holds, summed (0 where none): a calibration KB's one cell."""
    (seconds,) = conn.execute("SELECT coalesce(sum(wall_s), 0) FROM epochs").fetchone()
    return seconds


# --- validations and predictions -------------------------------------------------------------------------


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
    """The results of `advisor validate`, so that answers can say what was validated on this hardware (and
    `advisor calibrate`'s rates). A rate that breaks its rule (admission.speed_rate_problem: -1, 0, 1e-300,
    Inf, NaN) is refused before anything is written: a KBError, and none of the checks stored."""
    checks = list(checks)
    bad = [
        f"{c.name} = {c.value!r} {p}" for c in checks if (p := admission.speed_rate_problem(c.name, c.value))
    ]
    if bad:
        raise KBError(f"cannot store the calibration: {'; '.join(bad)}, so nothing was written.")
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
