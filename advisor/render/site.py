"""`advisor report`: a static site of a KB's answers, one index page that opens from disk (no server).

Every family × metric answer, the Pareto frontiers, the flowchart, the claims with their verdicts, `advisor
fit`'s cached predictions, and the provenance of each evidence group. The page is a Jinja2 template
(advisor/render/templates/report.html); the charts are Vega-Lite specs drawn by one script written beside it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from advisor.answers.claims import VERDICTS, check_all
from advisor.answers.evidence import params_text
from advisor.answers.flowchart import BestPath, summary, walk
from advisor.answers.frontier import frontier
from advisor.answers.recommendation import Answer, Entry, selector_flags
from advisor.answers.transfer import Transfer, transfers
from advisor.errors import Error, NoEvidence
from advisor.kb.reader import Group, group_settings, stats
from advisor.prediction.step import CATEGORIES, n_params, step_flops, tensor_peak
from advisor.render import charts
from advisor.render.numbers import fmt
from advisor.render.views import test_brief
from advisor.rules import Rules

SCRIPT = "vega.js"  # Vega, Vega-Lite and vega-embed, written once beside index.html
CHART_SIZE = (560, 380)
FLOWCHART_CELL = (200, 84)
RUNNERS_UP = 3


class NothingToReport(Error):
    """The KB holds no evidence the report could show."""


@dataclass
class Figure:
    """One chart of the page: its Vega-Lite spec, or the sentence that says why there is none."""

    id: str
    title: str
    spec: dict | None = None
    note: str | None = None


def write_site(conn: sqlite3.Connection, out: Path, rules: Rules, source: str | None, kb: str) -> Path:
    """Write index.html and the chart script into `out` (created); nothing else there is touched."""
    page = render(site_context(conn, rules, source, kb))
    out.mkdir(parents=True, exist_ok=True)
    (out / SCRIPT).write_text(charts.javascript_bundle(), encoding="utf-8")
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def render(context: dict) -> str:
    """The index page from its template (autoescaped: names and reasons from a KB are text, never markup)."""
    env = Environment(loader=PackageLoader("advisor.render", "templates"), autoescape=select_autoescape())
    return env.get_template("report.html").render(**context)


def site_context(conn: sqlite3.Connection, rules: Rules, source: str | None, kb: str) -> dict:
    """Everything the page shows, computed once."""
    paths = walk(conn, rules, source=source)
    if not any(p.answer for p in paths):
        where = f" from source {source!r}" if source else ""
        raise NothingToReport(
            f"the knowledge base has no runs{where}: nothing to report. "
            "Measure some with `advisor measure`, or drop --source (see `advisor kb stats`)."
        )
    families = [family_section(conn, rules, f, paths, source) for f in dict.fromkeys(p.family for p in paths)]
    kinds = {f["name"]: f["badge"] for f in families if f["group"]}
    flow = charts.flowchart_chart(paths, summary(paths), rules, FLOWCHART_CELL)
    verdicts = check_all(conn, source, rules)
    return dict(
        title="advisor report",
        kb=kb,
        source=source or "the best evidence per family",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=version("advisor"),
        script=SCRIPT,
        summary=summary(paths),
        flowchart=Figure("flowchart", "Recommendation flowchart", charts.spec(flow)),
        tree=flowchart_tree(paths),
        badges=kinds,
        mixed_evidence=mixed_evidence(kinds),
        families=[f for f in families if f["group"]],
        claims=[v.as_dict() for v in verdicts],
        claim_counts={k: sum(v.verdict == k for v in verdicts) for k in VERDICTS},
        fit=fit_tables(conn),
        transfers=[transfer_row(t) for t in transfers(conn, rules)],
        groups=stats(conn)["groups"],
        embed_options=charts.EMBED_OPTIONS,
    )


def transfer_row(t: Transfer) -> dict:
    """One family × metric of the scale section, as the page shows it."""
    lo, hi = t.interval
    return dict(
        family=t.family,
        metric=t.metric,
        sizes=f"{params_text(t.smaller.n_params)} → {params_text(t.larger.n_params)}",
        configurations=t.configurations,
        tau=f"{t.tau:+.2f} [{lo:+.2f}, {hi:+.2f}]",
        pick="held" if t.held else f"moved: {t.pick_smaller} → {t.pick_larger}",
    )


def evidence_badge(group: Group) -> str:
    """The kind of evidence a group is, as the report marks each row: the paper's figures, the shipped
    reference measurements, or the user's own runs."""
    if group.own:
        return "your runs"
    return "paper" if group.kind == "paper" else "reference measurement"


