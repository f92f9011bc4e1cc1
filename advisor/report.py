"""Rich renderables for every answer; only the CLI prints them."""

from __future__ import annotations

from rich.console import Group as RGroup
from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from advisor.flowchart import BestPath
from advisor.kb import RUN_COLUMNS
from advisor.pareto import FrontierPoint
from advisor.plot import point_labels, scatter
from advisor.recommend import Answer, Entry
from advisor.rules import Metric, Rules


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.4g} {unit}".strip()


def _with_ci(value: float, ci) -> str:
    return fmt(value) if not ci else f"{value:.4g} ±{(ci[1] - ci[0]) / 2:.2g}"


def _seeds(e: Entry) -> str:
    if e.seeds > 1 and e.ci95 is not None:
        return f"{e.seeds} seeds, 95% CI {e.ci95[0]:.4g}–{e.ci95[1]:.4g}"
    return "1 run" if e.seeds == 1 else f"{e.seeds} runs"


def answer_view(answer: Answer, rules: Rules) -> RenderableType:
    """The whole answer to `advisor recommend`: pick, evidence, alternatives, exclusions, holes, caveats, frontier."""
    parts: list[RenderableType] = [_headline(answer, rules)]
    if answer.alternatives:
        parts.append(_entries_table("Runners-up", answer.alternatives, show_tie=True))
    if answer.excluded:
        parts.append(_excluded_table(answer.excluded))
    if answer.holes:
        parts.append(Text("Holes in the evidence: " + "; ".join(answer.holes) + ".", style="yellow"))
    if answer.mixed_protocols:
        mixed = "; ".join(f"{p}: {', '.join(cfgs)}" for p, cfgs in answer.mixed_protocols.items())
        parts.append(
            Text(
                f"This evidence mixes runs measured with different settings ({mixed}): "
                "compare like with like, or measure the missing cells with the same settings.",
                style="bold yellow",
            )
        )
    if answer.caveats:
        caveats = Text("Caveats\n", style="bold")
        for c in answer.caveats:
            caveats.append(f"• {c}\n")
        parts.append(caveats)
    if answer.frontier:
        x, y = answer.frontier_axes
        parts.append(frontier_view(answer.frontier, rules, x, y, title=f"Pareto frontier: {y} vs {x}"))
    if answer.other_groups:
        others = ", ".join(g.label for g in answer.other_groups[:3])
        parts.append(Text(f"Other evidence (not mixed in; pick with --source): {others}", style="dim"))
    return RGroup(*parts)


def _headline(answer: Answer, rules: Rules) -> Panel:
    metric = answer.metric
    measure = rules.measures.get(answer.measure) if answer.measure else None
    body = Text()
    pick = answer.recommendation
    if pick:
        body.append(f"{pick.optimizer} + {pick.strategy}", style="bold green")
        body.append(f"\n{metric.label}: {fmt(pick.value, metric.unit)}", style="bold")
        if pick.stated:
            body.append(f" (stated: {pick.stated})")
        body.append(f" · {_seeds(pick)}", style="dim")
        if pick.tied:
            how = "95% intervals overlap" if pick.ci95 else "within the tie tolerance"
            why = (
                f"picked by {answer.tie_break} (rules/flowchart.toml)"
                if answer.tie_break
                else "picked for the best mean"
            )
            n = len(answer.tied_with)
            body.append(
                f"\ntied ({how}) with {n} other configuration{'s' if n > 1 else ''}, marked ≈; {why}",
                style="yellow",
            )
        if pick.seeds == 1:
            body.append("\nsingle-seed evidence: one run per configuration, no interval", style="yellow")
    else:
        body.append("No recommendation", style="bold red")
        body.append(f"\n{answer.why_none}")
    body.append(f"\nEvidence: {answer.group.label}", style="cyan")
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
    direction = "lower is better" if metric.direction == "min" else "higher is better"
    title = f"{answer.family}: optimize {metric.name} ({direction})"
    return Panel(body, title=title, title_align="left", border_style="green" if pick else "red")


def _entries_table(title: str, entries: list[Entry], show_tie: bool = False) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("optimizer")
    table.add_column("strategy")
    table.add_column("value", justify="right")
    table.add_column("evidence")
    for e in entries:
        mark = " ≈" if show_tie and e.tied else ""
        table.add_row(e.optimizer, e.strategy, fmt(e.value, e.unit) + mark, _seeds(e))
    return table


def _excluded_table(entries: list[Entry]) -> Table:
    table = Table(title="Excluded", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("optimizer")
    table.add_column("strategy")
    table.add_column("value", justify="right")
    table.add_column("reason", style="red")
    for e in entries:
        table.add_row(e.optimizer, e.strategy, fmt(e.value, e.unit), e.reason or "")
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
        table.add_row(
            label, p.optimizer, p.strategy, _with_ci(p.x, p.x_ci), _with_ci(p.y, p.y_ci), mark, style=style
        )
    plot = scatter(points, x_label=axis_label(xm), y_label=axis_label(ym))
    return RGroup(table, plot)


def axis_label(metric: Metric) -> str:
    """'time, s/epoch (lower is better)': the unit and the direction, never a bare 'min' read as minutes."""
    unit = f", {metric.unit}" if metric.unit else ""
    return f"{metric.name}{unit} ({'lower' if metric.direction == 'min' else 'higher'} is better)"


def flowchart_view(paths: list[BestPath], summary: dict) -> RenderableType:
    """Family → metric → optimizer → strategy, as the paper's Figure 1, with the counts under it."""
    tree = Tree("[bold]Recommendation flowchart[/bold]")
    by_family: dict[str, Tree] = {}
    for p in paths:
        node = by_family.get(p.family)
        if node is None:
            label = f"[bold]{p.family}[/bold]"
            if p.answer and p.answer.group:
                label += f"  [dim]{p.answer.group.label}[/dim]"
            node = by_family[p.family] = tree.add(label)
        pick = p.answer.recommendation if p.answer else None
        if pick:
            tie = " [yellow](tied)[/yellow]" if pick.tied else ""
            node.add(
                f"{p.metric} → [green]{pick.optimizer}[/green] → [cyan]{pick.strategy}[/cyan]  "
                f"[dim]{fmt(pick.value, pick.unit)}[/dim]{tie}"
            )
        else:
            why = (
                "no evidence"
                if not p.answer
                else "no figure"
                if p.answer.measure is None
                else "nothing qualifies"
            )
            node.add(f"{p.metric} → [red]{why}[/red]")
    counts = Text(
        f"\n{summary['answered']} of {summary['paths']} paths answered.  Optimizers on best paths: "
    )
    counts.append(", ".join(f"{k} {v}" for k, v in summary["optimizers"].items()) or "none")
    counts.append(
        ".  Strategies: " + (", ".join(f"{k} {v}" for k, v in summary["strategies"].items()) or "none")
    )
    return RGroup(tree, counts)


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
    for col in ("family", "source", "model", "hardware", "preset", "runs", "seeds"):
        groups.add_column(col)
    for g in stats["groups"]:
        groups.add_row(
            g["family"], g["source"], g["model"], g["hardware"], g["preset"], str(g["runs"]), str(g["seeds"])
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
    style = {"holds": "green", "does not hold": "bold red", "not enough evidence": "yellow"}
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
