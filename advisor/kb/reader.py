"""Reading a knowledge base: its evidence groups, the configurations and figures of one group, listings and
exports, and the shipped KB read together with the user's."""

from __future__ import annotations

import json
import os
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import KBError
from advisor.kb.schema import (
    check_schema,
    connect_kb_readonly,
    corrupt_error,
    integrity_problems,
)
from advisor.places import exists, resolve_db_path, shipped_kb_path, user_kb_path

SOURCE_KINDS = ("paper", "measured")


def source_kind(source: str) -> str:
    """'paper' for any paper:<arxiv id> source, else the source itself ('measured', 'import:...')."""
    return "paper" if source.startswith("paper:") else source


@dataclass(frozen=True)
class Group:
    """One evidence group: runs that may be ranked against each other (same source, hardware, scale, model,
    protocol: how they were measured, and data: what they trained on)."""

    source: str
    hardware: str
    preset: str
    model: str
    family: str
    n_runs: int
    n_seeds: int
    n_params: int | None = None  # the evidence model's size, where the runs state it
    protocol: str = (
        "paper"  # 'fair' (held-out loss, tuned rates), 'paper' (training loss, fixed epochs) or 'trainer'
    )
    data: str = ""  # 'generated', 'pranavmr/MM-IMDb@ad5b994', 'corpus.jsonl sha256:…'; '' not stated
    id: int | None = field(default=None, compare=False)  # the KB's groups.id (local to one KB)
    config_hash: str | None = field(default=None, compare=False)  # a user's model's config.json, hashed

    @property
    def kind(self) -> str:
        return source_kind(self.source)

    @property
    def label(self) -> str:
        seeds = f"{self.n_seeds} seeds" if self.n_seeds > 1 else "1 run per configuration"
        origin = f"paper {self.source.removeprefix('paper:')}" if self.kind == "paper" else self.source
        protocol = {"fair": ", fair protocol", "trainer": ", a Trainer run"}.get(self.protocol, "")
        yours = "your KB: " if self.own else ""
        return (
            f"{yours}{origin}, {self.model}, {self.hardware}, preset {self.preset}{protocol}, "
            f"{data_label(self.data)}, {seeds}"
        )

    @property
    def own(self) -> bool:
        """A group of the user's own KB, read beside the shipped one."""
        return is_users(self.id)

    @property
    def ref(self) -> str:
        """The group's id as a person types it (`--group`): '11' in the shipped KB (or a KB read alone),
        'u3' in the user's, read beside it."""
        return group_ref(self.id)

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "hardware": self.hardware,
            "preset": self.preset,
            "model": self.model,
            "family": self.family,
            "protocol": self.protocol,
            "data": self.data,
            "runs": self.n_runs,
            "seeds": self.n_seeds,
            "parameters": self.n_params,
            "label": self.label,
            "yours": self.own,
            "id": self.ref,
        }


def data_label(data: str) -> str:
    """The data of a group as an answer names it."""
    if data == "generated":
        return "generated data"
    return f"data {data}" if data else "data not stated"


@dataclass(frozen=True)
class Failure:
    """A seed of a configuration with no ok run: how its last run ended."""

    seed: int | None
    status: str
    error: str | None

    def as_dict(self) -> dict:
        return {"seed": self.seed, "status": self.status, "error": self.error}


FINISHED_NOT_OK = ("oom", "diverged", "untrained", "failed", "crashed")


@dataclass
class Cell:
    """One configuration (optimizer × strategy) of a group: how many runs it has, how they ended, and the
    seeds that have no ok run."""

    optimizer: str
    strategy: str
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    failed: list[Failure] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.optimizer} + {self.strategy}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.optimizer, self.strategy)

    @property
    def n_ok(self) -> int:
        return self.statuses.get("ok", 0)

    @property
    def seeds_total(self) -> int:
        """Seeds (runs, where a source does not say) that finished: ok, or failed with no ok run."""
        return self.n_ok + len(self.failed)

    @property
    def flag(self) -> str | None:
        """'2 of 3 seeds ok; seed 1 diverged' when a seed failed, else None."""
        if not self.failed:
            return None
        shown = ", ".join(
            f"{'seed ' + str(f.seed) if f.seed is not None else 'a run'} {f.status}" for f in self.failed[:3]
        )
        more = f" and {len(self.failed) - 3} more" if len(self.failed) > 3 else ""
        return f"{self.n_ok} of {self.seeds_total} seeds ok; {shown}{more}"


