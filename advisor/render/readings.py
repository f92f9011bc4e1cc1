"""A comparison's statistics in words: a p-value, the test against the pick and its reading (equivalent,
undecided, different), why a pick is tied and what its ties mean: the text the answer views and the
report's cards share."""

from __future__ import annotations

from advisor.answers.recommendation import Answer, Entry
from advisor.rules import Rules


def fmt_p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.2g}"


def test_brief(e: Entry) -> str:
    """'≈ undecided, p=0.21, +1.2 %' (tied), 'p=0.003, +8 %' (separated): the Holm-adjusted p against the pick
    and the difference from it; 'no test' without one."""
    t = e.test
    if not t:
        return ""
    diff = f", {percent(t['relative'])}" if t.get("relative") is not None else ""
    if e.tied:
        return f"≈ {reading_text(t)}" + ("" if t["kind"] is None else f", {fmt_p(t['p_holm'])}") + diff
    if t["kind"] is None:
        return ("exact" if t.get("exact") else "no test") + diff  # predictions: their difference is exact
    return fmt_p(t["p_holm"]) + diff


def reading_text(t: dict) -> str:
    """'equivalent (±1 %)', 'undecided (7 seeds would decide)', 'different': what a tie with the pick means."""
    if t.get("reading") == "equivalent":
        return f"equivalent (within ±{100 * t['margin_relative']:g} %)"
    if t.get("reading") == "different" and t.get("within_margin"):
        return f"different, though within ±{100 * t['margin_relative']:g} %"
    if t.get("reading") == "undecided" and t.get("rate_tie"):
        return f"undecided (it holds at one of two rates: {t['rate_tie']})"
    if t.get("reading") == "undecided":
        n = t.get("seeds_needed")
        if n is None:
            return "undecided (one run each: no test)"
        return (
            "undecided (more than 1000 seeds would decide)"
            if n > 1000
            else f"undecided ({n} seeds would decide)"
        )
    return t.get("reading") or "no test"


def test_line(t: dict) -> str:
    """The pick against its runner-up, in one line: the test, its p-values and the effect size."""
    head = f"vs {t['versus']}: "
    read = f"; {reading_text(t)}" if t.get("reading") else ""
    if t.get("exact") and t["kind"] is not None:  # no spread over seeds: the difference is exact, not tested
        return (
            head
            + f"exact over {t['n']} seeds (no spread), difference {_signed(t['difference'], t['relative'])}{read}"
        )
    if t["kind"] is None:
        return head + f"{t['note']}, difference {_signed(t['difference'], t['relative'])}{read}"
    effect = "" if t["effect_size"] is None else f", {t['effect_name']} {t['effect_size']:+.2g}"
    what = "seeds" if t["kind"] == "paired t" else "runs"
    return (
        f"{head}{t['kind']} over {t['n']} {what}, {fmt_p(t['p'])} (Holm-adjusted {t['p_holm']:.2g}), "
        f"difference {_signed(t['difference'], t['relative'])}{effect}{read}"
    )


def _signed(diff: float, relative: float | None) -> str:
    return f"{diff:+.4g}" + (f" ({relative:+.2g} %)" if relative is not None else "")


def tie_how(answer: Answer, rules: Rules) -> str:
    """Why the pick is tied, each reason as it is: a test that did not separate them after Holm's correction,
    a separation that rests on a learning rate chosen within the noise (rate_tie), means within the tie
    tolerance, or no test; with how far the tied configurations are from the pick."""
    tests = [e.test for e in answer.tied_with if e.test]
    alpha = rules.flowchart["ranking"]["alpha"]
    rate = [t for t in tests if t.get("rate_tie")]
    tested = [t for t in tests if t["kind"] and not t["within_tolerance"] and t not in rate]
    within = [t for t in tests if t["within_tolerance"] and t not in rate]
    untested = [t for t in tests if not t["kind"] and t not in rate + within]
    how = []
    if rate:
        others = f" (and {len(rate) - 1} more)" if len(rate) > 1 else ""
        how.append(
            f"{_count(rate)}separated by the test{_p_range(rate)}, but at one of two learning rates its tuning "
            f"could not tell apart: {rate[0]['rate_tie']}{others}"
        )
    if tested:
        how.append(
            f"{_count(tested)}not significantly different at α = {alpha:g}, Holm-adjusted{_p_range(tested)}"
        )
    if within:
        notes = sorted({t["note"] for t in within if t["note"]})
        how.append(f"{_count(within)}within the tie tolerance" + (f"; {', '.join(notes)}" if notes else ""))
    if untested:
        how.append(f"{_count(untested)}{untested[0]['note']}")
    return "; ".join(how) + _differences(tests)


def _count(tests: list[dict]) -> str:
    return f"{len(tests)} " if len(tests) > 1 else ""


def _p_range(tests: list[dict]) -> str:
    """', Holm p 0.014–0.016': the adjusted p-values of these comparisons."""
    ps = sorted(t["p_holm"] for t in tests if t.get("p_holm") is not None)
    if not ps:
        return ""
    return f", Holm p {ps[0]:.2g}" + (f"–{ps[-1]:.2g}" if f"{ps[-1]:.2g}" != f"{ps[0]:.2g}" else "")


def _differences(tests: list[dict]) -> str:
    """'; +1.5 % to +65 % from the pick': how far the tied configurations' means are from the pick's."""
    rel = sorted(t["relative"] for t in tests if t.get("relative") is not None)
    if not rel:
        return ""
    span = percent(rel[0]) + (f" to {percent(rel[-1])}" if percent(rel[-1]) != percent(rel[0]) else "")
    return f"; {span} from the pick"


def percent(relative: float) -> str:
    """'+0.38 %', '+6.5 %', '+730 %': two significant figures, never an exponent."""
    return f"{relative:+.0f} %" if abs(relative) >= 10 else f"{relative:+.2g} %"


def tie_readings(tests: list[dict]) -> str:
    """'1 equivalent within ±1 %, 2 undecided (up to 27 seeds per side would decide)': what the ties mean."""
    equivalent = [t for t in tests if t.get("reading") == "equivalent"]
    undecided = [t for t in tests if t.get("reading") == "undecided"]
    small = [t for t in tests if t.get("reading") == "different"]  # separated, inside the tie tolerance
    parts = []
    if equivalent:
        parts.append(f"{len(equivalent)} equivalent within ±{100 * equivalent[0]['margin_relative']:g} %")
    if small:
        parts.append(f"{len(small)} different but within the tie tolerance (the tie-break decides)")
    if undecided:
        needs = [t["seeds_needed"] for t in undecided if t.get("seeds_needed")]
        most = max(needs, default=0)
        seeds = (
            ""
            if not needs
            else " (over 1000 seeds per side"
            if most > 1000
            else f" (up to {most} seeds per side"
        )
        parts.append(
            f"{len(undecided)} undecided, not shown equivalent{seeds + ' would decide)' if seeds else ''}"
        )
    return ", ".join(parts) or "no comparison to read"
