"""`advisor frontier`: the Pareto frontier of two metrics over the usable configurations of one evidence group."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field, replace

from advisor.answers.evidence import GroupEvidence, select_group
from advisor.answers.pareto import FrontierPoint, pareto_view
from advisor.kb.queries.for_answers import Cell
from advisor.kb.queries.groups import Group
from advisor.rules import Rules, load_rules


@dataclass(frozen=True)
class LeftOut:
    """A configuration that may not be ranked, with why, and its figures where it has them (to draw it greyed)."""

    optimizer: str
    strategy: str
    reason: str
    x: float | None
    y: float | None


@dataclass
class Frontier:
    """A family's Pareto frontier on two metrics from one evidence group, and what could not be ranked."""

    family: str
    x: str  # metric names
    y: str
    group: Group
    measures: tuple[str | None, str | None]  # the stored measure each axis reads
    points: list[FrontierPoint]
    left_out: list[str]  # "<configuration>: <why it may not be ranked>"
    excluded: list[LeftOut] = field(default_factory=list)  # the same, as points for pictures

    def as_dict(self, rules: Rules | None = None) -> dict:
        """What `advisor frontier --json` prints (`rules`: default the installed ones)."""
        rules = rules or load_rules()
        return {
            "family": self.family,
            "x": {"metric": self.x, "unit": rules.metric(self.x).unit, "measure": self.measures[0]},
            "y": {"metric": self.y, "unit": rules.metric(self.y).unit, "measure": self.measures[1]},
            "evidence": self.group.as_dict(),
            "points": [p.as_dict() for p in self.points],
            "left_out": self.left_out,
        }


def frontier(
    conn: sqlite3.Connection,
    family: str,
    x: str,
    y: str,
    rules: Rules,
    source: str | None = None,
    group: Group | None = None,
) -> Frontier:
    """The x-vs-y frontier of `group`, else of the family's best evidence group that measured both;
    unusable configurations are left out, with why."""
    group = group or select_group(conn, rules, family, source, metric=(x, y)).group
    ev = GroupEvidence(conn, group, rules)
    applies = rules.flowchart["filters"]["divergence"]["applies_to"]
    judged = next((m for m in (x, y) if m in applies), y)  # a diverged run is off a frontier of its loss
    unusable = ev.unusable(judged)
    left_out = sorted(f"{ev.cells[k].name}: {why}" for k, why in unusable.items())
    points = frontier_points(ev, ev.usable(judged), x, y)
    excluded = [
        LeftOut(*key, why, ev.value(ev.cells[key], x), ev.value(ev.cells[key], y))
        for key, why in sorted(unusable.items())
    ]
    return Frontier(family, x, y, group, (ev.measure(x), ev.measure(y)), points, left_out, excluded)


def frontier_points(ev: GroupEvidence, cells: list[Cell], x: str, y: str) -> list[FrontierPoint]:
    """The x-vs-y Pareto view of the given configurations (those with both figures)."""
    stats = [(c, ev.stat(c, x), ev.stat(c, y)) for c in cells]
    items = [(c.optimizer, c.strategy, sx.mean, sy.mean, sx.ci, sy.ci) for c, sx, sy in stats if sx and sy]
    points = pareto_view(items, ev.rules.metric(x).direction, ev.rules.metric(y).direction)
    flags = {c.key: c.flag for c in cells if c.flag}  # a configuration with a failed seed says so
    return [replace(p, flag=flags.get((p.optimizer, p.strategy))) for p in points]
