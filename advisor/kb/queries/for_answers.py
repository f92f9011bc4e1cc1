"""What the answers read of a KB (recommend, frontier, flowchart, claims, transfer): a group's
configurations and how their runs ended, the sums of each measure and of each seed-paired difference, the
values and published figures of one measure, the rate a configuration was tuned to, the latest validation."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from advisor.kb.queries.groups import FIT_CHECK, SPEED_RATE, Group, group_row_id


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


def groups_measuring(conn: sqlite3.Connection, measures: tuple[str, ...], among: list[int]) -> set[int]:
    """Ids of the groups `among` with an ok run that holds any of `measures` (read from the maintained sums);
    asked by id, the sums' primary key finds a group's rows (the whole table scanned was 3 ms of an answer)."""
    if not measures or not among:
        return set()
    marks, ids = ", ".join("?" for _ in measures), ", ".join("?" for _ in among)
    sql = f"SELECT DISTINCT grp FROM cell_stats WHERE grp IN ({ids}) AND n > 0 AND measure IN ({marks})"
    return {row[0] for row in conn.execute(sql, [*among, *measures])}


def group_cells(conn: sqlite3.Connection, group: Group) -> list[Cell]:
    """Each configuration of a group with its run counts by status, the errors of runs that did not end ok,
    and its failed seeds (a seed with a finished run that is not ok, and no ok run)."""
    grp = group_row_id(conn, group)
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
        [group_row_id(conn, group)],
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
        [group_row_id(conn, group), *params],
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
        [group_row_id(conn, group), *factors],
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
        [group_row_id(conn, group), measure],
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
        [group_row_id(conn, group), measure],
    ):
        out.setdefault((opt, strat), (value, note or ""))
    return out


def rate_choice(
    conn: sqlite3.Connection, group: Group, optimizer: str, strategy: str, tuned_with: str
) -> tuple[float | None, dict[float, float]]:
    """(the rate a configuration's ok runs trained at, {rate: held-out loss} of the --tune-lr runs that chose
    it: the same model, preset and optimizer, tuned with `tuned_with`); (None, {}) where it was not tuned."""
    gid = group_row_id(conn, group)
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
