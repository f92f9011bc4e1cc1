"""Reading the knowledge base: where it is, its evidence groups, and the runs in one group."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from advisor.schema import KBError, connect_readonly

SOURCE_KINDS = ("paper", "measured")


def shipped_kb_path() -> Path:
    return Path(str(resources.files("advisor.shipped.kb"))) / "results.sqlite"


def resolve_db_path(db: str | os.PathLike | None) -> Path:
    """The KB to use: --db, then $ADVISOR_DB, then the shipped kb/results.sqlite."""
    if db:
        return Path(db)
    if os.environ.get("ADVISOR_DB"):
        return Path(os.environ["ADVISOR_DB"])
    return shipped_kb_path()


def user_dir() -> Path:
    """Where advisor keeps the user's own files: the platform's user data directory
    (~/.local/share/advisor on Linux; $XDG_DATA_HOME moves it)."""
    from platformdirs import user_data_path

    return user_data_path("advisor", appauthor=False)


def user_kb_path() -> Path:
    return user_dir() / "kb.sqlite"


def resolve_write_path(db: str | os.PathLike | None) -> Path:
    """The KB a command writes: --db, then $ADVISOR_DB, then the user's KB (its folder created). Never the
    shipped KB, which is package data."""
    if db:
        return Path(db)
    if os.environ.get("ADVISOR_DB"):
        return Path(os.environ["ADVISOR_DB"])
    path = user_kb_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def source_kind(source: str) -> str:
    """'paper' for any paper:<arxiv id> source, else the source itself ('measured', 'import:...')."""
    return "paper" if source.startswith("paper:") else source


@dataclass(frozen=True)
class Group:
    """One evidence group: runs that may be ranked against each other (same source, hardware, scale, model)."""

    source: str
    hardware: str
    preset: str
    model: str
    family: str
    n_runs: int
    n_seeds: int
    n_params: int | None = None  # the evidence model's size, where the runs state it

    @property
    def kind(self) -> str:
        return source_kind(self.source)

    @property
    def label(self) -> str:
        seeds = f"{self.n_seeds} seeds" if self.n_seeds > 1 else "1 run per configuration"
        origin = "paper 2608.08961" if self.kind == "paper" else self.source
        return f"{origin}, {self.model}, {self.hardware}, preset {self.preset}, {seeds}"

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "hardware": self.hardware,
            "preset": self.preset,
            "model": self.model,
            "family": self.family,
            "runs": self.n_runs,
            "seeds": self.n_seeds,
            "parameters": self.n_params,
            "label": self.label,
        }


@dataclass
class Cell:
    """One configuration (optimizer × strategy) of a group: how many runs it has, and how they ended."""

    optimizer: str
    strategy: str
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.optimizer} + {self.strategy}"

    @property
    def n_ok(self) -> int:
        return self.statuses.get("ok", 0)


@dataclass(frozen=True)
class Aggregate:
    """One measure of one configuration over its ok runs, already in the metric's unit."""

    n: int
    mean: float
    sum_sq: float  # sum of squared values, for the spread
    first_value: float  # the stored figure and its unit, as the source states it (for n == 1)
    first_unit: str


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
    """Every evidence group, optionally of one family, source kind (or exact source) and model."""
    where, params = _run_filter(family=family, source=source, model=model)
    sql = (
        "SELECT source, hardware, preset, model, family, sum(n), max(n), max(np) FROM ("
        "  SELECT source, hardware, preset, model, family, count(*) AS n, max(n_params) AS np FROM runs "
        + ("WHERE " + " AND ".join(where) if where else "")
        + "  GROUP BY source, hardware, preset, model, family, optimizer, strategy) "
        "GROUP BY source, hardware, preset, model, family ORDER BY family, source, hardware, preset, model"
    )
    return [Group(*r) for r in conn.execute(sql, params)]


GROUP_WHERE = "WHERE r.source = ? AND r.hardware = ? AND r.preset = ? AND r.model = ? AND r.family = ?"


