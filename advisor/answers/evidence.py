"""Evidence: choosing the one group an answer ranks, and that group as a grid of configurations (optimizer ×
strategy) with their metric values, seeds and intervals, and which of them may be ranked at all."""

from __future__ import annotations

import importlib
import math
import sqlite3
import threading
from dataclasses import dataclass

from advisor.answers.stats import TTest, finite, paired_t, relative_difference, welch_t
from advisor.errors import NoEvidence
from advisor.kb.reader import (
    Aggregate,
    Cell,
    Group,
    PairSums,
    evidence_groups,
    group_aggregates,
    group_cells,
    group_pairs,
)
from advisor.rules import Rules

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Selector:
    """Which evidence an answer may rank, beside --source: a preset, a hardware, or one group's id."""

    preset: str | None = None
    hardware: str | None = None
    group: int | None = None

    def keeps(self, g: Group) -> bool:
        return (
            (self.preset is None or g.preset == self.preset)
            and (self.hardware is None or g.hardware == self.hardware)
            and (self.group is None or g.id == self.group)
        )

    def __str__(self) -> str:
        return " ".join(f"--{k} {v}" for k, v in vars(self).items() if v is not None)


def select_group(
    conn: sqlite3.Connection,
    rules: Rules,
    family: str,
    source: str | None = None,
    model: str | None = None,
    selector: Selector | None = None,
) -> tuple[Group, list[Group]]:
    """The best evidence group for a family (rules: flowchart.evidence) among those the selector keeps, and
    the others available. Sources the rules never answer from (`--tune-lr`'s runs, which chose the rates)
    count only when asked for; so does the group a selector names."""
    prefs = rules.flowchart["evidence"]
    selector = selector or Selector()
    everything = evidence_groups(conn, family=family, source=source)
    groups = [
        g
        for g in everything
        if selector.keeps(g) and (source or selector.group or g.source not in prefs.get("answer_never", []))
    ]
    if not groups:
        where = f" from source {source!r}" if source else ""
        where += f" matching {selector}" if str(selector) else ""
        raise NoEvidence(
            f"the knowledge base has no runs of the {family} family{where}. "
            f"Measure some with `advisor measure`, or drop --source (see `advisor kb stats` for the groups)."
        )

    def rank(g: Group):
        return (
            g.model == model,
            g.own,  # the user's own measurements of the family, on their hardware, over anything shipped
            g.own and g.data not in ("generated", ""),  # of those, on their own (real) data over generated
            prefs["preset_rank"].get(g.preset, 1),
            prefs["protocol_rank"].get(g.protocol, 0),
            prefs["source_rank"].get(g.source, prefs["source_rank"].get(g.kind, 0)),
            g.n_seeds,
            g.n_runs,
        )

    chosen = max(groups, key=rank)
    never = prefs.get("answer_never", [])
    others = [g for g in everything if g is not chosen and (g.source not in never or selector.group == g.id)]
    return chosen, sorted(others, key=rank, reverse=True)


@dataclass(frozen=True)
class Stat:
    """A metric of one configuration over its ok runs (seeds), in the metric's unit."""

    mean: float
    n: int
    spread: float | None  # sample standard deviation; None for a single run
    stated: str | None = None  # the stored figure as its source states it, when converted and single
    ci: tuple[float, float] | None = None  # 95 % Student-t interval of the mean; None for a single run
    predicted: bool = False  # a prediction (advisor fit), not a measurement


@dataclass(frozen=True)
class Comparison:
    """A test of configuration a against b on one metric: paired by seed where they share seeds, else
    Welch's. `difference` is a - b (paired: the mean per-seed difference), `relative` that as % of b."""

    a: tuple[str, str]
    b: tuple[str, str]
    test: TTest
    relative: float | None

    def as_dict(self) -> dict:
        t = self.test
        return dict(
            kind=t.kind,
            n=t.n,
            statistic=finite(t.statistic),  # null: the differences have no spread (p is then 0 or 1)
            dof=t.dof,
            p=t.p,
            difference=t.difference,
            relative=self.relative,
            effect_size=finite(t.effect_size),
            effect_name=t.effect_name,
        )


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
        self._aggregates: dict[str, dict[tuple[str, str], Aggregate]] = {}
        for metric, measure in self._measures.items():
            spec = rules.measures.get(measure) if measure else None
            converted = spec is not None and (spec.factor != 1.0 or spec.scale is not None)
            self._aggregates[metric] = aggregates.get(measure, {})
            self._stats[metric] = {k: _stat(a, converted) for k, a in self._aggregates[metric].items()}
        # Seed-paired sums, for the measures read that a runs column does not scale (those have none).
        paired = {x for x in self._measures.values() if x and rules.measures[x].scale is None}
        self._pairs: dict[str, dict] = (
            group_pairs(conn, group, {x: rules.measures[x].factor for x in sorted(paired)})
            if group.n_seeds > 1
            else {}
        )

    def use_prediction(self, metric: str, measure: str, values: dict[tuple[str, str], float]) -> None:
        """Rank `metric` by predicted values (advisor fit) instead of the stored figures: e.g. memory for the
        user's model on the user's accelerator, which no run of this group measured."""
        self._measures[metric] = measure
        self._stats[metric] = {
            k: Stat(mean=v, n=1, spread=None, predicted=True) for k, v in values.items() if k in self.cells
        }
        self._aggregates[metric] = {}  # a prediction per configuration: nothing to test
        self._unusable = None

    def measure(self, metric: str) -> str | None:
        return self._measures.get(metric)

    def contended(self, key: tuple[str, str]) -> bool:
        """Whether an ok run of the configuration was timed under contention (measure `contended`)."""
        agg = group_aggregates(self.conn, self.group, {"contended": (1.0, None)}).get("contended", {})
        return key in agg and agg[key].mean > 0

    def stats(self, metric: str) -> dict[tuple[str, str], Stat]:
        """The metric of every configuration that has a figure for it."""
        return self._stats.get(metric, {})

    def pair(self, metric: str, a: tuple[str, str], b: tuple[str, str]) -> PairSums | None:
        """The seed-paired sums of a - b on the metric's measure, where both have ok runs of common seeds."""
        pairs = self._pairs.get(self._measures.get(metric) or "", {})
        if (a, b) in pairs:
            return pairs[(a, b)]
        return pairs[(b, a)].flipped() if (b, a) in pairs else None

    def compare(self, metric: str, a: tuple[str, str], b: tuple[str, str]) -> Comparison | None:
        """Test a against b: paired by seed when they share at least 2 seeds, else Welch's when each has at
        least 2 runs, else None (no test: e.g. one run per configuration)."""
        aggs = self._aggregates.get(metric, {})
        if a not in aggs or b not in aggs:
            return None
        pair = self.pair(metric, a, b)
        if pair is not None and pair.n >= 2:
            test = paired_t(pair.n, pair.sum_d, pair.sum_dd)
        else:
            test = welch_t(*((x.n, x.mean, x.sum_sq) for x in (aggs[a], aggs[b])))
        if test is None:
            return None
        return Comparison(a, b, test, relative_difference(test.difference, aggs[b].mean))

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
