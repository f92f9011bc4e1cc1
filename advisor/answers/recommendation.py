"""The recommendation: pick one evidence group, filter its configurations, rank them, explain the result."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field, replace

from advisor.answers.evidence import (
    Asked,
    GroupEvidence,
    Selector,
    Stat,
    for_its_model_only,
    params_text,
    select_group,
)
from advisor.answers.frontier import frontier_points
from advisor.answers.pareto import FrontierPoint
from advisor.answers.stats import holm, relative_difference, tost
from advisor.answers.trend import trend
from advisor.errors import RulesError
from advisor.kb.reader import Cell, Group, group_figures, group_settings, validation
from advisor.rules import Metric, Rules, gib, load_rules


@dataclass(frozen=True)
class Constraints:
    max_memory: float | None = None  # GB of accelerator memory (never compared with host RAM)
    max_time: float | None = None  # s/epoch, in the time metric's unit
    optimizers: tuple[str, ...] = ()
    exclude_optimizers: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    fit: object | None = None  # advisor fit's FitAnswer for the measured cells, on the user's model and GPU
    menu: object | None = None  # advisor fit's FitAnswer for the fine-tuning menu there


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
    constraints: Constraints = Constraints(),
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
    the menu's pick differs."""
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
        answer.notes += menu_disagreement(answer, metric)
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


def menu_disagreement(answer: Answer, metric: str) -> list[str]:
    """Why the menu's pick (advisor fit's, for the user's model) names another optimizer than this answer."""
    menu, pick = answer.menu, answer.recommendation
    chosen = (menu or {}).get("pick")
    if not chosen or f"· {pick.optimizer} ·" in f"{chosen['configuration']} ·":
        return []
    if pick.seeds == 1 and not pick.predicted:
        adam = next((e for e in answer.alternatives if e.optimizer in ("adamw", "adam") and e.value), None)
        theirs = f" ({adam.optimizer} here: {adam.value:.4g} against {pick.value:.4g})" if adam else ""
        return [
            f"The menu's pick ({chosen['configuration']}) differs, and stands: it puts AdamW-class optimizers "
            f"first, as fine-tuners do, and one run per configuration of {answer.group.label} gives no test of "
            f"{pick.optimizer} against them{theirs}."
        ]
    return [
        f"The menu's pick ({chosen['configuration']}) differs: it ranks what fits your model by what a "
        f"practitioner gives up and by speed, AdamW-class first, not by {metric}; this {metric} pick is read "
        f"from {answer.group.label}."
    ]


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


# Metrics an answer about the user's model on their accelerator ranks by advisor fit's prediction for that
# model, not by the evidence's measurements at another scale: metric -> (measure, the row's value).
PREDICTED = {
    "memory": ("predicted_gb", lambda r: r.total),
    "time": (
        "predicted_time_per_ksample",
        lambda r: 1000.0 / r.throughput if r.throughput and r.fits else None,
    ),
}

MEASURES_PREDICTED = {measure for measure, _ in PREDICTED.values()}


def scale_statement(rules: Rules, asked: int | None, group: Group, predicted: bool) -> dict | None:
    """The scale of the question against the evidence's, always stated where both are known: the ratio, and
    what it means for this ranking (a warning beyond rules' `scale_warning_ratio`, unless the ranking is
    advisor fit's prediction for the user's model itself)."""
    if not asked or not group.n_params:
        return None
    ratio = asked / group.n_params
    far = max(ratio, 1 / ratio) >= rules.flowchart["evidence"]["scale_warning_ratio"]
    x = max(ratio, 1 / ratio)
    times = f"{x:,.0f}× " if x >= 10 else f"{x:.1f}× "
    times += "larger" if ratio >= 1 else "smaller"
    text = (
        f"Scale: the question is about {params_text(asked)} parameters, the evidence's {group.model} has "
        + (f"{params_text(group.n_params)} ({times})")
    )
    if predicted:
        text += ": this ranking is advisor fit's prediction for the model asked about, not the evidence's"
    elif far:
        text += ": a ranking measured at one scale need not hold at the other"
    return dict(
        question=asked, evidence=group.n_params, ratio=ratio, warning=far and not predicted, text=text
    )


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
    memory_checked = _memory_check(ev, constraints, answer)
    for key, cell in sorted(ev.cells.items()):
        stat = ev.stat(cell, metric.name)
        reason = unusable.get(key) or _exclusion(ev, cell, constraints, memory_checked)
        if reason:
            answer.excluded.append(_entry(ev, cell, metric, stat, reason=reason))
            continue
        passed.append(cell)
        if stat is None:
            answer.holes.append(f"no {metric.name} figure for {cell.name}")
        else:
            candidates.append((cell, stat))
    answer.holes += [f"no run of {o} + {s}" for o, s in ev.grid_gaps()]
    ranked = _rank(ev, metric, candidates)
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
    tests = _tests_against_best(ev, metric, ranked)
    entries = [
        _entry(ev, c, metric, s, tied=tied, test=t)
        for (c, s), (t, tied) in zip(ranked[1:], tests, strict=True)
    ]
    answer.alternatives = entries[: ev.rules.flowchart["ranking"]["alternatives"]]
    answer.tied_with = [e for e in entries if e.tied]
    pick_test = _pick_test(ev, metric, ranked, tests[0][0]) if tests else None
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


