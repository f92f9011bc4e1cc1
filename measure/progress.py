"""Progress of `advisor measure`: the callbacks the runner and trainer make (`Reporter`, silent), and the
rich bars for a terminal: the grid (cells done/total, ETA) and the cell (steps, live loss).

A cell runs in its own process: there `ForwardingReporter` sends its progress as messages (steps batched, a
few a second), and the grid's process `replay`s them into its own Reporter."""

from __future__ import annotations

import time
from collections.abc import Callable

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


class ForwardingReporter(Reporter):
    """A cell's progress as messages for `send`: ("cell_start", config, total_steps) and ("steps",
    [loss, ...]), the steps batched to at most one message per `interval` seconds."""

    def __init__(self, send: Callable[[tuple], None], interval: float = 0.1):
        self.send, self.interval = send, interval
        self.losses: list[float] = []
        self.sent = -interval

    def cell_start(self, config, total_steps: int) -> None:
        self.flush()
        self.send(("cell_start", config, total_steps))

    def step(self, loss: float) -> None:
        self.losses.append(loss)
        if time.monotonic() - self.sent >= self.interval:
            self.flush()

    def flush(self) -> None:
        if self.losses:
            self.send(("steps", self.losses))
            self.losses = []
        self.sent = time.monotonic()


def replay(message: tuple, reporter: Reporter) -> None:
    """A ForwardingReporter's message, made again on `reporter`."""
    if message[0] == "cell_start":
        reporter.cell_start(message[1], message[2])
    elif message[0] == "steps":
        for loss in message[1]:
            reporter.step(loss)


STATUS_STYLE = {
    "ok": "green",
    "skipped": "dim",
    "oom": "red",
    "diverged": "red",
    "failed": "red",
    "crashed": "red",
    "untrained": "yellow",
}


def status_style(status: str) -> str:
    """The rich style of a cell's status ('default' for one this table does not know: never an empty tag)."""
    return STATUS_STYLE.get(status, "default")


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
        style = status_style(result.status)
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
        style = status_style(r.status)
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
