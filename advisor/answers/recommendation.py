"""The recommendation: pick one evidence group, filter its configurations, rank them, explain the result."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field, replace

from advisor.answers.comparison import (
    decided_by,
    ranked_by,
    ranking_alpha,
    test_of_the_pick,
    tests_against_best,
)
from advisor.answers.constraints import (
    MEASURES_PREDICTED,
    PREDICTED,
    Constraints,
    cell_rows,
    checks_memory,
    exclusion,
    menu_disagreement,
    menu_summary,
    model_summary,
)
from advisor.answers.evidence import (
    Asked,
    GroupEvidence,
    Selector,
    Stat,
    for_its_model_only,
    params_text,
    scale_statement,
    select_group,
)
from advisor.answers.frontier import frontier_points
from advisor.answers.pareto import FrontierPoint
from advisor.answers.trend import trend
from advisor.kb.queries.for_answers import Cell, group_figures, group_settings, validation
from advisor.kb.queries.groups import Group
from advisor.rules import Metric, Rules, load_rules


@dataclass
class Entry:
    """A configuration as an answer shows it."""

    optimizer: str
    strategy: str
    metric: str
    value: float | None
    unit: str
    source: str
    seeds: int = 0
    spread: float | None = None
    tied: bool = False
    reason: str | None = None
    stated: str | None = (
        None  # the figure as its source states it, when converted ('18.64 percent of 256 GB')
    )
    ci95: tuple[float, float] | None = None  # 95 % interval of the mean over seeds
    predicted: bool = False  # the value is advisor fit's prediction, not a measurement
    # The test against the pick (the pick's: against its runner-up): kind, n, p, p_holm, difference, ...
    test: dict | None = None
    seeds_ok: int = 0  # seeds (runs, where a source has none) with an ok run: what the mean is over
    seeds_total: int = 0  # those, and the seeds that finished without one
    failed: list[dict] = field(default_factory=list)  # {seed, status, error} of each failed seed
    flag: str | None = None  # '2 of 3 seeds ok; seed 1 diverged' when a seed failed
    measured: dict | None = (
        None  # ranked by prediction: what the evidence measured for it ({value, unit, ...})
    )

    def as_dict(self) -> dict:
        d = dict(
            optimizer=self.optimizer,
            strategy=self.strategy,
            metric=self.metric,
            value=self.value,
            unit=self.unit,
            source=self.source,
            seeds=self.seeds,
            spread=self.spread,
            tied=self.tied,
            stated=self.stated,
            ci95=list(self.ci95) if self.ci95 else None,
            predicted=self.predicted,
            test=self.test,
            seeds_ok=self.seeds_ok,
            seeds_total=self.seeds_total,
            failed=self.failed,
            flag=self.flag,
            measured=self.measured,
        )
        if self.reason is not None:
            d["reason"] = self.reason
        return d


@dataclass
class Answer:
    """A recommendation for one family and metric: the pick, its alternatives, exclusions, holes and caveats."""

    family: str
    metric: Metric
    group: Group | None
    measure: str | None
    recommendation: Entry | None = None
    alternatives: list[Entry] = field(default_factory=list)
    excluded: list[Entry] = field(default_factory=list)
    holes: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    frontier: list[FrontierPoint] = field(default_factory=list)
    frontier_axes: tuple[str, str] = ("time", "loss")
    why_none: str | None = None
    other_groups: list[Group] = field(default_factory=list)
    unmatched: dict[int, str] = field(default_factory=dict)  # the user's groups passed over, and why
    scale: int | None = None  # the parameters the question is about (Selection.scale)
    scale_note: dict | None = None  # that scale against the evidence's (scale_statement)
    disagreements: list[dict] = field(default_factory=list)  # other groups' differing picks (compare_groups)
    validation: dict | None = None  # the latest `advisor validate` on the evidence's hardware
    tie_break: str | None = None  # what picked the pick among configurations of practically equal means
    tied_with: list[Entry] = field(default_factory=list)  # every configuration tied with the pick
    mixed_protocols: dict[str, list[str]] = field(default_factory=dict)  # settings -> configurations, if > 1
    notes: list[str] = field(default_factory=list)  # what the answer did not do with the question, and why
    model: dict | None = None  # the user's model: name, parameters, accelerator, the evidence model's size
    menu: dict | None = None  # the fine-tuning menu predicted for the user's model (menu_summary)
    safe_alternative: Entry | None = None  # when a seed of the pick failed: the best with every seed ok
    ranking: list[tuple[str, str]] = field(default_factory=list)  # every ranked configuration, the pick first
    trend: dict | None = None  # the pick's lead across the sizes of its evidence's source (transfer.Trend)
    quality_unknown: dict | None = None  # a cost metric's pick with no loss figure (_unknown_quality)
    other_rows: list[dict] = field(
        default_factory=list
    )  # a table's best row besides the one ranked (other_rows)

    def as_dict(self, rules: Rules | None = None) -> dict:
        """What `advisor recommend --json` prints (`rules`: the rules the answer was made with; default the
        installed ones, the user's included)."""
        rules = rules or load_rules()
        measure = rules.measures.get(self.measure) if self.measure else None
        return {
            "family": self.family,
            "metric": {
                "name": self.metric.name,
                "direction": self.metric.direction,
                "unit": self.metric.unit,
                "measure": self.measure,
                "measure_label": measure.label if measure else None,
                "measure_note": measure.note if measure else None,
            },
            "evidence": self.group.as_dict() if self.group else None,
            "recommendation": self.recommendation.as_dict() if self.recommendation else None,
            "safe_alternative": self.safe_alternative.as_dict() if self.safe_alternative else None,
            "alternatives": [e.as_dict() for e in self.alternatives],
            "excluded": [e.as_dict() for e in self.excluded],
            "holes": self.holes,
            "caveats": self.caveats,
            "frontier": {
                "x": self.frontier_axes[0],
                "y": self.frontier_axes[1],
                "points": [p.as_dict() for p in self.frontier],
            },
            "why_none": self.why_none,
            "validation": self.validation,
            "tie_break": self.tie_break,
            "tied_with": [e.as_dict() for e in self.tied_with],
            "mixed_protocols": self.mixed_protocols,
            "notes": self.notes,
            "model": self.model,
            "menu": self.menu,
            "question_parameters": self.scale,
            "scale": self.scale_note,
            "other_evidence": [
                g.as_dict() | {"select": selector_flags(g), "passed_over": self.unmatched.get(g.id)}
                for g in self.other_groups
            ],
            "disagreements": self.disagreements,
            "trend": self.trend,
            "quality_unknown": self.quality_unknown,
            "other_rows": self.other_rows,
        }


def recommend(
    conn: sqlite3.Connection,
    family: str,
    metric: str,
    rules: Rules,
    constraints: Constraints | None = None,
    source: str | None = None,
    asked: Asked | None = None,
    evidence: dict[Group, GroupEvidence] | None = None,
    selector: Selector | None = None,
    compare_groups: bool = False,
    explain: bool = False,
) -> Answer:
    """Rank the configurations of the best evidence group for one metric, under the constraints.

    `evidence` caches each group's aggregates when one caller asks several questions (the flowchart);
    `compare_groups` ranks the other groups too, and names those whose pick differs (`disagreements`);
    `explain` adds the notes a person asking reads: a single run's pick beside the seeded evidence's, and why
    the menu's pick differs. No `constraints`: none."""
    constraints = constraints or Constraints()
    chosen = select_group(conn, rules, family, source, asked, selector, metric=metric)
    answer = _answer(conn, rules, chosen.group, chosen.others, metric, constraints, evidence)
    pinned = source or (
        selector and (selector.group or selector.preset or selector.hardware or selector.mine)
    )
    if answer.recommendation is None and constraints.fit is not None and not pinned:
        answer = _from_evidence_that_has_one(conn, rules, chosen, metric, constraints, evidence) or answer
    answer.unmatched, answer.scale = chosen.unmatched, chosen.scale
    predicted = answer.measure in MEASURES_PREDICTED
    answer.scale_note = scale_statement(rules, asked and asked.n_params, answer.group, predicted)
    if answer.scale_note and answer.scale_note["warning"]:
        from advisor.answers import transfer  # only an answer far from its evidence's scale reads it

        if metric in transfer.METRICS:
            found = transfer.transfers(conn, rules, metrics=(metric,))
            answer.scale_note["transfer"] = transfer.summary_line(found, metric)
    if answer.recommendation is not None and not predicted and answer.group is not None:
        found = trend(conn, rules, answer.group, metric, answer.ranking, evidence)
        answer.trend = found.as_dict(asked and asked.n_params) if found else None
    if constraints.fit is not None:
        answer.model = model_summary(constraints.fit, answer.group)
        answer.menu = menu_summary(constraints.menu, metric) if constraints.menu is not None else None
    prefs = rules.flowchart["evidence"]
    never = prefs.get("answer_never", [])
    eligible = [  # groups that could answer this question: not a particular model's (a base, fine-tuned)
        g
        for g in answer.other_groups
        if g.id not in chosen.unmatched
        and g.source not in never
        and not for_its_model_only(g, asked or Asked(), selector or Selector(), prefs)
    ]
    if compare_groups and answer.recommendation is not None and not predicted:
        answer.disagreements = disagreements(conn, rules, eligible, rules.metric(metric), constraints, answer)
    if explain and answer.recommendation is not None and not predicted:
        answer.notes += seeded_second_look(conn, rules, eligible, rules.metric(metric), constraints, answer)
        answer.notes += menu_disagreement(
            answer.menu, answer.recommendation, answer.alternatives, answer.group.label, metric
        )
    return answer


def seeded_second_look(
    conn: sqlite3.Connection,
    rules: Rules,
    others: list[Group],
    metric: Metric,
    c: Constraints,
    answer: Answer,
) -> list[str]:
    """Where a single-run group answers a metric that varies over seeds (not memory), what the best group with
    repeated seeds picks: a single run cannot tell two configurations apart from noise, so its pick is said
    beside the seeded one (never mixed with it: the two differ in source, hardware or scale)."""
    pick = answer.recommendation
    if pick.seeds != 1 or metric.name == "memory":
        return []
    seeded = next((g for g in others if g.n_seeds > 1), None)
    if seeded is None:
        return []
    theirs = pick_of(conn, rules, seeded, metric, c)
    if theirs is None:
        return []
    said = f"{seeded.label} ({params_text(seeded.n_params)} parameters)"
    if (theirs.optimizer, theirs.strategy) == (pick.optimizer, pick.strategy):
        return [f"Single-run evidence; the best evidence with repeated seeds, {said}, picks the same."]
    return [
        f"Single-run evidence: one run per configuration cannot tell it from noise. The best evidence with "
        f"repeated seeds, {said}, picks {theirs.optimizer} + {theirs.strategy} "
        f"({selector_flags(seeded)}).{_why_single(answer, seeded)}"
    ]


def _why_single(answer: Answer, seeded: Group) -> str:
    """Why a single-run group answers ahead of one with repeated seeds: the scale it shares with the question,
    where the seeded group's is further from it (' ' and a sentence; '' where the sizes say nothing)."""
    asked, theirs, ours = answer.scale, seeded.n_params, answer.group.n_params
    if not (asked and theirs and ours):
        return ""
    far = max(asked / theirs, theirs / asked)
    near = max(asked / ours, ours / asked)
    if far <= near:
        return ""
    return (
        f" This answer ranks the single runs first because they are at your model's scale ({params_text(ours)} "
        f"against {params_text(asked)}); the repeated seeds are {far:.0f}x from it."
    )


def _answer(
    conn, rules: Rules, group: Group, others: list[Group], metric: str, c: Constraints, evidence
) -> Answer:
    """One group's answer: its configurations ranked under the constraints (by advisor fit's prediction for a
    metric it predicts for the user's model), with its validation and mixed settings."""
    if c.fit is not None and metric in PREDICTED:  # ranked by prediction: a group of its own
        ev = GroupEvidence(conn, group, rules)
        measure, value = PREDICTED[metric]
        rows = cell_rows(c.fit, rules).items()
        ev.use_prediction(metric, measure, {k: v for k, r in rows if (v := value(r)) is not None})
    else:
        cache = {} if evidence is None else evidence
        ev = cache.get(group) or cache.setdefault(group, GroupEvidence(conn, group, rules))
    answer = rank_group(ev, rules.metric(metric), c, others)
    if ev.measure(metric) in MEASURES_PREDICTED:  # the evidence's own measurement, beside the prediction
        cache = {} if evidence is None else evidence
        measured = cache.get(group) or cache.setdefault(group, GroupEvidence(conn, group, rules))
        for e in [answer.recommendation, *answer.alternatives, *answer.excluded, *answer.tied_with]:
            if e is not None:
                e.measured = _measured_beside(measured, rules.metric(metric), (e.optimizer, e.strategy))
    answer.validation = validation(conn, group.hardware)
    protocols = group_settings(conn, group)
    answer.mixed_protocols = protocols if len(protocols) > 1 else {}
    return answer


def _measured_beside(ev: GroupEvidence, metric: Metric, key: tuple[str, str]) -> dict | None:
    """What the evidence measured for a configuration ranked by prediction: its value (in the metric's
    unit, at the evidence's scale and hardware), seeds, and the measure read."""
    cell = ev.cells.get(key)
    stat = ev.stat(cell, metric.name) if cell else None
    if stat is None:
        return None
    return dict(value=stat.mean, unit=metric.unit, seeds=stat.n, measure=ev.measure(metric.name))


def _from_evidence_that_has_one(
    conn, rules: Rules, chosen, metric: str, c: Constraints, evidence
) -> Answer | None:
    """Where the best evidence has no configuration that fits the user's model (the paper's 1B Llama ran
    Adam, which an 8B model on one GPU cannot), the next eligible group that has one answers, and says why."""
    prefs = rules.flowchart["evidence"]
    never = prefs.get("answer_never", [])
    # a family's grids first; then a particular model's group (a base fine-tuned full and with LoRA), whose
    # LoRA may be what fits where no full fine-tuning does
    particular = [g for g in chosen.others if for_its_model_only(g, Asked(), Selector(), prefs)]
    for group in [g for g in chosen.others if g not in particular] + particular:
        if group.id in chosen.unmatched or group.source in never:
            continue
        rest = [chosen.group] + [g for g in chosen.others if g is not group]
        answer = _answer(conn, rules, group, rest, metric, c, evidence)
        if answer.recommendation is not None:
            answer.notes.append(
                f"The best evidence ({chosen.group.label}) has no {metric} figure for a configuration that fits "
                f"your model; this answer is from the best evidence that has one"
                + (
                    ": a small base pretrained here, fine-tuned in full and with LoRA."
                    if group in particular
                    else "."
                )
            )
            return answer
    return None


COMPARED_GROUPS = 5  # other evidence groups an answer ranks to show where they disagree


def disagreements(
    conn: sqlite3.Connection,
    rules: Rules,
    others: list[Group],
    metric: Metric,
    c: Constraints,
    answer: Answer,
) -> list[dict]:
    """The other evidence groups whose pick for the same question differs from the answer's: shown side by
    side, never mixed in (their numbers are of other hardware, scale or source). Only the best-ranked
    COMPARED_GROUPS are asked: an answer stays fast beside a KB of many groups."""
    mine = (answer.recommendation.optimizer, answer.recommendation.strategy)
    out = []
    for group in others[:COMPARED_GROUPS]:
        theirs = pick_of(conn, rules, group, metric, c)
        if theirs is not None and (theirs.optimizer, theirs.strategy) != mine:
            out.append(
                {"evidence": group.as_dict(), "select": selector_flags(group), "pick": theirs.as_dict()}
            )
    return out


def pick_of(conn: sqlite3.Connection, rules: Rules, group: Group, metric: Metric, c: Constraints):
    """Another group's pick under the same constraints (what does not fit here does not fit there)."""
    return rank_group(GroupEvidence(conn, group, rules), metric, replace(c, menu=None)).recommendation


def selector_flags(group: Group) -> str:
    """The flags that make `advisor recommend` answer from this group."""
    return f"--source {group.source} --group {group.ref}"


def rank_group(ev: GroupEvidence, metric: Metric, constraints: Constraints, others=()) -> Answer:
    rules = ev.rules
    ranking_alpha(rules)  # a bad rules file is said before anything is ranked
    answer = Answer(
        family=ev.group.family,
        metric=metric,
        group=ev.group,
        measure=ev.measure(metric.name),
        other_groups=list(others),
    )
    candidates: list[tuple[Cell, Stat]] = []
    passed: list[Cell] = []  # every configuration no filter or constraint excluded
    unusable = ev.unusable(metric.name)
    memory_checked = checks_memory(ev, constraints, answer.notes)
    for key, cell in sorted(ev.cells.items()):
        stat = ev.stat(cell, metric.name)
        reason = unusable.get(key) or exclusion(ev, cell, constraints, memory_checked)
        if reason:
            answer.excluded.append(_entry(ev, cell, metric, stat, reason=reason))
            continue
        passed.append(cell)
        if stat is None:
            answer.holes.append(f"no {metric.name} figure for {cell.name}")
        else:
            candidates.append((cell, stat))
    answer.holes += [f"no run of {o} + {s}" for o, s in ev.grid_gaps()]
    ranked = ranked_by(ev, metric, candidates)
    if ranked:
        _rank_answer(ev, metric, ranked, answer)
        answer.quality_unknown = _unknown_quality(ev, metric, [c for c, _ in ranked])
        answer.other_rows = other_rows(ev, answer)
    else:
        answer.why_none = _why_none(ev, metric, answer)
    x = "time" if metric.name == "loss" else metric.name
    answer.frontier_axes = (x, "loss")
    answer.frontier = frontier_points(ev, passed, x, "loss")
    pick = answer.recommendation
    contended = bool(pick) and ev.contended((pick.optimizer, pick.strategy))
    answer.caveats = matching_caveats(rules, ev.group, metric.name, pick, contended, ev.measure(metric.name))
    return answer


OTHER_ROW = (
    "_best_other_row"  # a published figure's measure + this: its table's best row besides the chosen one
)


def other_rows(ev: GroupEvidence, answer: Answer) -> list[dict]:
    """For the pick and each runner-up shown, the best other row of the table its figure was read from, where
    the source stores one (Wen et al.: each ablation table's lowest loss below the authors' chosen setting):
    what a reader of the table sees beside the figure ranked."""
    if not answer.measure:
        return []
    found = group_figures(ev.conn, ev.group, answer.measure + OTHER_ROW)
    shown = [e for e in (answer.recommendation, *answer.alternatives) if e is not None]
    return [
        {"optimizer": e.optimizer, "strategy": e.strategy, "ranked": e.value, "value": v, "where": where}
        for e in shown
        if (row := found.get((e.optimizer, e.strategy))) is not None
        for v, where in [row]
    ]


def _unknown_quality(ev: GroupEvidence, metric: Metric, ranked: list[Cell]) -> dict | None:
    """Where a pick on a cost (time, memory, throughput) has no loss figure in its evidence, the pick's
    quality is unknown: said, with the best configuration on the metric whose loss is known and usable (the
    seed paper's NanoVLM gives no loss for SGD, its fastest). None for a quality metric or a pick with a loss."""
    quality = ev.rules.flowchart["filters"]["divergence"]["applies_to"]
    pick = ranked[0]
    if metric.name in quality or ev.measure("loss") is None or ev.stat(pick, "loss") is not None:
        return None
    bad = ev.unusable("loss")
    known = next((c for c in ranked if ev.stat(c, "loss") is not None and c.key not in bad), None)
    text = f"{pick.name} has no loss figure in this evidence: how well it trains is unknown."
    if known is None:
        return {"text": text + " No configuration ranked here has a usable one.", "best_known": None}
    value, loss = ev.value(known, metric.name), ev.value(known, "loss")
    shown = f"{value:.4g} {metric.unit or ''}".strip()
    text += f" The best on {metric.name} whose loss is known: {known.name} ({shown}, loss {loss:.4g})."
    best = {"optimizer": known.optimizer, "strategy": known.strategy, "value": value, "loss": loss}
    return {"text": text, "best_known": best}


def _rank_answer(ev: GroupEvidence, metric: Metric, ranked: list[tuple[Cell, Stat]], answer: Answer) -> None:
    """The pick, its runners-up and ties: every other candidate tested against the pick, Holm-adjusted."""
    best_cell, best_stat = ranked[0]
    answer.ranking = [c.key for c, _ in ranked]
    tests = tests_against_best(ev, metric, ranked)
    entries = [
        _entry(ev, c, metric, s, tied=tied, test=t)
        for (c, s), (t, tied) in zip(ranked[1:], tests, strict=True)
    ]
    answer.alternatives = entries[: ev.rules.flowchart["ranking"]["alternatives"]]
    answer.tied_with = [e for e in entries if e.tied]
    pick_test = test_of_the_pick(ev, metric, ranked, tests[0][0]) if tests else None
    answer.recommendation = _entry(
        ev, best_cell, metric, best_stat, tied=bool(answer.tied_with), test=pick_test
    )
    equal = [best_cell] + [
        c for (c, _), (t, _) in zip(ranked[1:], tests, strict=True) if t["within_tolerance"]
    ]
    if len(equal) > 1:
        answer.tie_break = decided_by(ev, metric, best_cell, equal[1], equal)
    if answer.recommendation.flag:
        answer.safe_alternative = next((e for e in entries if e.flag is None), None)


def _entry(
    ev: GroupEvidence, cell: Cell, metric: Metric, stat: Stat | None, tied=False, reason=None, test=None
) -> Entry:
    return Entry(
        optimizer=cell.optimizer,
        strategy=cell.strategy,
        metric=metric.name,
        value=stat.mean if stat else None,
        unit=_unit(ev, metric),
        source=ev.group.source,
        seeds=stat.n if stat else cell.n_ok,
        spread=stat.spread if stat else None,
        tied=tied,
        reason=reason,
        stated=stat.stated if stat else None,
        ci95=stat.ci if stat else None,
        predicted=stat.predicted if stat else False,
        test=test,
        seeds_ok=cell.n_ok,
        seeds_total=cell.seeds_total,
        failed=[f.as_dict() for f in cell.failed],
        flag=_flag(
            cell, metric, stat, None if reason else ev.diverged().get((cell.optimizer, cell.strategy))
        ),
    )


def _unit(ev: GroupEvidence, metric: Metric) -> str:
    """The unit of the values ranked: the measure's own where it states one (a prediction), else the metric's."""
    measure = ev.rules.measures.get(ev.measure(metric.name) or "")
    return (measure.unit if measure else None) or metric.unit


def _flag(cell: Cell, metric: Metric, stat: Stat | None, diverged: str | None = None) -> str | None:
    """The cell's failed seeds, ok seeds without a figure for the metric (e.g. a run that never reached the
    target loss has no time to target): a mean over the rest would flatter the configuration; and, in an
    answer that keeps it (time, memory), a loss that diverged: fast, but it did not train."""
    flags = [cell.flag] if cell.flag else []
    if diverged:
        flags.append(f"its loss {diverged.removeprefix('diverged: its loss ')}: it did not train")
    if stat and not stat.predicted and stat.n < cell.n_ok:
        flags.append(f"{metric.name} on {stat.n} of {cell.n_ok} ok seeds (the others have no figure)")
    return "; ".join(flags) or None


def _why_none(ev: GroupEvidence, metric: Metric, answer: Answer) -> str:
    if answer.measure is None:
        return (
            f"the evidence group ({ev.group.label}) has no {metric.name} figure at all; "
            "try another --source or --optimize."
        )
    counts: dict[str, int] = {}
    for e in answer.excluded:
        reason = e.reason or ""
        kind = reason.split(" (")[0].split(":")[0] if not reason.startswith("not in") else reason
        if reason.startswith("predicted"):
            kind = "predicted not to fit your model on your accelerator (advisor fit)"
        counts[kind] = counts.get(kind, 0) + 1
    parts = [f"{n} {'configuration' if n == 1 else 'configurations'}: {k}" for k, n in counts.items()]
    no_fig = sum(h.startswith("no ") and "figure" in h for h in answer.holes)
    if no_fig:
        parts.append(f"{no_fig} without a {metric.name} figure")
    return "nothing qualifies: " + "; ".join(parts) + "."


def matching_caveats(
    rules: Rules,
    group: Group,
    metric: str,
    pick: Entry | None,
    contended: bool = False,
    measure: str | None = None,
) -> list[str]:
    """The caveats of rules/caveats.toml whose every `when` key matches this answer (the measure ranked too:
    a caveat about the evidence's host RAM never follows an answer ranked by prediction; the source exactly,
    so one paper's caveats never follow another's figures)."""
    context = {
        "measure": measure,
        "predicted": measure in MEASURES_PREDICTED,
        "contended": contended,
        "protocol": group.protocol,
        "single_run": group.n_seeds == 1,
        "family": group.family,
        "metric": metric,
        "preset": group.preset,
        "optimizer": pick.optimizer if pick else None,
        "strategy": pick.strategy if pick else None,
        "flagged": bool(pick and pick.flag),
    }
    sources = {group.source, group.kind}  # a caveat names a source exactly, or every source of a kind
    out = []
    for caveat in rules.caveats:
        when = dict(caveat.get("when", {}))
        named = when.pop("source", None)
        if named is not None and not sources & set(named if isinstance(named, list) else [named]):
            continue
        if all(context.get(k) in (v if isinstance(v, list) else [v]) for k, v in when.items()):
            out.append(caveat["text"])
    return out


__all__ = ["Answer", "Constraints", "Entry", "recommend"]
