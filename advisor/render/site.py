"""`advisor report`: a static site of a KB's answers, one index page that opens from disk (no server).

Every family × metric answer, the Pareto frontiers, the flowchart, the claims with their verdicts, what fits
which accelerator for every model `advisor fit` traced (its own answer, from the traces it cached), and the
provenance of each evidence group. The page is a Jinja2 template (advisor/render/templates/report.html); the
charts are Vega-Lite specs drawn by one script written beside it. It is made to be sent: no absolute path.
"""

from __future__ import annotations

import html
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from advisor.answers.claims import VERDICTS
from advisor.answers.evidence import params_text
from advisor.answers.flowchart import BestPath
from advisor.answers.recommendation import Answer, Entry, selector_flags
from advisor.answers.report_data import FamilyData, Provenance, ReportData
from advisor.answers.transfer import Transfer
from advisor.kb.queries.groups import Group, json_value
from advisor.prediction import answer as fit_answer
from advisor.prediction.accelerators import gib
from advisor.prediction.answer import TracedFits
from advisor.prediction.cache import Traced
from advisor.render import charts
from advisor.render.numbers import fmt
from advisor.render.readings import test_brief
from advisor.rules import Accelerator, Rules

SCRIPT = "vega.js"  # Vega, Vega-Lite, vega-embed and charts.DRAW, written once beside index.html
INDEX = "index.html"
GENERATOR = '<meta name="generator" content="advisor report">'  # in the head of every page a report writes
# The page runs vega.js alone ('self'): no inline script, so no hash a path rewrite could touch
POLICY = charts.page_policy(own_files=True)
CHART_SIZE = (560, 380)
FLOWCHART_CELL = (200, 84)
RUNNERS_UP = 3
# An absolute path in the page's text: a slash that no word, dot, tilde, colon, slash or tag bracket precedes
# ('s/epoch', 'http://', '</td>' are not paths), then what a path's parts are made of
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/<>-])/[\w.+@%=-][^\s\"'<>&;:,()\[\]{}|*?`\\]*")


@dataclass
class SiteFigure:
    """One chart of the page: its Vega-Lite spec, or the sentence that says why there is none."""

    id: str
    title: str
    spec: dict | None = None
    note: str | None = None


def write_site(data: ReportData, out: Path, rules: Rules, kb: str) -> Path:
    """Write the page of `data` (advisor.answers.report_data.gather_report: what the KB `kb` holds) and the
    chart script into `out` (created); nothing else there is touched, and each is replaced whole
    (charts.replace_file: a symbolic link there is replaced, never written through). The page names no
    absolute path (without_paths): it is made to be sent, and the sender's folders are theirs."""
    with charts.unchecked():
        context = site_context(data, rules, kb)
    page = without_paths(render(context))
    out.mkdir(parents=True, exist_ok=True)
    charts.replace_file(out / SCRIPT, (charts.javascript_bundle() + charts.DRAW).encode("utf-8"))
    index = out / INDEX
    charts.replace_file(index, page.encode("utf-8"))  # last: the page marks the folder as a report's
    return index


def render(context: dict) -> str:
    """The index page from its template (autoescaped: names and reasons from a KB are text, never markup;
    specs as script_json), under a policy that runs vega.js alone."""
    return charts.environment().get_template("report.html").render(**context, policy=POLICY)


def foreign_files(out: Path) -> bool:
    """Whether `out` holds files a report did not write: a folder that is not empty and whose index.html is
    not a report's page (a plain file, not a link, with GENERATOR in its head). A report rewrites only its own."""
    if not out.is_dir() or not any(out.iterdir()):
        return False
    return not is_report_page(out / INDEX)


def in_the_way(out: Path) -> list[Path]:
    """What stands where the report's files go and cannot be replaced by a file: a folder named index.html or
    vega.js (a link, a pipe or a file can; never written through or opened)."""
    return [out / n for n in (SCRIPT, INDEX) if (out / n).is_dir() and not (out / n).is_symlink()]


def is_report_page(path: Path) -> bool:
    """Whether `path` is a page a report wrote: a plain file (never a link followed) naming it in its head."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode) and GENERATOR.encode() in f.read(4096)


def shown_path(path: str | os.PathLike, cwd: Path | None = None, home: Path | None = None) -> str:
    """A path as a page that is sent may name it: relative to the folder the report was made in when under
    it, from ~ when under the home folder, else its last part alone; a relative one as it is."""
    path = Path(path)
    if not path.is_absolute():
        return str(path)
    for base, prefix in ((cwd or Path.cwd(), ""), (home or Path.home(), "~/")):
        if path != base and path.is_relative_to(base):
            return prefix + path.relative_to(base).as_posix()
    return path.name or str(path)


def without_paths(text: str) -> str:
    """The text with every absolute path in it as shown_path shows it: the KB's file, a model's folder, a
    data file named in a run's settings."""
    cwd, home = Path.cwd(), Path.home()
    return ABSOLUTE_PATH.sub(
        lambda m: html.escape(shown_path(html.unescape(m[0]), cwd, home), quote=False), text
    )


