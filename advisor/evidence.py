"""One evidence group as a grid of configurations (optimizer × strategy) with their metric values."""

from __future__ import annotations

import importlib
import math
import sqlite3
import threading
from dataclasses import dataclass

from advisor.kb import Aggregate, CellRuns, Group, group_aggregates, group_cells
from advisor.rules import Rules

Cell = CellRuns  # a configuration of the grid, with its runs' statuses


CONFIDENCE = 0.95


@dataclass(frozen=True)
class Stat:
    """A metric of one configuration over its ok runs (seeds), in the metric's unit."""

    mean: float
    n: int
    spread: float | None  # sample standard deviation; None for a single run
    stated: str | None = None  # the stored figure as its source states it, when converted and single
    ci: tuple[float, float] | None = None  # 95 % Student-t interval of the mean; None for a single run

    def overlaps(self, other: Stat) -> bool:
        """Whether the two intervals (a single run's is its value) share a point."""
        lo1, hi1 = self.ci or (self.mean, self.mean)
        lo2, hi2 = other.ci or (other.mean, other.mean)
        return lo1 <= hi2 and lo2 <= hi1


def _stat(agg: Aggregate, converted: bool) -> Stat:
    spread = ci = None
    if agg.n > 1:
        spread = math.sqrt(max(0.0, (agg.sum_sq - agg.n * agg.mean**2) / (agg.n - 1)))
        half = t_quantile(agg.n - 1) * spread / math.sqrt(agg.n)
        ci = (agg.mean - half, agg.mean + half)
    stated = f"{agg.first_value:g} {agg.first_unit}" if converted and agg.n == 1 else None
    return Stat(mean=agg.mean, n=agg.n, spread=spread, stated=stated, ci=ci)


def t_quantile(dof: int) -> float:
    """The two-sided 95 % Student-t quantile (scipy, imported only when a group has repeated seeds)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, 0.5 + CONFIDENCE / 2))


class GroupEvidence:
    """The runs of one group, arranged by configuration, with each metric read from one stored measure."""

    def __init__(self, conn: sqlite3.Connection, group: Group, rules: Rules):
        self.conn, self.group, self.rules = conn, group, rules
        if group.n_seeds > 1:  # intervals will need scipy: import it while SQLite aggregates (GIL released)
            threading.Thread(target=importlib.import_module, args=("scipy.special",), daemon=True).start()
        self.cells: dict[tuple[str, str], Cell] = {
            (c.optimizer, c.strategy): c for c in group_cells(conn, group)
        }
        wanted = {x for m in rules.metrics.values() for x in m.measures}
        aggregates = group_aggregates(
            conn, group, {x: (rules.measures[x].factor, rules.measures[x].scale) for x in sorted(wanted)}
        )
        # One measure per metric and group: the first, in the rules' preference order, that the group has.
        self._measures = {
            name: next((x for x in m.measures if x in aggregates), None) for name, m in rules.metrics.items()
        }
        self._stats: dict[str, dict[tuple[str, str], Stat]] = {}
        for metric, measure in self._measures.items():
            spec = rules.measures.get(measure) if measure else None
            converted = spec is not None and (spec.factor != 1.0 or spec.scale is not None)
            self._stats[metric] = {k: _stat(a, converted) for k, a in aggregates.get(measure, {}).items()}

    def measure(self, metric: str) -> str | None:
        return self._measures.get(metric)

    def stats(self, metric: str) -> dict[tuple[str, str], Stat]:
        """The metric of every configuration that has a figure for it."""
        return self._stats.get(metric, {})

    def stat(self, cell: Cell, metric: str) -> Stat | None:
        return self.stats(metric).get((cell.optimizer, cell.strategy))

    def value(self, cell: Cell, metric: str) -> float | None:
        stat = self.stat(cell, metric)
        return stat.mean if stat else None

    def grid_gaps(self) -> list[tuple[str, str]]:
        """Configurations of the family's grid with no run at all in this group."""
        fam = self.rules.families.get(self.group.family)
        if fam is None:
            return []
        return [(o, s) for o in fam.grid_optimizers for s in fam.grid_strategies if (o, s) not in self.cells]

    def diverged(self) -> dict[tuple[str, str], str]:
        """Configurations the divergence filter finds unusable, with the reason (rules: flowchart.filters.divergence)."""
        spec = self.rules.flowchart["filters"]["divergence"]
        fields = [f for f in spec["compare_within"] if f != "family"]  # a group holds one family
        metric = self.rules.metric(spec["metric"])
        losses = {k: s.mean for k, s in self.stats(spec["metric"]).items()}
        out = {}
        for key, loss in losses.items():
            cell = self.cells[key]
            peers = [
                v
                for k, v in losses.items()
                if all(getattr(self.cells[k], f) == getattr(cell, f) for f in fields)
            ]
            best = metric.best(peers)
            if loss < spec["min_loss"] or best <= 0:
                continue
            ratio = loss / best
            if ratio > spec["max_ratio_to_best"]:
                within = " and ".join(fields) or "group"
                out[key] = (
                    f"diverged: loss {loss:.4g} is {ratio:.1f}x the best of the same {within} "
                    f"({best:.4g}; limit {spec['max_ratio_to_best']}x)"
                )
        return out
