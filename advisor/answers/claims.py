"""The paper's claims (rules/claims.toml) re-checked against one evidence source: holds, does not hold,
or not enough evidence, with the numbers on both sides."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from advisor.answers.evidence import GroupEvidence, Stat, select_group
from advisor.answers.flowchart import walk
from advisor.answers.recommendation import Answer, Entry, recommend
from advisor.errors import NoEvidence, RulesError
from advisor.kb.queries.groups import Group
from advisor.places import shipped_rules_dir
from advisor.rules import Rules
from advisor.rules_files import read_rules_file

HOLDS, FAILS, UNKNOWN = "holds", "does not hold", "not enough evidence"
NOT_COMPARABLE = "not comparable"  # the evidence was measured under another protocol than the claim's
VERDICTS = (HOLDS, FAILS, UNKNOWN, NOT_COMPARABLE)
# What each protocol holds equal, for a verdict that cannot compare two of them (advisor/measuring/training/protocol.py).
PROTOCOL_MEANS = {
    "fair": "equal optimizer updates, held-out loss, tuned rates",
    "paper": "equal micro-batches, training loss, one rate",
    "trainer": "a user's Trainer run: their data, rate and schedule",
}
KINDS = ("ratio", "ratio_all", "range", "best", "diverged", "never_best", "path_counts")  # claims.toml


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
    """The paper's claims (rules/claims.toml), checked against its schema as every rules file is."""
    return _claims_file(directory)["claims"]


def claims_source(directory: str | None = None) -> str:
    """The source whose claims rules/claims.toml holds: what `--source paper` checks them on, among papers."""
    return _claims_file(directory)["source"]


def _claims_file(directory: str | None) -> dict:
    path = (shipped_rules_dir() if directory is None else Path(directory)) / "claims.toml"
    return read_rules_file(path, "claims")


