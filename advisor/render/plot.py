"""A terminal scatter plot of a Pareto view, as a rich renderable that fits the console it is printed on.

Written by hand rather than with plotext: plotext prints ANSI strings to stdout, while report functions
here must return renderables that render the same into a test console, a pipe or a terminal. Frontier
points carry a `*` after their label (colour is lost in a pipe), and a dotted staircase joins them.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from advisor.answers.pareto import FrontierPoint

LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits
MAX_WIDTH = 100  # columns of plot area: wider terminals get margins, not a stretched plot
MIN_WIDTH = 16
HEIGHT = 12
MARK, PATH = "*", "·"  # after a frontier point's label; the frontier's staircase between them
FRONTIER_STYLE, OTHER_STYLE = "bold green", "dim"


def point_labels(points: list[FrontierPoint]) -> list[str]:
    """One short label per point, in order, shared by the plot and its table."""
    return [LABELS[i] if i < len(LABELS) else "+" for i in range(len(points))]


@dataclass
class Scatter:
    """Points at their (x, y) on a character grid as wide as the console allows; axes annotated with ranges."""

    points: list[FrontierPoint]
    x_label: str
    y_label: str
    x_dir: str = "min"
    height: int = HEIGHT

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.points:
            yield from self.lines(options.max_width)

    def lines(self, max_width: int) -> list[Text]:
        """The plot's lines, none wider than max_width (rich wraps the axis legends, never the grid)."""
        ys = [p.y for p in self.points]
        y_ticks = (f"{max(ys):.4g}", f"{min(ys):.4g}")
        y_width = max(map(len, y_ticks))
        width = max(MIN_WIDTH, min(MAX_WIDTH, max_width - y_width - 2))
        grid = CharGrid(self.points, width, self.rows())
        grid.draw_staircase(self.x_dir)
        grid.draw_points(point_labels(self.points))
        out = []
        for r, cells in enumerate(grid.cells):
            tick = y_ticks[0] if r == 0 else y_ticks[1] if r == len(grid.cells) - 1 else ""
            line = Text(f"{tick:>{y_width}} │", style="dim")
            for ch, style in cells:
                line.append(ch, style=style)
            out.append(line)
        pad = " " * (y_width + 2)
        out.append(Text(" " * y_width + " └" + "─" * width, style="dim"))
        lo, hi = (f"{v:.4g}" for v in (grid.x0, grid.x1))
        out.append(Text(pad + lo + hi.rjust(width - len(lo)), style="dim"))
        out += [Text(f"{pad}x: {self.x_label}", style="dim"), Text(f"{pad}y: {self.y_label}", style="dim")]
        legend = f"{pad}A{MARK} = point A is on the Pareto frontier ({PATH}{PATH} joins them)"
        out.append(Text(legend, style=FRONTIER_STYLE))
        return out

    def rows(self) -> int:
        """One row when every point has the same y (a lone point): never rows that nothing can occupy."""
        return 1 if len({p.y for p in self.points}) == 1 else self.height


class CharGrid:
    """A width × height character grid with the points' data ranges mapped onto it (high y at the top)."""

    def __init__(self, points: list[FrontierPoint], width: int, height: int):
        self.points, self.width, self.height = points, width, height
        xs, ys = [p.x for p in points], [p.y for p in points]
        self.x0, self.x1, self.y0, self.y1 = min(xs), max(xs), min(ys), max(ys)
        self.cells: list[list[tuple[str, str]]] = [[(" ", "")] * width for _ in range(height)]

    def at(self, p: FrontierPoint) -> tuple[int, int]:
        """(row, col) of a point."""
        col = 0 if self.x1 == self.x0 else round((p.x - self.x0) / (self.x1 - self.x0) * (self.width - 1))
        row = 0 if self.y1 == self.y0 else round((self.y1 - p.y) / (self.y1 - self.y0) * (self.height - 1))
        return row, col

    def free(self, row: int, col: int) -> bool:
        """Whether a cell is on the grid and holds nothing but, perhaps, the staircase."""
        return 0 <= col < self.width and self.cells[row][col][0] in (" ", PATH)

    def draw_staircase(self, x_dir: str) -> None:
        """The frontier as the boundary of what it dominates: along x then y when lower x is better, else y first."""
        spots = sorted(self.at(p)[::-1] for p in self.points if p.on_frontier)  # (col, row), left to right
        for (c0, r0), (c1, r1) in zip(spots, spots[1:], strict=False):
            corner = (c1, r0) if x_dir == "min" else (c0, r1)
            for (ca, ra), (cb, rb) in (((c0, r0), corner), (corner, (c1, r1))):
                for r in range(min(ra, rb), max(ra, rb) + 1):
                    for c in range(min(ca, cb), max(ca, cb) + 1):
                        if self.free(r, c):
                            self.cells[r][c] = (PATH, FRONTIER_STYLE)

    def draw_points(self, labels: list[str]) -> None:
        """Each point's label; a frontier point wins a shared cell and gets MARK beside it where there is room."""
        order = sorted(zip(labels, self.points, strict=True), key=lambda lp: lp[1].on_frontier)
        for label, p in order:  # frontier points last: they overwrite
            row, col = self.at(p)
            self.cells[row][col] = (label, FRONTIER_STYLE if p.on_frontier else OTHER_STYLE)
        for _, p in order:
            row, col = self.at(p)
            side = next((c for c in (col + 1, col - 1) if p.on_frontier and self.free(row, c)), None)
            if side is not None:
                self.cells[row][side] = (MARK, FRONTIER_STYLE)


def scatter(points: list[FrontierPoint], x_label: str, y_label: str, x_dir: str = "min") -> Scatter:
    """The terminal plot of a Pareto view (labels as in its table), sized when printed."""
    return Scatter(points, x_label, y_label, x_dir)
