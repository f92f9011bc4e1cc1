"""Exact Pareto frontier of points in two objectives, by sort-and-sweep in O(n log n).

Written by hand: scipy and numpy have no Pareto routine, and the sweep is a dozen lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby


def frontier(points: Sequence[tuple[float, float]], x_dir: str = "min", y_dir: str = "min") -> list[int]:
    """Indices of the non-dominated points, sorted by x (best first).

    A point is dominated when another is at least as good in both objectives and strictly better in one.
    Identical points do not dominate each other, so duplicates on the frontier are all kept.
    """
    sx = 1.0 if x_dir == "min" else -1.0
    sy = 1.0 if y_dir == "min" else -1.0
    order = sorted(range(len(points)), key=lambda i: (sx * points[i][0], sy * points[i][1]))
    kept: list[int] = []
    best_y = float("inf")  # best (signed) y among points with strictly better x
    for _, same_x in groupby(order, key=lambda i: sx * points[i][0]):
        same_x = list(same_x)
        group_best = sy * points[same_x[0]][1]  # sorted: the first has the best y at this x
        if group_best < best_y:
            kept += [i for i in same_x if sy * points[i][1] == group_best]
            best_y = group_best
    return kept


@dataclass(frozen=True)
class FrontierPoint:
    """A configuration's mean on two metrics, whether it is on the frontier, and its intervals over seeds."""

    optimizer: str
    strategy: str
    x: float
    y: float
    on_frontier: bool
    x_ci: tuple[float, float] | None = None  # 95 % intervals over seeds, where there are several
    y_ci: tuple[float, float] | None = None
    within_noise: bool = (
        False  # off the frontier of means, but no frontier point beats it beyond its intervals
    )
    flag: str | None = None  # '2 of 3 seeds ok; seed 1 diverged': the means are over the ok seeds only

    def as_dict(self) -> dict:
        return dict(
            optimizer=self.optimizer,
            strategy=self.strategy,
            x=self.x,
            y=self.y,
            on_frontier=self.on_frontier,
            within_noise=self.within_noise,
            x_ci=list(self.x_ci) if self.x_ci else None,
            y_ci=list(self.y_ci) if self.y_ci else None,
            flag=self.flag,
        )


def pareto_view(items: Sequence[tuple], x_dir: str, y_dir: str) -> list[FrontierPoint]:
    """(optimizer, strategy, x, y[, x_ci, y_ci]) items as points, frontier marked, sorted by x (best first).

    With intervals, a point off the frontier is marked `within_noise` unless some frontier point is better
    in both objectives with intervals that do not overlap: seeds cannot tell it from the frontier.
    """
    items = [tuple(i) + (None, None)[: 6 - len(i)] for i in items]
    on = set(frontier([(i[2], i[3]) for i in items], x_dir, y_dir))
    sx = 1.0 if x_dir == "min" else -1.0
    sy = 1.0 if y_dir == "min" else -1.0
    best = [items[i] for i in on]

    def clearly_better(q, p) -> bool:
        return _beyond(q[2], q[4], p[2], p[4], sx) and _beyond(q[3], q[5], p[3], p[5], sy)

    points = [
        FrontierPoint(
            o,
            s,
            x,
            y,
            i in on,
            xc,
            yc,
            within_noise=i not in on and not any(clearly_better(q, items[i]) for q in best),
        )
        for i, (o, s, x, y, xc, yc) in enumerate(items)
    ]
    return sorted(points, key=lambda p: (sx * p.x, p.optimizer, p.strategy))


def _beyond(a: float, a_ci, b: float, b_ci, sign: float) -> bool:
    """a is better than b (sign: +1 smaller is better) and their intervals do not overlap."""
    a_lo, a_hi = a_ci or (a, a)
    b_lo, b_hi = b_ci or (b, b)
    return a_hi < b_lo if sign > 0 else a_lo > b_hi
