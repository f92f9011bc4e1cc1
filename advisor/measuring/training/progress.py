"""Progress of `advisor measure`: the callbacks the runner and trainer make (`Reporter`, silent), the rich
bars for a terminal (the grid: cells done/total, ETA; the cell: steps, live loss), and plain lines where
stderr is no terminal (CI, Slurm, nohup): one per epoch and one per cell, each with the grid's ETA.

A cell runs in its own process: there `ForwardingReporter` sends its progress as messages (steps batched, a
few a second), and the grid's process `replay`s them into its own Reporter."""

from __future__ import annotations

import time
from collections import Counter
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
from rich.table import Table

from advisor.rules import MEASURE_WORDS


class Reporter:
    """Progress callbacks; the silent default. The CLI passes a rich one. `key` tells apart cells that run
    at the same time (a cluster's: their run ids); one cell at a time leaves it None."""

    def grid_start(self, total: int) -> None: ...
    def waiting(self, what: str) -> None: ...  # what the grid waits for before its first cell starts
    def cell_start(self, config, total_steps: int, key=None) -> None: ...
    def cell_placed(self, where: str, key=None) -> None: ...  # a cluster's: the node a try started on
    def step(self, loss: float, key=None) -> None: ...
    def epoch(self, row: dict, key=None) -> None: ...
    def cell_end(self, result, key=None) -> None: ...


class ForwardingReporter(Reporter):
    """A cell's progress as messages for `send`: ("cell_start", config, total_steps) and ("steps",
    [loss, ...]), the steps batched to at most one message per `interval` seconds."""

    def __init__(self, send: Callable[[tuple], None], interval: float = 0.1):
        self.send, self.interval = send, interval
        self.losses: list[float] = []
        self.sent = -interval

    def cell_start(self, config, total_steps: int, key=None) -> None:
        self.flush()
        self.send(("cell_start", config, total_steps))

    def step(self, loss: float, key=None) -> None:
        self.losses.append(loss)
        if time.monotonic() - self.sent >= self.interval:
            self.flush()

    def epoch(self, row: dict, key=None) -> None:
        self.flush()
        self.send(("epoch", {k: row.get(k) for k in EPOCH_FIELDS}))

    def flush(self) -> None:
        if self.losses:
            self.send(("steps", self.losses))
            self.losses = []
        self.sent = time.monotonic()


def replay(message: tuple, reporter: Reporter, key=None) -> None:
    """A ForwardingReporter's message, made again on `reporter` (for the cell `key`)."""
    if message[0] == "cell_start":
        reporter.cell_start(message[1], message[2], key)
    elif message[0] == "steps":
        for loss in message[1]:
            reporter.step(loss, key)
    elif message[0] == "epoch":
        reporter.epoch(message[1], key)


EPOCH_FIELDS = ("epoch", "loss", "eval_loss", "wall_s")  # what an epoch's progress line shows


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


FAILURES = ("failed", "crashed")  # cells that ended without an outcome of training (ok, oom, diverged, ...)


def counted(n: int, noun: str) -> str:
    """'1 cell', '2 cells': a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def failure_causes(results: list) -> list[str]:
    """One line per distinct cause of the cells that failed or crashed, most frequent first ('2 cells
    failed: RuntimeError: ...'): a cause shared by every cell is said once, not once per cell."""
    causes = Counter((r.status, r.error or "no reason recorded") for r in results if r.status in FAILURES)
    return [f"{counted(n, 'cell')} {status}: {error}" for (status, error), n in causes.most_common()]


def nothing_measured(results: list) -> bool:
    """Whether no cell ended ok, or with another outcome of training or a skip, and some failed or crashed:
    the grid measured nothing, and says so with exit code 1."""
    return bool(results) and all(r.status in FAILURES for r in results)


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


class PlainReporter(Reporter):
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


def reporter_for(console: Console) -> Reporter:
    """Rich bars on a terminal, plain lines anywhere else (`measure 2>log`, CI, Slurm, nohup)."""
    if console.is_terminal:
        return RichReporter(console)
    return PlainReporter(lambda line: print(line, file=console.file, flush=True))


LOSS_MEASURES = ("eval_loss", "loss")
MEMORY_MEASURES = ("gpu_mem_peak_gb", "tensor_peak_gb", "peak_rss_gb")


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
