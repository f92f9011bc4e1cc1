"""The terminal scatter plot: fits the terminal it is printed on, marks the frontier without colour, and
draws no row that nothing can occupy."""

import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from advisor.answers.pareto import FrontierPoint
from advisor.render.plot import MARK, scatter


def render(renderable, width: int) -> list[str]:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(renderable)
    return console.file.getvalue().splitlines()


def plot_rows(lines: list[str]) -> list[str]:
    """The grid's rows: the lines drawn against the y axis."""
    return [line for line in lines if "│" in line and "┃" not in line]


@pytest.mark.parametrize("columns", [60, 80, 120])
@pytest.mark.parametrize("source", ["paper", "measured"])
def test_frontier_fits_the_terminal(invoke, columns, source):
    out = invoke("frontier", "--arch", "vision", "--source", source, env={"COLUMNS": str(columns)}).output
    widest = max(cell_len(line) for line in out.splitlines())
    assert widest <= columns, f"a line of {widest} columns in a {columns}-column terminal"
    axis = next(line for line in out.splitlines() if "└" in line)
    assert cell_len(axis) >= min(columns, 100) - 2, "the plot does not use the terminal's width"


def test_frontier_points_are_marked_without_colour(invoke):
    """Piped output keeps no bold: a * after the label marks each frontier point, as the table's ● does."""
    out = invoke("frontier", "--arch", "vision").output
    table_frontier = set(re.findall(r"^([A-Z])\s+│.*│ ●\s*$", out, flags=re.M))
    assert table_frontier == {"A", "C", "D"}
    plot = "\n".join(plot_rows(out.splitlines()))
    after, before = re.findall(rf"([A-Za-z])\{MARK}", plot), re.findall(rf"\{MARK}([A-Za-z])", plot)
    marked = set(after) | set(before)  # the mark goes after the label, or before it at the right edge
    assert marked == table_frontier
    assert "A* = point A is on the Pareto frontier" in out
    assert "time, s/epoch (lower is better)" in out  # the unit, never a bare "min" read as minutes


def test_one_point_draws_one_row():
    lone = [FrontierPoint("sgd", "standard", 1.0, 2.0, True)]
    lines = render(scatter(lone, "time, s/epoch", "loss"), 80)
    assert len(plot_rows(lines)) == 1 and "A*" in plot_rows(lines)[0]


def test_points_of_one_loss_draw_one_row():
    flat = [FrontierPoint("sgd", s, x, 2.0, x == 1.0) for s, x in (("standard", 1.0), ("accumulation", 3.0))]
    assert len(plot_rows(render(scatter(flat, "x", "y"), 80))) == 1


def test_staircase_joins_frontier_points():
    points = [
        FrontierPoint("sgd", "standard", 1.0, 3.0, True),
        FrontierPoint("adam", "standard", 2.0, 4.0, False),
        FrontierPoint("sgd", "accumulation", 3.0, 1.0, True),
    ]
    rows = plot_rows(render(scatter(points, "x", "y"), 60))
    top_of_stair = next(r for r in rows if "A*" in r)
    assert "·" in top_of_stair.split("A*")[1], "the staircase leaves A along x (lower x is better)"
    assert len(rows) == 12 and all(cell_len(r) <= 60 for r in rows)


def test_a_narrow_console_keeps_a_usable_plot():
    points = [FrontierPoint("sgd", "standard", x, 10 - x, True) for x in range(5)]
    lines = render(scatter(points, "x", "y"), 30)
    assert all(cell_len(line) <= 30 for line in plot_rows(lines))
