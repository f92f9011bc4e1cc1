"""Evidence: choosing the one group an answer ranks, and that group as a grid of configurations (optimizer ×
strategy) with their metric values, seeds and intervals, and which of them may be ranked at all."""

from __future__ import annotations

import importlib
import math
import sqlite3
import threading
from dataclasses import dataclass

from advisor.kb import Aggregate, Cell, Group, evidence_groups, group_aggregates, group_cells
from advisor.rules import Rules

CONFIDENCE = 0.95


class NoEvidence(Exception):
    """No evidence group holds runs for the question asked."""


def select_group(
    conn: sqlite3.Connection, rules: Rules, family: str, source: str | None = None, model: str | None = None
) -> tuple[Group, list[Group]]:
    """The best evidence group for a family (rules: flowchart.evidence), and the others available."""
    groups = evidence_groups(conn, family=family, source=source)
    if not groups:
        where = f" from source {source!r}" if source else ""
        raise NoEvidence(
            f"the knowledge base has no runs of the {family} family{where}. "
            f"Measure some with `advisor measure`, or drop --source."
        )
    prefs = rules.flowchart["evidence"]

    def rank(g: Group):
        return (
            g.model == model,
            prefs["preset_rank"].get(g.preset, 1),
            prefs["source_rank"].get(g.source, prefs["source_rank"].get(g.kind, 0)),
            g.n_seeds,
            g.n_runs,
        )

    ordered = sorted(groups, key=rank, reverse=True)
    return ordered[0], ordered[1:]


@dataclass(frozen=True)
class Stat:
    """A metric of one configuration over its ok runs (seeds), in the metric's unit."""

    mean: float
    n: int
    spread: float | None  # sample standard deviation; None for a single run
    stated: str | None = None  # the stored figure as its source states it, when converted and single
    ci: tuple[float, float] | None = None  # 95 % Student-t interval of the mean; None for a single run
    predicted: bool = False  # a prediction (advisor fit), not a measurement

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
        self._unusable: dict[tuple[str, str], str] | None = None
        self._stats: dict[str, dict[tuple[str, str], Stat]] = {}
        for metric, measure in self._measures.items():
            spec = rules.measures.get(measure) if measure else None
            converted = spec is not None and (spec.factor != 1.0 or spec.scale is not None)
            self._stats[metric] = {k: _stat(a, converted) for k, a in aggregates.get(measure, {}).items()}

    def use_prediction(self, metric: str, measure: str, values: dict[tuple[str, str], float]) -> None:
        """Rank `metric` by predicted values (advisor fit) instead of the stored figures: e.g. memory for the
        user's model on the user's accelerator, which no run of this group measured."""
        self._measures[metric] = measure
        self._stats[metric] = {
            k: Stat(mean=v, n=1, spread=None, predicted=True) for k, v in values.items() if k in self.cells
        }
        self._unusable = None

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

    def unusable(self) -> dict[tuple[str, str], str]:
        """The one rule for which configurations may be ranked (recommend, frontier and claims alike): those
        with an ok run that the divergence filter keeps. Every other one, with the reason."""
        if self._unusable is not None:
            return self._unusable
        diverged = self.diverged()
        out = {}
        for key, cell in sorted(self.cells.items()):
            if not cell.n_ok:
                statuses = "/".join(f"{n} {s}" if n > 1 else s for s, n in sorted(cell.statuses.items()))
                out[key] = statuses + (f": {sorted(cell.errors)[0]}" if cell.errors else "")
            elif key in diverged:
                out[key] = diverged[key]
        self._unusable = out
        return out

    def usable(self) -> list[Cell]:
        """The configurations that may be ranked, in name order."""
        unusable = self.unusable()
        return [c for k, c in sorted(self.cells.items()) if k not in unusable]

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
