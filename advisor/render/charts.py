"""Pictures of answers for people and papers: Pareto frontiers and the recommendation flowchart as
Vega-Lite charts (Altair), written as self-contained HTML that works offline, or as PNG (vl-convert renders
it without a browser).

Imported only by the commands that draw (the `plots` extra): answering stays as light as it was.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from importlib.metadata import version

import altair as alt
import vl_convert
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from advisor.answers.flowchart import BestPath
from advisor.answers.frontier import Frontier, LeftOut
from advisor.answers.pareto import FrontierPoint
from advisor.files import cached_text, replace_file  # noqa: F401 (replace_file: the pages' one write path)
from advisor.places import user_dir
from advisor.render.chart_layout import (
    DOMINATED,
    EXCLUDED,
    FRONTIER,
    KEY_COLUMN_GAP,
    KEY_INDENT,
    LABEL_DX,
    LABEL_DY,
    NOISE,
    axis_domains,
    keep_on_scale,
    key_columns,
    key_height,
    key_title,
    place_labels,
    plot_area,
    short_config,
)
from advisor.render.numbers import fmt
from advisor.render.plot import point_labels
from advisor.rules import Metric, Rules

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
    "ast": True,  # Vega's expression interpreter: no code made at run time, so no 'unsafe-eval' in the policy
    "actions": {"export": True, "source": False, "compiled": False, "editor": False},
}
VL_VERSION = "_".join(alt.SCHEMA_VERSION.split(".")[:2])  # 'v6_4': vl-convert's name for Altair's Vega-Lite
AXIS = alt.Axis(tickCount=6, labelOverlap=True, labelFlush=True)
GRID_AXIS = {"labelFontSize": 13, "domain": False, "ticks": False, "labelPadding": 8}
PNG_SCALE = 2  # PNG pixels per chart pixel: sharp in a paper or on a slide
FRONTIER_SIZE = (640, 420)  # the whole picture, axes and legend included (autosize "fit")
KEY_FONT = 10  # px: the key legend's labels (20 in a PNG)
# What a page advisor writes may load: its own scripts alone (by hash, or 'self': the report's vega.js), no
# inline handler, no eval, no network; inline styles (Vega's and vega-embed's) and data: images (an export)
PAGE_POLICY = (
    "default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src data: blob:; "
    "font-src data:; base-uri 'none'; form-action 'none'"
)
# JSON inside <script>: what could end the element, open a comment or a line in old JavaScript, \u-escaped
SCRIPT_JSON_ESCAPES = {c: f"\\u{ord(c):04x}" for c in "<>&'\u2028\u2029"}
LINE_SEPARATORS = str.maketrans({"\u2028": " ", "\u2029": " "})
# Draws every [data-spec] element of a page with the spec its data-spec names (the same on every page)
DRAW = """
(function () {
  var options = JSON.parse(document.getElementById("embed-options").textContent);
  var charts = Array.prototype.slice.call(document.querySelectorAll("[data-spec]"));
  window.views = {};  // chart id -> its Vega view: its scales, as drawn, for whoever checks them
  Promise.all(charts.map(function (el) {
    el.textContent = "";
    return vegaEmbed(el, JSON.parse(document.getElementById(el.dataset.spec).textContent), options)
      .then(function (result) { window.views[el.id] = result.view; });
  })).then(function () {
    document.body.dataset.charts = "ready";
  }, function (error) {
    document.body.dataset.charts = "failed";
    console.error(error);
  });
})();
"""


def axis_title(metric: Metric) -> str:
    """'wall time per epoch, s/epoch (lower is better)': what, in which unit, and which way is good."""
    unit = f", {metric.unit}" if metric.unit else ""
    return f"{metric.label}{unit} ({'lower' if metric.direction == 'min' else 'higher'} is better)"


def frontier_chart(
    front: Frontier, rules: Rules, size: tuple[int, int] = FRONTIER_SIZE, grow: bool = False
) -> alt.LayerChart:
    """Every configuration at its means with its seed intervals, the frontier's staircase, points within
    noise marked, excluded ones greyed (the reason on hover); the frontier's points named beside them, every
    other one lettered and its letter keyed in a legend (a PNG has no hover); axes with units and direction
    that never stretch a practically equal difference across the whole plot. `grow`: the picture taller by
    its key (a page's; a PNG keeps the size --help states)."""
    xm, ym = rules.metric(front.x), rules.metric(front.y)
    domains = axis_domains(front.points, xm, ym, rules)
    drawn = [e for e in front.excluded if e.x is not None and e.y is not None]
    rows = [_point_row(p, xm, ym) for p in front.points] + [_excluded_row(e, xm, ym) for e in drawn]
    for r in rows:
        keep_on_scale(r, domains)
    _keyed(rows)
    columns = key_columns(rows, size[0])
    key = key_height(rows, columns, size[0])
    if grow:
        size = (size[0], size[1] + key)
    place_labels(rows, domains, xm.direction, ym.direction, plot_area(size, 0 if grow else key))
    base = alt.Chart(alt.Data(values=rows))
    x, y = _position(alt.X, "x", xm, domains[0]), _position(alt.Y, "y", ym, domains[1])
    present = [s for s in STYLE if any(r["status"] == s for r in rows)]
    colour, shape = _by_status(alt.Color, 0, present), _by_status(alt.Shape, 1, present)
    names = {
        "key": "point",
        "config": "configuration",
        "status": "status",
        "x_text": front.x,
        "y_text": front.y,
        "note": "note",
    }
    tooltip = [alt.Tooltip(f"{k}:N", title=t) for k, t in names.items()]
    layers = [
        base.mark_rule(clip=True, strokeWidth=1.5, opacity=0.55).encode(
            x=alt.X("x_lo:Q"), x2=alt.X2("x_hi:Q"), y=y, color=colour
        ),
        base.mark_rule(clip=True, strokeWidth=1.5, opacity=0.55).encode(
            x=x, y=alt.Y("y_lo:Q"), y2=alt.Y2("y_hi:Q"), color=colour
        ),
        base.transform_filter(f"datum.status === '{FRONTIER}'")
        .mark_line(interpolate="step-after" if xm.direction == "min" else "step-before", strokeWidth=2)
        .encode(x=x, y=y, color=alt.ColorValue(STYLE[FRONTIER][0]), order=alt.Order("x:Q")),
        *_label_layers(base, rows, x, y),
        *_key_layer(base, rows, x, y, columns, size[0]),
        base.mark_point(filled=True, size=110, opacity=0.95, clip=True).encode(  # last: no label hides one
            x=x, y=y, color=colour, shape=shape, tooltip=tooltip
        ),
    ]
    title = f"{front.family}: {front.y} against {front.x}"
    return _framed(layers, size, title, _subtitle(front, rules))


def _position(channel, field: str, metric: Metric, domain: list[float]):
    """An axis of the metric: its title with unit and direction, the given range, no forced zero."""
    scale = alt.Scale(domain=domain, zero=False, nice=False)
    return channel(f"{field}:Q", title=axis_title(metric), scale=scale, axis=AXIS)


def _by_status(channel, style: int, present: list[str]):
    """Colour (style 0) or shape (1) by status, over the statuses the chart has: their legend above the plot
    (the key of the lettered points takes the bottom)."""
    scale = alt.Scale(domain=present, range=[STYLE[s][style] for s in present])
    return channel("status:N", title=None, scale=scale, legend=alt.Legend(orient="top"))


def _keyed(rows: list[dict]) -> None:
    """Each row's letter (the ranked points' as `advisor frontier`'s table letters them, then the excluded
    ones'), and what is written beside its point: a frontier point's name, any other point's letter, keyed
    to its configuration in the legend."""
    for r, letter in zip(rows, point_labels(rows), strict=True):
        named = r["status"] == FRONTIER
        r["key"] = letter
        r["text"] = r["config"] if named else letter
        r["entry"] = None if named else f"{letter} {short_config(r['optimizer'], r['strategy'])}"


def _key_layer(base, rows: list[dict], x, y, columns: int, width: int) -> list:
    """The legend that keys every lettered point to its configuration: an empty text mark per such point,
    whose opacity channel is there for its legend only (its symbols hidden: the letters are the symbols)."""
    entries = [r["entry"] for r in rows if r["entry"]]
    if not entries:
        return []
    legend = alt.Legend(
        title=key_title(rows, width),
        orient="bottom",
        direction="horizontal",
        columns=columns,
        symbolSize=0,
        symbolOpacity=0,
        labelOffset=0,
        labelFontSize=KEY_FONT,
        labelLimit=0,
        titleLimit=width - KEY_INDENT,
        rowPadding=1,
        columnPadding=KEY_COLUMN_GAP,
        titleFontSize=KEY_FONT,
        titleFontWeight="normal",
        titleColor="#475569",
    )
    scale = alt.Scale(domain=entries, range=[1] * len(entries))  # ordinal: in the key's order, letters'
    opacity = alt.Opacity("entry:O", scale=scale, legend=legend)
    return [base.transform_filter("datum.entry").mark_text(text="").encode(x=x, y=y, opacity=opacity)]


def _label_layers(base, rows: list[dict], x, y) -> list:
    """Each point's name or letter where place_labels put it, each twice: a white halo under the ink keeps
    it readable over lines and bars."""
    placements = sorted({r["label"] for r in rows})  # "right below", ...
    return [
        base.transform_filter(f"datum.label === '{where}'")
        .mark_text(align=side, dx=LABEL_DX[side], dy=LABEL_DY[level], fontSize=12, **ink)
        .encode(x=x, y=y, text=alt.Text("text:N"))
        for ink in ({"stroke": "white", "strokeWidth": 4, "strokeOpacity": 0.85}, {"color": "#1e293b"})
        for where in placements
        for side, level in [where.split()]
    ]


def _framed(layers: list, size: tuple[int, int], title: str, subtitle: list[str]) -> alt.LayerChart:
    """The layers as one picture: its size (all of it: autosize fit), title, fonts and legend placement. Made
    in one step: each of Altair's .properties() and .configure_*() copies every layer again."""
    return alt.LayerChart(
        layer=layers,
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
        config=alt.Config(
            font=FONT,
            axis=alt.AxisConfig(
                labelFontSize=12, titleFontSize=13, titleFontWeight="normal", gridColor="#eef0f3"
            ),
            legend=alt.LegendConfig(
                orient="bottom", labelFontSize=12, symbolSize=110, direction="horizontal"
            ),
            view=alt.ViewConfig(stroke="#cbd5e1"),
        ),
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
        optimizer=p.optimizer,
        strategy=p.strategy,
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


def _excluded_row(e: LeftOut, xm: Metric, ym: Metric) -> dict:
    """An excluded configuration, greyed, with the reason on hover."""
    return dict(
        config=f"{e.optimizer} + {e.strategy}",
        optimizer=e.optimizer,
        strategy=e.strategy,
        status=EXCLUDED,
        x=e.x,
        y=e.y,
        x_text=fmt(e.x, xm.unit),
        y_text=fmt(e.y, ym.unit),
        note=e.reason,
        label="left above",
    )


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
    ).encode(text=alt.Text("text:N"), tooltip=tooltip)
    size = (cell[0] * len(metrics) + 120, cell[1] * len(families) + 110)
    subtitle = _counts_lines(summary)
    return _framed([cells, text], size, "Recommendation flowchart: family → metric → pick", subtitle)


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
    """A self-contained HTML page of one chart that opens offline: the Vega libraries inlined, the spec as
    escaped JSON, and a policy that runs no script but that one (a string from a KB is only ever text)."""
    code = inline_script(javascript_bundle() + DRAW)
    chart_spec = spec(chart)
    template = environment().get_template("chart.html")
    return template.render(
        title=page_title(chart_spec),
        policy=page_policy((code,)),
        spec=chart_spec,
        options=EMBED_OPTIONS,
        script=Markup(code),
    )


def page_title(chart_spec: dict) -> str:
    """The chart's title as its page's: its first line."""
    title = chart_spec.get("title", {})
    text = title.get("text", "advisor") if isinstance(title, dict) else title
    return text[0] if isinstance(text, list) else str(text)


@functools.cache
def environment() -> Environment:
    """advisor's page templates, autoescaped (a name from a KB is text, never markup), with script_json."""
    env = Environment(loader=PackageLoader("advisor.render", "templates"), autoescape=select_autoescape())
    env.filters["script_json"] = script_json
    return env


def script_json(value) -> Markup:
    """`value` as JSON that is safe inside a <script> element: '<', '>', '&', "'" and U+2028/2029 \\u-escaped
    (the JSON means the same), so no string can close the element, open a comment or end a line."""
    text = json.dumps(value, ensure_ascii=False)
    return Markup(re.sub("[<>&'\u2028\u2029]", lambda m: SCRIPT_JSON_ESCAPES[m[0]], text))


def inline_script(code: str) -> str:
    """Code made safe to write between <script> and </script>: a '</script' or '<!--' in it (in a string or a
    regular expression; none is in Vega's bundle today) written as '<\\/script', '<\\!--', which mean the same."""
    code = re.sub(r"</(script)", r"<\\/\1", code, flags=re.I)
    return code.replace("<!--", "<\\!--")


def script_hash(code: str) -> str:
    """The policy's name for one inline script: 'sha256-' and its digest, base64."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(code.encode("utf-8")).digest()).decode() + "'"


def page_policy(inline: tuple[str, ...] = (), own_files: bool = False) -> str:
    """The Content-Security-Policy of a page: its inline scripts by hash, and ('self') the script files
    written beside it; nothing else runs, not an injected <script>, an onerror= or a javascript: URL."""
    scripts = ["'self'"] if own_files else []
    return PAGE_POLICY.format(scripts=" ".join(scripts + [script_hash(c) for c in inline]) or "'none'")


def png_bytes(chart, scale: int = PNG_SCALE) -> bytes:
    """The chart as a PNG, rendered without a browser; its pixels are the chart's size times `scale`."""
    return vl_convert.vegalite_to_png(one_line(chart.to_dict()), scale=scale, vl_version=VL_VERSION)


@functools.cache
def javascript_bundle() -> str:
    """Vega, Vega-Lite and vega-embed as one classic script (window.vegaEmbed): written once per site. Bundling
    takes vl-convert a second, so it is kept in the user's data folder (cache/), named by all its bytes depend
    on (vl-convert's version and VL_VERSION) and by their sha256: checked when read, rebuilt when it fails,
    built in memory where the folder cannot be written (cached_text). Once per process either way."""
    stem = f"vega-bundle-{version('vl-convert-python')}-{VL_VERSION}"
    build = functools.partial(vl_convert.javascript_bundle, vl_version=VL_VERSION)
    return cached_text(user_dir() / "cache", stem, build)


def unchecked():
    """A context in which Altair does not check each object as it is made (its debug mode: 0.07 s of a
    report's eleven charts): they are made by the code above and pinned by tests (a PNG's spec is still
    checked whole, in png_bytes)."""
    return alt.utils.schemapi.debug_mode(False)


def spec(chart) -> dict:
    """The chart's Vega-Lite specification, to embed in a page (its strings one_line)."""
    return one_line(
        chart.to_dict(validate=False)
    )  # made above and checked by the tests: no 0.1 s schema check


def one_line(value):
    """Every string in a spec with U+2028/2029 as spaces: Vega-Lite quotes titles into the expressions it
    builds (a tooltip, a mark's description), where either ends the string literal; a name from a KB or a
    label from a rules file holding one would stop the chart from drawing."""
    if isinstance(value, str):
        return value.translate(LINE_SEPARATORS)
    if isinstance(value, dict):
        return {k: one_line(v) for k, v in value.items()}
    if isinstance(value, list):
        return [one_line(v) for v in value]
    return value