def ranking_alpha(rules: Rules) -> float:
    """The significance level below which a Holm-adjusted p separates two configurations."""
    alpha = rules.flowchart["ranking"].get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise RulesError(
            f"rules/flowchart.toml: [ranking] alpha must be a number between 0 and 1 (e.g. 0.05), not {alpha!r}."
        )
    return float(alpha)


def _tests_against_best(
    ev: GroupEvidence, metric: Metric, ranked: list[tuple[Cell, Stat]]
) -> list[tuple[dict, bool]]:
    """(test, tied) for each of ranked[1:] against ranked[0]. Tied: not significantly different at alpha
    after Holm's correction over the comparisons made; with one run per configuration (or predictions),
    within the tie tolerance; with seeds but too few for a test (a pick with one ok seed of three), tied:
    nothing shows them apart. Means within the tie tolerance are tied whatever the test says: the
    tie-break rules decide those."""
    alpha = ranking_alpha(ev.rules)
    best_cell, best_stat = ranked[0]
    comparisons = [ev.compare(metric.name, c.key, best_cell.key) for c, _ in ranked[1:]]
    tested = [i for i, cmp in enumerate(comparisons) if cmp is not None]
    adjusted = dict(zip(tested, holm([comparisons[i].test.p for i in tested]), strict=True))
    by_p = sorted(tested, key=lambda i: comparisons[i].test.p)  # Holm multiplies the r-th smallest p by m - r
    multiplier = {i: len(tested) - rank for rank, i in enumerate(by_p)}
    out = []
    for i, ((cell, stat), cmp) in enumerate(zip(ranked[1:], comparisons, strict=True)):
        equal = _equal(ev.rules, best_stat, stat)
        test = _test_dict(cmp, adjusted.get(i), stat, best_stat, best_cell.name, equal)
        test["decided_by"] = _tie_break_test(ev, metric, best_cell, cell, alpha) if equal else None
        tied = (equal and test["decided_by"] is None) or (cmp is not None and adjusted[i] >= alpha)
        tied = tied or (cmp is None and _untestable(stat, best_stat))
        holm_separated = cmp is not None and adjusted[i] < alpha
        test |= reading(
            ev.rules, metric, cmp, stat, best_stat, not tied, multiplier.get(i, 1), holm_separated
        )
        _unless_at_both_rates(ev, metric, test, best_cell, cell)
        out.append((test, tied or "rate_tie" in test))  # a separation at one rate of two is no separation
    return out


def equivalence_margin(rules: Rules, metric: Metric) -> float:
    """The relative margin within which two means are equivalent (rules/flowchart.toml)."""
    margins = rules.flowchart["ranking"].get("equivalence_margins", {})
    key = metric.name if metric.name in margins else "default"
    margin = margins.get(key)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 < margin < 1:
        raise RulesError(
            f"rules/flowchart.toml: [ranking] equivalence_margins.{key} must be a fraction between 0 "
            f"and 1 (e.g. 0.01 for 1 %), not {margin!r}."
        )
    return float(margin)