def _group_params(group: Group) -> list:
    return [group.source, group.hardware, group.preset, group.model, group.family]


def group_cells(conn: sqlite3.Connection, group: Group) -> list[Cell]:
    """Each configuration of a group with its run counts by status and the errors of runs that did not end ok."""
    cells: dict[tuple[str, str], Cell] = {}
    for opt, strat, status, n in conn.execute(  # from the covering index runs_group
        f"SELECT optimizer, strategy, status, count(*) FROM runs r {GROUP_WHERE} "
        "GROUP BY optimizer, strategy, status ORDER BY optimizer, strategy, status",
        _group_params(group),
    ):
        cells.setdefault((opt, strat), Cell(opt, strat)).statuses[status] = n
    for opt, strat, error in conn.execute(
        f"SELECT DISTINCT optimizer, strategy, error FROM runs r {GROUP_WHERE} AND status != 'ok' "
        "AND error IS NOT NULL ORDER BY error",
        _group_params(group),
    ):
        cells[(opt, strat)].errors.append(error)
    return list(cells.values())


def group_protocols(conn: sqlite3.Connection, group: Group) -> dict[str, list[str]]:
    """Each protocol of the group's runs ('preset defaults', 'lr=0.01', None: unknown) and its configurations."""
    out: dict[str, list[str]] = {}
    for protocol, opt, strat in conn.execute(
        f"SELECT DISTINCT protocol, optimizer, strategy FROM runs r {GROUP_WHERE} ORDER BY 1, 2, 3",
        _group_params(group),
    ):
        out.setdefault(protocol or "unknown", []).append(f"{opt}+{strat}")
    return out


RUN_SCALE_COLUMNS = ("host_memory_gb", "accelerator_memory_gb")


def group_aggregates(
    conn: sqlite3.Connection, group: Group, conversions: dict[str, tuple[float, str | None]]
) -> dict[str, dict[tuple[str, str], Aggregate]]:
    """Every named measure over the ok runs of each configuration, converted as value * factor * run[scale].

    conversions: measure name -> (factor, scale column or None). Aggregated in SQL, one query per scale
    column: a group may hold 100,000 runs, and an answer must stay under a second.
    """
    by_scale: dict[str | None, list[str]] = {}
    for name, (_, scale) in conversions.items():
        if scale is not None and scale not in RUN_SCALE_COLUMNS:
            raise ValueError(f"cannot scale by runs.{scale}; choose from {', '.join(RUN_SCALE_COLUMNS)}")
        by_scale.setdefault(scale, []).append(name)
    out: dict[str, dict[tuple[str, str], Aggregate]] = {}
    for scale, names in by_scale.items():
        v = f"m.value * r.{scale}" if scale else "m.value"
        marks = ",".join("?" * len(names))
        rows = conn.execute(
            f"SELECT m.name, r.optimizer, r.strategy, count({v}), avg({v}), sum({v} * {v}), min(m.value), min(m.unit) "
            f"FROM runs r JOIN metrics m ON m.run_id = r.id {GROUP_WHERE} AND r.status = 'ok' "
            # `+m.name`: read each run's few figures in one range scan rather than probing every name
            f"AND +m.name IN ({marks}) AND {v} IS NOT NULL GROUP BY m.name, r.optimizer, r.strategy",
            [*_group_params(group), *names],
        )
        for name, o, s, n, mean, sq, raw, unit in rows:
            f = conversions[name][0]
            out.setdefault(name, {})[(o, s)] = Aggregate(n, mean * f, sq * f * f, raw, unit)
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
    """Resolve the KB path and open it read-only (raises KBError with a sentence to act on)."""
    path = resolve_db_path(db)
    return connect_readonly(path)


__all__ = [
    "KBError",
    "Group",
    "Cell",
    "evidence_groups",
    "group_cells",
    "open_for_reading",
    "resolve_db_path",
]