def mixed_evidence(badges: dict[str, str]) -> str | None:
    """The banner of a page whose families answer from different kinds of evidence, else None."""
    kinds = sorted(set(badges.values()))
    if len(kinds) < 2:
        return None
    said = "; ".join(f"{kind}: {', '.join(f for f, k in badges.items() if k == kind)}" for kind in kinds)
    return (
        f"The rows below answer from different kinds of evidence ({said}): compare a row with another only "
        "knowing that its numbers come from another scale, protocol or machine."
    )


def flowchart_tree(paths: list[BestPath]) -> dict[str, list[dict]]:
    """family -> its paths as {metric, optimizer, strategy, value, how}: the tree in words."""
    tree: dict[str, list[dict]] = {}
    for p in paths:
        pick = p.pick
        tree.setdefault(p.family, []).append(
            dict(
                metric=p.metric,
                optimizer=pick.optimizer if pick else None,
                strategy=pick.strategy if pick else None,
                value=fmt(pick.value, pick.unit) if pick else None,
                how=charts.separation_text(pick, p.answer.tie_break) if pick else charts.why_none(p),
            )
        )
    return tree


def family_section(
    conn: sqlite3.Connection, rules: Rules, family: str, paths: list[BestPath], source: str | None
) -> dict:
    """One family: its evidence group and provenance, an answer card per metric, its frontiers."""
    answers = [p.answer for p in paths if p.family == family and p.answer]
    group = answers[0].group if answers else None
    return dict(
        name=family,
        group=group,
        badge=evidence_badge(group) if group else None,
        provenance=provenance(conn, group) if group else None,
        answers=[answer_card(a, rules) for a in answers],
        figures=frontier_figures(conn, rules, family, source) if group else [],
    )


def answer_card(a: Answer, rules: Rules) -> dict:
    """One family × metric answer, as the page shows it."""
    pick, metric = a.recommendation, a.metric
    measure = rules.measures.get(a.measure) if a.measure else None
    return dict(
        metric=metric.name,
        label=metric.label,
        direction="lower is better" if metric.direction == "min" else "higher is better",
        measure=measure.label if measure else None,
        pick=f"{pick.optimizer} + {pick.strategy}" if pick else None,
        optimizer=pick.optimizer if pick else None,
        value=fmt(pick.value, pick.unit) if pick else None,
        stated=pick.stated if pick else None,
        seeds=seeds_text(pick) if pick else None,
        how=charts.separation_text(pick, a.tie_break) if pick else None,
        tied=len(a.tied_with) if pick and pick.tied else 0,
        flag=pick.flag if pick else None,
        why_none=a.why_none,
        runners_up=[_entry_row(e) for e in a.alternatives[:RUNNERS_UP]],
        excluded=[dict(config=f"{e.optimizer} + {e.strategy}", reason=e.reason) for e in a.excluded],
        holes=a.holes,
        caveats=a.caveats,
    )


def seeds_text(e: Entry) -> str:
    """'3 seeds, 95% CI 0.57–0.64', '1 run'."""
    if e.seeds > 1 and e.ci95 is not None:
        return f"{e.seeds} seeds, 95% CI {e.ci95[0]:.4g}–{e.ci95[1]:.4g}"
    return "1 run" if e.seeds == 1 else f"{e.seeds} runs"


def _entry_row(e: Entry) -> dict:
    """A runner-up: its configuration, value and test against the pick."""
    return dict(config=f"{e.optimizer} + {e.strategy}", value=fmt(e.value, e.unit), test=test_brief(e))


