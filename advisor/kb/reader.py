"""Reading a knowledge base: its evidence groups, the configurations and figures of one group, listings and
exports, and the shipped KB read together with the user's."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from advisor.kb.schema import connect_readonly
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

    @property
    def kind(self) -> str:
        return source_kind(self.source)

    @property
    def label(self) -> str:
        seeds = f"{self.n_seeds} seeds" if self.n_seeds > 1 else "1 run per configuration"
        origin = "paper 2608.08961" if self.kind == "paper" else self.source
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
        "g.data, g.id FROM groups g JOIN (SELECT grp, optimizer, strategy, sum(n) AS n FROM cell_status "
        "GROUP BY grp, optimizer, strategy) c ON c.grp = g.id "
        + ("WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY g.id ORDER BY g.family, g.source, g.hardware, g.preset, g.model, g.protocol, g.data"
    )
    return [Group(*r) for r in conn.execute(sql, params)]


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


FIT_CHECK = (
    "fit_%"  # validations of advisor fit's predictions (bench/fit_accuracy.py), not advisor validate's
)


def validation(conn: sqlite3.Connection, hardware: str) -> dict | None:
    """The latest `advisor validate` run on this hardware: when, how many checks, which failed."""
    row = conn.execute(
        "SELECT max(created_at) FROM validations WHERE hardware = ? AND name NOT LIKE ?",
        [hardware, FIT_CHECK],
    ).fetchone()
    if not row or row[0] is None:
        return None
    checks = conn.execute(
        "SELECT name, model, passed FROM validations WHERE hardware = ? AND created_at = ? AND name NOT LIKE ?",
        [hardware, row[0], FIT_CHECK],
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
    where, params = _run_filter(family=family, source=source, status=status)
    sql = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
    sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
    if limit:
        sql += f" LIMIT {int(limit)}"
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in conn.execute(sql, params)]


def export_runs(conn: sqlite3.Connection, source: str | None = None) -> list[dict]:
    """Every run with all its provenance, metrics and epochs: the format `advisor kb import` reads back."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    where, params = _run_filter(source=source)
    sql = "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
    out = []
    epoch_cols = [r[1] for r in conn.execute("PRAGMA table_info(epochs)")]
    for row in conn.execute(sql, params).fetchall():
        run = dict(zip(cols, row, strict=True))
        run_id = run.pop("id")
        run.pop("grp")  # a KB's own numbering: the importing KB gives the run its group
        run["software"] = json.loads(run["software"] or "{}")
        run["config"] = json.loads(run["config"] or "{}")
        run["metrics"] = [
            dict(name=n, value=v, unit=u, certainty=c, note=note)
            for n, v, u, c, note in conn.execute(
                "SELECT name, value, unit, certainty, note FROM metrics WHERE run_id = ? ORDER BY name",
                [run_id],
            )
        ]
        run["epochs"] = [
            {k: v for k, v in zip(epoch_cols, e, strict=True) if k != "run_id"}
            for e in conn.execute("SELECT * FROM epochs WHERE run_id = ? ORDER BY epoch", [run_id])
        ]
        out.append(run)
    return out


def export_validations(conn: sqlite3.Connection) -> list[dict]:
    """Every validation, as `advisor kb import` reads them back."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(validations)")]
    rows = conn.execute("SELECT * FROM validations ORDER BY id").fetchall()
    out = []
    for row in rows:
        v = {k: val for k, val in zip(cols, row, strict=True) if k != "id"}
        v["software"] = json.loads(v["software"] or "{}")
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


def open_for_reading(db: str | os.PathLike | None) -> sqlite3.Connection:
    """The KB to answer from, read-only (raises KBError with a sentence to act on): --db or $ADVISOR_DB
    alone; else the shipped KB and, when it exists, the user's, read together (`read_together`)."""
    if db or os.environ.get("ADVISOR_DB"):
        return connect_readonly(resolve_db_path(db))
    conn = connect_readonly(shipped_kb_path())
    if exists(user_kb_path()):
        read_together(conn, user_kb_path())
    return conn


# The user's KB read beside the shipped one: its row ids are shifted by this much, so that no id of one
# equals an id of the other and every reference (a run's metrics, a group's summaries) stays within its KB.
USER_ID_OFFSET = 1 << 40
_ID_COLUMNS = ("id", "run_id", "grp")


def read_together(conn: sqlite3.Connection, user_path: Path) -> None:
    """ATTACH the user's KB to a read-only connection of the shipped one, and shadow each table with a TEMP
    view of both (temp comes first in SQLite's name lookup): every query sees the two KBs as one, each run
    keeping its provenance, and nothing is copied or written. Tables the user's KB lacks stay the shipped
    KB's own."""
    connect_readonly(user_path).close()  # an advisor KB at this schema, or a sentence
    conn.execute("ATTACH DATABASE ? AS user", [f"{Path(user_path).resolve().as_uri()}?mode=ro"])
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
