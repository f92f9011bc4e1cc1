"""The sort-and-sweep frontier against the O(n²) definition, on random and adversarial point sets."""

import random

import pytest

from advisor.answers.pareto import frontier, pareto_view


def brute_force(points, x_dir="min", y_dir="min"):
    sx, sy = (1 if x_dir == "min" else -1), (1 if y_dir == "min" else -1)
    signed = [(sx * x, sy * y) for x, y in points]
    return sorted(
        i
        for i, (xi, yi) in enumerate(signed)
        if not any(xj <= xi and yj <= yi and (xj < xi or yj < yi) for xj, yj in signed)
    )


@pytest.mark.parametrize("x_dir,y_dir", [("min", "min"), ("max", "min"), ("min", "max"), ("max", "max")])
def test_matches_brute_force_on_random_points(x_dir, y_dir):
    rng = random.Random(1234)
    for trial in range(400):
        n = rng.randint(0, 40)
        grid = rng.choice([3, 10, 1000])  # small grids force ties and duplicates
        points = [(rng.randint(0, grid) / 7, rng.randint(0, grid) / 3) for _ in range(n)]
        assert sorted(frontier(points, x_dir, y_dir)) == brute_force(points, x_dir, y_dir), (trial, points)


def test_edge_cases():
    assert frontier([]) == []
    assert frontier([(1.0, 1.0)]) == [0]
    assert sorted(frontier([(1.0, 1.0), (1.0, 1.0)])) == [0, 1]  # identical points do not dominate each other
    assert frontier([(1.0, 2.0), (1.0, 1.0)]) == [1]  # same x, better y dominates
    assert frontier([(1.0, 1.0), (2.0, 1.0)]) == [0]  # same y, better x dominates


def test_view_marks_and_sorts():
    view = pareto_view([("a", "s", 3.0, 1.0), ("b", "s", 1.0, 3.0), ("c", "s", 2.0, 4.0)], "min", "min")
    assert [(p.optimizer, p.on_frontier) for p in view] == [("b", True), ("c", False), ("a", True)]