def site_context(data: ReportData, rules: Rules, kb: str) -> dict:
    """Everything the page shows, as its template reads it, from what was gathered (nothing more is read)."""
    paths, source = data.paths, data.source
    families = [family_section(f, rules) for f in data.families]
    kinds = {f["name"]: f["badge"] for f in families if f["group"]}
    flow = charts.flowchart_chart(paths, data.summary, rules, FLOWCHART_CELL)
    verdicts = data.verdicts
    return dict(
        title="advisor report",
        kb=kb,
        source=source or "the best evidence per family",
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        version=version("advisor"),
        script=SCRIPT,
        summary=data.summary,
        flowchart=SiteFigure("flowchart", "Recommendation flowchart", charts.spec(flow)),
        tree=flowchart_tree(paths, {f["name"]: f["group"] for f in families}),
        badges=kinds,
        mixed_evidence=mixed_evidence(kinds),
        families=[f for f in families if f["group"]],
        claims=[v.as_dict() for v in verdicts],
        claim_counts={k: sum(v.verdict == k for v in verdicts) for k in VERDICTS},
        fit=fit_sections(data.fits),
        transfers=[transfer_row(t) for t in data.transfers],
        groups=data.groups,
        embed_options=charts.EMBED_OPTIONS,
    )


def transfer_row(t: Transfer) -> dict:
    """One family × metric of the scale section, as the page shows it."""
    return dict(
        family=t.family,
        metric=t.metric,
        sizes=f"{params_text(t.smaller.n_params)} → {params_text(t.larger.n_params)}",
        configurations=t.configurations,
        tau=t.tau_text,
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


def flowchart_tree(paths: list[BestPath], main: dict[str, Group | None]) -> dict[str, list[dict]]:
    """family -> its paths as {metric, optimizer, strategy, value, how, evidence}: the tree in words; a path
    answered by another group than its family's `main` one (the badge beside the family) names it."""
    tree: dict[str, list[dict]] = {}
    for p in paths:
        pick, group = p.pick, p.answer.group if p.answer else None
        tree.setdefault(p.family, []).append(
            dict(
                metric=p.metric,
                optimizer=pick.optimizer if pick else None,
                strategy=pick.strategy if pick else None,
                value=fmt(pick.value, pick.unit) if pick else None,
                how=charts.separation_text(pick, p.answer.tie_break) if pick else charts.why_none(p),
                evidence=group.label if group is not None and group != main.get(p.family) else None,
            )
        )
    return tree


def family_section(family: FamilyData, rules: Rules) -> dict:
    """One family: its evidence groups (the one answering most of its metrics first: a published table of
    losses answers the loss alone) with their provenance, an answer card per metric, its frontiers."""
    answers, group = family.answers, family.group
    cards = [
        answer_card(a, rules) | {"evidence": a.group.label if a.group != group else None} for a in answers
    ]
    return dict(
        name=family.name,
        group=group,
        badge=evidence_badge(group) if group else None,
        provenance=provenance(family.provenance[0]) if group else None,
        more_provenance=[
            provenance(p) | {"answers": ", ".join(a.metric.name for a in answers if a.group == p.group)}
            for p in family.provenance[1:]
        ],
        answers=cards,
        figures=frontier_figures(family, rules) if group else [],
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


def frontier_figures(family: FamilyData, rules: Rules) -> list[SiteFigure]:
    """Loss against each other metric the flowchart walks, in the family section's group; a figure without
    points says why instead."""
    out = []
    for f in family.frontiers:
        fid, title = f"{family.name}-{f.x}", f"loss against {f.x}"
        if f.front is None:
            out.append(SiteFigure(fid, title, note=f.note))
            continue
        if not f.front.points:
            note = f"No configuration has both a {f.x} and a loss figure in this evidence."
            out.append(SiteFigure(fid, title, note=note))
            continue
        chart = charts.frontier_chart(f.front, rules, CHART_SIZE, grow=True)
        out.append(SiteFigure(fid, title, charts.spec(chart)))
    return out


def provenance(p: Provenance) -> dict:
    """Where the group's numbers come from: hardware, software, settings, when, and how its runs ended."""
    group, span = p.group, p.span
    memory = (("host", span["host_memory_gb"]), ("accelerator", span["accelerator_memory_gb"]))
    stamps = (span["started_at"], span["finished_at"])
    return dict(
        id=group.ref,
        select=selector_flags(group),
        source=group.source,
        model=group.model + (f" ({group.n_params / 1e6:.1f} M parameters)" if group.n_params else ""),
        hardware=group.hardware,
        device=span["device"],
        memory=", ".join(f"{label} {fmt(gb, 'GB')}" for label, gb in memory if gb),
        preset=group.preset,
        protocol=group.protocol,
        runs=", ".join(f"{n} {s}" for s, n in p.statuses),
        seeds=group.n_seeds,
        when=" – ".join(dict.fromkeys(t[:10] for t in stamps if t)) or "as published",
        software=software_of(span["software"]),
        settings="; ".join(p.settings),
    )


def software_of(stored: str | None) -> str:
    """A run's `software` column in words ('torch 2.13.0, transformers 5.0'): what the KB's JSON object names,
    'not stated' where it is empty, and 'unreadable' where the column is not a JSON object (a KB edited by
    hand or by another tool: the page says so and goes on)."""
    if not stored:
        return "not stated"
    try:
        software = json_value(stored)
    except ValueError:
        return "unreadable (not JSON)"
    if not isinstance(software, dict):
        return "unreadable (not a JSON object)"
    return ", ".join(f"{k} {v}" for k, v in software.items() if v and k != "platform") or "not stated"


def fit_sections(fits: list[TracedFits]) -> list[dict]:
    """advisor fit's answers for every model and shape the KB holds traces of (api.traced_fits), as sections."""
    return [fit_section(traced, answers) for traced, answers in fits]


def fit_section(traced: Traced, answers: list) -> dict:
    """One model and shape: its size, and an accelerator a row."""
    first = next((a for _, a in answers if isinstance(a, fit_answer.FitAnswer)), None)
    shape = (
        f"{traced.seq_len} tokens"
        if traced.seq_len
        else f"{traced.image_size} px"
        if traced.image_size
        else ""
    )
    if traced.method != "trainer":  # TRL's SFT step beside Trainer's
        shape = (
            f"{shape}, TRL's {traced.method.upper()} step" if shape else f"TRL's {traced.method.upper()} step"
        )
    return dict(
        model=shown_path(traced.name),
        params=f"{first.n_params / 1e9:.3g} B parameters" if first else None,
        shape=shape,
        rows=[fit_row(acc, a) for acc, a in answers],
    )


def fit_row(acc: Accelerator, a) -> dict:
    """An accelerator's row: fits or not, the largest micro-batch, the configuration advisor fit picks, its
    memory and speed, where its memory peaks, what its adapter measured against full fine-tuning, and the
    code that runs it."""
    if isinstance(a, str):
        return dict(key=acc.key, gpu=acc.name, memory=None, fits=None, note=a)
    shown = a.pick or a.several
    row = dict(
        key=acc.key,
        gpu=acc.name,
        memory=f"{gib(a.question.budget_gb):.3g} GiB",
        fits=a.pick is not None,
        verdict=_verdict(a),
        batch=a.pick.max_batch_size if a.pick else None,
        note=None,
    )
    if shown is None:
        smallest = min(a.rows, key=lambda r: r.total)
        return row | dict(pick=None, config=smallest.label, total=f"{gib(smallest.total):.1f} GiB", code=None)
    speed = (
        f"{shown.tokens_per_s:,.0f} tokens/s" if shown.tokens_per_s else fmt(shown.throughput, "samples/s")
    )
    launch = shown.launch["command"] if shown.launch else None
    return row | dict(
        pick=shown.label,
        total=f"{gib(shown.total):.1f} GiB" + (" per GPU" if shown.world > 1 else ""),
        speed=speed if shown.throughput else None,
        peak=phase_words(shown.peak_phase),
        quality=shown.adapter_evidence,  # its adapter's measured loss against full fine-tuning, if any
        code=shown.trainer_code,
        launch=launch,
    )


def _verdict(a) -> str:
    """'8 of 8 configurations fit', 'none of 30 fits one; 4 GPUs hold it', 'none of 30 configurations fits'."""
    n = len(a.rows)
    if a.pick:
        return f"{len(a.fitting)} of {n} configurations fit"
    if a.several:
        return f"none of {n} fits one; {a.several.world} GPUs hold it"
    return f"none of {n} configurations fits"


def phase_words(phase: str) -> str:
    """A traced step's phase as a reader says it: 'backward0' -> 'backward', 'optimizer_step' -> 'optimizer step'."""
    return re.sub(r"\d+$", "", phase).replace("_", " ")
