"""The paper's claims (rules/claims.toml) re-checked against one evidence source: holds, does not hold,
or not enough evidence, with the numbers on both sides."""

from __future__ import annotations

import sqlite3
import tomllib
from dataclasses import dataclass
from functools import cache

from advisor.evidence import GroupEvidence
from advisor.recommend import NoEvidence, recommend, select_group
from advisor.rules import Rules, load_rules, rules_dir

HOLDS, FAILS, UNKNOWN = "holds", "does not hold", "not enough evidence"


@dataclass
class Verdict:
    id: str
    text: str
    paper: str
    verdict: str
    found: str  # the numbers from the evidence, or why there are none
    evidence: list[str]

    def as_dict(self) -> dict:
        return dict(
            id=self.id,
            text=self.text,
            paper=self.paper,
            verdict=self.verdict,
            found=self.found,
            evidence=self.evidence,
        )


def load_claims(directory: str | None = None) -> list[dict]:
    path = (rules_dir() if directory is None else __import__("pathlib").Path(directory)) / "claims.toml"
    return tomllib.loads(path.read_text())["claims"]


class Checker:
    def __init__(self, conn: sqlite3.Connection, source: str | None, rules: Rules | None = None):
        self.conn, self.source, self.rules = conn, source, rules or load_rules()
        self.evidence = cache(self._evidence)

    def _evidence(self, family: str) -> GroupEvidence | None:
        try:
            group, _ = select_group(self.conn, self.rules, family, self.source)
        except NoEvidence:
            return None
        return GroupEvidence(self.conn, group, self.rules)

    def check(self, claim: dict) -> Verdict:
        kind = claim["kind"]
        verdict, found, groups = getattr(self, f"_{kind}")(claim)
        return Verdict(claim["id"], claim["text"], claim.get("paper", ""), verdict, found, sorted(groups))

    def _value(self, ev: GroupEvidence, metric: str, optimizer: str, strategy: str):
        cell = ev.cells.get((optimizer, strategy))
        return ev.value(cell, metric) if cell else None

    def _ratio(self, c):
        ev = self.evidence(c["family"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        a = self._value(ev, c["metric"], c["a"]["optimizer"], c["a"]["strategy"])
        b = self._value(ev, c["metric"], c["b"]["optimizer"], c["b"]["strategy"])
        name_a = f"{c['a']['optimizer']}+{c['a']['strategy']}"
        name_b = f"{c['b']['optimizer']}+{c['b']['strategy']}"
        if a is None or b is None or b == 0:
            return UNKNOWN, f"no {c['metric']} figure for {name_a if a is None else name_b}", {ev.group.label}
        ratio = a / b
        ok = c["min"] <= ratio <= c["max"]
        return (
            HOLDS if ok else FAILS,
            f"{name_a} {a:.4g} / {name_b} {b:.4g} = x{ratio:.3g} (claim: x{c['min']:g}-{c['max']:g})",
            {ev.group.label},
        )

    def _ratio_all(self, c):
        parts, offenders, groups = [], [], set()
        for family in c["families"]:
            ev = self.evidence(family)
            if ev is None:
                continue
            groups.add(ev.group.label)
            optimizers = c.get("optimizers") or sorted({o for o, _ in ev.cells})
            for opt in optimizers:
                a, b = self._value(ev, c["metric"], opt, c["a"]), self._value(ev, c["metric"], opt, c["b"])
                if a is None or b is None or b == 0:
                    continue
                ratio = a / b
                tag = f"{family} {opt} x{ratio:.3g}"
                parts.append(tag)
                if not c["min"] <= ratio <= c["max"]:
                    offenders.append(tag)
        if not parts:
            return (
                UNKNOWN,
                f"no configuration has both a {c['a']} and a {c['b']} {c['metric']} figure",
                groups,
            )
        claim = f"(claim: x{c['min']:g}-{c['max']:g} for each)"
        if offenders:
            return FAILS, f"{len(offenders)} of {len(parts)} outside: {', '.join(offenders)} {claim}", groups
        return HOLDS, f"{', '.join(parts)} {claim}", groups

    def _range(self, c):
        ev = self.evidence(c["family"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        measure = ev.measure(c["metric"])
        if c.get("measure") and measure != c["measure"]:
            have = f"only {measure}" if measure else f"no {c['metric']} figure"
            return UNKNOWN, f"no {c['measure']} figure ({have} in this evidence)", {ev.group.label}
        values = {k: s.mean for k, s in ev.stats(c["metric"]).items()}
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
        parts, wrong, missing, groups = [], [], [], set()
        for e in c["expect"]:
            try:
                answer = recommend(self.conn, e["family"], e["metric"], source=self.source, rules=self.rules)
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
            if pick.optimizer != e.get("optimizer", pick.optimizer) or pick.strategy != e.get(
                "strategy", pick.strategy
            ):
                wrong.append(
                    f"{tag}, claim {e.get('optimizer', '')}{'+' + e['strategy'] if 'strategy' in e else ''}"
                )
        if wrong:
            return FAILS, "; ".join(wrong), groups
        if missing:
            return (
                UNKNOWN,
                f"no answer for {', '.join(missing)}" + (f"; {'; '.join(parts)}" if parts else ""),
                groups,
            )
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

        paths = walk(self.conn, source=self.source, rules=self.rules)
        picks = [p for p in paths if p.answer and p.answer.recommendation]
        groups = {p.answer.group.label for p in picks}
        hits = [
            f"{p.family} {p.metric}" for p in picks if p.answer.recommendation.optimizer == c["optimizer"]
        ]
        if hits:
            return FAILS, f"{c['optimizer']} is best for {', '.join(hits)}", groups
        if not picks:
            return UNKNOWN, "no best paths", groups
        return HOLDS, f"{c['optimizer']} on none of {len(picks)} answered best paths", groups


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
    return "\n".join(lines) + "\n"
