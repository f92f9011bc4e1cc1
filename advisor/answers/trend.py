"""A source's sizes side by side: the groups that differ only in scale (Wen et al.'s 130 M to 1.2 B, the
reference grid's tiny and small) and, per metric, the pick's lead over its runner-up at each size: the trend an
answer from any of them states, and `advisor transfer` lists. Cheap: the short answer reads it."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from advisor.answers.evidence import GroupEvidence, params_text
from advisor.kb.queries.groups import Group, evidence_groups
from advisor.rules import Rules

TUNING_SOURCES = ("measured:tuning",)  # runs that chose rates (a run per rate, not per seed) are not evidence


def _scale_key(g: Group) -> tuple:
    """What groups that differ only in scale share: family, source, hardware, protocol and data."""
    return (g.family, g.source, g.hardware, g.protocol, g.data)


def scale_chains(conn: sqlite3.Connection, family: str | None = None) -> list[list[Group]]:
    """Groups that differ only in scale (a stated parameter count each), smallest first: measured grids with
    seeds, and published tables (one run per configuration) as the scale points they are."""
    never = TUNING_SOURCES
    by_kind: dict[tuple, list[Group]] = {}
    for g in evidence_groups(conn, family=family):
        if (  # the reference grid's scales; a particular model's group (preset custom: a base, fine-tuned) is none
            g.n_params
            and (g.n_seeds > 1 or g.kind == "paper")
            and not g.own
            and g.source not in never
            and g.preset != "custom"
        ):
            by_kind.setdefault(_scale_key(g), []).append(g)
    return [sorted(groups, key=lambda g: g.n_params) for groups in by_kind.values() if len(groups) > 1]


@dataclass(frozen=True)
class Trend:
    """One configuration's lead over another at every size of one source (Wen et al.'s 130 M to 1.2 B, the
    reference grid's tiny and small): what the evidence shows across scale, said where an answer reads one size.
    A lead is how much better the pick is, in the metric's unit (positive: better)."""

    source: str
    family: str
    metric: str
    pick: str
    versus: str
    points: tuple[tuple[int, float], ...]  # (parameters, lead), smallest first
    single_runs: bool  # one run per configuration at some size: each lead is one difference, no spread

    @property
    def direction(self) -> str:
        """'shrinks', 'grows', 'reverses' (the other leads somewhere), or 'moves' (up and down)."""
        leads = [lead for _, lead in self.points]
        steps = [b - a for a, b in zip(leads, leads[1:], strict=False)]
        if min(leads) <= 0 < max(leads):
            return "reverses"
        if all(d < 0 for d in steps):
            return "shrinks"
        if all(d > 0 for d in steps):
            return "grows"
        return "moves"

    def text(self, asked: int | None = None) -> str:
        """'Across paper 2509.02046's sizes, muon + standard's lead over adamw + standard in loss: +0.065 at
        130 M, ..., +0.014 at 1.2 B: the lead shrinks with size (your 1.24 B: nearest 1.2 B)'."""
        paper = self.source.startswith("paper:")
        origin = f"paper {self.source.removeprefix('paper:')}" if paper else f"the {self.source} grid"
        leads = ", ".join(f"{lead:+.3g} at {params_text(n)}" for n, lead in self.points)
        said = {
            "shrinks": "the lead shrinks with size",
            "grows": "the lead grows with size",
            "reverses": "the lead changes sign across sizes",
            "moves": "the lead rises and falls with size: no trend",
        }[self.direction]
        runs = "; one run each: each lead is one difference, untested" if self.single_runs else ""
        return (
            f"Across {origin}'s sizes, {self.pick}'s lead over {self.versus} in {self.metric}: {leads}: "
            f"{said}{self._toward(asked)}{runs}."
        )

    def _toward(self, asked: int | None) -> str:
        """Where the question's size sits among the sizes: beside one of them, or beyond the largest."""
        if not asked:
            return ""
        sizes = [n for n, _ in self.points]
        if asked > 1.5 * sizes[-1]:
            return (
                f" (your {params_text(asked)}: beyond the largest, {params_text(sizes[-1])}; "
                "carrying the trend past it is a guess)"
            )
        nearest = min(sizes, key=lambda n: abs(math.log(asked / n)))
        return f" (your {params_text(asked)}: nearest {params_text(nearest)})"

    def as_dict(self, asked: int | None = None) -> dict:
        return dict(
            source=self.source,
            family=self.family,
            metric=self.metric,
            pick=self.pick,
            versus=self.versus,
            points=[{"parameters": n, "lead": lead} for n, lead in self.points],
            direction=self.direction,
            single_runs=self.single_runs,
            text=self.text(asked),
        )


def trend(
    conn: sqlite3.Connection,
    rules: Rules,
    group: Group,
    metric: str,
    ranked: list[tuple[str, str]],
    evidence: dict | None = None,
) -> Trend | None:
    """The lead of ranked[0] (the pick) over the first of ranked[1:] that every size of `group`'s scale chain
    measured, usable, on the same measure; None where the group has no other size or no such pair."""
    chain = next((c for c in scale_chains(conn, group.family) if group in c), None)
    if chain is None or len(ranked) < 2:
        return None
    evidence = {} if evidence is None else evidence
    evs = [evidence.get(g) or evidence.setdefault(g, GroupEvidence(conn, g, rules)) for g in chain]
    if len({ev.measure(metric) for ev in evs}) != 1 or evs[0].measure(metric) is None:
        return None
    usable = [{k: s.mean for k, s in ev.stats(metric).items() if k not in ev.unusable(metric)} for ev in evs]
    pick = ranked[0]
    versus = next((k for k in ranked[1:] if all(pick in u and k in u for u in usable)), None)
    if versus is None:
        return None
    sign = 1.0 if rules.metric(metric).direction == "min" else -1.0
    points = tuple((g.n_params, sign * (u[versus] - u[pick])) for g, u in zip(chain, usable, strict=True))
    name = " + ".join
    single = any(g.n_seeds == 1 for g in chain)
    return Trend(group.source, group.family, metric, name(pick), name(versus), points, single)


def trends(
    conn: sqlite3.Connection, rules: Rules, family: str | None, metrics: tuple[str, ...]
) -> list[Trend]:
    """Each scale chain's trend per metric, for the pick at its largest size against its runners-up there: what
    `advisor recommend` says beside an answer from any size of the chain."""
    out = []
    evidence: dict = {}
    for chain in scale_chains(conn, family):
        largest = evidence.setdefault(chain[-1], GroupEvidence(conn, chain[-1], rules))
        for metric in metrics:
            sign = 1.0 if rules.metric(metric).direction == "min" else -1.0
            stats = largest.stats(metric)
            ranked = sorted(
                (k for k in stats if k not in largest.unusable(metric)),
                key=lambda k: (sign * stats[k].mean, k),
            )
            found = trend(conn, rules, chain[-1], metric, ranked, evidence)
            if found is not None:
                out.append(found)
    return out
