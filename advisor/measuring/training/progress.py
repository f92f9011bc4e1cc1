"""Progress of `advisor measure`: the callbacks the runner and trainer make (`Reporter`, silent), what a
cell's process sends of them to the grid's, and the causes of the cells that failed. What a terminal or a
log shows of them (bars, lines, the closing table) is advisor.render.progress_views' and grid_views'.

A cell runs in its own process: there `ForwardingReporter` sends its progress as messages (steps batched, a
few a second), and the grid's process `replay`s them into its own Reporter."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from advisor.render.numbers import counted


class Reporter:
    """Progress callbacks; the silent default. The CLI passes one that draws (advisor.render.progress_views).
    `key` tells apart cells that run at the same time (a cluster's: their run ids); one cell at a time leaves
    it None."""

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


FAILURES = ("failed", "crashed")  # cells that ended without an outcome of training (ok, oom, diverged, ...)


def failure_causes(results: list) -> list[str]:
    """One line per distinct cause of the cells that failed or crashed, most frequent first ('2 cells
    failed: RuntimeError: ...'): a cause shared by every cell is said once, not once per cell."""
    causes = Counter((r.status, r.error or "no reason recorded") for r in results if r.status in FAILURES)
    return [f"{counted(n, 'cell')} {status}: {error}" for (status, error), n in causes.most_common()]


def nothing_measured(results: list) -> bool:
    """Whether no cell ended ok, or with another outcome of training or a skip, and some failed or crashed:
    the grid measured nothing, and says so with exit code 1."""
    return bool(results) and all(r.status in FAILURES for r in results)


LOSS_MEASURES = ("eval_loss", "loss")
MEMORY_MEASURES = ("gpu_mem_peak_gb", "tensor_peak_gb", "peak_rss_gb")
