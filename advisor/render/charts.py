"""Pictures of answers for people and papers: Pareto frontiers and the recommendation flowchart as
Vega-Lite charts (Altair), written as self-contained HTML that works offline, or as PNG (vl-convert renders
it without a browser).

Imported only by the commands that draw (the `plots` extra): answering stays as light as it was.
"""

from __future__ import annotations

import functools

import altair as alt
import vl_convert

from advisor.answers.flowchart import BestPath
from advisor.answers.frontier import Frontier, LeftOut
from advisor.answers.pareto import FrontierPoint
from advisor.render.numbers import fmt
from advisor.rules import Metric, Rules

FRONTIER, NOISE, DOMINATED, EXCLUDED = (
    "on the frontier",
    "within noise of the frontier",
    "dominated",
    "excluded",
)
STYLE = {  # status -> (colour, shape)
    FRONTIER: ("#1d4ed8", "circle"),
    NOISE: ("#f59e0b", "diamond"),
    DOMINATED: ("#94a3b8", "circle"),
    EXCLUDED: ("#a3a9b3", "cross"),
}
OPTIMIZER_COLOURS = {
    "sgd": "#9ecae1",
    "sgd-momentum": "#8dd3c7",
    "adam": "#a1d99b",
    "adamw": "#c7e9c0",
    "adagrad": "#fdd0a2",
    "adadelta": "#dadaeb",
    "cgd": "#fcbba1",
    "adafactor": "#fff3b0",
}
NO_ANSWER_COLOUR = "#eef0f3"
FONT = "Liberation Sans, Helvetica, Arial, sans-serif"
EMBED_OPTIONS = {
    "renderer": "svg",
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
}
VL_VERSION = "_".join(alt.SCHEMA_VERSION.split(".")[:2])  # 'v6_4': vl-convert's name for Altair's Vega-Lite
LABEL_DX = {"left": 8, "right": -8, "center": 0}  # text anchor -> offset from its point, px
LABEL_DY = {"above": -11, "below": 16}
CHAR_PX = 6.6  # the width of a character of 12 px sans-serif, about
AXIS = alt.Axis(tickCount=6, labelOverlap=True, labelFlush=True)
GRID_AXIS = {"labelFontSize": 13, "domain": False, "ticks": False, "labelPadding": 8}
PNG_SCALE = 2  # PNG pixels per chart pixel: sharp in a paper or on a slide
FRONTIER_SIZE = (640, 420)  # the whole picture, axes and legend included (autosize "fit")


def axis_title(metric: Metric) -> str:
    """'wall time per epoch, s/epoch (lower is better)': what, in which unit, and which way is good."""
    unit = f", {metric.unit}" if metric.unit else ""
    return f"{metric.label}{unit} ({'lower' if metric.direction == 'min' else 'higher'} is better)"


def frontier_chart(front: Frontier, rules: Rules, size: tuple[int, int] = FRONTIER_SIZE) -> alt.LayerChart:
    """Every configuration at its means with its seed intervals, the frontier's staircase, points within
    noise marked, excluded ones greyed (the reason on hover); axes with units and direction."""
    xm, ym = rules.metric(front.x), rules.metric(front.y)
    domains = _domains(front.points, ym.direction)
    rows = [_point_row(p, xm, ym) for p in front.points]
    rows += [_excluded_row(e, xm, ym, domains) for e in front.excluded if e.x is not None and e.y is not None]
    place_labels(rows, domains, xm.direction, ym.direction, size)
    base = alt.Chart(alt.Data(values=rows))
    x, y = _position(alt.X, "x", xm, domains[0]), _position(alt.Y, "y", ym, domains[1])
    present = [s for s in STYLE if any(r["status"] == s for r in rows)]
    colour, shape = _by_status(alt.Color, 0, present), _by_status(alt.Shape, 1, present)
    names = {
        "config": "configuration",
        "status": "status",
        "x_text": front.x,
        "y_text": front.y,
        "note": "note",
    }
    tooltip = [alt.Tooltip(f"{k}:N", title=t) for k, t in names.items()]
    layers = [
        base.mark_rule(clip=True, strokeWidth=1.5, opacity=0.55).encode(
            x="x_lo:Q", x2="x_hi:Q", y=y, color=colour
        ),
        base.mark_rule(clip=True, strokeWidth=1.5, opacity=0.55).encode(
            x=x, y="y_lo:Q", y2="y_hi:Q", color=colour
        ),
        base.transform_filter(f"datum.status === '{FRONTIER}'")
        .mark_line(interpolate="step-after" if xm.direction == "min" else "step-before", strokeWidth=2)
        .encode(x=x, y=y, color=alt.value(STYLE[FRONTIER][0]), order="x:Q"),
        *_label_layers(base, rows, x, y),
        base.mark_point(filled=True, size=110, opacity=0.95, clip=True).encode(  # last: no label hides one
            x=x, y=y, color=colour, shape=shape, tooltip=tooltip
        ),
    ]
    title = f"{front.family}: {front.y} against {front.x}"
    return _framed(alt.layer(*layers), size, title, _subtitle(front, rules))


