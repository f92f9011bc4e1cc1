"""Two-sample tests for comparing configurations: paired by seed, Welch's when unpaired, Holm's correction
when one configuration is compared with many, and effect sizes.

Pure functions of the sums the KB maintains (advisor/kb/summaries.py), so an answer never reads the runs.
Student's t distribution is computed here, in a few lines of the standard library (the regularized
incomplete beta function by its continued fraction), so that no answer imports numpy or scipy (0.2 s of a
0.3 s answer); tests/answers/test_stats.py holds it to scipy's to 1e-10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

# Below this fraction of the mean square, a variance is rounding noise in the maintained sums (added and
# taken out run by run), not a spread: differences that are all equal give exactly zero.
ZERO_VARIANCE = 1e-10


@dataclass(frozen=True)
class TTest:
    """A two-sided t-test of a - b, with its effect size."""

    kind: str  # 'paired t' | 'Welch t'
    n: int  # paired: the seeds both sides share; Welch: the runs of both sides together
    statistic: float  # t; ±inf when the differences have no spread and a nonzero mean
    dof: float
    p: float
    difference: float  # mean of a - mean of b (paired: the mean of the per-seed differences)
    effect_size: float  # Cohen's d_z (paired) or Hedges' g (Welch); ±inf with no spread
    effect_name: str
    se: float = math.nan  # the standard error of the difference (0: no spread on either side)
    per_side: float = math.nan  # the runs behind each side: seeds (paired), the mean of both sides (Welch)


def two_sided_p(t: float, dof: float) -> float:
    """P(|T| >= |t|) for Student's t with `dof` degrees of freedom: I_x(dof/2, 1/2) at x = dof/(dof + t²)."""
    if math.isinf(t):
        return 0.0
    t2 = t * t
    return min(1.0, _betainc(dof / 2, 0.5, dof / (dof + t2), t2 / (dof + t2)))


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """The regularized incomplete beta function I_x(a, b), with y = 1 - x given exactly (no cancellation):
    its continued fraction where it converges fast, else 1 - I_y(b, a) (Numerical Recipes, 3rd ed., 6.4)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, y) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return h


def _t_upper(t: float, dof: float) -> float:
    """P(T > t) for t >= 0."""
    return 0.5 * two_sided_p(t, dof)


def _t_density(t: float, dof: float) -> float:
    log = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    return math.exp(log - (dof + 1) / 2 * math.log1p(t * t / dof))


def sample_variance(n: int, total: float, sum_sq: float) -> float:
    """The unbiased variance of n values from their sum and sum of squares (0 below rounding noise)."""
    mean = total / n
    var = max(0.0, (sum_sq - n * mean * mean) / (n - 1))
    return 0.0 if var <= ZERO_VARIANCE * (sum_sq / n) else var


def _ratio(num: float, den: float) -> float:
    """num / den where den may be 0: ±inf for a nonzero num, 0 for none (nothing to tell apart)."""
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.copysign(math.inf, num)


def paired_t(n: int, sum_d: float, sum_dd: float) -> TTest | None:
    """Student's paired t-test of the per-seed differences d (n, their sum and sum of squares).

    t = mean(d) / (sd(d) / sqrt(n)), n - 1 degrees of freedom; effect size Cohen's d_z = mean(d) / sd(d).
    Differences that are all equal give p = 0 (all nonzero) or p = 1 (all zero). None when n < 2."""
    if n < 2:
        return None
    mean = sum_d / n + 0.0  # + 0.0: no '-0.0' for a difference of nothing
    sd = math.sqrt(sample_variance(n, sum_d, sum_dd))
    t = _ratio(mean, sd / math.sqrt(n))
    p = 1.0 if mean == 0 and sd == 0 else two_sided_p(t, n - 1)
    return TTest(
        "paired t", n, t, float(n - 1), p, mean, _ratio(mean, sd), "Cohen's d_z", sd / math.sqrt(n), n
    )


def welch_t(a: tuple[int, float, float], b: tuple[int, float, float]) -> TTest | None:
    """Welch's unpaired t-test of a - b, each side given as (n, mean, sum of squares).

    t = (mean_a - mean_b) / sqrt(var_a/n_a + var_b/n_b), Welch–Satterthwaite degrees of freedom; effect
    size Hedges' g (Cohen's d over the pooled sd, times 1 - 3 / (4 (n_a + n_b) - 9)). None when a side has
    fewer than 2 values."""
    (na, ma, sqa), (nb, mb, sqb) = a, b
    if na < 2 or nb < 2:
        return None
    va, vb = sample_variance(na, na * ma, sqa), sample_variance(nb, nb * mb, sqb)
    diff = ma - mb + 0.0
    se2 = va / na + vb / nb
    t = _ratio(diff, math.sqrt(se2))
    if se2 > 0:
        dof = se2 * se2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    else:
        dof = float(na + nb - 2)
    p = 1.0 if diff == 0 and se2 == 0 else two_sided_p(t, dof)
    pooled = math.sqrt(((na - 1) * va + (nb - 1) * vb) / (na + nb - 2))
    g = _ratio(diff, pooled) * (1 - 3 / (4 * (na + nb) - 9))
    return TTest("Welch t", na + nb, t, dof, p, diff, g, "Hedges' g", math.sqrt(se2), (na + nb) / 2)


@cache  # an answer asks for the same few (dof, level) pairs hundreds of times
def t_quantile(dof: float, level: float) -> float:
    """The `level` quantile of Student's t with `dof` degrees of freedom: the root of P(T > t) = 1 - level,
    by Newton's method kept inside a bracket that bisection narrows when a step would leave it."""
    if level == 0.5:
        return 0.0
    if level < 0.5:
        return -t_quantile(dof, 1.0 - level)
    tail = 1.0 - level
    lo, hi = 0.0, 1.0
    while _t_upper(hi, dof) > tail:
        lo, hi = hi, hi * 2
    t = (lo + hi) / 2
    for _ in range(200):
        excess = _t_upper(t, dof) - tail  # > 0: t is below the root
        lo, hi = (t, hi) if excess > 0 else (lo, t)
        step = t + excess / _t_density(t, dof)
        new = step if lo < step < hi else (lo + hi) / 2
        if abs(new - t) <= 1e-14 * max(1.0, abs(t)):
            return new
        t = new
    return t


