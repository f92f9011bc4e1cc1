"""How a configuration compares with the pick: Holm's correction over the tests against the best, the
equivalence margin, the tie-breaks, and the sentence a comparison is read as (recommendation.py ranks by them)."""

from __future__ import annotations

from advisor.answers.evidence import (
    GroupEvidence,
    Stat,
)
from advisor.answers.stats import holm, relative_difference, tost
from advisor.errors import RulesError
from advisor.kb.queries.for_answers import Cell
from advisor.rules import Metric, Rules


def ranking_alpha(rules: Rules) -> float:
    """The significance level below which a Holm-adjusted p separates two configurations."""
    alpha = rules.flowchart["ranking"].get("alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise RulesError(
            f"rules/flowchart.toml: [ranking] alpha must be a number between 0 and 1 (e.g. 0.05), not {alpha!r}."
        )
    return float(alpha)


def tests_against_best(
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


def test_of_the_pick(
    ev: GroupEvidence, metric: Metric, ranked: list[tuple[Cell, Stat]], runner_up: dict
) -> dict:
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


def _equal(rules: Rules, a: Stat, b: Stat) -> bool:
    """Practically equal means: within the rules' relative tie tolerance."""
    tol = rules.flowchart["ranking"]["tie_tolerance"]
    return abs(a.mean - b.mean) <= tol * max(abs(a.mean), abs(b.mean))


def ranked_by(
    ev: GroupEvidence, metric: Metric, candidates: list[tuple[Cell, Stat]]
) -> list[tuple[Cell, Stat]]:
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
