"""Rich renderables for every answer; only the CLI prints them."""

from __future__ import annotations

from rich.console import Group as RGroup
from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from advisor.answers.evidence import params_text
from advisor.answers.flowchart import BestPath
from advisor.answers.pareto import FrontierPoint
from advisor.answers.recommendation import Answer, Entry, selector_flags
from advisor.kb.queries.for_report import RUN_COLUMNS
from advisor.render.numbers import fmt
from advisor.render.plot import point_labels, scatter
from advisor.render.readings import fmt_p, test_brief, test_line, tie_how, tie_readings
from advisor.rules import Metric, Rules, gib


def _with_ci(value: float, ci) -> str:
    return fmt(value) if not ci else f"{value:.4g} ±{(ci[1] - ci[0]) / 2:.2g}"


def _seeds(e: Entry) -> str:
    if e.predicted:
        return "predicted (advisor fit)"
    if e.seeds > 1 and e.ci95 is not None:
        return f"{e.seeds} seeds, 95% CI {e.ci95[0]:.4g}–{e.ci95[1]:.4g}"
    return "1 run" if e.seeds == 1 else f"{e.seeds} runs"


def _disagreements_table(answer: Answer) -> Table:
    """Each evidence group's pick where it differs from the answer's, side by side."""
    table = Table(title="Other evidence picks differently", title_justify="left", show_edge=False)
    for col in ("evidence", "pick", answer.metric.name, "select with"):
        table.add_column(col)
    rec = answer.recommendation
    table.add_row(
        answer.group.label, f"{rec.optimizer} + {rec.strategy}", fmt(rec.value, rec.unit), "(this answer)"
    )
    for d in answer.disagreements:
        pick = d["pick"]
        table.add_row(
            d["evidence"]["label"],
            f"{pick['optimizer']} + {pick['strategy']}",
            fmt(pick["value"], pick["unit"]),
            d["select"],
        )
    return table


def flag_text(e) -> str:
    """'⚠ 2 of 3 seeds ok; seed 1 diverged: mean over the 2 ok seeds'."""
    n = e.seeds if e.seeds is not None else e.seeds_ok  # the seeds the mean is over
    return f"⚠ {e.flag}: mean over the {n} ok seed{'s' if n != 1 else ''}"


def answer_view(answer: Answer, rules: Rules, verbose: bool = False) -> RenderableType:
    """`advisor recommend`: the pick, why, its evidence and what of the question was not applied; with
    `verbose`, the alternatives, exclusions, holes, caveats, frontier and other evidence too."""
    if not verbose:
        return RGroup(_headline(answer, rules, notes=True), *_brief(answer))
    parts: list[RenderableType] = [_headline(answer, rules)]
    if answer.alternatives:
        parts.append(_entries_table("Runners-up", answer.alternatives, show_tie=True))
    if answer.other_rows:
        parts.append(_other_rows(answer))
    if answer.excluded:
        parts.append(_excluded_table(answer.excluded))
    if answer.holes:
        parts.append(Text("Holes in the evidence: " + "; ".join(answer.holes) + ".", style="yellow"))
    for note in answer.notes:
        parts.append(Text(note, style="bold yellow"))
    if answer.mixed_protocols:
        parts.append(Text(_mixed(answer), style="bold yellow"))
    if answer.caveats:
        caveats = Text("Caveats\n", style="bold")
        for c in answer.caveats:
            caveats.append(f"• {c}\n")
        parts.append(caveats)
    if answer.frontier:
        x, y = answer.frontier_axes
        parts.append(frontier_view(answer.frontier, rules, x, y, title=f"Pareto frontier: {y} vs {x}"))
    if answer.disagreements:
        parts.append(_disagreements_table(answer))
    if answer.other_groups:
        parts.append(_other_evidence(answer))
    return RGroup(*parts)


