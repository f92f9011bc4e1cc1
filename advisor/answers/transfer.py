"""How rankings carry across scale: the same grid measured at two model sizes of a family (the CPU reference
grid at presets tiny and small), and per metric the rank agreement of its configurations (Kendall's tau-b,
with a bootstrap interval over configurations and seeds) and whether the pick stayed the pick.

The honest answer to "does a grid of 4 M-parameter models tell me anything about my 8 B model?": it says how
well a ranking moved from one scale to the next one measured, which is all the evidence can say.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from advisor.answers.evidence import GroupEvidence, params_text
from advisor.answers.trend import scale_chains
from advisor.kb.queries.for_answers import group_values
from advisor.kb.queries.groups import Group
from advisor.rules import Rules

METRICS = ("loss", "time", "memory")  # the metrics a grid at two scales is compared on
RESAMPLES = 2000  # bootstrap resamples of the seeds (percentile interval)
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Transfer:
    """One family × metric measured at two scales: how well the smaller one's ranking predicted the larger's."""

    family: str
    metric: str
    smaller: Group
    larger: Group
    configurations: int  # ranked at both scales
    tau: float  # Kendall's tau-b of the configurations' means
    # its 95 % bootstrap interval (seeds resampled within each configuration); None where a scale has one run
    # per configuration (a published table): nothing to resample, so no interval is claimed
    interval: tuple[float, float] | None
    pick_smaller: str
    pick_larger: str

    @property
    def held(self) -> bool:
        return self.pick_smaller == self.pick_larger

    @property
    def text(self) -> str:
        return (
            f"{self.family} {self.metric}, {params_text(self.smaller.n_params)} → {params_text(self.larger.n_params)}: "
            f"τ = {self.tau_text} over {self.configurations} configurations; the pick "
            + ("held" if self.held else f"moved ({self.pick_smaller} → {self.pick_larger})")
        )

    @property
    def tau_text(self) -> str:
        """'+0.55 [+0.05, +0.78]', or '+0.33 (one run each: no interval)'."""
        if self.interval is None:
            return f"{self.tau:+.2f} (one run each: no interval)"
        lo, hi = self.interval
        return f"{self.tau:+.2f} [{lo:+.2f}, {hi:+.2f}]"

    def as_dict(self) -> dict:
        return dict(
            family=self.family,
            metric=self.metric,
            smaller=self.smaller.as_dict(),
            larger=self.larger.as_dict(),
            configurations=self.configurations,
            tau=self.tau,
            interval=list(self.interval) if self.interval else None,
            pick_smaller=self.pick_smaller,
            pick_larger=self.pick_larger,
            held=self.held,
        )


def scale_pairs(conn: sqlite3.Connection, family: str | None = None) -> list[tuple[Group, Group]]:
    """Each group of a scale chain with the next size up."""
    return [
        (a, b)
        for chain in scale_chains(conn, family)
        for a, b in zip(chain, chain[1:], strict=False)
        if a.n_params < b.n_params
    ]


def transfers(
    conn: sqlite3.Connection, rules: Rules, family: str | None = None, metrics: tuple[str, ...] = METRICS
) -> list[Transfer]:
    """Every family × metric measured at two scales, in family and metric order."""
    out = []
    for small, large in scale_pairs(conn, family):
        ev_small, ev_large = GroupEvidence(conn, small, rules), GroupEvidence(conn, large, rules)
        for metric in metrics:
            t = _transfer(conn, rules, ev_small, ev_large, metric)
            if t is not None:
                out.append(t)
    return sorted(out, key=lambda t: (t.family, METRICS.index(t.metric), t.smaller.n_params))


def _transfer(conn, rules: Rules, small: GroupEvidence, large: GroupEvidence, metric: str) -> Transfer | None:
    measure = small.measure(metric)
    if measure is None or measure != large.measure(metric):
        return None  # the two scales measured it differently: not comparable
    skip = set(small.unusable(metric)) | set(large.unusable(metric))
    values = [group_values(conn, ev.group, measure) for ev in (small, large)]
    keys = sorted((set(values[0]) & set(values[1])) - skip)
    if len(keys) < 3:
        return None
    sign = 1.0 if rules.metric(metric).direction == "min" else -1.0
    means = [[sum(v[k]) / len(v[k]) for k in keys] for v in values]
    picks = [" + ".join(keys[min(range(len(keys)), key=lambda i: sign * m[i])]) for m in means]
    seeded = small.group.n_seeds > 1 and large.group.n_seeds > 1
    interval = bootstrap_tau([[v[k] for k in keys] for v in values]) if seeded else None
    return Transfer(
        small.group.family,
        metric,
        small.group,
        large.group,
        len(keys),
        kendall_tau_b(*means),
        interval,
        *picks,
    )


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b of two paired sequences (ties corrected), or 0.0 when either is constant."""
    import numpy as np

    return float(_tau_b(np.asarray([x], float), np.asarray([y], float))[0])


