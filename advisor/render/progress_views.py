"""What `advisor measure` shows while its grid runs: rich bars for a terminal (the grid: cells done/total,
ETA; the cell: steps, live loss), and plain lines where stderr is no terminal (CI, Slurm, nohup): one per
epoch and one per cell, each with the grid's ETA.

Both take the callbacks of advisor.measuring.training.progress.Reporter (grid_start, waiting, cell_start,
cell_placed, step, epoch, cell_end), by name: render never imports the measurement side.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from advisor.render.numbers import counted

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


class RichReporter:
    """Rich bars on a terminal: the grid's (cells done of all, the last one's status, its ETA) and one per
    running cell (its steps, the live loss); a failed cell's cause said once, above the bars."""

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
        self.grid_task = None
        self.cell_tasks: dict = {}  # a bar per running cell, by key
        self.places: dict = {}  # where a cluster's cells run, by key
        self.said: set = set()  # the causes of failed cells said so far: each is said once
        self.waits = False  # whether the grid's bar says what it waits for

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def grid_start(self, total: int) -> None:
        self.grid_task = self.progress.add_task("grid", total=total, info="")

    def waiting(self, what: str) -> None:
        """Said on the grid's bar until the first cell starts."""
        self.waits = True
        self.progress.update(self.grid_task, info=f"[dim]{what}[/]")

    def cell_start(self, config, total_steps: int, key=None) -> None:
        if self.waits:
            self.waits = False
            self.progress.update(self.grid_task, info="")
        self._drop(key)
        where = f" @ {self.places.pop(key)}" if key in self.places else ""
        self.cell_tasks[key] = self.progress.add_task(f"  {config.label}{where}", total=total_steps, info="")

    def cell_placed(self, where: str, key=None) -> None:
        self.places[key] = where

    def step(self, loss: float, key=None) -> None:
        if key in self.cell_tasks:
            self.progress.update(self.cell_tasks[key], advance=1, info=f"loss {loss:.4g}")

    def epoch(self, row: dict, key=None) -> None: ...  # the cell's bar shows its steps; an epoch adds nothing

    def _drop(self, key) -> None:
        if key in self.cell_tasks:
            self.progress.remove_task(self.cell_tasks.pop(key))

    def cell_end(self, result, key=None) -> None:
        if key is not None:  # one cell at a time keeps its last bar until the next starts
            self._drop(key)
        style = status_style(result.status)
        loss = f" loss {result.loss:.4g}" if result.loss is not None else ""
        self.waits = False
        self.progress.update(self.grid_task, advance=1, info=f"last: [{style}]{result.status}[/]{loss}")
        cause = (result.status, result.error)
        if result.status not in ("ok", "skipped") and cause not in self.said:  # a cause once, not per cell
            self.said.add(cause)
            self.console.print(
                f"[{style}]{escape(result.config.label)}: {result.status}[/] — {escape(str(result.error))}"
            )


class PlainReporter:
    """One line per epoch and per cell on a stream that is no terminal (a log file, CI, a Slurm job's
    output), where rich's bars would print nothing until the end:

        [3/60] llama/small adam+standard seed 0 · epoch 2/4 · loss 2.412 · held-out 2.508 · 1.3 s · ETA 4 min
        [3/60] llama/small adam+standard seed 0 · ok · loss 2.301 · 6.1 s · ETA 4 min
    """

    def __init__(self, write: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.write, self.clock = write, clock
        self.total = self.done = 0
        self.started = clock()
        self.cells: dict = {}  # key -> (label, epochs, started): cells that run at the same time

    def grid_start(self, total: int) -> None:
        self.total, self.done, self.started = total, 0, self.clock()
        self.write(f"advisor measure: {counted(total, 'cell')}")

    def waiting(self, what: str) -> None:
        self.write(what)

    def cell_placed(self, where: str, key=None) -> None:
        self.write(f"[{self.done}/{self.total}] cell {key} started on {where}")

    def cell_start(self, config, total_steps: int, key=None) -> None:
        self.cells[key] = (config.label, config.epochs, self.clock())

    def step(self, loss: float, key=None) -> None: ...  # a line per epoch, none per step

    def epoch(self, row: dict, key=None) -> None:
        label, epochs, _ = self.cells.get(key, ("", None, self.started))
        parts = [f"epoch {row['epoch'] + 1}" + (f"/{epochs}" if epochs else "")]
        parts += [f"loss {row['loss']:.4g}"] if row.get("loss") is not None else []
        parts += [f"held-out {row['eval_loss']:.4g}"] if row.get("eval_loss") is not None else []
        parts += [f"{row['wall_s']:.1f} s"] if row.get("wall_s") is not None else []
        self.write(self._line(label, parts))

    def cell_end(self, result, key=None) -> None:
        self.done += 1
        _, _, started = self.cells.pop(key, (None, None, self.started))
        parts = [result.status]
        parts += [f"loss {result.loss:.4g}"] if result.loss is not None else []
        parts += [f"{self.clock() - started:.1f} s"] if result.status != "skipped" else []
        parts += [result.error] if result.error and result.status not in ("ok", "skipped") else []
        self.write(self._line(result.config.label, parts))

    def _line(self, label: str, parts: list[str]) -> str:
        position = (
            f"[{min(self.done + 1, self.total) if parts[0].startswith('epoch') else self.done}/{self.total}]"
        )
        return " · ".join([f"{position} {label}", *parts, f"ETA {self._eta()}"])

    def _eta(self) -> str:
        """The grid's time left at the mean time per finished cell so far ('?' before the first one)."""
        if not self.done:
            return "?"
        left = (self.clock() - self.started) / self.done * (self.total - self.done)
        return f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"

    def __enter__(self) -> PlainReporter:
        return self

    def __exit__(self, *exc) -> None:
        pass


def reporter_for(console: Console) -> RichReporter | PlainReporter:
    """Rich bars on a terminal, plain lines anywhere else (`measure 2>log`, CI, Slurm, nohup)."""
    if console.is_terminal:
        return RichReporter(console)
    return PlainReporter(lambda line: print(line, file=console.file, flush=True))