def _other_rows(answer: Answer) -> Text:
    """The source's own tables beside the rows ranked: each figure's best other row, and where it is."""
    out = Text(
        "Other rows of the source's tables (the row ranked is the authors' chosen setting)", style="bold"
    )
    for r in answer.other_rows:
        unit = answer.recommendation.unit if answer.recommendation else ""
        out.append(
            f"\n• {r['optimizer']} + {r['strategy']}: {fmt(r['value'], unit)} beside the {fmt(r['ranked'], unit)} ranked"
        )
        out.append(f" ({r['where']})", style="dim")
    return out


def _mixed(answer: Answer) -> str:
    """The warning of evidence whose runs were measured with different settings."""
    mixed = "; ".join(f"{p}: {', '.join(cfgs)}" for p, cfgs in answer.mixed_protocols.items())
    return (
        f"This evidence mixes runs measured with different settings ({mixed}): "
        "compare like with like, or measure the missing cells with the same settings."
    )


def _brief(answer: Answer) -> list[RenderableType]:
    """The short answer's tail: the closest runners-up in one line, and what --verbose adds."""
    out: list[RenderableType] = [Text(_mixed(answer), style="bold yellow")] if answer.mixed_protocols else []
    if answer.alternatives:
        close = ", ".join(
            f"{e.optimizer} + {e.strategy} {fmt(e.value, e.unit)}" for e in answer.alternatives[:3]
        )
        out.append(Text(f"Next: {close}", style="dim"))
    more = [
        (len(answer.alternatives), "runners-up"),
        (len(answer.excluded), "excluded"),
        (len(answer.holes), "holes"),
        (len(answer.caveats), "caveats"),
        (1 if answer.frontier else 0, "frontier"),
        (len(answer.other_groups), "other evidence"),
    ]
    said = [f"{name} ({n})" if name != "frontier" else name for n, name in more if n]
    if said:
        out.append(Text(f"--verbose: {', '.join(said)} · --json", style="dim"))
    return out


def _other_evidence(answer: Answer) -> Text:
    """The groups not ranked, with the flags that select each; the user's own runs passed over come first, each
    with why (they did not match the question)."""
    passed = [g for g in answer.other_groups if g.id in answer.unmatched]
    rest = [g for g in answer.other_groups if g.id not in answer.unmatched]
    lines = [f"  {g.label}: passed over, {answer.unmatched[g.id]}" for g in passed[:5]]
    lines += [f"  {g.label}: {selector_flags(g)}" for g in rest[: max(0, 5 - len(passed))]]
    more = len(answer.other_groups) - len(lines)
    lines += [f"  and {more} more (advisor kb stats)"] if more > 0 else []
    return Text("Other evidence (not mixed in; select with):\n" + "\n".join(lines), style="dim")


def menu_lines(menu: dict) -> str:
    """The fine-tuning menu for the user's model, in a few lines of recommend's headline."""

    def said(row: dict) -> str:
        speed = f", {row['tokens_per_s']:,.0f} tokens/s" if row["tokens_per_s"] else ""
        per = " per rank" if row.get("per_rank") else ""
        return f"{row['configuration']} ({gib(row['memory_gb']):.1f} GiB{per}{speed})"

    lines = [f"Across the fine-tuning menu ({menu['fitting']} of {menu['configurations']} fit; advisor fit):"]
    if menu["pick"]:
        lines.append(f"  the pick: {said(menu['pick'])}")
    else:
        lines += [
            f"  {r['rung']}: {'fits' if r['fits'] else 'does not fit'}"
            + (f" at {gib(r['memory_gb']):.1f} GiB" if r["memory_gb"] else "")
            for r in menu["ladder"]
        ]
    best = menu["best_for_metric"]
    if best and best != menu["pick"]:
        lines.append(f"  best by this metric: {said(best)}")
    measured = (menu["pick"] or {}).get("adapter_evidence")
    if measured:
        lines.append(f"  its adapter, measured: {measured}")
    lines.append(f"  {menu['quality']}")
    return "\n".join(lines)