def _position(channel, field: str, metric: Metric, domain: list[float]):
    """An axis of the metric: its title with unit and direction, the given range, no forced zero."""
    scale = alt.Scale(domain=domain, zero=False, nice=False)
    return channel(f"{field}:Q", title=axis_title(metric), scale=scale, axis=AXIS)


def _by_status(channel, style: int, present: list[str]):
    """Colour (style 0) or shape (1) by status, over the statuses the chart has (the legend lists those)."""
    return channel(
        "status:N", title=None, scale=alt.Scale(domain=present, range=[STYLE[s][style] for s in present])
    )


def _label_layers(base, rows: list[dict], x, y) -> list:
    """The frontier points' names where place_labels put them, each twice: a white halo under the ink keeps
    it readable over lines and bars."""
    placements = sorted({r["label"] for r in rows if r["status"] == FRONTIER})  # "right below", ...
    return [
        base.transform_filter(f"datum.status === '{FRONTIER}' && datum.label === '{where}'")
        .mark_text(align=side, dx=LABEL_DX[side], dy=LABEL_DY[level], fontSize=12, **ink)
        .encode(x=x, y=y, text="config:N")
        for ink in ({"stroke": "white", "strokeWidth": 4, "strokeOpacity": 0.85}, {"color": "#1e293b"})
        for where in placements
        for side, level in [where.split()]
    ]


def _framed(chart, size: tuple[int, int], title: str, subtitle: list[str]):
    """The picture's size (all of it: autosize fit), title, fonts and legend placement."""
    return (
        chart.properties(
            width=size[0],
            height=size[1],
            autosize=alt.AutoSizeParams(type="fit", contains="padding"),
            title=alt.TitleParams(
                title,
                subtitle=subtitle,
                anchor="start",
                fontSize=16,
                subtitleColor="#475569",
                limit=size[0] - 24,
            ),  # a line too long for the picture ends in an ellipsis, never outside it
            background="white",
            padding=12,
        )
        .configure(font=FONT)
        .configure_axis(labelFontSize=12, titleFontSize=13, titleFontWeight="normal", gridColor="#eef0f3")
        .configure_legend(orient="bottom", labelFontSize=12, symbolSize=110, direction="horizontal")
        .configure_view(stroke="#cbd5e1")
    )


def _subtitle(front: Frontier, rules: Rules) -> list[str]:
    """The evidence ranked, what each axis reads, and what was excluded and why (the PNG has no hover)."""
    lines = [f"Evidence: {front.group.label}"]
    measures = [rules.measures.get(m) for m in front.measures]
    if all(measures):
        lines.append(f"x: {measures[0].label}; y: {measures[1].label}")
    if front.excluded:
        lines.append("Excluded (grey crosses, not ranked): " + excluded_summary(front.excluded))
    return lines


def excluded_summary(excluded: list[LeftOut], most: int = 4) -> str:
    """'cgd + standard, cgd + checkpointing (diverged); adam + standard (oom, no figure)'."""
    by_why: dict[str, list[str]] = {}
    for e in excluded:
        drawn = "" if e.x is not None and e.y is not None else ", no figure"
        by_why.setdefault(e.reason.split(":")[0] + drawn, []).append(f"{e.optimizer} + {e.strategy}")
    parts = []
    for why, names in by_why.items():
        more = f" and {len(names) - most} more" if len(names) > most else ""
        parts.append(f"{', '.join(names[:most])}{more} ({why})")
    return "; ".join(parts)


def _domains(points: list[FrontierPoint], y_dir: str) -> tuple[list[float], list[float]]:
    """Each axis' range over the ranked points and their intervals, padded (more on the better y, where the
    frontier's labels go); excluded points never stretch it."""
    out = []
    for axis in ("x", "y"):
        values = [getattr(p, axis) for p in points]
        values += [v for p in points for v in (getattr(p, f"{axis}_ci") or ())]
        lo, hi = min(values), max(values)
        pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
        low, high = (
            (2 * pad, pad)
            if axis == "y" and y_dir == "min"
            else (pad, 2 * pad)
            if axis == "y"
            else (pad, pad)
        )
        out.append([lo - low, hi + high])
    return out[0], out[1]