def reading(
    rules: Rules,
    metric: Metric,
    cmp,
    stat: Stat,
    versus: Stat,
    separated: bool,
    comparisons: int = 1,
    holm_separated: bool = False,
) -> dict:
    """What a comparison with the pick says: 'equivalent' (TOST: the 90 % interval of the difference within
    ±margin of the pick's mean), 'different' (separated) or 'undecided', with the seeds per side that would
    decide it (`comparisons`: Holm's multiplier on this comparison, which asks a difference for more). A
    comparison Holm's correction separates is never read equivalent: 'different', with `within_margin` where
    the difference is real but inside the margin (memory's exact 0.2 %). A measure with no spread over seeds
    (memory) is compared exactly, without a t-test; one run per configuration says nothing about the spread,
    so it stays undecided whatever the values: equivalence needs an interval."""
    relative = equivalence_margin(rules, metric)
    margin = relative * abs(versus.mean)
    out = dict(margin=margin, margin_relative=relative, interval90=None, seeds_needed=None, exact=False)
    if cmp is None:
        exact = stat.predicted or versus.predicted  # predictions have no spread: their difference is exact
        diff = abs(stat.mean - versus.mean)
        out["exact"] = exact
        if exact:  # inside the margin: practically no difference
            out["reading"] = "equivalent" if diff < margin else "different"
        else:  # one run each: no spread to tell a difference from noise, nor an interval to show equivalence,
            out["reading"] = "undecided"  # whatever the values (two that round alike are not equivalent)
        return out
    eq = tost(cmp.test, margin, different=separated or holm_separated, comparisons=comparisons)
    out |= dict(interval90=list(eq.interval), seeds_needed=eq.seeds_needed, exact=cmp.test.se == 0)
    out["within_margin"] = eq.equivalent
    if holm_separated or (separated and not eq.equivalent):
        out["reading"] = "different"  # shown real: never 'equivalent', however small (within_margin says so)
    else:  # a difference shown real but inside the margin, without Holm's separation, is practically none
        out["reading"] = "equivalent" if eq.equivalent else "different" if separated else "undecided"
    return out


def _unless_at_both_rates(ev: GroupEvidence, metric: Metric, test: dict, best: Cell, cell: Cell) -> None:
    """A quality difference read 'different' is 'undecided' where the losing configuration's tuned rate won by
    less than the noise and its held-out loss trails the pick's by less than the other rate could gain
    (RateTie.reach): the order holds at one of two rates the evidence cannot tell apart (`rate_tie` says which
    and by how much; measuring it at its runner-up rate with seeds decides it). Farther behind than that, no
    choice between the two rates closes the difference, and the pick's own rate cannot undo its lead (it was
    measured at the rate it has): the difference stands."""
    quality = ev.rules.flowchart["filters"]["divergence"]["applies_to"]  # the metrics a rate's choice moves
    if test.get("reading") != "different" or metric.name not in quality:
        return
    tie, (ahead, behind) = ev.rate_tie(cell), (ev.stat(best, "loss"), ev.stat(cell, "loss"))
    if tie is None or ahead is None or behind is None or behind.mean == 0:
        return
    if (behind.mean - ahead.mean) / abs(behind.mean) < tie.reach:
        test["reading"], test["rate_tie"] = "undecided", tie.text


def _tie_break_test(ev: GroupEvidence, metric: Metric, best: Cell, cell: Cell, alpha: float) -> dict | None:
    """Where two configurations are practically equal on the metric (checkpointing's loss is standard's,
    by construction), the first tie-break metric on which the pick is significantly better, with its test:
    then the answer is decided, not tied. None when no tie-break metric separates them."""
    for name in ev.rules.flowchart["ranking"]["tie_break_metrics"]:
        if name == metric.name or ev.value(best, name) is None or ev.value(cell, name) is None:
            continue
        cmp = ev.compare(name, best.key, cell.key)
        if cmp is None or cmp.test.p >= alpha:
            return None  # the next metric in line cannot separate them: tied
        sign = 1.0 if ev.rules.metric(name).direction == "min" else -1.0
        return {"metric": name, **cmp.as_dict()} if sign * cmp.test.difference < 0 else None
    return None


def _pick_test(ev: GroupEvidence, metric: Metric, ranked: list[tuple[Cell, Stat]], runner_up: dict) -> dict:
    """The pick against its runner-up (the same test, from the pick's side), with the runner-up's Holm p."""
    (best_cell, best_stat), (cell, stat) = ranked[0], ranked[1]
    cmp = ev.compare(metric.name, best_cell.key, cell.key)
    out = _test_dict(cmp, runner_up["p_holm"], best_stat, stat, cell.name, runner_up["within_tolerance"])
    out["decided_by"] = runner_up.get("decided_by")
    out |= {k: runner_up[k] for k in ("reading", "margin", "margin_relative", "seeds_needed", "exact")}
    out |= {k: runner_up[k] for k in ("rate_tie", "within_margin") if k in runner_up}
    lo_hi = runner_up["interval90"]
    out["interval90"] = [-lo_hi[1], -lo_hi[0]] if lo_hi else None  # the same interval, from the pick's side
    return out


def _test_dict(cmp, p_holm, stat: Stat, versus: Stat, versus_name: str, equal: bool) -> dict:
    """A comparison as --json gives it; without a test, the difference of the means and why no test."""
    if cmp is not None:
        out = cmp.as_dict()
    else:
        diff = stat.mean - versus.mean
        keys = ("kind", "n", "statistic", "dof", "p", "difference", "relative", "effect_size", "effect_name")
        out = dict.fromkeys(keys) | dict(difference=diff, relative=relative_difference(diff, versus.mean))
    out |= dict(p_holm=p_holm, versus=versus_name, within_tolerance=equal, note=None)
    if cmp is None:
        out["note"] = _no_test(stat, versus)
    return out