def frontier_figures(conn: sqlite3.Connection, rules: Rules, family: str, source: str | None) -> list[Figure]:
    """Loss against each other metric the flowchart walks; a figure without points says why instead."""
    out = []
    for x in [m for m in rules.flowchart["metrics"] if m != "loss"]:
        fid, title = f"{family}-{x}", f"loss against {x}"
        try:
            front = frontier(conn, family, x, "loss", rules, source)
        except NoEvidence as e:
            out.append(Figure(fid, title, note=str(e)))
            continue
        if not front.points:
            note = f"No configuration has both a {x} and a loss figure in this evidence."
            out.append(Figure(fid, title, note=note))
            continue
        out.append(Figure(fid, title, charts.spec(charts.frontier_chart(front, rules, CHART_SIZE))))
    return out


def provenance(conn: sqlite3.Connection, group: Group) -> dict:
    """Where the group's numbers come from: hardware, software, settings, when, and how its runs ended."""
    row = conn.execute(
        "SELECT min(device), max(host_memory_gb), max(accelerator_memory_gb), min(started_at), "
        "max(finished_at), count(DISTINCT seed), min(software) FROM runs WHERE grp = ?",
        [group.id],
    ).fetchone()
    statuses = conn.execute(
        "SELECT status, count(*) FROM runs WHERE grp = ? GROUP BY status ORDER BY count(*) DESC", [group.id]
    ).fetchall()
    software = json.loads(row[6] or "{}")
    return dict(
        id=group.ref,
        select=selector_flags(group),
        source=group.source,
        model=group.model + (f" ({group.n_params / 1e6:.1f} M parameters)" if group.n_params else ""),
        hardware=group.hardware,
        device=row[0],
        memory=", ".join(
            f"{label} {fmt(gb, 'GB')}" for label, gb in (("host", row[1]), ("accelerator", row[2])) if gb
        ),
        preset=group.preset,
        protocol=group.protocol,
        runs=", ".join(f"{n} {s}" for s, n in statuses),
        seeds=group.n_seeds,
        when=" – ".join(dict.fromkeys(t[:10] for t in row[3:5] if t)) or "as published",
        software=", ".join(f"{k} {v}" for k, v in software.items() if v and k != "platform") or "not stated",
        settings="; ".join(group_settings(conn, group)),
    )


def _configuration(payload: dict) -> str:
    """What trains and where the optimizer lives, as a prefix of the optimizer's name ('lora r16 · ')."""
    what = payload.get("configuration") or {}
    adapter = what.get("adapter") or {"adapter": "full"}
    label = "" if adapter["adapter"] == "full" else f"{adapter['adapter']} r{adapter.get('r')} · "
    return label + ("offloaded " if what.get("offload", "none") != "none" else "")


def fit_tables(conn: sqlite3.Connection) -> list[dict]:
    """`advisor fit`'s cached predictions, per model and shape: the tensor peak at micro-batch 1 by category."""
    rows = conn.execute(
        "SELECT model, dtype, seq_len, image_size, device, optimizer, strategy, payload FROM predictions "
        "ORDER BY model, dtype, seq_len, image_size, device, optimizer, strategy"
    ).fetchall()
    tables: dict[tuple, dict] = {}
    for model, dtype, seq_len, image_size, device, optimizer, strategy, payload in rows:
        payload = json.loads(payload)
        shape = f"{seq_len} tokens" if seq_len else f"{image_size} px" if image_size else ""
        key = (model, dtype, shape, device)
        table = tables.setdefault(key, dict(model=model, dtype=dtype, shape=shape, device=device, rows=[]))
        table["params"] = f"{n_params(payload) / 1e9:.3g} B parameters"
        phase, peak = tensor_peak(payload, 1)
        table["rows"].append(
            dict(
                optimizer=_configuration(payload) + optimizer,
                strategy=strategy,
                parts=[f"{peak[c] / 1e9:.2f}" for c in CATEGORIES],
                total=f"{sum(peak.values()) / 1e9:.2f}",
                phase=phase,
                tflops=f"{step_flops(payload, 1) / 1e12:.3g}",
            )
        )
    return list(tables.values())
