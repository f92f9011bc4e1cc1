"""`advisor measure --plan` as a table: the cells a plan prices (advisor.measuring.planning.plan computes
them, duck-typed here: render never imports the measurement side), where their figures came from, and what
they add up to on W workers."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text


def hours(seconds: float) -> str:
    """A duration as people read it: s (tenths under 10 s), min or h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_view(plan):
    """The cells (seeds folded into one row), where their costs come from, and what they add up to."""
    sources = [Text(f"{s.split(':')[0]}: {s.split(':', 1)[-1].strip()}", style="dim") for s in _sources(plan)]
    return Group(_cells_table(plan), *sources, *_read_lines(plan), *_totals(plan))


def _sources(plan) -> list[str]:
    return sorted({c.source for c in plan.cells})


def _read_lines(plan) -> list[Text]:
    """Which KBs were read (and why one was not), and what the model shapes timed here cost (the words
    `calibrated`/`Not calibrated` are the output's, older than the shape timing's name)."""
    read = [kb["kb"] for kb in plan.kbs if kb["read"]]
    lines = [Text(f"Read: {', '.join(read) or 'no KB'} (a figure from the first that has it).", style="dim")]
    for kb in plan.kbs:
        if kb["problem"]:
            lines.append(Text(f"Not read, {kb['kb']}: {kb['problem']}", style="yellow"))
    if plan.timings:
        spent = sum(c["wall_s"] for c in plan.timings)
        shapes = "; ".join(c["cell"] for c in plan.timings)
        lines.append(Text(f"Calibrated here in {spent:.1f} s: {shapes} (--json: every part).", style="dim"))
    lines += [Text(f"Not calibrated, {why}.", style="yellow") for why in plan.untimed]
    return lines


def _cells_table(plan) -> Table:
    """One row per model × optimizer × strategy (its seeds folded), narrow enough for 80 columns."""
    title = f"Plan on {plan.target} ({plan.budget_gb:.0f} GB; ✗: predicted not to fit)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    any_done = any(c.done for c in plan.cells)
    for name in ("model", "optimizer", "strategy", "seeds", *["done"] * any_done, "time", "GB", "from"):
        right = name in ("seeds", "done", "time", "GB")
        wraps = name in ("strategy", "from")  # "checkpointing +" / "accumulation" on two lines
        table.add_column(name, justify="right" if right else "left", no_wrap=not wraps, min_width=15 * wraps)
    rows: dict[tuple, list] = {}
    for cell in plan.cells:
        c = cell.config
        rows.setdefault((c.model, c.preset, c.optimizer, c.strategy), []).append(cell)
    for (model, preset, optimizer, strategy), cells in rows.items():
        first = cells[0]
        memory = "?" if first.memory_gb is None else f"{first.memory_gb:.2f}"
        table.add_row(
            f"{model}/{preset}" if "/" not in model else Path(model).name,
            optimizer,
            strategy.replace("+", " + "),
            str(len(cells)),
            *[str(sum(c.done for c in cells))] * any_done,
            "?" if first.seconds is None else hours(first.seconds),
            f"[red]{memory} ✗[/]" if first.fits is False else memory,  # a mark that survives piping
            first.label,
        )
    return table


def _totals(plan) -> list[Text]:
    """The cells left out and why, the work left, and the makespan per worker count."""
    lines = []
    bad = sum(c.fits is False for c in plan.cells)
    if bad:
        lines.append(Text(f"{bad} cells predicted not to fit: they would end out of memory.", style="red"))
    done = sum(c.done for c in plan.cells)
    if done:
        lines.append(Text(f"{done} cells already ended in the KB measure writes: it skips them."))
    unknown = sum(c.seconds is None for c in plan.cells)
    known = " (of the cells of known cost)" if unknown else ""
    if unknown:
        lines.append(Text(f"{unknown} cells of unknown cost: the makespan leaves them out.", style="yellow"))
    lines.append(
        Text(f"{len(plan.runnable)} cells to run{known}, {hours(sum(plan.runnable))} of work in all.")
    )
    for workers, span in plan.makespans.items():
        bound = hours(plan.lower_bound(workers))
        plural = "s" * (workers > 1)
        lines.append(Text(f"Makespan on {workers} worker{plural}{known}: {hours(span)} (at least {bound})"))
    lines.append(Text("Assumptions: " + "; ".join(plan.assumptions) + ".", style="dim"))
    return lines
