"""Progress where there is no terminal: `advisor measure 2>log` writes a line per epoch and per cell, each
with the grid's ETA, instead of nothing until the end."""

import io
import re
import subprocess
import sys
from dataclasses import replace

import pytest
from rich.console import Console

from advisor.measuring.grid.runner import CellResult
from advisor.measuring.recipe.config import RunConfig
from advisor.measuring.training.progress import ForwardingReporter, failure_causes, nothing_measured, replay
from advisor.render.numbers import counted
from advisor.render.progress_views import PlainReporter, RichReporter, reporter_for

CFG = RunConfig(model="llama", preset="tiny", optimizer="adam", epochs=2)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_plain_lines_for_epochs_and_cells_with_the_grids_eta():
    lines, clock = [], Clock()
    plain = PlainReporter(lines.append, clock)
    plain.grid_start(3)
    plain.cell_start(CFG, 8)
    clock.now += 2
    plain.epoch({"epoch": 0, "loss": 2.5, "eval_loss": 2.61, "wall_s": 1.9})
    clock.now += 2
    plain.cell_end(CellResult(CFG, "ok", run_id=1, loss=2.31))
    plain.cell_start(replace(CFG, optimizer="sgd"), 8)
    clock.now += 1
    plain.cell_end(CellResult(replace(CFG, optimizer="sgd"), "diverged", run_id=2, error="loss became nan"))
    assert lines[0] == "advisor measure: 3 cells"
    assert lines[1] == (f"[1/3] {CFG.label} · epoch 1/2 · loss 2.5 · held-out 2.61 · 1.9 s · ETA ?")
    assert lines[2] == f"[1/3] {CFG.label} · ok · loss 2.31 · 4.0 s · ETA 8 s"  # 4 s a cell, 2 to go
    sgd = replace(CFG, optimizer="sgd").label
    assert lines[3] == f"[2/3] {sgd} · diverged · 1.0 s · loss became nan · ETA 2 s"


def test_epochs_reach_the_grids_reporter_from_a_cells_process():
    sent, lines = [], []
    forwarding = ForwardingReporter(sent.append)
    forwarding.cell_start(CFG, 8)
    forwarding.step(2.9)
    forwarding.epoch({"epoch": 0, "loss": 2.5, "eval_loss": None, "wall_s": 1.0, "tokens": 999})
    plain = PlainReporter(lines.append, Clock())
    plain.grid_start(1)
    for message in sent:
        replay(message, plain)
    assert lines[-1] == f"[1/1] {CFG.label} · epoch 1/2 · loss 2.5 · 1.0 s · ETA ?"


def test_a_terminal_gets_bars_and_a_file_gets_lines():
    assert isinstance(reporter_for(Console(file=io.StringIO(), force_terminal=True)), RichReporter)
    assert isinstance(reporter_for(Console(file=io.StringIO())), PlainReporter)


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_measure_with_stderr_redirected_writes_a_line_per_epoch(tmp_path):
    log = tmp_path / "log"
    args = ["--model", "llama", "--preset", "tiny", "--optimizer", "adam", "--optimizer", "adamw"]
    args += [
        "--strategy",
        "standard",
        "--epochs",
        "2",
        "--steps-per-epoch",
        "2",
        "--db",
        tmp_path / "m.sqlite",
    ]
    with open(log, "w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "advisor", "measure", *map(str, args)], stderr=err, stdout=subprocess.PIPE
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert text.splitlines()[0] == "advisor measure: 2 cells"
    assert sum(" · epoch " in line for line in text.splitlines()) == 4  # 2 cells x 2 epochs
    assert sum(" · ok · " in line for line in text.splitlines()) == 2
    assert "\x1b[" not in text  # no terminal codes in a log


def test_one_cell_is_one_cell_and_the_first_seconds_say_what_they_wait_for():
    lines = []
    plain = PlainReporter(lines.append, Clock())
    plain.grid_start(1)
    plain.waiting("starting the worker process (importing torch, transformers)…")
    assert lines == [
        "advisor measure: 1 cell",
        "starting the worker process (importing torch, transformers)…",
    ]
    assert [counted(n, "cell") for n in (0, 1, 2)] == ["0 cells", "1 cell", "2 cells"]


def test_the_bar_says_what_the_grid_waits_for_until_a_cell_starts_and_a_cause_once():
    out = io.StringIO()
    with RichReporter(Console(file=out, force_terminal=True, width=200)) as rich:
        rich.grid_start(3)
        rich.waiting("starting the worker process")
        grid = rich.progress.tasks[0]
        assert grid.fields["info"] == "[dim]starting the worker process[/]"
        rich.cell_start(CFG, 8)
        assert grid.fields["info"] == "", "the first cell clears it"
        for optimizer in ("sgd", "adam", "adagrad"):  # the same cause three times: said once
            cfg = replace(CFG, optimizer=optimizer)
            rich.cell_end(
                CellResult(cfg, "crashed", error="the cell's process raised OSError: [Errno 28] [/x]")
            )
    said = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # the terminal's codes left out
    assert said.count("OSError: [Errno 28] [/x]") == 1  # said as written: brackets are no markup


def test_failures_are_said_once_per_cause_and_a_grid_that_measured_nothing_is_told_apart():
    def result(optimizer, status, error=None):
        return CellResult(replace(CFG, optimizer=optimizer), status, error=error)

    crashed = (
        "the cell's process was killed by signal 9 (SIGKILL: the kernel's out-of-memory killer or kill -9)"
    )
    results = [
        result("sgd", "failed", "RuntimeError: boom"),
        result("adam", "crashed", crashed),
        result("adamw", "failed", "RuntimeError: boom"),
    ]
    assert failure_causes(results) == ["2 cells failed: RuntimeError: boom", f"1 cell crashed: {crashed}"]
    assert nothing_measured(results)
    # an outcome of training (diverged, untrained, oom) or a skip is something measured: only the failures
    # are said, and the command exits 0
    for status in ("ok", "diverged", "untrained", "oom", "skipped"):
        assert not nothing_measured([*results, result("adagrad", status, "why")]), status
    assert not nothing_measured([]) and failure_causes([result("sgd", "ok")]) == []