class Checker:
    def __init__(self, conn: sqlite3.Connection, source: str | None, rules: Rules):
        if source == "paper":  # the paper's own figures, not another paper's published beside them
            source = claims_source()
        self.conn, self.source, self.rules = conn, source, rules
        self.cache: dict = {}  # Group -> GroupEvidence, shared with every recommend() the checks make
        self.evidence = cache(self._evidence)
        self._walked: list | None = None
        self.groups: dict[str, Group] = {}  # label -> group, of every group a check has used

    def _evidence(self, family: str, metric: str | None = None) -> GroupEvidence | None:
        """The family's evidence group for a claim about `metric`: one that measured it, where any did."""
        try:
            group = select_group(self.conn, self.rules, family, self.source, metric=metric).group
        except NoEvidence:
            return None
        self.groups[group.label] = group
        return self.cache.get(group) or self.cache.setdefault(
            group, GroupEvidence(self.conn, group, self.rules)
        )

    def check(self, claim: dict) -> Verdict:
        kind = claim.get("kind")
        if kind not in KINDS:
            raise RulesError(
                f"claim {claim.get('id')!r} has kind {kind!r}; rules/claims.toml knows {', '.join(KINDS)}."
            )
        verdict, found, groups = getattr(self, f"_{kind}")(claim)
        other = self._other_protocol(claim, groups)
        if other:
            verdict, found = NOT_COMPARABLE, f"{other} (what it found: {found})"
        return Verdict(
            claim["id"],
            claim["text"],
            claim.get("paper", ""),
            verdict,
            claim.get("note", ""),
            found,
            sorted(groups),
        )

    def _other_protocol(self, claim: dict, labels: set[str]) -> str | None:
        """Why the evidence cannot judge the claim, when a group it used was measured under another protocol
        than the claim was made under (rules/claims.toml `protocol`, default the paper's); else None."""
        made = claim.get("protocol", "paper")
        other = sorted({g.protocol for label, g in self.groups.items() if label in labels} - {made})
        if not other:
            return None
        return (
            f"{other[0]}-protocol evidence ({PROTOCOL_MEANS.get(other[0], other[0])}) against a claim of the "
            f"{made} protocol ({PROTOCOL_MEANS.get(made, made)}); measure with `advisor measure --protocol "
            f"{made}` to judge it"
        )

    def _stat(self, ev: GroupEvidence, metric: str, optimizer: str, strategy: str) -> Stat | None:
        """The figure of a configuration that may be ranked (GroupEvidence.unusable: the one rule), else None."""
        cell = ev.cells.get((optimizer, strategy))
        if cell is None or (optimizer, strategy) in ev.unusable(metric):
            return None
        return ev.stat(cell, metric)

    def _ratio(self, c):
        ev = self.evidence(c["family"], c["metric"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        a = self._stat(ev, c["metric"], c["a"]["optimizer"], c["a"]["strategy"])
        b = self._stat(ev, c["metric"], c["b"]["optimizer"], c["b"]["strategy"])
        name_a = f"{c['a']['optimizer']}+{c['a']['strategy']}"
        name_b = f"{c['b']['optimizer']}+{c['b']['strategy']}"
        if a is None or b is None or b.mean == 0:
            side = c["a"] if a is None else c["b"]
            why = (
                ev.unusable(c["metric"]).get((side["optimizer"], side["strategy"]))
                or f"no {c['metric']} figure"
            )
            return UNKNOWN, f"{name_a if a is None else name_b}: {why}", {ev.group.label}
        verdict, text = _judge(a, b, c["min"], c["max"])
        keys = [(c[s]["optimizer"], c[s]["strategy"]) for s in ("a", "b")]
        return (
            verdict,
            f"{name_a} {a.mean:.4g} / {name_b} {b.mean:.4g} = {text} (claim: x{c['min']:g}-{c['max']:g})"
            + _flags(ev, keys),
            {ev.group.label},
        )

    def _ratio_all(self, c):
        judged, groups, flags = [], set(), []
        for family in c["families"]:
            ev = self.evidence(family, c["metric"])
            if ev is None:
                continue
            groups.add(ev.group.label)
            for opt in c.get("optimizers") or sorted({o for o, _ in ev.cells}):
                a, b = self._stat(ev, c["metric"], opt, c["a"]), self._stat(ev, c["metric"], opt, c["b"])
                if a is not None and b is not None and b.mean != 0:
                    verdict, text = _judge(a, b, c["min"], c["max"])
                    judged.append((verdict, f"{family} {opt} {text}"))
                    flags.append(_flags(ev, [(opt, c["a"]), (opt, c["b"])], family))
        if not judged:
            return (
                UNKNOWN,
                f"no configuration has both a {c['a']} and a {c['b']} {c['metric']} figure",
                groups,
            )
        claim = f"(claim: x{c['min']:g}-{c['max']:g} for each)" + "".join(flags)
        fails = [t for v, t in judged if v == FAILS]
        unsure = [t for v, t in judged if v == UNKNOWN]
        if fails:
            return FAILS, f"{len(fails)} of {len(judged)} outside: {', '.join(fails)} {claim}", groups
        if unsure:
            return (
                UNKNOWN,
                f"{len(unsure)} of {len(judged)} across an edge, within noise: {', '.join(unsure)} {claim}",
                groups,
            )
        return HOLDS, f"{', '.join(t for _, t in judged)} {claim}", groups

    def _range(self, c):
        ev = self.evidence(c["family"], c["metric"])
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        measure = ev.measure(c["metric"])
        if c.get("measure") and measure != c["measure"]:
            have = f"only {measure}" if measure else f"no {c['metric']} figure"
            return UNKNOWN, f"no {c['measure']} figure ({have} in this evidence)", {ev.group.label}
        unusable = ev.unusable(c["metric"])
        stats = {k: s for k, s in sorted(ev.stats(c["metric"]).items()) if k not in unusable}
        if not stats:
            return UNKNOWN, f"no {c['metric']} figure", {ev.group.label}
        means = [s.mean for s in stats.values()]
        found = f"{len(stats)} configurations, {min(means):.4g}-{max(means):.4g} (claim: {c['min']:g}-{c['max']:g})"
        found += _flags(ev, list(stats))
        # Symmetric: outside when a configuration's interval (or single value) lies wholly outside the
        # range; inside when every one lies wholly inside; otherwise the seeds cannot tell.
        where = {k: _place(s.ci or (s.mean, s.mean), c["min"], c["max"]) for k, s in stats.items()}
        outside = [f"{o}+{t} {stats[(o, t)].mean:.4g}" for (o, t), w in where.items() if w == FAILS]
        unsure = [f"{o}+{t} {stats[(o, t)].mean:.4g}" for (o, t), w in where.items() if w == UNKNOWN]
        if outside:
            return FAILS, found + "; outside: " + ", ".join(outside), {ev.group.label}
        if unsure:
            return UNKNOWN, found + "; across the edge within noise: " + ", ".join(unsure), {ev.group.label}
        return HOLDS, found, {ev.group.label}

    def _answer(self, family: str, metric: str) -> Answer | None:
        try:
            answer = recommend(self.conn, family, metric, self.rules, source=self.source, evidence=self.cache)
        except NoEvidence:
            return None
        self.groups[answer.group.label] = answer.group
        return answer

    def _best(self, c):
        """Holds when each claimed configuration is the pick and nothing unclaimed is statistically tied
        with it; does not hold when a pick is unclaimed and nothing claimed is statistically tied with it;
        otherwise not enough evidence. Ties of practically equal means are decided by the tie-break rules,
        as the flowchart decides them."""
        parts, wrong, unsure, missing, groups = [], [], [], [], set()
        for e in c["expect"]:
            answer = self._answer(e["family"], e["metric"])
            pick = answer.recommendation if answer else None
            if pick is None:
                missing.append(f"{e['family']} {e['metric']}")
                continue
            groups.add(answer.group.label)
            tag = f"{e['family']} {e['metric']}: {pick.optimizer}+{pick.strategy}" + (
                " (tied)" if pick.tied else ""
            )
            tag += f" [{pick.flag}]" if pick.flag else ""
            parts.append(tag)
            contested = _contested(answer, lambda x, e=e: _matches(x, e))
            claimed = f"{e.get('optimizer', '')}{'+' + e['strategy'] if 'strategy' in e else ''}"
            if contested:
                others = ", ".join(f"{x.optimizer}+{x.strategy} ({_p(x)})" for x in contested)
                unsure.append(f"{tag}, not separated from {others}; claim {claimed}")
            elif not _matches(pick, e):
                wrong.append(f"{tag}, claim {claimed}")
        if wrong:
            return FAILS, "; ".join(wrong + unsure), groups
        if unsure or missing:
            gaps = [f"no answer for {', '.join(missing)}"] if missing else []
            shown = " ".join(unsure)
            return UNKNOWN, "; ".join(gaps + unsure + [p for p in parts if p not in shown]), groups
        return HOLDS, "; ".join(parts), groups

    def _diverged(self, c):
        ev = self.evidence(c["family"], "loss")
        if ev is None:
            return UNKNOWN, f"no {c['family']} evidence", set()
        diverged = ev.diverged() | ev.declared()
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
        """Symmetric as `best`: a path counts against the claim when its pick uses the optimizer and is
        separated from every configuration that does not; it leaves the claim open when the optimizer's
        side and the other are statistically tied."""
        paths = self._paths()
        picks = [p for p in paths if p.pick]
        groups = {p.answer.group.label for p in picks}

        def uses(entry) -> bool:
            return entry.optimizer == c["optimizer"]

        hits = [p for p in picks if uses(p.pick) and not _contested(p.answer, uses)]
        open_ = [p for p in picks if _contested(p.answer, uses)]
        if hits:
            return FAILS, f"{c['optimizer']} is best for {_path_names(hits + open_, flags=True)}", groups
        if open_:
            return (
                UNKNOWN,
                f"{c['optimizer']} is not separated from the pick for {_path_names(open_, flags=True)}",
                groups,
            )
        if not picks:
            return UNKNOWN, "no best paths", groups
        return HOLDS, f"{c['optimizer']} on none of {len(picks)} answered best paths", groups

    def _paths(self) -> list:
        """The flowchart's best paths on this evidence (walked once per check_all)."""
        if self._walked is None:
            self._walked = walk(self.conn, self.rules, source=self.source, evidence=self.cache)
            self.groups |= {p.answer.group.label: p.answer.group for p in self._walked if p.answer}
        return self._walked

    def _path_counts(self, c):
        """Figure 1's own counts: on how many of the flowchart's best paths the optimizer (or strategy)
        lies. A path is uncertain when it has no answer, or when its pick is statistically tied with a
        configuration on the other side; the count found is a range, and the claim holds only when that
        range is exactly its count."""
        field = _path_counts_field(c)
        want = c[field]
        paths = self._paths()
        groups = {p.answer.group.label for p in paths if p.answer and p.answer.group}

        def on(entry) -> bool:
            return getattr(entry, field) == want

        firm = [p for p in paths if p.pick and on(p.pick) and not _contested(p.answer, on)]
        open_ = [p for p in paths if not p.pick or _contested(p.answer, on)]
        tied = [p for p in firm if p.pick.tied]
        lo, hi = len(firm), len(firm) + len(open_)
        found = f"{want} on {lo} of {len(paths)} best paths"
        found += f" ({len(tied)} of them tied: {_path_names(tied)})" if tied else ""
        if open_:
            found += f"; {len(open_)} open (no answer, or not separated): {_path_names(open_)}; so {lo}-{hi}"
        found += f" (claim: {c['count']} of {c['paths']})"
        flagged = [p for p in firm if p.pick.flag]
        found += "".join(f"; {p.family} {p.metric}: {p.pick.flag}" for p in flagged)
        if len(paths) != c["paths"]:
            return (
                UNKNOWN,
                f"{found}; the flowchart walks {len(paths)} paths, the claim counts {c['paths']}",
                groups,
            )
        if lo == hi == c["count"]:
            return HOLDS, found, groups
        if c["count"] < lo or c["count"] > hi:
            return FAILS, found, groups
        return UNKNOWN, found, groups


def _path_names(paths, flags: bool = False) -> str:
    """'vision time, decoder loss' (with each pick's failed-seed flag, when asked)."""
    return ", ".join(
        f"{p.family} {p.metric}" + (f" [{p.pick.flag}]" if flags and p.pick and p.pick.flag else "")
        for p in paths
    )


def _path_counts_field(c: dict) -> str:
    """'optimizer' or 'strategy': what a path_counts claim counts (a bad claim is said in one sentence)."""
    fields = [f for f in ("optimizer", "strategy") if f in c]
    if len(fields) != 1:
        raise RulesError(
            f"claim {c.get('id')!r}: a path_counts claim names exactly one optimizer or strategy."
        )
    for key in ("count", "paths"):
        value = c.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise RulesError(f"claim {c.get('id')!r}: {key} must be a whole number >= 0, not {value!r}.")
    if c["count"] > c["paths"]:
        raise RulesError(f"claim {c.get('id')!r}: count {c['count']} exceeds paths {c['paths']}.")
    return fields[0]


def _contested(answer: Answer, side) -> list[Entry]:
    """Configurations statistically tied with the pick (not merely of practically equal means, which the
    tie-break rules decide) that lie on the other side of the claim than the pick: the evidence cannot
    say which of the two is best."""
    pick = answer.recommendation
    if pick is None:
        return []
    return [
        e
        for e in answer.tied_with
        if not (e.test and e.test["within_tolerance"]) and bool(side(e)) != bool(side(pick))
    ]


def _p(e: Entry) -> str:
    t = e.test or {}
    return f"p={t['p_holm']:.2g}" if t.get("p_holm") is not None else "no test"


def _flags(ev: GroupEvidence, keys, prefix: str = "") -> str:
    """'; adam+standard: 2 of 3 seeds ok; seed 1 diverged (mean over the ok seeds)' for each flagged one."""
    out = ""
    for key in dict.fromkeys(keys):
        cell = ev.cells.get(key)
        if cell is not None and cell.flag:
            name = f"{prefix + ' ' if prefix else ''}{cell.optimizer}+{cell.strategy}"
            out += f"; {name}: {cell.flag} (mean over the {cell.n_ok} ok)"
    return out


def _matches(entry, expect: dict) -> bool:
    return entry.optimizer == expect.get("optimizer", entry.optimizer) and entry.strategy == expect.get(
        "strategy", entry.strategy
    )


def _judge(a: Stat, b: Stat, lo: float, hi: float) -> tuple[str, str]:
    """The ratio a/b against [lo, hi], judged symmetrically. With intervals over seeds, the ratio's range
    over both 95 % intervals decides: inside [lo, hi] holds, wholly outside does not hold, across an edge
    is not enough evidence. Without intervals (one run each) the point estimate decides both ways."""
    ratio = a.mean / b.mean
    if a.ci is None and b.ci is None:
        return (HOLDS if lo <= ratio <= hi else FAILS), f"x{ratio:.3g}"
    a_lo, a_hi = a.ci or (a.mean, a.mean)
    b_lo, b_hi = b.ci or (b.mean, b.mean)
    if b_lo <= 0:
        return UNKNOWN, f"x{ratio:.3g} (interval includes 0)"
    r_lo, r_hi = a_lo / b_hi, a_hi / b_lo
    text = f"x{ratio:.3g} [x{r_lo:.3g}-x{r_hi:.3g}]"
    verdict = _place((r_lo, r_hi), lo, hi)
    return verdict, text if verdict != UNKNOWN else text[:-1] + ", within noise]"


def _place(interval: tuple[float, float], lo: float, hi: float) -> str:
    """HOLDS when the interval lies inside [lo, hi], FAILS when wholly outside it, else UNKNOWN."""
    if lo <= interval[0] and interval[1] <= hi:
        return HOLDS
    if interval[1] < lo or interval[0] > hi:
        return FAILS
    return UNKNOWN


def check_all(
    conn: sqlite3.Connection, source: str | None, rules: Rules, claims: list[dict] | None = None
) -> list[Verdict]:
    checker = Checker(conn, source, rules)
    return [checker.check(c) for c in (claims or load_claims())]


def markdown(verdicts: list[Verdict], source: str | None, command: str) -> str:
    """The reproduction report: every claim, the paper's numbers, ours, and the verdict."""
    counts = {v: sum(x.verdict == v for x in verdicts) for v in VERDICTS}
    groups = sorted({g for v in verdicts for g in v.evidence})
    lines = [
        f"# The paper's claims against {source or 'the best available'} evidence",
        "",
        f"Made by `{command}`; the claims are data in `rules/claims.toml`.",
        "",
        f"**{counts[HOLDS]} hold, {counts[FAILS]} do not hold, {counts[UNKNOWN]} lack evidence, "
        f"{counts[NOT_COMPARABLE]} not comparable (measured under another protocol)** "
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