def _value_text(value: float, ci, unit: str) -> str:
    """'0.6018 s/epoch (95% CI 0.57–0.64)'."""
    text = fmt(value, unit)
    return text + (f" (95% CI {ci[0]:.4g}–{ci[1]:.4g})" if ci else "")


def _point_row(p: FrontierPoint, xm: Metric, ym: Metric) -> dict:
    """A ranked configuration as the chart draws it: status, means, intervals, and the text of its hover."""
    status = FRONTIER if p.on_frontier else NOISE if p.within_noise else DOMINATED
    (x_lo, x_hi), (y_lo, y_hi) = p.x_ci or (None, None), p.y_ci or (None, None)
    return dict(
        config=f"{p.optimizer} + {p.strategy}",
        status=status,
        x=p.x,
        y=p.y,
        x_lo=x_lo,
        x_hi=x_hi,
        y_lo=y_lo,
        y_hi=y_hi,
        x_text=_value_text(p.x, p.x_ci, xm.unit),
        y_text=_value_text(p.y, p.y_ci, ym.unit),
        note=(f"⚠ {p.flag}: means over the ok seeds" if p.flag else ""),
        label="left above",
    )


def _excluded_row(e: LeftOut, xm: Metric, ym: Metric, domains) -> dict:
    """An excluded configuration, greyed; one beyond the ranked points' range sits on the edge, said on hover."""
    x, y = (_clamp(v, d) for v, d in ((e.x, domains[0]), (e.y, domains[1])))
    edge = " (drawn at the edge: off the scale)" if (x, y) != (e.x, e.y) else ""
    return dict(
        config=f"{e.optimizer} + {e.strategy}",
        status=EXCLUDED,
        x=x,
        y=y,
        x_text=fmt(e.x, xm.unit),
        y_text=fmt(e.y, ym.unit),
        note=e.reason + edge,
        label="left above",
    )


def _clamp(value: float, domain: list[float]) -> float:
    """The value, or the point half-way into the padding on the side it is off the scale (seen whole)."""
    inset = (domain[1] - domain[0]) * 0.035
    return min(max(value, domain[0] + inset), domain[1] - inset)


def place_labels(rows: list[dict], domains, x_dir: str, y_dir: str, size: tuple[int, int]) -> None:
    """Each frontier label where it covers the least of the other labels and points, inside the plot; first
    choice the side of its point that nothing dominates (better x and y), where the staircase is not."""
    plot = (size[0] - 90, size[1] - 170)  # the plot area: the picture less axes, titles and legend (about)
    (x_lo, x_hi), (y_lo, y_hi) = domains
    spots = [
        ((r["x"] - x_lo) / (x_hi - x_lo) * plot[0], (y_hi - r["y"]) / (y_hi - y_lo) * plot[1]) for r in rows
    ]
    taken = [(x - 6, y - 6, x + 6, y + 6) for x, y in spots]  # every point's symbol, and the staircase
    taken += _staircase([s for r, s in zip(rows, spots, strict=True) if r["status"] == FRONTIER], x_dir)
    better, worse = ("right", "left") if x_dir == "min" else ("left", "right")  # text anchors
    levels = ("below", "above") if y_dir == "min" else ("above", "below")
    choices = [(side, level) for level in levels for side in (better, "center", worse)]
    for r, (x, y) in sorted(zip(rows, spots, strict=True), key=lambda rs: rs[1][0]):
        if r["status"] != FRONTIER:
            continue
        boxes = {c: _label_box(x, y, len(r["config"]) * CHAR_PX, *c) for c in choices}
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


