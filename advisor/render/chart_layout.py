"""Where a frontier chart's parts go, in numbers (no Altair here): its axes' ranges, a point moved onto the
scale, the key's columns, lines and title, and each point's label placed where it covers the least; the
statuses a point is drawn as. advisor.render.charts draws them."""

from __future__ import annotations

import math

from advisor.answers.comparison import equivalence_margin
from advisor.answers.pareto import FrontierPoint
from advisor.rules import Metric, Rules

FRONTIER, NOISE, DOMINATED, EXCLUDED = (
    "on the frontier",
    "within noise of the frontier",
    "dominated",
    "excluded",
)

LABEL_DX = {"left": 8, "right": -8, "center": 0}  # text anchor -> offset from its point, px
LABEL_DY = {"above": -11, "below": 16}
CHAR_PX = 6.6  # the width of a character of 12 px sans-serif, about
PERCENT_CAP = 100.0  # a share in % (utilization): its axis never runs past it
KEY_TITLE = "Key: the other points, lettered as in advisor frontier's table"
KEY_STRATEGY = {  # strategies as the key names them (its title says so): four columns fit a picture
    "standard": "std",
    "checkpointing": "ckpt",
    "selective-checkpointing": "sel-ckpt",
    "accumulation": "accum",
    "accumulation-equal-samples": "accum-eq",
    "checkpointing+accumulation": "ckpt+accum",
}
KEY_CHAR_PX = 5.0  # the width of a character of the key, about (4.8 measured, in Liberation Sans)
KEY_SYMBOL_PX = 8  # what Vega keeps before each label for its (hidden) symbol, about
KEY_COLUMN_GAP = 12  # px between the key's columns
KEY_MOST_COLUMNS = 6
KEY_INDENT = 80  # px of the picture left of the key: it starts where the plot does, past the y axis
KEY_LINE_PX = 13  # px per line of the key
KEY_TITLE_GAP = 6  # px between the key's title and its entries


def short_config(optimizer: str, strategy: str) -> str:
    """A configuration as the key names it: the strategy shortened ('adamw + ckpt'), the key's title says how."""
    return f"{optimizer} + {KEY_STRATEGY.get(strategy, strategy)}"


def key_columns(rows: list[dict], width: int) -> int:
    """The most columns of the key that fit across the picture, entries laid out row by row, each column as
    wide as its longest entry."""
    lengths = [len(r["entry"]) for r in rows if r["entry"]]
    for columns in range(min(KEY_MOST_COLUMNS, len(lengths)), 1, -1):
        widest = [max(lengths[c::columns]) * KEY_CHAR_PX + KEY_SYMBOL_PX for c in range(columns)]
        if sum(widest) + KEY_COLUMN_GAP * (columns - 1) <= width - KEY_INDENT:
            return columns
    return 1