def _tau_b(x, y):
    """tau-b of each row pair of x and y (rows: bootstrap resamples); numpy, all pairs at once. Written here
    because scipy.stats.kendalltau takes one pair of sequences per call (2,000 calls per interval) and
    scipy.stats is never imported on the answer path."""
    import numpy as np

    i, j = np.triu_indices(x.shape[1], k=1)
    sx, sy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])
    concordance = (sx * sy).sum(axis=1)
    denominator = np.sqrt((sx != 0).sum(axis=1) * (sy != 0).sum(axis=1).astype(float))
    return np.divide(
        concordance, denominator, out=np.zeros_like(concordance, dtype=float), where=denominator > 0
    )


def bootstrap_tau(
    values: list[list[list[float]]], resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The percentile interval of tau-b over resamples of both what was measured and what was compared:
    the configurations (with replacement, the same ones at both scales) and, within each, its seeds (at each
    scale independently). values[scale][configuration] -> that configuration's per-seed values. Resampling
    the seeds alone would break the exact ties of deterministic measures (memory) one way only, and put the
    interval beside the estimate."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(values[0])
    means = []
    for scale in values:
        cols = []
        for seeds in scale:
            v = np.asarray(seeds, float)
            cols.append(v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1))
        means.append(np.stack(cols, axis=1))
    picked = rng.integers(0, n, size=(resamples, n))
    taus = _tau_b(*(np.take_along_axis(m, picked, axis=1) for m in means))
    tail = (1 - CONFIDENCE) / 2 * 100
    lo, hi = np.percentile(taus, [tail, 100 - tail])
    return float(lo), float(hi)


def summary_line(found: list[Transfer], metric: str) -> str | None:
    """'at 0.3 M → 4 M parameters the loss ranking agreed with τ = 0.71 [0.52, 0.86] (median of 4 families);
    the pick held in 3 of 4': what an answer far from its evidence's scale says."""
    largest: dict[str, Transfer] = {}  # per family, the pair that reaches the largest scale
    for t in found:
        if t.metric == metric and (
            t.family not in largest or t.larger.n_params > largest[t.family].larger.n_params
        ):
            largest[t.family] = t
    of = list(largest.values())
    if not of:
        return None
    of.sort(key=lambda t: t.tau)
    mid = of[len(of) // 2]
    sizes = f"{params_text(min(t.smaller.n_params for t in of))}–{params_text(max(t.larger.n_params for t in of))}"
    families = f" (median of {len(of)} families: {mid.family})" if len(of) > 1 else f" ({mid.family})"
    return (
        f"How rankings carry across scale: from the smaller to the larger scale measured or published ({sizes} "
        f"parameters) the {metric} ranking agreed with τ = {mid.tau_text}{families}; "
        f"the pick held in {sum(t.held for t in of)} of {len(of)} (advisor transfer)"
    )