def _headline(answer: Answer, rules: Rules, notes: bool = False) -> Panel:
    """The pick, its figure and seeds, the evidence, the scale, the user's model and menu, the measure; with
    `notes`, what of the question was not applied (a constraint the evidence cannot take)."""
    metric = answer.metric
    measure = rules.measures.get(answer.measure) if answer.measure else None
    body = Text()
    pick = answer.recommendation
    if pick:
        body.append(f"{pick.optimizer} + {pick.strategy}", style="bold green")
        single = pick.seeds == 1 and not pick.predicted
        if single and metric.name != "memory":  # said first: one run each cannot tell a lead from noise
            body.append(" · from single runs: one run each, no test", style="bold yellow")
        label = f"predicted {metric.name}" if pick.predicted else metric.label
        body.append(f"\n{label}: {fmt(pick.value, pick.unit)}", style="bold")
        if pick.stated:
            body.append(f" (stated: {pick.stated})")
        body.append(f" · {_seeds(pick)}", style="dim")
        if pick.measured:
            m = pick.measured
            body.append(f" · measured on the evidence: {fmt(m['value'], m['unit'])}", style="dim")
        if pick.flag:
            body.append(f"\n{flag_text(pick)}", style="bold red")
            safe = answer.safe_alternative
            body.append(
                f"\nBest with every seed ok: {safe.optimizer} + {safe.strategy}, {fmt(safe.value, safe.unit)}"
                if safe
                else "\nNo other candidate has every seed ok.",
                style="bold",
            )
        if answer.quality_unknown:
            body.append(f"\n{answer.quality_unknown['text']}", style="bold yellow")
        if pick.test and (pick.test["kind"] or pick.seeds > 1):  # single runs: said on the first line
            body.append(f"\n{test_line(pick.test)}", style="dim")
        if pick.tied:
            why = (
                f"picked by {answer.tie_break} (rules/flowchart.toml)"
                if answer.tie_break
                else "picked for the best mean"
            )
            n = len(answer.tied_with)
            readings = tie_readings([e.test for e in answer.tied_with if e.test])
            body.append(
                f"\ntied with {n} other configuration{'s' if n > 1 else ''} ({tie_how(answer, rules)}), marked ≈: "
                f"{readings}; {why}",
                style="yellow",
            )
        if single and metric.name == "memory":  # memory does not vary over seeds: one run is its figure
            body.append("\nsingle-seed evidence: one run per configuration, no interval", style="yellow")
    else:
        body.append("No recommendation", style="bold red")
        body.append(f"\n{answer.why_none}")
    body.append(f"\nEvidence: {answer.group.label}", style="cyan")
    if answer.scale_note:
        body.append(
            f"\n{answer.scale_note['text']}", style="bold yellow" if answer.scale_note["warning"] else "cyan"
        )
        if answer.scale_note.get("transfer"):
            body.append(f"\n{answer.scale_note['transfer']}", style="cyan")
    if answer.trend:
        body.append(f"\n{answer.trend['text']}", style="cyan")
    m = answer.model
    if m:
        where = m["accelerator"] or f"a {gib(m['memory_gb']):.4g} GiB budget"
        tokens = f" × {m['seq_len']} tokens" if m["seq_len"] else ""
        step = f", TRL's {m['method'].upper()} step" if m.get("method", "trainer") != "trainer" else ""
        body.append(
            f"\nYour model: {m['name']}, {m['parameters'] / 1e9:.3g} B parameters, on {where} "
            f"({m['dtype']}, micro-batch {m['batch_size']}{tokens}{step}): configurations predicted not to "
            "fit are excluded",
            style="cyan",
        )
    menu = answer.menu
    if menu:
        body.append("\n" + menu_lines(menu), style="magenta")
    v = answer.validation
    if v and v["passed"]:
        body.append(
            f"\nValidated on this hardware: {v['checks']} checks passed (advisor validate, {v['at']})",
            style="green",
        )
    elif v:
        body.append(
            f"\nValidation FAILED on this hardware ({v['at']}): {', '.join(v['failed'])}", style="bold red"
        )
    if measure:
        body.append(f"\nMeasure: {measure.label}", style="dim")
        if measure.note:
            body.append(f" — {measure.note}", style="dim")
    for note in answer.notes if notes else ():
        body.append(f"\n{note}", style="bold yellow")
    direction = "lower is better" if metric.direction == "min" else "higher is better"
    title = f"{answer.family}: optimize {metric.name} ({direction})"
    # the title as text, not markup: a family or metric named with brackets prints as named
    return Panel(body, title=Text(title), title_align="left", border_style="green" if pick else "red")