def key_rows(rows: list[dict], columns: int) -> int:
    """Lines the key takes (0: every point is named on the plot)."""
    keyed = sum(1 for r in rows if r["entry"])
    return -(-keyed // columns)


def key_title(rows: list[dict], width: int) -> list[str]:
    """The key's title: what its letters are, then the short names of the strategies it uses, in lines that
    fit the picture (a title line too long would end in an ellipsis)."""
    used = {r["strategy"] for r in rows if r["entry"]}
    said = [f"{short} = {name}" for name, short in KEY_STRATEGY.items() if name in used]
    most = int((width - KEY_INDENT) / KEY_CHAR_PX)
    lines = [KEY_TITLE]
    for part in said:
        if len(lines) > 1 and len(lines[-1]) + len(part) + 2 <= most:
            lines[-1] += f"; {part}"
        else:
            lines.append(part)
    return lines


def key_height(rows: list[dict], columns: int, width: int) -> int:
    """The key's pixels, about: its title's lines and its entries' (0: every point is named on the plot)."""
    lines = key_rows(rows, columns)
    return (len(key_title(rows, width)) * KEY_LINE_PX + KEY_TITLE_GAP + lines * KEY_LINE_PX) if lines else 0


def axis_domains(
    points: list[FrontierPoint], xm: Metric, ym: Metric, rules: Rules
) -> tuple[list[float], list[float]]:
    """Each axis' range over the ranked points and their intervals (excluded points never stretch it), padded:
    more on the better y, where the frontier's labels go."""
    x = _domain(_axis_values(points, "x"), xm, rules, (1, 1))
    y = _domain(_axis_values(points, "y"), ym, rules, (2, 1) if ym.direction == "min" else (1, 2))
    return x, y


def _axis_values(points: list[FrontierPoint], axis: str) -> list[float]:
    """An axis' means and interval ends over the ranked points."""
    return [getattr(p, axis) for p in points] + [v for p in points for v in (getattr(p, f"{axis}_ci") or ())]


def least_span(metric: Metric, rules: Rules, value: float) -> float:
    """The narrowest an axis of the metric may be around `value`: twice the rules' equivalence margin of it
    (rules/flowchart.toml; never under the tie tolerance). A difference the rules read as practically equal
    then spans at most half the plot, and one under the tie tolerance a few percent of it: the VLM's
    0.04 % time difference is a dot, not the whole height."""
    ranking = rules.flowchart["ranking"]
    return 2 * max(equivalence_margin(rules, metric), ranking["tie_tolerance"]) * abs(value)


def _domain(values: list[float], metric: Metric, rules: Rules, room: tuple[int, int]) -> list[float]:
    """The range of one axis: the values, widened to least_span, padded by a tenth each side (`room` tenths),
    then kept to what the metric can be."""
    lo, hi = min(values), max(values)
    least = least_span(metric, rules, max(abs(lo), abs(hi)))
    if hi - lo < least:
        lo, hi = (lo + hi - least) / 2, (lo + hi + least) / 2
    pad = (hi - lo) * 0.1 or 1.0  # a span of 0: one value of 0
    return _bounded([lo - room[0] * pad, hi + room[1] * pad], values, metric, least)


def _bounded(domain: list[float], values: list[float], metric: Metric, least: float) -> list[float]:
    """A range never below zero where no value is (a loss, a time, a memory cannot be), never past 100 for
    a share in % (utilization), and still `least` wide after either cut."""
    floor = 0.0 if min(values) >= 0 else -math.inf
    ceiling = PERCENT_CAP if metric.unit == "%" else math.inf
    low, high = max(domain[0], floor), min(domain[1], ceiling)
    if high - low < least:
        low, high = (max(floor, high - least), high) if high == ceiling else (low, min(ceiling, low + least))
    return [low, high]


def keep_on_scale(row: dict, domains) -> None:
    """A point beyond the axes' range (an excluded one, or a share above 100 %) moved onto its edge, seen
    whole, and said so on hover."""
    x, y = (_clamp(row[k], d) for k, d in (("x", domains[0]), ("y", domains[1])))
    if (x, y) != (row["x"], row["y"]):
        row.update(x=x, y=y, note=row["note"] + " (drawn at the edge: off the scale)")


def _clamp(value: float, domain: list[float]) -> float:
    """The value, or the point half-way into the padding on the side it is off the scale (seen whole)."""
    if domain[0] <= value <= domain[1]:
        return value
    inset = (domain[1] - domain[0]) * 0.035
    return min(max(value, domain[0] + inset), domain[1] - inset)


def plot_area(size: tuple[int, int], key: int) -> tuple[float, float]:
    """The plot area in pixels, about: the picture less axes, titles, the status legend and the key (`key`
    pixels of it; 0 where the picture was grown by it)."""
    return size[0] - 90, max(60, size[1] - 170 - key)


def place_labels(rows: list[dict], domains, x_dir: str, y_dir: str, plot: tuple[float, float]) -> None:
    """Each point's text (a frontier point's name, another's letter) where it covers the least of the other
    texts and points, inside the plot: the frontier's names first, each first choice the side of its point
    that nothing dominates (better x and y), where the staircase is not."""
    (x_lo, x_hi), (y_lo, y_hi) = domains
    spots = [
        ((r["x"] - x_lo) / (x_hi - x_lo) * plot[0], (y_hi - r["y"]) / (y_hi - y_lo) * plot[1]) for r in rows
    ]
    taken = [(x - 6, y - 6, x + 6, y + 6) for x, y in spots]  # every point's symbol, and the staircase
    taken += _staircase([s for r, s in zip(rows, spots, strict=True) if r["status"] == FRONTIER], x_dir)
    better, worse = ("right", "left") if x_dir == "min" else ("left", "right")  # text anchors
    levels = ("below", "above") if y_dir == "min" else ("above", "below")
    choices = [(side, level) for level in levels for side in (better, "center", worse)]
    order = sorted(zip(rows, spots, strict=True), key=lambda rs: (rs[0]["status"] != FRONTIER, rs[1][0]))
    for r, (x, y) in order:
        boxes = {c: _label_box(x, y, len(r["text"]) * CHAR_PX, *c) for c in choices}
        inside = {
            c: 0 <= b[0] and b[2] <= plot[0] and 0 <= b[1] and b[3] <= plot[1] for c, b in boxes.items()
        }
        best = min(choices, key=lambda c: (not inside[c], sum(_overlap(boxes[c], t) for t in taken)))
        r["label"] = " ".join(best)
        taken.append(boxes[best])


def _staircase(spots: list[tuple[float, float]], x_dir: str) -> list[tuple[float, float, float, float]]:
    """The frontier line's segments in pixels, as thin boxes (step-after when lower x is better, else before)."""
    spots, out = sorted(spots), []
    for (x0, y0), (x1, y1) in zip(spots, spots[1:], strict=False):
        corner = (x1, y0) if x_dir == "min" else (x0, y1)
        for (ax, ay), (bx, by) in (((x0, y0), corner), (corner, (x1, y1))):
            out.append((min(ax, bx) - 2, min(ay, by) - 2, max(ax, bx) + 2, max(ay, by) + 2))
    return out


def _label_box(x: float, y: float, width: float, side: str, level: str) -> tuple[float, float, float, float]:
    """The pixels a label of this width covers, anchored at its point's (x, y) as the text layers draw it."""
    left = x + LABEL_DX[side] - {"left": 0, "center": width / 2, "right": width}[side]
    top = y + LABEL_DY[level] - 7
    return left, top, left + width, top + 14


def _overlap(a, b) -> float:
    """The area two boxes share."""
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
