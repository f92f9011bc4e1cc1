"""The paper's claims (rules/claims.toml) re-checked against one evidence source: holds, does not hold,
or not enough evidence, with the numbers on both sides."""

from __future__ import annotations

import sqlite3
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from advisor.evidence import GroupEvidence, Stat
from advisor.recommend import NoEvidence, recommend, select_group
from advisor.rules import Rules, load_rules, rules_dir

HOLDS, FAILS, UNKNOWN = "holds", "does not hold", "not enough evidence"


@dataclass
class Verdict:
    id: str
    text: str
    paper: str
    verdict: str
    note: str  # how to read the claim against measured evidence, from rules/claims.toml
    found: str  # the numbers from the evidence, or why there are none
    evidence: list[str]

    def as_dict(self) -> dict:
        return dict(
            note=self.note,
            id=self.id,
            text=self.text,
            paper=self.paper,
            verdict=self.verdict,
            found=self.found,
            evidence=self.evidence,
        )


def load_claims(directory: str | None = None) -> list[dict]:
    path = (rules_dir() if directory is None else Path(directory)) / "claims.toml"
    return tomllib.loads(path.read_text())["claims"]


class Checker:
    def __init__(self, conn: sqlite3.Connection, source: str | None, rules: Rules | None = None):
        self.conn, self.source, self.rules = conn, source, rules or load_rules()
        self.cache: dict = {}  # Group -> GroupEvidence, shared with every recommend() the checks make
        self.evidence = cache(self._evidence)

    def _evidence(self, family: str) -> GroupEvidence | None:
        try:
            group, _ = select_group(self.conn, self.rules, family, self.source)
        except NoEvidence:
            return None
        return self.cache.get(group) or self.cache.setdefault(
            group, GroupEvidence(self.conn, group, self.rules)
        )

    def check(self, claim: dict) -> Verdict:
        kind = claim["kind"]
        verdict, found, groups = getattr(self, f"_{kind}")(claim)
        return Verdict(
            claim["id"],
            claim["text"],
            claim.get("paper", ""),
            verdict,
            claim.get("note", ""),
            found,
            sorted(groups),
        )

    def _stat(self, ev: GroupEvidence, metric: str, optimizer: str, strategy: str) -> Stat | None:
        """The figure of a configuration that may be ranked (GroupEvidence.unusable: the one rule), else None."""
        cell = ev.cells.get((optimizer, strategy))
        if cell is None or (optimizer, strategy) in ev.unusable():
            return None
        return ev.stat(cell, metric)

    def _ratio(self, c):
        ev = self.evidence(c["family"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        a = self._stat(ev, c["metric"], c["a"]["optimizer"], c["a"]["strategy"])
        b = self._stat(ev, c["metric"], c["b"]["optimizer"], c["b"]["strategy"])
        name_a = f"{c['a']['optimizer']}+{c['a']['strategy']}"
        name_b = f"{c['b']['optimizer']}+{c['b']['strategy']}"
        if a is None or b is None or b.mean == 0:
            side = c["a"] if a is None else c["b"]
            why = ev.unusable().get((side["optimizer"], side["strategy"])) or f"no {c['metric']} figure"
            return UNKNOWN, f"{name_a if a is None else name_b}: {why}", {ev.group.label}
        verdict, text = _judge(a, b, c["min"], c["max"])
        return (
            verdict,
            f"{name_a} {a.mean:.4g} / {name_b} {b.mean:.4g} = {text} (claim: x{c['min']:g}-{c['max']:g})",
            {ev.group.label},
        )

    def _ratio_all(self, c):
        judged, groups = [], set()
        for family in c["families"]:
            ev = self.evidence(family)
            if ev is None:
                continue
            groups.add(ev.group.label)
            for opt in c.get("optimizers") or sorted({o for o, _ in ev.cells}):
                a, b = self._stat(ev, c["metric"], opt, c["a"]), self._stat(ev, c["metric"], opt, c["b"])
                if a is not None and b is not None and b.mean != 0:
                    verdict, text = _judge(a, b, c["min"], c["max"])
                    judged.append((verdict, f"{family} {opt} {text}"))
        if not judged:
            return (
                UNKNOWN,
                f"no configuration has both a {c['a']} and a {c['b']} {c['metric']} figure",
                groups,
            )
        claim = f"(claim: x{c['min']:g}-{c['max']:g} for each)"
        fails = [t for v, t in judged if v == FAILS]
        unsure = [t for v, t in judged if v == UNKNOWN]
        if fails:
            return FAILS, f"{len(fails)} of {len(judged)} outside: {', '.join(fails)} {claim}", groups
        if unsure:
            return (
                UNKNOWN,
                f"{len(unsure)} of {len(judged)} outside only within noise: {', '.join(unsure)} {claim}",
                groups,
            )
        return HOLDS, f"{', '.join(t for _, t in judged)} {claim}", groups

    def _range(self, c):
        ev = self.evidence(c["family"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        measure = ev.measure(c["metric"])
        if c.get("measure") and measure != c["measure"]:
            have = f"only {measure}" if measure else f"no {c['metric']} figure"
            return UNKNOWN, f"no {c['measure']} figure ({have} in this evidence)", {ev.group.label}
        unusable = ev.unusable()
        values = {k: s.mean for k, s in ev.stats(c["metric"]).items() if k not in unusable}
        if not values:
            return UNKNOWN, f"no {c['metric']} figure", {ev.group.label}
        lo, hi = min(values.values()), max(values.values())
        outside = [
            f"{o}+{s} {v:.4g}" for (o, s), v in sorted(values.items()) if not c["min"] <= v <= c["max"]
        ]
        found = f"{len(values)} configurations, {lo:.4g}-{hi:.4g} (claim: {c['min']:g}-{c['max']:g})"
        return (
            (FAILS, found + "; outside: " + ", ".join(outside), {ev.group.label})
            if outside
            else (HOLDS, found, {ev.group.label})
        )

    def _best(self, c):
        parts, wrong, unsure, missing, groups = [], [], [], [], set()
        for e in c["expect"]:
            try:
                answer = recommend(
                    self.conn,
                    e["family"],
                    e["metric"],
                    source=self.source,
                    rules=self.rules,
                    evidence=self.cache,
                )
            except NoEvidence:
                missing.append(f"{e['family']} {e['metric']}")
                continue
            groups.add(answer.group.label)
            pick = answer.recommendation
            if pick is None:
                missing.append(f"{e['family']} {e['metric']}")
                continue
            tag = f"{e['family']} {e['metric']}: {pick.optimizer}+{pick.strategy}" + (
                " (tied)" if pick.tied else ""
            )
            parts.append(tag)
            if _matches(pick, e):
                continue
            expected = f"claim {e.get('optimizer', '')}{'+' + e['strategy'] if 'strategy' in e else ''}"
            if any(_matches(t, e) for t in answer.tied_with):
                unsure.append(f"{tag}, tied with the claimed {e.get('optimizer', '')}")
            else:
                wrong.append(f"{tag}, {expected}")
        if wrong:
            return FAILS, "; ".join(wrong + unsure), groups
        if unsure or missing:
            gaps = [f"no answer for {', '.join(missing)}"] if missing else []
            return UNKNOWN, "; ".join(gaps + unsure + [p for p in parts if p not in " ".join(unsure)]), groups
        return HOLDS, "; ".join(parts), groups

    def _diverged(self, c):
        ev = self.evidence(c["family"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        diverged = ev.diverged()
        cells = [(k, cell) for k, cell in sorted(ev.cells.items()) if k[0] == c["optimizer"]]
        if not cells:
            return UNKNOWN, f"no run of {c['optimizer']}", {ev.group.label}
        usable = [f"{cell.name}" for k, cell in cells if cell.n_ok and k not in diverged]
        states = [
            f"{cell.name}: "
            + ("diverged (filter)" if k in diverged else "usable" if cell.n_ok else "/".join(cell.statuses))
            for k, cell in cells
        ]
        return (FAILS if usable else HOLDS), "; ".join(states), {ev.group.label}

    def _never_best(self, c):
        from advisor.flowchart import walk

        paths = walk(self.conn, source=self.source, rules=self.rules, evidence=self.cache)
        picks = [p for p in paths if p.answer and p.answer.recommendation]
        groups = {p.answer.group.label for p in picks}
        mine = [p for p in picks if p.answer.recommendation.optimizer == c["optimizer"]]
        hits = [f"{p.family} {p.metric}" for p in mine if not p.answer.recommendation.tied]
        tied = [f"{p.family} {p.metric}" for p in mine if p.answer.recommendation.tied]
        if hits:
            return FAILS, f"{c['optimizer']} is best for {', '.join(hits + tied)}", groups
        if tied:
            return UNKNOWN, f"{c['optimizer']} is picked, tied with others, for {', '.join(tied)}", groups
        if not picks:
            return UNKNOWN, "no best paths", groups
        return HOLDS, f"{c['optimizer']} on none of {len(picks)} answered best paths", groups


def _matches(entry, expect: dict) -> bool:
    return entry.optimizer == expect.get("optimizer", entry.optimizer) and entry.strategy == expect.get(
        "strategy", entry.strategy
    )


def _judge(a: Stat, b: Stat, lo: float, hi: float) -> tuple[str, str]:
    """The ratio a/b against [lo, hi]: holds, does not hold beyond the seeds' intervals, or within noise."""
    ratio = a.mean / b.mean
    if lo <= ratio <= hi:
        return HOLDS, f"x{ratio:.3g}"
    a_lo, a_hi = a.ci or (a.mean, a.mean)
    b_lo, b_hi = b.ci or (b.mean, b.mean)
    if b_lo <= 0:
        return UNKNOWN, f"x{ratio:.3g} (interval includes 0)"
    r_lo, r_hi = a_lo / b_hi, a_hi / b_lo  # the ratio's range over both 95 % intervals
    if r_hi < lo or r_lo > hi:
        return FAILS, f"x{ratio:.3g}" + (f" [x{r_lo:.3g}-x{r_hi:.3g}]" if a.ci or b.ci else "")
    return UNKNOWN, f"x{ratio:.3g} [x{r_lo:.3g}-x{r_hi:.3g}, within noise]"


def check_all(
    conn: sqlite3.Connection, source: str | None, rules: Rules | None = None, claims: list[dict] | None = None
) -> list[Verdict]:
    checker = Checker(conn, source, rules)
    return [checker.check(c) for c in (claims or load_claims())]


def markdown(verdicts: list[Verdict], source: str | None, command: str) -> str:
    """The reproduction report: every claim, the paper's numbers, ours, and the verdict."""
    counts = {v: sum(x.verdict == v for x in verdicts) for v in (HOLDS, FAILS, UNKNOWN)}
    groups = sorted({g for v in verdicts for g in v.evidence})
    lines = [
        f"# The paper's claims against {source or 'the best available'} evidence",
        "",
        f"Made by `{command}`; the claims are data in `rules/claims.toml`.",
        "",
        f"**{counts[HOLDS]} hold, {counts[FAILS]} do not hold, {counts[UNKNOWN]} lack evidence** "
        f"(of {len(verdicts)}).",
        "",
        "Evidence groups ranked:",
        "",
    ]
    lines += [f"- {g}" for g in groups] + [
        "",
        "| claim | paper | found here | verdict |",
        "| --- | --- | --- | --- |",
    ]
    for v in verdicts:
        cells = [f"**{v.id}**: {v.text}", v.paper, v.found, v.verdict]
        lines.append("| " + " | ".join(x.replace("|", "/") for x in cells) + " |")
    notes = [f"- **{v.id}** ({v.verdict}): {v.note}" for v in verdicts if v.note]
    if notes:
        lines += ["", "## Reading the verdicts", ""] + notes
    return "\n".join(lines) + "\n"
