"""What `advisor measure` says when its grid has run: the rates --tune-lr chose, each cell's outcome, and the
closing lines (the order's seed, the shard, the causes of failure, how many ended ok, what to ask). The
grid's objects (advisor.measuring: CellResult, Tuned, Measured) are read by their fields, never imported."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table

from advisor.render.numbers import counted
from advisor.render.progress_views import status_style
from advisor.rules import MEASURE_WORDS


def tuned_table(tuned: list) -> Table:
    """The rates --tune-lr chose (advisor.measuring.grid.tuning.Tuned), and what every rate tried gave."""
    table = Table(title="--tune-lr: rates chosen on the tuning seed", title_justify="left", show_edge=False)
    for col in ("model", "optimizer", "tuned with", "chosen", "tried"):
        table.add_column(col)
    for t in tuned:
        chosen = f"{t.lr:g}" if t.lr is not None else "[red]none trained: default kept[/red]"
        chosen += " [yellow](edge of the grid)[/yellow]" if t.at_edge else ""
        tried = ", ".join(f"{lr:g}: {what}" for lr, what in t.tried.items())
        table.add_row(t.model, t.optimizer, t.strategy, chosen, tried)
    return table


def summary_table(results: list) -> Table:
    """The grid's cells (runner.CellResult) with their status, loss, epoch time and memory peak, each column
    named by its measure ('held-out loss', 'tensor peak GB'; mixed measures are marked per row)."""
    loss, memory = (
        _header(results, kind, fallback)
        for kind, fallback in (("loss_measure", "loss"), ("memory_measure", "peak GB"))
    )
    table = Table(title="advisor measure", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("model", "optimizer", "strategy", "seed", "status", loss, "s/epoch", memory):
        table.add_column(
            col, justify="left" if col in ("model", "optimizer", "strategy", "status") else "right"
        )
    for r in results:
        style = status_style(r.status)
        table.add_row(
            r.config.model,
            r.config.optimizer,
            r.config.strategy,
            str(r.config.seed),
            f"[{style}]{r.status}[/]",
            _fmt(r.loss) + _mark(loss, r.loss_measure, MEASURE_WORDS),
            _fmt(r.epoch_time),
            _fmt(r.peak_memory_gb) + _mark(memory, r.memory_measure, MEASURE_WORDS),
        )
    return table


def _header(results: list, kind: str, fallback: str) -> str:
    """The column's measure when every row with a figure shares it, else the generic name."""
    kinds = {getattr(r, kind) for r in results if getattr(r, kind)}
    return MEASURE_WORDS[kinds.pop()] if len(kinds) == 1 else fallback


def _mark(header: str, measure: str | None, words: dict) -> str:
    """' (RSS growth GB)' after a figure whose measure the column's header does not name."""
    return "" if measure is None or words.get(measure) == header else f" ({words.get(measure, measure)})"


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4g}"


def closing_lines(measured, causes: list[str], ask: Callable[[], str]) -> str:
    """What a finished grid says last: the order's seed, the shard, one line per cause of failure (`causes`:
    advisor.measuring.training.progress.failure_causes), how many ended ok, where, and what to ask (when
    there is something to ask about: `ask()`, the flags that make recommend answer from the runs just made)."""
    grid, results = measured.grid, measured.results
    lines = [f"Cell order shuffled with --order-seed {measured.ran.order_seed} (recorded with every run)."]
    if grid.shard is not None:
        lines.append(
            f"Shard {grid.shard}: {len(grid.cells)} of the grid's {counted(grid.planned, 'cell')}. When every "
            "shard is done: advisor kb merge SHARD.sqlite ... --db ALL.sqlite"
        )
    lines += causes
    if measured.nothing_measured:
        return "\n".join(lines)
    if measured.extra:
        lines.append(f"--decide ran {counted(len(measured.extra), 'more seed cell')} for close calls.")
    for call in measured.calls:  # what --decide left undecided
        need = f"{call.needed} seeds per side would decide it" if call.needed else "no seed count decides it"
        lines.append(
            f"Still undecided, {call.family} {call.metric}: {' + '.join(call.other)} against the pick "
            f"{' + '.join(call.pick)} at {call.seeds} seeds ({need})."
        )
    done = sum(r.status == "ok" for r in results)
    first = grid.cells[0].config.model if grid.cells else "MODEL"
    asked = any(r.status in ("ok", "skipped") for r in results)
    lines.append(
        f"{done} ok of {counted(len(results), 'cell')}, written to {grid.path}."
        + (f" Ask: advisor recommend --model {first} {ask()}" if asked else "")
    )
    return "\n".join(lines)


def nothing_measured_sentence(measured) -> str:
    """Why the command exits 1: no cell was measured; what to do, and where the tracebacks are."""
    results = measured.results
    kept = any(r.run_id is not None for r in results)
    where = (
        f"; each run's traceback is kept with it in {measured.grid.path} (advisor kb export)" if kept else ""
    )
    return (
        f"no cell was measured ({counted(len(results), 'cell')} failed or crashed): fix the cause above, "
        f"then run the same command again{where}."
    )
