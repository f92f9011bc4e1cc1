"""A terminal scatter plot of a Pareto view, as a rich Text.

Written by hand rather than with plotext: plotext prints ANSI strings to stdout, while report functions
here must return renderables that render the same into a test console, a pipe or a terminal.
"""

from __future__ import annotations

import string

from rich.text import Text

from advisor.pareto import FrontierPoint

LABELS = string.ascii_uppercase + string.ascii_lowercase + string.digits


def point_labels(points: list[FrontierPoint]) -> list[str]:
    """One short label per point, in order, shared by the plot and its table."""
    return [LABELS[i] if i < len(LABELS) else "+" for i in range(len(points))]


def scatter(
    points: list[FrontierPoint], x_label: str, y_label: str, width: int = 56, height: int = 12
) -> Text:
    """Points at their (x, y) on a character grid: frontier points bold, others dim; axes annotated with ranges."""
    text = Text()
    if not points:
        return text
    xs, ys = [p.x for p in points], [p.y for p in points]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    grid: list[list[tuple[str, str]]] = [[(" ", "")] * width for _ in range(height)]
    for label, p in zip(point_labels(points), points, strict=True):
        col = 0 if x1 == x0 else round((p.x - x0) / (x1 - x0) * (width - 1))
        row = 0 if y1 == y0 else round((y1 - p.y) / (y1 - y0) * (height - 1))  # high y at the top
        current = grid[row][col][0]
        if current == " " or p.on_frontier:
            grid[row][col] = (label, "bold green" if p.on_frontier else "dim")
    y_width = max(len(f"{y1:.4g}"), len(f"{y0:.4g}"))
    for r, cells in enumerate(grid):
        tick = f"{y1:.4g}" if r == 0 else f"{y0:.4g}" if r == height - 1 else ""
        text.append(f"{tick:>{y_width}} │", style="dim")
        for ch, style in cells:
            text.append(ch, style=style)
        text.append("\n")
    text.append(" " * y_width + " └" + "─" * width + "\n", style="dim")
    lo, hi = f"{x0:.4g}", f"{x1:.4g}"
    text.append(" " * (y_width + 2) + lo + hi.rjust(width - len(lo)) + "\n", style="dim")
    text.append(f"{' ' * (y_width + 2)}x: {x_label}\n{' ' * (y_width + 2)}y: {y_label}\n", style="dim")
    text.append(" " * (y_width + 2) + "bold = on the Pareto frontier", style="bold green")
    return text
