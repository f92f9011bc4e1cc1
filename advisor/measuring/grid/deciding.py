"""`advisor measure --decide`: more seeds where they are cheap enough to decide a close call.

After the grid, each family's answer for each metric of rules/protocol.toml [deciding] is read from the KB the
grid wrote, as `advisor recommend` ranks it (the group these cells wrote: measured here, at their preset, on
this hardware, of their data). Its runner-up, where the paired test does not separate it from the pick and
two one-sided tests do not call it equivalent (the margins of rules/flowchart.toml), is a close call, and the answer says how many seeds per side would decide it at 80 %
power. Where that is at most `max_seeds`, both configurations get seeds up to it, at the rates the grid
tuned; the estimate comes from the seeds at hand, so this repeats, `rounds` times at most. A close call that
needs more stays undecided, and answers keep saying what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from advisor.answers.evidence import Asked, Selector
from advisor.answers.recommendation import recommend
from advisor.errors import NoEvidence
from advisor.kb.open import open_for_reading
from advisor.kb.queries.groups import evidence_groups
from advisor.measuring.grid.runner import MEASURED_SOURCE
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.measuring.recipe.config import GridCell
from advisor.rules import Rules


@dataclass(frozen=True)
class CloseCall:
    """A runner-up not yet told apart from its answer's pick, nor equivalent to it, and what would decide it."""

    model: str  # as the runs name it: the group's model
    family: str
    metric: str
    pick: tuple[str, str]  # (optimizer, strategy)
    other: tuple[str, str]
    seeds: int  # the fewer of the two configurations' seeds now
    needed: int | None  # seeds per side that would decide it at 80 % power (None: the test cannot say)

    def decidable(self, rules: Rules) -> bool:
        return self.needed is not None and self.seeds < self.needed <= rules.protocol["deciding"]["max_seeds"]

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "family": self.family,
            "metric": self.metric,
            "pick": " + ".join(self.pick),
            "other": " + ".join(self.other),
            "seeds": self.seeds,
            "seeds_needed": self.needed,
        }


def close_calls(path: Path, cells: list[GridCell], rules: Rules) -> list[CloseCall]:
    """The close calls of the answers of the groups the cells wrote (each found exactly: measured, its model,
    preset, hardware, protocol and data), for every metric [deciding] names."""
    conn = open_for_reading(path)
    calls: list[CloseCall] = []
    try:
        for identity in dict.fromkeys(_identity(cell) for cell in cells):
            model, family = identity[0], identity[1]
            found = [g for g in evidence_groups(conn, family, model=model) if _identity_of(g) == identity]
            for group, metric in ((g, m) for g in found for m in rules.protocol["deciding"]["metrics"]):
                try:
                    answer = recommend(
                        conn,
                        family,
                        metric,
                        rules,
                        asked=Asked(model=model),
                        selector=Selector(group=group.id),
                    )
                except NoEvidence:
                    continue
                calls += _of(answer.as_dict(), model, family, metric)
    finally:
        conn.close()
    return calls


def _identity(cell: GridCell) -> tuple:
    """What the group of a cell's runs is keyed by (advisor/kb/summaries.py GROUP_COLUMNS), as it stores it."""
    cfg = cell.config
    hardware = describe(resolve_device(cfg.device))["hardware"]
    preset = cfg.preset if cell.model.reference else "custom"
    return (
        cfg.model,
        cell.model.family.name,
        MEASURED_SOURCE,
        hardware,
        preset,
        cfg.protocol,
        cfg.data_id or "generated",
    )


def _identity_of(g) -> tuple:
    return (g.model, g.family, g.source, g.hardware, g.preset, g.protocol, g.data)


def _of(answer: dict, model: str, family: str, metric: str) -> list[CloseCall]:
    """An answer's close call: its runner-up, where undecided. The configurations further down are left: no
    seed of theirs changes the pick, and the seeds an answer says would decide them ignore Holm's
    correction, which asks more of every comparison but the closest."""
    pick, runners_up = answer["recommendation"], answer["alternatives"]
    if pick is None or not runners_up:
        return []
    other = runners_up[0]
    test = other.get("test") or {}
    if test.get("reading") != "undecided":
        return []
    seeds = min(pick["seeds"] or 0, other["seeds"] or 0)
    config = (other["optimizer"], other["strategy"])
    return [
        CloseCall(
            model,
            family,
            metric,
            (pick["optimizer"], pick["strategy"]),
            config,
            seeds,
            test.get("seeds_needed"),
        )
    ]


def more_seeds(cells: list[GridCell], calls: list[CloseCall], rules: Rules) -> list[GridCell]:
    """The cells that extend both sides of every decidable close call to the seeds it needs: each a cell of
    the grid (its tuned rate) at a seed it has not run."""
    want: dict[tuple[str, str, str], int] = {}
    for call in calls:
        if call.decidable(rules):
            for side in (call.pick, call.other):
                key = (call.model, *side)
                want[key] = max(want.get(key, 0), call.needed)
    have: dict[tuple, int] = {}
    first: dict[tuple, GridCell] = {}
    for cell in cells:
        key = (cell.config.model, cell.config.optimizer, cell.config.strategy)
        have[key] = max(have.get(key, 0), cell.config.seed + 1)
        first.setdefault(key, cell)
    return [
        first[key].with_config(seed=seed)
        for key, seeds in want.items()
        if key in first
        for seed in range(have[key], seeds)
    ]
