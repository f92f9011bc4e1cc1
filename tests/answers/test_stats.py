"""advisor/answers/stats.py against scipy.stats: paired and Welch t-tests from maintained sums, Holm, effect sizes."""

import math
import random

import pytest
from scipy import stats as sps

from advisor.answers import stats
from advisor.answers.stats import holm, paired_t, relative_difference, tost, welch_t


def sums(values):
    return len(values), sum(values), sum(v * v for v in values)


def aggregate(values):
    n, total, sq = sums(values)
    return n, total / n, sq


@pytest.mark.parametrize("seed", range(8))
def test_paired_t_is_scipys_ttest_rel(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    a = [rng.gauss(1.0, 0.2) for _ in range(n)]
    b = [x - rng.gauss(0.05, 0.05) for x in a]
    test = paired_t(*sums([x - y for x, y in zip(a, b, strict=True)]))
    ref = sps.ttest_rel(a, b)
    assert test.kind == "paired t" and test.n == n and test.dof == n - 1
    assert test.statistic == pytest.approx(ref.statistic, rel=1e-9)
    assert test.p == pytest.approx(ref.pvalue, rel=1e-9)
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / n
    assert test.difference == pytest.approx(mean)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    assert test.effect_name == "Cohen's d_z" and test.effect_size == pytest.approx(mean / sd)


@pytest.mark.parametrize("seed", range(8))
def test_welch_is_scipys_unequal_variance_ttest_ind(seed):
    rng = random.Random(100 + seed)
    a = [rng.gauss(1.0, 0.1) for _ in range(rng.randint(2, 8))]
    b = [rng.gauss(1.1, 0.3) for _ in range(rng.randint(2, 8))]
    test = welch_t(aggregate(a), aggregate(b))
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert test.kind == "Welch t" and test.n == len(a) + len(b)
    assert test.statistic == pytest.approx(ref.statistic, rel=1e-9)
    assert test.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert test.dof == pytest.approx(ref.df, rel=1e-9)
    na, nb = len(a), len(b)
    pooled = math.sqrt(((na - 1) * sps.tvar(a) + (nb - 1) * sps.tvar(b)) / (na + nb - 2))
    g = (sum(a) / na - sum(b) / nb) / pooled * (1 - 3 / (4 * (na + nb) - 9))
    assert test.effect_name == "Hedges' g" and test.effect_size == pytest.approx(g)


def test_the_issues_case_paired_separates_what_welch_cannot():
    """Adagrad beats Adadelta in every seed by a small margin: paired p ~ 0.001, Welch p ~ 0.1."""
    adagrad, adadelta = [1.500, 1.520, 1.480], [1.530, 1.548, 1.512]
    paired = paired_t(*sums([x - y for x, y in zip(adagrad, adadelta, strict=True)]))
    welch = welch_t(aggregate(adagrad), aggregate(adadelta))
    assert paired.p < 0.01 < 0.05 < welch.p
    assert paired.p == pytest.approx(sps.ttest_rel(adagrad, adadelta).pvalue)


def test_differences_without_spread():
    """All equal and nonzero: certainly different (p = 0, t infinite); all zero: nothing to tell (p = 1).
    The maintained sums carry rounding noise: 0.1 + 0.2 style sums must still count as no spread."""
    d = [0.1 + 0.2] * 3
    n, s, ss = sums(d)
    test = paired_t(n, s, ss * (1 + 1e-15))
    assert test.p == 0.0 and math.isinf(test.statistic) and math.isinf(test.effect_size)
    zero = paired_t(3, 0.0, 0.0)
    assert zero.p == 1.0 and zero.statistic == 0.0 and zero.difference == 0.0
    assert str(paired_t(3, -0.0, 0.0).difference) == "0.0"  # never '-0.0' in an answer
    same = welch_t((3, 1.0, 3.0), (3, 1.0, 3.0))
    assert same.p == 1.0
    apart = welch_t((3, 1.0, 3.0), (2, 2.0, 8.0))
    assert apart.p == 0.0 and math.isinf(apart.statistic)


def test_no_test_without_two_values():
    assert paired_t(1, 0.3, 0.09) is None and paired_t(0, 0.0, 0.0) is None
    assert welch_t((1, 1.0, 1.0), (5, 2.0, 20.5)) is None
    assert welch_t((4, 1.0, 4.1), (1, 2.0, 4.0)) is None


def test_holm_is_the_step_down_adjustment():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> monotone 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.02]) == [0.02] and holm([]) == []


