"""Progress of `advisor measure`: the callbacks the runner and trainer make (`Reporter`, silent), and the
rich bars for a terminal: the grid (cells done/total, ETA) and the cell (steps, live loss)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table


class Reporter:
    """Progress callbacks; the silent default. The CLI passes a rich one."""

    def grid_start(self, total: int) -> None: ...
    def cell_start(self, config, total_steps: int) -> None: ...
    def step(self, loss: float) -> None: ...
    def cell_end(self, result) -> None: ...


STATUS_STYLE = {
    "ok": "green",
    "skipped": "dim",
    "oom": "red",
    "diverged": "red",
    "failed": "red",
    "crashed": "red",
}


class RichReporter(Reporter):
    def __init__(self, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.grid_task = self.cell_task = None

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def grid_start(self, total: int) -> None:
        self.grid_task = self.progress.add_task("grid", total=total, info="")

    def cell_start(self, config, total_steps: int) -> None:
        if self.cell_task is not None:
            self.progress.remove_task(self.cell_task)
        self.cell_task = self.progress.add_task(f"  {config.label}", total=total_steps, info="")

    def step(self, loss: float) -> None:
        self.progress.update(self.cell_task, advance=1, info=f"loss {loss:.4g}")

    def cell_end(self, result) -> None:
        style = STATUS_STYLE.get(result.status, "")
        loss = f" loss {result.loss:.4g}" if result.loss is not None else ""
        self.progress.update(self.grid_task, advance=1, info=f"last: [{style}]{result.status}[/]{loss}")
        if result.status not in ("ok", "skipped"):
            self.console.print(f"[{style}]{result.config.label}: {result.status}[/] — {result.error}")


def summary_table(results: list) -> Table:
    """The grid's cells (runner.CellResult) with their status, loss, epoch time and memory peak."""
    table = Table(title="advisor measure", title_justify="left", show_edge=False, pad_edge=False)
    for col in ("model", "optimizer", "strategy", "seed", "status", "loss", "s/epoch", "peak GB"):
        table.add_column(col, justify="right" if col in ("seed", "loss", "s/epoch", "peak GB") else "left")
    for r in results:
        style = STATUS_STYLE.get(r.status)
        table.add_row(
            r.config.model,
            r.config.optimizer,
            r.config.strategy,
            str(r.config.seed),
            f"[{style}]{r.status}[/]",
            _fmt(r.loss),
            _fmt(r.epoch_time),
            _fmt(r.peak_memory_gb),
        )
    return table


def _fmt(v) -> str:
    return "—" if v is None else f"{v:.4g}"