def _entries_table(title: str, entries: list[Entry], show_tie: bool = False) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("optimizer")
    table.add_column("strategy")
    table.add_column("value", justify="right")
    table.add_column("evidence")
    table.add_column("vs pick", justify="right")
    for e in entries:
        mark = " ≈" if show_tie and e.tied else ""
        evidence = Text(_seeds(e))
        if e.flag:
            evidence.append(f"\n{flag_text(e)}", style="bold red")
        if e.measured:  # ranked by prediction: the evidence's own measurement beside it
            m = e.measured
            evidence.append(f"\nmeasured on the evidence: {fmt(m['value'], m['unit'])}", style="dim")
        table.add_row(e.optimizer, e.strategy, fmt(e.value, e.unit) + mark, evidence, test_brief(e))
    return table


def _excluded_table(entries: list[Entry]) -> Table:
    table = Table(title="Excluded", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("optimizer")
    table.add_column("strategy")
    table.add_column("value", justify="right")
    table.add_column("reason", style="red")
    for e in entries:
        reason = e.reason or ""
        if e.flag and e.seeds_ok:  # with no ok seed, the reason already gives the statuses
            reason += f"\n{flag_text(e)}"
        table.add_row(e.optimizer, e.strategy, fmt(e.value, e.unit), reason)
    return table


def frontier_view(
    points: list[FrontierPoint],
    rules: Rules,
    x: str,
    y: str,
    title: str | None = None,
    evidence: str | None = None,
) -> RenderableType:
    """A table of every point (frontier marked) and a terminal scatter plot with the same labels."""
    xm, ym = rules.metric(x), rules.metric(y)
    table = Table(
        title=title or f"Pareto frontier: {y} vs {x}",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        caption=evidence,
        caption_justify="left",
    )
    for col in (
        "pt",
        "optimizer",
        "strategy",
        f"{x} ({xm.unit})" if xm.unit else x,
        f"{y} ({ym.unit})" if ym.unit else y,
        "frontier",
    ):
        table.add_column(col)
    for label, p in zip(point_labels(points), points, strict=True):
        style = "bold green" if p.on_frontier else "yellow" if p.within_noise else None
        mark = "●" if p.on_frontier else "≈ (within noise)" if p.within_noise else ""
        strategy = p.strategy + (" ⚠" if p.flag else "")
        table.add_row(
            label, p.optimizer, strategy, _with_ci(p.x, p.x_ci), _with_ci(p.y, p.y_ci), mark, style=style
        )
    plot = scatter(points, x_label=axis_label(xm), y_label=axis_label(ym), x_dir=xm.direction)
    flagged = [p for p in points if p.flag]
    if not flagged:
        return RGroup(table, plot)
    flags = Text(style="bold red")
    for p in flagged:
        flags.append(f"⚠ {p.optimizer} + {p.strategy}: {p.flag}; its means are over the ok seeds only\n")
    return RGroup(table, flags, plot)


def axis_label(metric: Metric) -> str:
    """'time, s/epoch (lower is better)': the unit and the direction, never a bare 'min' read as minutes."""
    unit = f", {metric.unit}" if metric.unit else ""
    return f"{metric.name}{unit} ({'lower' if metric.direction == 'min' else 'higher'} is better)"


def flowchart_view(paths: list[BestPath], summary: dict) -> RenderableType:
    """Family → evidence → metric → optimizer → strategy, as the paper's Figure 1, with the counts under it.
    Each path sits under the evidence group that answered it: a family whose metrics are answered by several
    groups (Wen et al.'s loss, the seed paper's time) gets a header for each."""
    tree = Tree("[bold]Recommendation flowchart[/bold]")
    by_family: dict[str, list[BestPath]] = {}
    for p in paths:
        by_family.setdefault(p.family, []).append(p)
    for family, own in by_family.items():
        groups: dict[str | None, list[BestPath]] = {}
        for p in own:
            groups.setdefault(p.answer.group.label if p.answer and p.answer.group else None, []).append(p)
        labelled = [g for g in groups if g is not None]
        node = tree.add(
            f"[bold]{family}[/bold]" + (f"  [dim]{labelled[0]}[/dim]" if len(labelled) == 1 else "")
        )
        for label, under in groups.items():
            parent = node if label is None or len(labelled) == 1 else node.add(f"[dim]{label}[/dim]")
            for p in under:
                parent.add(_path_line(p))
    counts = Text(
        f"\n{summary['answered']} of {summary['paths']} paths answered, {summary['tied']} of them tied "
        f"({summary['tied_equivalent']} equivalent, {summary['tied_undecided']} undecided).  "
        "Optimizers on best paths: "
    )
    counts.append(_counts(summary["optimizers"], summary["optimizers_tied"]))
    counts.append(".  Strategies: " + _counts(summary["strategies"], summary["strategies_tied"]))
    return RGroup(tree, counts)


def _path_line(p: BestPath) -> str:
    """One flowchart path: 'loss → adam → accumulation  0.06 (tied, ...)', or why it has no pick."""
    pick = p.pick
    if pick:
        flag = f"  [bold red]⚠ {pick.flag}[/bold red]" if pick.flag else ""
        return (
            f"{p.metric} → [green]{pick.optimizer}[/green] → [cyan]{pick.strategy}[/cyan]  "
            f"[dim]{fmt(pick.value, pick.unit)}[/dim]{_separation(pick, p.answer.tie_break)}{flag}"
        )
    why = "no evidence" if not p.answer else "no figure" if p.answer.measure is None else "nothing qualifies"
    return f"{p.metric} → [red]{why}[/red]"


def _separation(pick: Entry, tie_break: str | None) -> str:
    """How the pick stands against its runner-up: 'p=0.003 vs X', '(tied, undecided, p=0.21 vs X)'."""
    t = pick.test
    if t is None:
        return ""
    broken = f"; tie-break: {tie_break}" if tie_break else ""
    read = t.get("reading", "undecided")
    if t["kind"] is None:
        return f" [yellow](tied, {read}, no test{broken})[/yellow]" if pick.tied else ""
    if pick.tied:
        return f" [yellow](tied, {read}, {fmt_p(t['p_holm'])} vs {t['versus']}{broken})[/yellow]"
    decided = t.get("decided_by")
    if decided:  # practically equal on the metric (checkpointing's loss is standard's): decided by the next
        return (
            f"  [green]equal {pick.metric}, {decided['metric']} {fmt_p(decided['p'])}[/green] "
            f"[dim]vs {t['versus']}[/dim]"
        )
    return f"  [green]{fmt_p(t['p_holm'])}[/green] [dim]vs {t['versus']}[/dim]"


def _counts(counts: dict, tied: dict) -> str:
    """'sgd 5 (1 tied), adam 3': how many best paths, and how many of those are tied."""
    return ", ".join(
        f"{k} {v}" + (f" ({tied[k]} tied)" if tied.get(k) else "") for k, v in counts.items()
    ) or ("none")


def stats_view(stats: dict, path: str) -> RenderableType:
    head = Text(f"{path}\n", style="bold")
    head.append(
        f"{stats['runs']} runs, {stats['metrics']} run-level figures, {stats['epochs']} epoch rows; "
        f"schema {', '.join(stats['schema'])}\n"
    )
    head.append("By status: " + ", ".join(f"{k} {v}" for k, v in sorted(stats["by_status"].items())))
    groups = Table(
        title="Evidence groups (never ranked against each other)",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("group", "family", "source", "model", "hardware", "preset", "protocol", "runs", "seeds"):
        groups.add_column(col)
    for g in stats["groups"]:
        groups.add_row(
            str(g["id"]) + (" (yours)" if g["yours"] else ""),
            g["family"],
            g["source"],
            g["model"],
            g["hardware"],
            g["preset"],
            g["protocol"],
            str(g["runs"]),
            str(g["seeds"]),
        )
    return RGroup(head, groups)


def runs_view(runs: list[dict]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    cols = [c for c in RUN_COLUMNS if c not in ("device", "error", "started_at", "finished_at")]
    for col in cols:
        table.add_column(col)
    for r in runs:
        style = None if r["status"] == "ok" else "red"
        table.add_row(*("" if r[c] is None else str(r[c]) for c in cols), style=style)
    return table


def validation_view(checks: list[dict], hardware: str) -> RenderableType:
    table = Table(
        title=f"advisor validate on {hardware}", title_justify="left", show_edge=False, pad_edge=False
    )
    for col in ("check", "model", "result", "measured", "tolerance", "detail"):
        table.add_column(col)
    for c in checks:
        result = "[green]pass[/green]" if c["passed"] else "[bold red]FAIL[/bold red]"
        table.add_row(
            c["name"], c["model"] or "", result, f"{c['value']:.3g}", f"{c['tolerance']:.3g}", c["detail"]
        )
    failed = [c for c in checks if not c["passed"]]
    verdict = (
        Text(f"All {len(checks)} checks passed.", style="bold green")
        if not failed
        else Text(
            f"{len(failed)} of {len(checks)} checks FAILED: "
            + ", ".join(f"{c['name']} ({c['model']})" if c["model"] else c["name"] for c in failed),
            style="bold red",
        )
    )
    return RGroup(table, verdict)


def claims_view(verdicts) -> RenderableType:
    style = {
        "holds": "green",
        "does not hold": "bold red",
        "not enough evidence": "yellow",
        "not comparable": "magenta",
    }
    table = Table(
        title="The paper's claims, re-checked",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
        show_lines=True,
    )
    for col in ("claim", "paper", "found here", "verdict"):
        table.add_column(col)
    for v in verdicts:
        table.add_row(
            f"[bold]{v.id}[/bold]\n{v.text}", v.paper, v.found, f"[{style[v.verdict]}]{v.verdict}[/]"
        )
    counts = ", ".join(f"{sum(v.verdict == k for v in verdicts)} {k}" for k in style)
    groups = sorted({g for v in verdicts for g in v.evidence})
    return RGroup(table, Text(f"{counts}. Evidence: " + "; ".join(groups), style="dim"))


def transfer_view(found: list, family: str | None, trends: list = ()) -> RenderableType:
    """advisor transfer: one row per family × metric measured at two scales, then each source's trends."""
    if not found and not trends:
        where = f" of the {family} family" if family else ""
        return Text(
            f"No evidence{where} measured at two scales: `make reference` measures the CPU grid at presets tiny "
            "and small (groups that differ only in scale, with seeds).",
            style="yellow",
        )
    table = Table(
        title="How rankings carry across scale", title_justify="left", show_edge=False, pad_edge=False
    )
    for col in ("family", "metric", "parameters", "configurations", "Kendall τ-b [95 %]", "pick"):
        table.add_column(col, justify="right" if col in ("configurations",) else "left")
    for t in found:
        table.add_row(
            t.family,
            t.metric,
            f"{params_text(t.smaller.n_params)} → {params_text(t.larger.n_params)}",
            str(t.configurations),
            t.tau_text,
            "[green]held[/]" if t.held else f"[yellow]{t.pick_smaller} → {t.pick_larger}[/]",
        )
    note = (
        "τ-b: 1 the same order, 0 unrelated. The interval resamples each configuration's seeds (a percentile "
        "bootstrap: with 3 seeds it is narrower than the truth); one that spans 0 means the smaller grid's order "
        "says nothing measurable about the larger one's."
    )
    leads = Text("\nLeads across sizes (the pick at the largest size against its runner-up at every size)")
    for t in trends:
        leads.append(f"\n• {t.family}: {t.text()}")
    return RGroup(table, Text(note, style="dim"), *([leads] if trends else []))