def test_holm_against_a_brute_force_definition():
    rng = random.Random(7)
    for _ in range(50):
        p = [rng.random() ** 3 for _ in range(rng.randint(1, 9))]
        m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
        for rank, i in enumerate(order):
            expect = max(min(1.0, (m - r) * p[order[r]]) for r in range(rank + 1))
            assert holm(p)[i] == pytest.approx(expect)


def test_relative_difference():
    assert relative_difference(-0.05, 2.0) == pytest.approx(-2.5)
    assert relative_difference(0.1, -0.5) == pytest.approx(20.0)  # of |reference|
    assert relative_difference(1.0, 0.0) is None


@pytest.mark.parametrize("seed", range(12))
def test_tost_is_two_one_sided_scipy_tests(seed):
    """Equivalent exactly when both one-sided tests reject at 5 % (scipy), and the interval is scipy's 90 %."""
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    d = [rng.gauss(rng.choice([0.0, 0.004, 0.02]), rng.choice([0.001, 0.01])) for _ in range(n)]
    margin = 0.01
    eq = tost(paired_t(*sums(d)), margin)
    above = sps.ttest_1samp(d, -margin, alternative="greater").pvalue
    below = sps.ttest_1samp(d, margin, alternative="less").pvalue
    assert eq.equivalent == (above < 0.05 and below < 0.05)
    ci = sps.ttest_1samp(d, 0).confidence_interval(0.90)
    assert eq.interval == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert (eq.seeds_needed is None) == eq.equivalent


def sample(n, mean, sd):
    """n values with exactly this mean and sample standard deviation."""
    base = [(-1.0) ** i for i in range(n - n % 2)] + [0.0] * (n % 2)
    m = sum(base) / n
    s = math.sqrt(sum((x - m) ** 2 for x in base) / (n - 1))
    return [mean + sd * (x - m) / s for x in base]


@pytest.mark.parametrize(("mean", "margin"), [(0.002, 0.01), (0.03, 0.01)])
def test_the_seeds_it_asks_for_decide_with_80_percent_power(mean, margin):
    """Simulated at the observed difference and spread: with the seeds asked for, equivalence (a small
    difference) or a difference (a large one) is shown in about 80 % of repeats; with 3, far less often."""
    first = paired_t(*sums(sample(3, mean, 0.02)))
    eq = tost(first, margin)
    assert not eq.equivalent and eq.seeds_needed > 3

    def decided(n, rng):
        test = paired_t(*sums([rng.gauss(mean, 0.02) for _ in range(n)]))
        return tost(test, margin).equivalent if mean < margin else test.p < 0.05

    rng = random.Random(7)
    at = sum(decided(eq.seeds_needed, rng) for _ in range(2000)) / 2000
    few = sum(decided(3, rng) for _ in range(2000)) / 2000
    assert 0.75 <= at <= 0.9 and few < 0.5, (at, few)


def test_a_measure_without_spread_is_compared_exactly():
    exact = paired_t(*sums([0.0002, 0.0002, 0.0002]))
    assert exact.se == 0
    inside, outside = tost(exact, 0.001), tost(exact, 0.0001)
    assert inside.equivalent and inside.interval == (0.0002, 0.0002) and inside.seeds_needed is None
    assert not outside.equivalent and outside.seeds_needed is None  # nothing more seeds could change


@pytest.mark.parametrize("dof", [1, 1.5, 2, 3, 4.2, 9.7, 30, 1000, 1e5])
def test_the_t_distribution_is_scipys(dof):
    """Student's t computed in the standard library (quantiles by Newton on the incomplete beta function)
    equals scipy's to 1e-9 (6e-11 at worst measured), tails and fractional Welch degrees of freedom included."""
    from scipy.special import stdtr, stdtrit

    for level in (0.5, 0.5001, 0.6, 0.8, 0.95, 0.975, 0.999, 0.999999, 0.025, 1e-6):
        assert stats.t_quantile(dof, level) == pytest.approx(float(stdtrit(dof, level)), rel=1e-9, abs=1e-12)
    for t in (0.0, 0.001, 0.5, 1.0, 2.0, 3.3, 10.0, 100.0, 1e4):
        assert stats.two_sided_p(t, dof) == pytest.approx(
            float(min(1, 2 * stdtr(dof, -t))), rel=1e-9, abs=1e-300
        )