def _untestable(a: Stat, b: Stat) -> bool:
    """Repeated-seed evidence that still allows no test: neither a prediction nor one run each."""
    return not (a.predicted or b.predicted) and not (a.n == 1 and b.n == 1)


def _no_test(a: Stat, b: Stat) -> str:
    if a.predicted or b.predicted:
        return "no test: predicted values"
    if a.n == 1 and b.n == 1:
        return "no test: one run per configuration"
    return "no test: fewer than 2 runs on one side, and fewer than 2 seeds in common"


def _exclusion(ev: GroupEvidence, cell: Cell, c: Constraints, memory_checked: bool) -> str | None:
    """Why the user's constraints, or the prediction for their model, exclude a usable configuration."""
    if c.optimizers and cell.optimizer not in c.optimizers:
        return f"not in --optimizer {', '.join(c.optimizers)}"
    if cell.optimizer in c.exclude_optimizers:
        return "not in the optimizers left by --exclude-optimizer"
    if c.strategies and cell.strategy not in c.strategies:
        return f"not in --strategy {', '.join(c.strategies)}"
    if c.fit is not None:
        row = cell_rows(c.fit, ev.rules).get((cell.optimizer, cell.strategy))
        if row is not None and not row.fits:
            q = c.fit.question
            where = q.accelerator.name if q.accelerator else "the --memory budget"
            return f"predicted {gib(row.total):.1f} GiB > {gib(q.budget_gb):.4g} GiB on {where} (advisor fit)"
        if row is not None and c.max_memory is not None and row.total > c.max_memory:
            return (
                f"predicted {gib(row.total):.1f} GiB exceeds --memory {gib(c.max_memory):.4g} (advisor fit)"
            )
    limits = [("time", c.max_time, "--max-time")] + (
        [("memory", c.max_memory, "--memory")] if memory_checked else []
    )
    for metric_name, limit, flag in limits:
        if limit is None:
            continue
        value, unit = ev.value(cell, metric_name), ev.rules.metric(metric_name).unit
        asked = f"{flag} {gib(limit):.4g} (GiB)" if flag == "--memory" else f"{flag} {limit:g} {unit}"
        if value is None:
            return f"no {metric_name} figure to check {asked} against"
        if value > limit:
            return f"exceeds {asked}"
    return None


def _memory_check(ev: GroupEvidence, c: Constraints, answer: Answer) -> bool:
    """Whether --memory is checked against the evidence's own figures: only figures of accelerator
    memory (never host RAM). With a prediction, the prediction is what is checked."""
    if c.max_memory is None or c.fit is not None:
        return False
    measure = ev.measure("memory")
    if measure is not None and ev.rules.measures[measure].accelerator:
        return True
    stated = ev.rules.measures[measure].label if measure else "no memory figure"
    answer.notes.append(
        f"--memory {gib(c.max_memory):.4g} (GiB) means accelerator memory, and this evidence states only {stated}: "
        "not applied. Pass --model with --gpu (or --memory) to check what fits by prediction."
    )
    return False


def cell_rows(fit, rules: Rules) -> dict[tuple[str, str], object]:
    """(optimizer, strategy) of a KB cell -> the best-ranked prediction, without offload, of the configuration
    the cell trained: full fine-tuning for a plain strategy and for a measured arm (predicted as the strategy
    it stands for: the same step, another data budget), the adapter on its step for an adapter strategy
    (rules' `as_fit`). The KB's cells trained every weight they trained on the accelerator."""
    best: dict[tuple[str, str, str], object] = {}
    for r in fit.rows:  # ranked
        if r.offload == "none":
            best.setdefault((r.adapter.kind, r.optimizer, r.strategy), r)
    out: dict[tuple[str, str], object] = {}
    for strategy in rules.strategies:
        adapter, step = rules.as_fit(strategy)
        out |= {(o, strategy): r for (a, o, s), r in best.items() if (a, s) == (adapter, step)}
    return out


QUALITY_GAP = (
    "Quality (loss) evidence in the KB: the paper's optimizers, Lion, Muon, schedule-free AdamW and torchao's "
    "8-bit AdamW against AdamW (the CPU reference grid), and LoRA against full fine-tuning on small bases "
    "pretrained here (advisor fit quotes both); QLoRA and 4-bit states have none yet: those rows are ranked "
    "by memory and speed, as predicted for your model."
)


