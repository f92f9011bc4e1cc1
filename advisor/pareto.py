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
    optimizer: str
    strategy: str
    x: float
    y: float
    on_frontier: bool

    def as_dict(self) -> dict:
        return dict(
            optimizer=self.optimizer, strategy=self.strategy, x=self.x, y=self.y, on_frontier=self.on_frontier
        )


def pareto_view(
    items: Sequence[tuple[str, str, float, float]], x_dir: str, y_dir: str
) -> list[FrontierPoint]:
    """(optimizer, strategy, x, y) items as points, frontier marked, sorted by x (best first)."""
    on = set(frontier([(x, y) for _, _, x, y in items], x_dir, y_dir))
    sx = 1.0 if x_dir == "min" else -1.0
    points = [FrontierPoint(o, s, x, y, i in on) for i, (o, s, x, y) in enumerate(items)]
    return sorted(points, key=lambda p: (sx * p.x, p.optimizer, p.strategy))