MAX_SEEDS = 1000  # beyond this many seeds a comparison is called out of reach, not given a count


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided tests (TOST) of a - b against a margin ±m: equivalent when the 1 - 2α interval of the
    difference lies inside (-m, m). With the difference test, a comparison reads 'equivalent', 'different'
    or 'undecided'; undecided says how many seeds per side would decide it (80 % power, at the observed
    difference and spread)."""

    margin: float  # m, in the metric's unit
    interval: tuple[float, float]  # the 1 - 2α (90 %) interval of a - b
    equivalent: bool
    seeds_needed: int | None  # per side, to decide at the observed difference and spread; None: decided


def tost(
    test: TTest, margin: float, alpha: float = 0.05, different: bool = False, comparisons: int = 1
) -> Equivalence:
    """TOST of a t-test's difference against ±margin; `different`: the difference test already rejected
    equality (then no more seeds are asked for); `comparisons`: the multiplier Holm's correction puts on
    this comparison's p (the seeds that would show a difference are counted at alpha / comparisons). Zero
    spread (a deterministic measure) is exact: the interval is the difference itself, and no t quantile is
    read."""
    d, se = test.difference, test.se
    half = 0.0 if se == 0 else t_quantile(test.dof, 1 - alpha) * se
    lo, hi = d - half, d + half
    equivalent = -margin < lo and hi < margin
    needed = None
    if not (equivalent or different) and se > 0:
        # to show equivalence, the interval must shrink inside the margin; to show a difference, off zero
        gap, level = (
            (margin - abs(d), 1 - alpha) if abs(d) < margin else (abs(d), 1 - alpha / 2 / comparisons)
        )
        needed = seeds_to_decide(se * math.sqrt(test.per_side), gap, level, int(test.per_side))
    return Equivalence(margin, (lo, hi), equivalent, needed)


POWER = 0.8  # the chance a decision is made at the seeds asked for, if the observed values are the truth


def seeds_to_decide(sd: float, gap: float, level: float, have: int) -> int:
    """The fewest seeds per side n > have at which a comparison with per-seed spread `sd` decides with
    POWER (80 %) when the truth is what was observed: (t(level) + t(POWER)) * sd / sqrt(n) < gap, n - 1
    degrees of freedom (conservative for Welch). MAX_SEEDS + 1 when not even that many would. Over several
    comparisons, `level` carries Holm's correction (tost's `comparisons`)."""

    def decides(n: int) -> bool:  # the left side falls as n grows: the first n that decides is bisected
        return (t_quantile(n - 1, level) + t_quantile(n - 1, POWER)) * sd / math.sqrt(n) < gap

    lo, hi = max(have + 1, 2), MAX_SEEDS
    if not decides(hi):
        return MAX_SEEDS + 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid + 1, hi)
    return lo


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment, in the input's order: the i-th smallest p times (m - i + 1), made
    monotone and capped at 1. Rejecting where the adjusted p < alpha controls the family-wise error."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def relative_difference(difference: float, reference: float) -> float | None:
    """A difference as a percentage of |reference| (what it is compared against); None when that is 0."""
    return None if reference == 0 else 100.0 * difference / abs(reference)


def finite(x: float | None) -> float | None:
    """x, or None where it is not finite (JSON has no infinity)."""
    return x if x is not None and math.isfinite(x) else None


__all__ = [
    "Equivalence",
    "TTest",
    "holm",
    "paired_t",
    "relative_difference",
    "tost",
    "two_sided_p",
    "welch_t",
]