@dataclass(frozen=True)
class Aggregate:
    """One measure of one configuration over its ok runs, already in the metric's unit."""

    n: int
    mean: float
    sum_sq: float  # sum of squared values, for the spread
    first_value: float  # the stored figure and its unit, as the source states it (for n == 1)
    first_unit: str


@dataclass(frozen=True)
class PairSums:
    """Seed-paired differences d = a - b of two configurations' per-seed means, over the seeds both have."""

    n: int
    sum_d: float
    sum_dd: float

    def flipped(self) -> PairSums:
        return PairSums(self.n, -self.sum_d, self.sum_dd)


def _run_filter(source: str | None = None, **equal) -> tuple[list[str], list]:
    """WHERE terms for runs: `source` is a kind ('paper' means any paper:<id>) or an exact source."""
    where, params = [], []
    if source == "paper":
        where.append("source LIKE 'paper:%'")
    elif source:
        where.append("source = ?")
        params.append(source)
    for column, value in equal.items():
        if value:
            where.append(f"{column} = ?")
            params.append(value)
    return where, params


def evidence_groups(
    conn: sqlite3.Connection, family: str | None = None, source: str | None = None, model: str | None = None
) -> list[Group]:
    """Every evidence group, optionally of one family, source kind (or exact source) and model: read from
    the summaries (advisor/kb/summaries.py), never from the runs."""
    where, params = _run_filter(family=family, source=source, model=model)
    where = [w.replace("source", "g.source", 1) if w.startswith("source") else f"g.{w}" for w in where]
    sql = (
        "SELECT g.source, g.hardware, g.preset, g.model, g.family, sum(c.n), max(c.n), g.n_params, g.protocol, "
        "g.data, g.id, g.config_hash FROM groups g JOIN (SELECT grp, optimizer, strategy, sum(n) AS n FROM cell_status "
        "GROUP BY grp, optimizer, strategy) c ON c.grp = g.id "
        + ("WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY g.id ORDER BY g.family, g.source, g.hardware, g.preset, g.model, g.protocol, g.data"
    )
    return [Group(*r) for r in conn.execute(sql, params)]


def groups_measuring(conn: sqlite3.Connection, measures: tuple[str, ...]) -> set[int]:
    """Ids of the groups with an ok run that holds any of `measures` (read from the maintained sums)."""
    if not measures:
        return set()
    marks = ", ".join("?" for _ in measures)
    sql = f"SELECT DISTINCT grp FROM cell_stats WHERE n > 0 AND measure IN ({marks})"
    return {row[0] for row in conn.execute(sql, list(measures))}


def _group_id(conn: sqlite3.Connection, group: Group) -> int | None:
    if group.id is not None:
        return group.id
    row = conn.execute(
        "SELECT id FROM groups WHERE source = ? AND hardware = ? AND preset = ? AND model = ? AND family = ? "
        "AND protocol = ? AND data = ?",
        [group.source, group.hardware, group.preset, group.model, group.family, group.protocol, group.data],
    ).fetchone()
    return row[0] if row else None


def group_cells(conn: sqlite3.Connection, group: Group) -> list[Cell]:
    """Each configuration of a group with its run counts by status, the errors of runs that did not end ok,
    and its failed seeds (a seed with a finished run that is not ok, and no ok run)."""
    grp = _group_id(conn, group)
    cells: dict[tuple[str, str], Cell] = {}
    for opt, strat, status, n in conn.execute(
        "SELECT optimizer, strategy, status, sum(n) FROM cell_status WHERE grp = ? "
        "GROUP BY optimizer, strategy, status ORDER BY optimizer, strategy, status",
        [grp],
    ):
        cells.setdefault((opt, strat), Cell(opt, strat)).statuses[status] = n
    finished = ", ".join(repr(s) for s in FINISHED_NOT_OK)
    rows = conn.execute(  # the partial index runs_not_ok: few rows however many runs the group has
        "SELECT r.optimizer, r.strategy, r.seed, r.status, r.error, EXISTS (SELECT 1 FROM runs o WHERE "
        "o.grp = r.grp AND o.optimizer = r.optimizer AND o.strategy = r.strategy AND o.seed IS r.seed AND "
        f"o.status = 'ok') FROM runs r WHERE r.grp = ? AND r.status != 'ok' AND r.status IN ({finished}) "
        "ORDER BY r.optimizer, r.strategy, r.seed, r.id",
        [grp],
    ).fetchall()
    seen: set = set()
    for opt, strat, seed, status, error, has_ok in rows:
        cell = cells[(opt, strat)]
        if error and error not in cell.errors:
            cell.errors.append(error)
        if has_ok and seed is not None:
            continue
        if seed is not None and (opt, strat, seed) in seen:  # the latest run of the seed stands
            cell.failed = [f for f in cell.failed if f.seed != seed]
        seen.add((opt, strat, seed))
        cell.failed.append(Failure(seed, status, error))
    for cell in cells.values():
        cell.errors.sort()
    return list(cells.values())


def group_settings(conn: sqlite3.Connection, group: Group) -> dict[str, list[str]]:
    """Each setting of the group's runs ('preset defaults', 'lr=0.01'; 'unknown' where a run does not say)
    and its configurations."""
    out: dict[str, list[str]] = {}
    for settings, opt, strat in conn.execute(
        "SELECT DISTINCT settings, optimizer, strategy FROM cell_status WHERE grp = ? ORDER BY 1, 2, 3",
        [_group_id(conn, group)],
    ):
        out.setdefault(settings or "unknown", []).append(f"{opt}+{strat}")
    return out


RUN_SCALE_COLUMNS = ("host_memory_gb", "accelerator_memory_gb")


def group_aggregates(
    conn: sqlite3.Connection, group: Group, conversions: dict[str, tuple[float, str | None]]
) -> dict[str, dict[tuple[str, str], Aggregate]]:
    """Every named measure over the ok runs of each configuration, converted as value * factor * run[scale].

    conversions: measure name -> (factor, scale column or None). Read from the maintained sums (a group may
    hold a million runs, and an answer must stay under a second)."""
    for _, scale in conversions.values():
        if scale is not None and scale not in RUN_SCALE_COLUMNS:
            raise ValueError(f"cannot scale by runs.{scale}; choose from {', '.join(RUN_SCALE_COLUMNS)}")
    if not conversions:
        return {}
    out: dict[str, dict[tuple[str, str], Aggregate]] = {}
    terms = " OR ".join("(measure = ? AND scale = ?)" for _ in conversions)
    params = [x for name, (_, scale) in conversions.items() for x in (name, scale or "")]
    for name, o, s, n, total, sq, raw, unit in conn.execute(
        "SELECT measure, optimizer, strategy, n, total, total_sq, first_value, first_unit FROM cell_stats "
        f"WHERE grp = ? AND ({terms}) AND n > 0",
        [_group_id(conn, group), *params],
    ):
        f = conversions[name][0]
        out.setdefault(name, {})[(o, s)] = Aggregate(n, total / n * f, sq * f * f, raw, unit)
    return out


def group_pairs(
    conn: sqlite3.Connection, group: Group, factors: dict[str, float]
) -> dict[str, dict[tuple[tuple[str, str], tuple[str, str]], PairSums]]:
    """Seed-paired sums of each measure for every two configurations, converted by its factor: measure ->
    {(a, b): PairSums} with a < b (PairSums.flipped for b - a). Measures scaled by a runs column have none."""
    if not factors:
        return {}
    out: dict = {}
    marks = ",".join("?" * len(factors))
    for name, ao, ast, bo, bst, n, sum_d, sum_dd in conn.execute(
        "SELECT measure, a_optimizer, a_strategy, b_optimizer, b_strategy, n, sum_d, sum_dd FROM pair_stats "
        f"WHERE grp = ? AND measure IN ({marks}) AND n > 0",
        [_group_id(conn, group), *factors],
    ):
        f = factors[name]
        out.setdefault(name, {})[((ao, ast), (bo, bst))] = PairSums(n, sum_d * f, sum_dd * f * f)
    return out


def group_values(conn: sqlite3.Connection, group: Group, measure: str) -> dict[tuple[str, str], list[float]]:
    """Each configuration's per-seed values of one measure over its ok runs, as stored (a bootstrap over
    seeds needs the values, not the sums the summaries keep; a group holds a few hundred)."""
    out: dict[tuple[str, str], list[float]] = {}
    for opt, strat, value in conn.execute(
        "SELECT r.optimizer, r.strategy, m.value FROM runs r JOIN metrics m ON m.run_id = r.id "
        "WHERE r.grp = ? AND r.status = 'ok' AND m.name = ? ORDER BY r.optimizer, r.strategy, r.seed, r.id",
        [_group_id(conn, group), measure],
    ):
        out.setdefault((opt, strat), []).append(value)
    return out


def group_figures(
    conn: sqlite3.Connection, group: Group, measure: str
) -> dict[tuple[str, str], tuple[float, str]]:
    """Each configuration's stored figure of one measure with the note that says where it comes from (a
    published table's row): one run per configuration, as a paper's group holds; the first where several."""
    out: dict[tuple[str, str], tuple[float, str]] = {}
    for opt, strat, value, note in conn.execute(
        "SELECT r.optimizer, r.strategy, m.value, m.note FROM runs r JOIN metrics m ON m.run_id = r.id "
        "WHERE r.grp = ? AND r.status = 'ok' AND m.name = ? ORDER BY r.optimizer, r.strategy, r.id",
        [_group_id(conn, group), measure],
    ):
        out.setdefault((opt, strat), (value, note or ""))
    return out


def group_span(conn: sqlite3.Connection, group: Group) -> dict:
    """What a group's runs ran on and when: a device, the most host and accelerator memory, the first start,
    the last finish and a software column (as stored): the provenance a report shows."""
    row = conn.execute(
        "SELECT min(device), max(host_memory_gb), max(accelerator_memory_gb), min(started_at), "
        "max(finished_at), min(software) FROM runs WHERE grp = ?",
        [_group_id(conn, group)],
    ).fetchone()
    keys = ("device", "host_memory_gb", "accelerator_memory_gb", "started_at", "finished_at", "software")
    return dict(zip(keys, row, strict=True))


def group_statuses(conn: sqlite3.Connection, group: Group) -> list[tuple[str, int]]:
    """(status, runs) of a group's runs, the most frequent first: how they ended, as a report counts them."""
    rows = conn.execute(
        "SELECT status, count(*) FROM runs WHERE grp = ? GROUP BY status ORDER BY count(*) DESC",
        [_group_id(conn, group)],
    )
    return [(status, n) for status, n in rows]


FIT_CHECK = (
    "fit_%"  # validations of advisor fit's predictions (bench/fit_accuracy.py), not advisor validate's
)
SPEED_RATE = "speed_%"  # `advisor calibrate`'s rates (advisor/measuring/device_speed.py), not checks


def validation(conn: sqlite3.Connection, hardware: str) -> dict | None:
    """The latest `advisor validate` run on this hardware: when, how many checks, which failed."""
    row = conn.execute(
        "SELECT max(created_at) FROM validations WHERE hardware = ? AND name NOT LIKE ? AND name NOT LIKE ?",
        [hardware, FIT_CHECK, SPEED_RATE],
    ).fetchone()
    if not row or row[0] is None:
        return None
    checks = conn.execute(
        "SELECT name, model, passed FROM validations WHERE hardware = ? AND created_at = ? "
        "AND name NOT LIKE ? AND name NOT LIKE ?",
        [hardware, row[0], FIT_CHECK, SPEED_RATE],
    ).fetchall()
    failed = [f"{n} ({m})" if m else n for n, m, ok in checks if not ok]
    return {"hardware": hardware, "at": row[0], "checks": len(checks), "failed": failed, "passed": not failed}


def sources(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT source FROM runs ORDER BY source")]


def stats(conn: sqlite3.Connection) -> dict:
    """Counts a user checks first: runs by source and status, groups, metrics, schema."""
    by_source = [
        dict(source=r[0], runs=r[1])
        for r in conn.execute("SELECT source, count(*) FROM runs GROUP BY source ORDER BY source")
    ]
    by_status = {r[0]: r[1] for r in conn.execute("SELECT status, count(*) FROM runs GROUP BY status")}
    for _ in _abandoned(conn):  # shown as what they are: crashed (the next writer marks them)
        by_status["running"] -= 1
        by_status["crashed"] = by_status.get("crashed", 0) + 1
    by_status = {k: v for k, v in by_status.items() if v}
    by_metric = {
        r[0]: r[1] for r in conn.execute("SELECT name, count(*) FROM metrics GROUP BY name ORDER BY name")
    }
    schema = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY rowid")]
    return {
        "runs": conn.execute("SELECT count(*) FROM runs").fetchone()[0],
        "metrics": conn.execute("SELECT count(*) FROM metrics").fetchone()[0],
        "epochs": conn.execute("SELECT count(*) FROM epochs").fetchone()[0],
        "by_source": by_source,
        "by_status": by_status,
        "by_metric": by_metric,
        "groups": [g.as_dict() for g in evidence_groups(conn)],
        "schema": schema,
    }


# The columns `advisor kb runs` lists (and `kb export --format csv` repeats per figure, less the long ones).
RUN_COLUMNS = (
    "id",
    "source",
    "model",
    "family",
    "optimizer",
    "strategy",
    "preset",
    "seed",
    "hardware",
    "device",
    "status",
    "error",
    "started_at",
    "finished_at",
)


def list_runs(
    conn: sqlite3.Connection,
    family: str | None = None,
    source: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Runs with their provenance and status; a `running` run whose owner is gone is shown crashed, with
    why (readers never write: the next writer marks it)."""
    live = status in ("running", "crashed")  # filtered after the owners are looked at
    where, params = _run_filter(family=family, source=source, status=None if live else status)
    if live:
        where.append("status IN ('running', 'crashed')")
    sql = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
    sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
    if limit and not live:
        sql += f" LIMIT {int(limit)}"
    rows = [dict(zip(RUN_COLUMNS, r, strict=True)) for r in conn.execute(sql, params)]
    gone = dict(_abandoned(conn))
    for row in rows:
        if row["id"] in gone:
            row.update(status="crashed", error=gone[row["id"]])
    rows = [r for r in rows if r["status"] == status] if live else rows
    return rows[:limit] if limit else rows


def _abandoned(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    """(id, why) of the runs still marked `running` whose owner is gone: readers show them crashed."""
    from advisor.kb import lease  # a writer's module (sockets, the store): off the answer path

    rows = conn.execute("SELECT id, owner, lease_until, started_at FROM runs WHERE status = 'running'")
    return [
        (i, why)
        for i, owner, lease_until, started in rows
        if (why := lease.abandoned(owner, lease_until, started))
    ]


def export_runs(conn: sqlite3.Connection, source: str | None = None) -> list[dict]:
    """Every run with all its provenance, metrics and epochs: the format `advisor kb import` reads back."""
    return [run for batch in iter_runs(conn, source) for run in batch]


def iter_runs(conn: sqlite3.Connection, source: str | None = None, batch: int = 500) -> Iterator[list[dict]]:
    """Every run as `export_runs` gives it, `batch` runs at a time from one cursor: a KB of any size is read
    in bounded memory (`kb merge` streams its sources through this). JSON that does not parse is left as
    its text, for the rules to refuse (advisor.kb.admission)."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    epoch_cols = [r[1] for r in conn.execute("PRAGMA table_info(epochs)")]
    where, params = _run_filter(source=source)
    cursor = conn.execute(
        "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id", params
    )
    while rows := cursor.fetchmany(batch):
        runs = {row[0]: _exported(dict(zip(cols, row, strict=True))) for row in rows}
        marks = ", ".join("?" * len(runs))
        for run_id, *figure in conn.execute(
            f"SELECT run_id, name, value, unit, certainty, note FROM metrics WHERE run_id IN ({marks}) "
            "ORDER BY run_id, name",
            list(runs),
        ):
            runs[run_id]["metrics"].append(
                dict(zip(("name", "value", "unit", "certainty", "note"), figure, strict=True))
            )
        for e in conn.execute(
            f"SELECT * FROM epochs WHERE run_id IN ({marks}) ORDER BY run_id, epoch", list(runs)
        ):
            row = dict(zip(epoch_cols, e, strict=True))
            runs[row.pop("run_id")]["epochs"].append(row)
        yield list(runs.values())


def _exported(run: dict) -> dict:
    """A runs row as an export holds it: no local numbering (the importing KB gives the run its group), JSON
    columns parsed."""
    run.pop("id")
    run.pop("grp")
    for key in ("software", "config"):
        run[key] = _parsed(run[key])
    return {**run, "metrics": [], "epochs": []}


def _parsed(text):
    """A JSON column's object, or the text itself where it is not JSON (the rules then say so)."""
    try:
        return json_value(text)
    except ValueError:
        return text


def json_value(text: str | None) -> object:
    """A JSON column's value ({} where it is NULL), or ValueError however it is not JSON (nested too deeply
    included): the one parse of a stored JSON column, for every reader."""
    if text is None:
        return {}
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {e}") from e


def export_validations(conn: sqlite3.Connection) -> list[dict]:
    """Every validation, as `advisor kb import` reads them back."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(validations)")]
    rows = conn.execute("SELECT * FROM validations ORDER BY id").fetchall()
    out = []
    for row in rows:
        v = {k: val for k, val in zip(cols, row, strict=True) if k != "id"}
        v["software"] = _parsed(v["software"])
        out.append(v)
    return out


def fit_validations(conn: sqlite3.Connection) -> list[dict]:
    """advisor fit's predictions checked against real steps, per hardware: how many, how close."""
    rows = conn.execute(
        "SELECT hardware, count(*), sum(passed), max(abs(value)), group_concat(value) FROM validations "
        "WHERE name LIKE ? GROUP BY hardware ORDER BY hardware",
        [FIT_CHECK],
    ).fetchall()
    out = []
    for hardware, n, passed, worst, values in rows:
        errors = sorted(abs(float(v)) for v in values.split(","))
        out.append(
            dict(hardware=hardware, checks=n, passed=passed, median=errors[len(errors) // 2], worst=worst)
        )
    return out


def speed_calibrations(conn: sqlite3.Connection) -> dict[str, dict]:
    """`advisor calibrate`'s chosen calibration per hardware: {hardware: {rate name: value, 'at': when it was
    recorded (ISO, UTC), 'device': the device's name, 'spread': the worst rate's spread over its fastest
    rounds, 'rounds': the rounds run, 'agreed': whether they agreed within 'tolerance', 'tolerance',
    'calibrations': how many usable calibrations of this hardware the KB holds}}. A calibration is the rows
    of one hardware recorded at one time; one any of whose figures breaks its rule (speed_rate_problem: -1,
    0, Inf, NULL) is left out whole. The choice: the latest calibration whose rounds agreed; where none
    did, the latest (one that did not agree, or one recorded before calibrate compared rounds, whose
    spread, rounds and agreed are None)."""
    try:
        rows = conn.execute(
            "SELECT hardware, device, name, value, passed, tolerance, created_at FROM validations "
            "WHERE name LIKE ? ORDER BY hardware, created_at, id",
            [SPEED_RATE],
        ).fetchall()
    except sqlite3.DatabaseError:
        return {}
    from advisor.kb import admission  # the rates' rules: a few ms, on fit's path only where it reads a KB

    found: dict[str, dict[str, dict]] = {}  # hardware -> created_at -> the calibration
    broken: set[tuple[str, str]] = set()
    for hardware, device, name, value, passed, tolerance, at in rows:
        if admission.speed_rate_problem(name, value):
            broken.add((hardware, at))
            continue
        c = found.setdefault(hardware, {}).setdefault(
            at,
            {"at": at, "device": device, "spread": None, "rounds": None, "agreed": None, "tolerance": None},
        )
        if name == "speed_spread":
            c.update(spread=value, agreed=bool(passed), tolerance=tolerance)
        elif name == "speed_rounds":
            c["rounds"] = int(value)
        else:
            c[name] = value
    out: dict[str, dict] = {}
    for hardware, by_time in found.items():
        usable = [c for at, c in by_time.items() if (hardware, at) not in broken]
        if not usable:
            continue
        agreed = [c for c in usable if c["agreed"]]
        chosen = max(agreed or usable, key=lambda c: c["at"])
        out[hardware] = {**chosen, "calibrations": len(usable)}
    return out


def speed_problems(conn: sqlite3.Connection, limit: int) -> list[str]:
    """`advisor calibrate`'s rows whose figure breaks its rule (speed_rate_problem), as check_kb says a
    broken row (at most `limit`)."""
    from advisor.kb import admission  # off the answer path (see _check_pages_and_rows)

    out = []
    rows = conn.execute("SELECT id, name, value FROM validations WHERE name LIKE ? ORDER BY id", [SPEED_RATE])
    for row_id, name, value in rows:
        if len(out) >= limit:
            break
        if problem := admission.speed_rate_problem(name, value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            out.append(f"validations {row_id} {name}: value = {shown} breaks its rule ({problem})")
    return out


def rate_choice(
    conn: sqlite3.Connection, group: Group, optimizer: str, strategy: str, tuned_with: str
) -> tuple[float | None, dict[float, float]]:
    """(the rate a configuration's ok runs trained at, {rate: held-out loss} of the --tune-lr runs that chose
    it: the same model, preset and optimizer, tuned with `tuned_with`); (None, {}) where it was not tuned."""
    gid = _group_id(conn, group)
    chosen = conn.execute(
        "SELECT json_extract(config, '$.lr'), count(*) AS n FROM runs WHERE grp = ? AND optimizer = ? "
        "AND strategy = ? AND status = 'ok' AND json_extract(config, '$.lr_grid') IS NOT NULL "
        "GROUP BY 1 ORDER BY n DESC LIMIT 1",
        [gid, optimizer, strategy],
    ).fetchone()
    if chosen is None or not isinstance(chosen[0], int | float):
        return None, {}
    tried = conn.execute(
        "SELECT json_extract(r.config, '$.lr'), m.value FROM runs r JOIN metrics m ON m.run_id = r.id "
        "AND m.name = 'eval_loss' WHERE r.source = 'measured:tuning' AND r.status = 'ok' AND r.model = ? "
        "AND r.preset = ? AND r.optimizer = ? AND r.strategy = ?",  # a tuning loss holds on any host (lease.PORTABLE)
        [group.model, group.preset, optimizer, tuned_with],
    ).fetchall()
    return float(chosen[0]), {float(lr): v for lr, v in tried if isinstance(lr, int | float)}


def tuned_rates(conn: sqlite3.Connection, model: str, preset: str, config_hash: str) -> dict:
    """{(optimizer, 'full' | 'lora', accumulating): (lr, runs, effective batch)} that --tune-lr chose for a
    model's measured runs (those that record the grid of rates they were chosen from): by its config's hash,
    or a reference model by name at its preset. The most frequent rate where runs differ."""
    try:
        rows = conn.execute(
            "SELECT r.optimizer, r.strategy, json_extract(r.config, '$.lr'), "
            "json_extract(r.config, '$.batch_size'), json_extract(r.config, '$.accumulation_steps') "
            "FROM runs r LEFT JOIN groups g ON g.id = r.grp WHERE r.source = 'measured' AND r.status = 'ok' "
            "AND json_extract(r.config, '$.lr_grid') IS NOT NULL "
            "AND (g.config_hash = ? OR (r.model = ? AND r.preset = ?))",
            [config_hash, model, preset],
        ).fetchall()
    except sqlite3.DatabaseError:  # a KB without groups' config hashes (not migrated): no tuned rate read
        return {}
    found: dict[tuple, Counter] = {}
    for optimizer, strategy, lr, batch, steps in rows:
        if not isinstance(lr, int | float) or not isinstance(batch, int) or lr <= 0:
            continue
        accumulating = strategy.endswith("accumulation")
        window = steps if accumulating and isinstance(steps, int) else 1
        key = (optimizer, "lora" if strategy == "lora" else "full", accumulating)
        found.setdefault(key, Counter())[(float(lr), batch * window)] += 1
    return {
        key: (rate, sum(counts.values()), batch)
        for key, counts in found.items()
        for (rate, batch), _ in counts.most_common(1)
    }


PAST_RUNS_SQL = """
SELECT r.cell_key, r.source, r.config, r.optimizer, r.strategy, r.data,
       (julianday(r.finished_at) - julianday(r.started_at)) * 86400,
       (SELECT sum(e.wall_s) FROM epochs e WHERE e.run_id = r.id),
       (SELECT sum(e.steps) FROM epochs e WHERE e.run_id = r.id),
       (SELECT count(*) FROM epochs e WHERE e.run_id = r.id AND e.wall_s IS NULL),
       (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.name = 'peak_rss_gb'),
       (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.name = 'achieved_gflops')
FROM runs r
WHERE r.status = 'ok' AND r.source IN ('measured', 'measured:tuning') AND r.hardware IN ({})
  AND r.model IN ({})
"""


def past_runs(conn: sqlite3.Connection, accepts: Callable[[str], bool], models: set[str]) -> list[tuple]:
    """(cell key, source, config, optimizer, strategy, data, wall s, trained s, updates, untimed epochs, peak
    RSS GB, GFLOP/s) of the ok measured runs of `models` on each hardware `accepts`: what a plan prices from."""
    hardware = [h for (h,) in conn.execute("SELECT DISTINCT hardware FROM runs") if accepts(h)]
    if not hardware:
        return []
    marks = (",".join("?" * len(hardware)), ",".join("?" * len(models)))
    return conn.execute(PAST_RUNS_SQL.format(*marks), [*hardware, *models]).fetchall()


def measured_values(conn: sqlite3.Connection, measure: str) -> list[tuple[str, float]]:
    """(hardware, value) of one measure over every ok run: what a prediction calibrates against."""
    rows = conn.execute(
        "SELECT r.hardware, m.value FROM metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE m.name = ? AND r.status = 'ok'",
        [measure],
    )
    return [(hardware, value) for hardware, value in rows]


# --- advisor fit's traces, cached in the KB (table predictions; advisor.prediction.cache) ----------------


def prediction_payloads(conn: sqlite3.Connection, keys: list[str]) -> dict[str, dict]:
    """key -> payload of the cached traces the KB holds among `keys`: a question answered without tracing."""
    marks = ",".join("?" * len(keys))
    rows = conn.execute(f"SELECT key, payload FROM predictions WHERE key IN ({marks})", keys)
    return {k: json.loads(p) for k, p in rows}


def predictions_held(conn: sqlite3.Connection, keys: list[str]) -> int:
    """How many of `keys` the KB holds a cached trace of: whether answering needs tracing (torch)."""
    marks = ",".join("?" * len(keys))
    (n,) = conn.execute(f"SELECT count(*) FROM predictions WHERE key IN ({marks})", keys).fetchone()
    return n


def traced_predictions(conn: sqlite3.Connection) -> list[tuple]:
    """(model, config hash, seq len, image size, device, family, optimizer, strategy, dtype, payload text) of
    every cached trace, by model and shape, oldest first: what a report answers advisor fit from."""
    return conn.execute(
        "SELECT model, config_hash, seq_len, image_size, device, family, optimizer, strategy, dtype, payload "
        "FROM predictions ORDER BY model, seq_len, image_size, device, created_at"
    ).fetchall()


def run_groups(path: Path, run_ids: list[int]) -> list[int]:
    """The evidence groups (their row ids in that KB) of runs just written there, in the runs' order."""
    ids = [i for i in run_ids if isinstance(i, int)]
    if not ids:
        return []
    conn = connect_kb_readonly(path)
    try:
        found = dict(
            conn.execute(
                f"SELECT id, grp FROM runs WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).fetchall()
        )
    finally:
        conn.close()
    return list(dict.fromkeys(found[i] for i in ids if found.get(i) is not None))


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


# The user's KB read beside the shipped one: its row ids are shifted by this much, so that no id of one
# equals an id of the other and every reference (a run's metrics, a group's summaries) stays within its KB.
USER_ID_OFFSET = 1 << 40
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
    from advisor.kb import admission  # off the answer path when the check is remembered (a few ms)

    try:
        size = path.stat().st_size
        if size <= (MAX_CHECKED_BYTES if full else MAX_CHECKED_BYTES_ALONE):
            damage = integrity_problems(conn, db)
            if damage:
                raise corrupt_error(path, ValueError(f"integrity check: {'; '.join(damage[:2])}"))
        broken = admission.stored_problems(conn, db, tables=None if full else admission.SUMMARIES)
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

    try:
        conn = connect_kb_readonly(path)
    except KBError as e:
        return [str(e)]
    try:
        damage = integrity_problems(conn, full=True)
        if damage:
            return [f"SQLite's integrity check: {d}" for d in damage]
        broken = admission.stored_problems(conn)
        return broken + speed_problems(conn, admission.MAX_REPORTED - len(broken))
    except sqlite3.DatabaseError as e:
        return [str(corrupt_error(path, e))]
    finally:
        conn.close()


def kbs_read() -> list[Path]:
    """The KB files a read command reads by default: the shipped KB, and the user's where it exists."""
    return [shipped_kb_path()] + ([user_kb_path()] if exists(user_kb_path()) else [])


def group_ref(row_id: int | None) -> str | None:
    """A group's row id as a person types it: '11', or 'u3' for the user's KB read beside the shipped one."""
    if row_id is None:
        return None
    return f"u{row_id - USER_ID_OFFSET}" if is_users(row_id) else str(row_id)


def group_id_of(ref: str) -> int | None:
    """The row id a typed group id names ('11', 'u3'; see Group.ref), or None when it names none."""
    text = ref.strip().lower()
    own = text.startswith("u")
    digits = text[1:] if own else text
    if not digits.isdigit() or int(digits) < 1:
        return None
    return int(digits) + (USER_ID_OFFSET if own else 0)


def is_users(group_or_run_id: int | None) -> bool:
    """Whether a row read through `read_together` comes from the user's KB."""
    return group_or_run_id is not None and group_or_run_id >= USER_ID_OFFSET
