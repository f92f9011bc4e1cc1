"""The recommendation flowchart: every family × metric walked through `recommend`, like the paper's Figure 1."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import dataclass

from advisor.answers.recommendation import Answer, recommend
from advisor.errors import NoEvidence
from advisor.rules import Rules


@dataclass
class BestPath:
    """The flowchart's answer for one family and metric (None where no evidence group answers)."""

    family: str
    metric: str
    answer: Answer | None  # None: no evidence group for this family

    @property
    def pick(self):
        return self.answer.recommendation if self.answer else None

    def as_dict(self) -> dict:
        pick, safe = self.pick, self.answer.safe_alternative if self.answer else None
        return {
            "family": self.family,
            "metric": self.metric,
            "optimizer": pick.optimizer if pick else None,
            "strategy": pick.strategy if pick else None,
            "value": pick.value if pick else None,
            "unit": pick.unit if pick else None,
            "tied": pick.tied if pick else False,
            # the pick against its runner-up: the test that separated them, or found them tied
            "separated_by": pick.test if pick else None,
            "tie_break": self.answer.tie_break if pick else None,
            "flag": pick.flag if pick else None,
            "safe_alternative": {"optimizer": safe.optimizer, "strategy": safe.strategy} if safe else None,
            "evidence": self.answer.group.label if self.answer and self.answer.group else None,
        }


def walk(
    conn: sqlite3.Connection,
    rules: Rules,
    source: str | None = None,
    evidence: dict | None = None,
) -> list[BestPath]:
    """One best path per family × metric of rules/flowchart.toml (optimizer and strategy None where no evidence)."""
    paths = []
    evidence = {} if evidence is None else evidence  # each group aggregated once, whatever the metric
    for family in rules.families:
        for metric in rules.flowchart["metrics"]:
            try:
                answer = recommend(conn, family, metric, rules, source=source, evidence=evidence)
                paths.append(BestPath(family, metric, answer))
            except NoEvidence:
                paths.append(BestPath(family, metric, None))
    return paths


def summary(paths: list[BestPath]) -> dict:
    """How many best paths each optimizer and strategy lies on (the paper: 'SGD, seven of sixteen')."""
    picks = [p.pick for p in paths if p.pick]
    tied = [p for p in picks if p.tied]
    return {
        "paths": len(paths),
        "answered": len(picks),
        "tied": len(tied),
        # what a tie means, read against the runner-up: equivalent (TOST, within the margin) or undecided
        "tied_equivalent": sum((p.test or {}).get("reading") == "equivalent" for p in tied),
        "tied_undecided": sum((p.test or {}).get("reading") != "equivalent" for p in tied),
        "optimizers": dict(Counter(p.optimizer for p in picks).most_common()),
        "strategies": dict(Counter(p.strategy for p in picks).most_common()),
        # of those, the paths whose pick is tied with another configuration (counted above too)
        "optimizers_tied": dict(Counter(p.optimizer for p in tied).most_common()),
        "strategies_tied": dict(Counter(p.strategy for p in tied).most_common()),
        "flagged": sum(p.flag is not None for p in picks),
    }