def menu_summary(fit, metric: str) -> dict:
    """The fine-tuning menu for the user's model (advisor fit): the configuration a practitioner would pick,
    the best by this metric where a prediction decides it (memory, speed), and the ladder when nothing as
    asked fits. Quality is evidence's alone: the KB's (QUALITY_GAP), which the rows quote as their trades."""
    fitting = fit.fitting
    best = None
    if metric == "memory":
        best = min(fit.rows, key=lambda r: r.total)
    elif metric in ("time", "throughput", "utilization") and fitting:
        best = max(fitting, key=lambda r: r.tokens_per_s or r.throughput or 0.0)
    return {
        "pick": _menu_row(fit.pick),
        "best_for_metric": _menu_row(best),
        "fitting": len(fitting),
        "configurations": len(fit.rows),
        "ladder": [r.as_dict() for r in fit.ladder],
        "quality": QUALITY_GAP,
    }


def _menu_row(row) -> dict | None:
    if row is None:
        return None
    return {
        "configuration": row.label,
        "fits": row.fits,
        "memory_gb": row.total,
        "per_rank": row.world > 1,
        "host_gb": round(row.host_gb, 4),
        "tokens_per_s": row.tokens_per_s,
        "trade": row.trade,
        "adapter_trade": row.adapter_trade,
        "adapter_evidence": row.adapter_evidence,
    }


def model_summary(fit, group: Group) -> dict:
    """The user's model as the answer names it (its scale against the evidence's: `scale_statement`)."""
    q = fit.question
    out = {
        "name": q.model.name,
        "parameters": fit.n_params,
        "accelerator": q.accelerator.name if q.accelerator else None,
        "memory_gb": round(q.budget_gb, 3),
        "dtype": ", ".join(q.dtypes),
        "batch_size": q.batch_size,
        "seq_len": q.seq_len,
        "method": q.method,  # the step predicted: Trainer's, or TRL's (advisor fit --method)
        "evidence_parameters": group.n_params,
    }
    return out


def _equal(rules: Rules, a: Stat, b: Stat) -> bool:
    """Practically equal means: within the rules' relative tie tolerance."""
    tol = rules.flowchart["ranking"]["tie_tolerance"]
    return abs(a.mean - b.mean) <= tol * max(abs(a.mean), abs(b.mean))


def _rank(ev: GroupEvidence, metric: Metric, candidates: list[tuple[Cell, Stat]]) -> list[tuple[Cell, Stat]]:
    """Best mean first. Only configurations whose means are practically equal to the best are reordered by
    the tie-break rules: overlapping intervals make a tie to report, not a reason to prefer a worse mean."""
    sign = 1.0 if metric.direction == "min" else -1.0
    ordered = sorted(candidates, key=lambda cs: (sign * cs[1].mean, cs[0].optimizer, cs[0].strategy))
    if not ordered:
        return []
    best = ordered[0][1]
    equal = [cs for cs in ordered if _equal(ev.rules, best, cs[1])]
    rest = [cs for cs in ordered if cs not in equal]
    cells = [c for c, _ in equal]
    return sorted(equal, key=lambda cs: [v for _, v in _tie_break_key(ev, metric, cells, cs[0])]) + rest


def _tie_break_key(
    ev: GroupEvidence, metric: Metric, tied: list[Cell], cell: Cell
) -> list[tuple[str, float]]:
    """(what, value) pairs, compared in order: the other metrics every tied cell has, then preferences."""
    ranking = ev.rules.flowchart["ranking"]
    key = []
    for name in ranking["tie_break_metrics"]:
        if name == metric.name:
            continue
        values = [ev.value(c, name) for c in tied]
        if all(v is not None for v in values):  # a metric breaks a tie only if every tied cell has it
            sign = 1.0 if ev.rules.metric(name).direction == "min" else -1.0
            key.append((name, sign * ev.value(cell, name)))
    key.append(("the preferred optimizer order", _index(ranking["prefer_optimizers"], cell.optimizer)))
    key.append(("the preferred strategy order", _index(ranking["prefer_strategies"], cell.strategy)))
    return key


def decided_by(ev: GroupEvidence, metric: Metric, first: Cell, second: Cell, tied: list[Cell]) -> str:
    """Which tie-break put `first` ahead of `second` (both tied with the best)."""
    for (name, a), (_, b) in zip(
        _tie_break_key(ev, metric, tied, first), _tie_break_key(ev, metric, tied, second), strict=True
    ):
        if a != b:
            return name
    return "name order"


def _index(order: list[str], item: str) -> int:
    return order.index(item) if item in order else len(order)


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