def flowchart_chart(
    paths: list[BestPath], summary: dict, rules: Rules, cell: tuple[int, int] = (150, 78)
) -> alt.LayerChart:
    """The paper's Figure 1 as a grid: a family per row, a metric per column, each cell the best optimizer and
    strategy with its value; tied and flagged picks said in the cell, the test and evidence on hover."""
    metrics = list(dict.fromkeys(p.metric for p in paths))
    families = list(dict.fromkeys(p.family for p in paths))
    rows = [_path_row(p, rules) for p in paths]
    present = [o for o in [*rules.optimizers, "no answer"] if any(r["optimizer"] == o for r in rows)]
    colours = [OPTIMIZER_COLOURS.get(o, NO_ANSWER_COLOUR) for o in present]
    colour = alt.Color("optimizer:N", title="optimizer", scale=alt.Scale(domain=present, range=colours))
    base = alt.Chart(alt.Data(values=rows)).encode(
        x=alt.X("metric:N", sort=metrics, title=None, axis=alt.Axis(orient="top", labelAngle=0, **GRID_AXIS)),
        y=alt.Y("family:N", sort=families, title=None, axis=alt.Axis(labelFontWeight="bold", **GRID_AXIS)),
    )
    tooltip = [
        alt.Tooltip(f"{k}:N", title=k) for k in ("family", "metric", "pick", "value", "how", "evidence")
    ]
    cells = base.mark_rect(stroke="white", strokeWidth=3).encode(color=colour, tooltip=tooltip)
    text = base.mark_text(
        lineBreak="\n", baseline="middle", lineHeight=16, dy=-16, fontSize=13, color="#0f172a"
    ).encode(text="text:N", tooltip=tooltip)
    size = (cell[0] * len(metrics) + 120, cell[1] * len(families) + 110)
    subtitle = _counts_lines(summary)
    return _framed(alt.layer(cells, text), size, "Recommendation flowchart: family → metric → pick", subtitle)


def _path_row(p: BestPath, rules: Rules) -> dict:
    """A flowchart cell: the pick in three lines (optimizer, strategy, value), and its hover."""
    pick = p.pick
    row = dict(family=p.family, metric=p.metric, evidence=p.answer.group.label if p.answer else "no evidence")
    if pick is None:
        why = why_none(p)
        return row | dict(optimizer="no answer", text=f"\n{why}\n", pick="—", value="—", how=why)
    mark = " ≈" if pick.tied else ""
    flag = " ⚠" if pick.flag else ""
    return row | dict(
        optimizer=pick.optimizer,
        text=f"{pick.optimizer}{flag}\n{pick.strategy}\n{fmt(pick.value, pick.unit)}{mark}",
        pick=f"{pick.optimizer} + {pick.strategy}",
        value=fmt(pick.value, pick.unit),
        how=separation_text(pick, p.answer.tie_break),
    )


def why_none(p: BestPath) -> str:
    """Why a path has no pick, in two words."""
    if not p.answer:
        return "no evidence"
    return "no figure" if p.answer.measure is None else "nothing qualifies"


def separation_text(pick, tie_break: str | None) -> str:
    """How the pick stands against its runner-up, in words: 'p=0.003 vs X', 'tied (no test)'."""
    t = pick.test
    flag = f"; ⚠ {pick.flag}" if pick.flag else ""
    if t is None:
        return "no other candidate" + flag
    broken = f"; tie-break: {tie_break}" if tie_break else ""
    tied = f"tied ({t.get('reading', 'undecided')}), " if pick.tied else ""
    if t["kind"] is None:
        return (tied + "no test" if pick.tied else t["note"] or "no test") + broken + flag
    p = "p<0.001" if t["p_holm"] < 0.001 else f"p={t['p_holm']:.2g}"
    return tied + f"{t['kind']} {p} vs {t['versus']}" + broken + flag


def _counts_lines(summary: dict) -> list[str]:
    """'16 of 16 paths answered, 2 tied (≈: 1 equivalent, 1 undecided)', then how many best paths each optimizer and strategy is on."""
    opts = ", ".join(f"{k} {v}" for k, v in summary["optimizers"].items()) or "none"
    strategies = ", ".join(f"{k} {v}" for k, v in summary["strategies"].items()) or "none"
    return [
        f"{summary['answered']} of {summary['paths']} paths answered, {summary['tied']} tied (≈: "
        f"{summary['tied_equivalent']} equivalent, {summary['tied_undecided']} undecided), "
        f"{summary['flagged']} with a failed seed.",
        f"On best paths: {opts}; {strategies}.",
    ]


def html_page(chart) -> str:
    """A self-contained HTML page of one chart: the Vega libraries inlined, so it opens offline."""
    return chart.to_html(inline=True, embed_options=EMBED_OPTIONS)


def png_bytes(chart, scale: int = PNG_SCALE) -> bytes:
    """The chart as a PNG, rendered without a browser; its pixels are the chart's size times `scale`."""
    return vl_convert.vegalite_to_png(chart.to_dict(), scale=scale, vl_version=VL_VERSION)


@functools.cache
def javascript_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script (window.vegaEmbed): written once per site."""
    return vl_convert.javascript_bundle(vl_version=VL_VERSION)


def spec(chart) -> dict:
    """The chart's Vega-Lite specification, to embed in a page."""
    return chart.to_dict(validate=False)  # made above and checked by the tests: no 0.1 s schema check each
