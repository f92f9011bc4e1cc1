"""What a grid cell spends outside training (issue 25): the measured step's tracker keeps only the step's
peak, with PyTorch's own figures; the device's peak, the generated data and the FLOP count are worked out
once per grid, not per cell (measuring.memo)."""

import pickle
import sqlite3
from dataclasses import replace

import pytest

from advisor.measuring import tensors
from advisor.measuring.config import GridCell, RunConfig
from advisor.measuring.grid import run_grid
from advisor.measuring.hardware import resolve_device
from advisor.measuring.runner import plan_grid
from advisor.measuring.trainer import Trainer
from advisor.model_ref import resolve_model
from advisor.places import shipped_rules_dir
from advisor.rules import load_rules

RULES = load_rules(str(shipped_rules_dir()))


def trainer(model: str, strategy: str) -> tuple[Trainer, object]:
    """A tiny cell's trainer, set up, and its training set."""
    (cell,) = plan_grid(
        [resolve_model(model, RULES)], RULES, ["adam"], [strategy], 1, RunConfig(preset="tiny")
    )
    cfg = cell.config.resolved()
    t = Trainer(GridCell(replace(cfg, device=resolve_device(cfg.device)), cell.model), RULES)
    t.setup()
    dataset, t.heldout, _ = t.datasets()
    return t, dataset


@pytest.mark.parametrize("model,strategy", [("llama", "accumulation"), ("vit", "checkpointing")])
def test_the_step_peak_tracker_gives_pytorchs_own_figures(model, strategy, monkeypatch):
    """The same step measured by the stock MemTracker and by ours (per-module peaks left out): every figure
    equal, to the byte; the first step makes the optimizer's state, so both measure a later one."""
    from torch.distributed._tools.mem_tracker import MemTracker

    t, dataset = trainer(model, strategy)
    t.measured_step(dataset)  # the optimizer's state exists from here on, as after training
    ours = t.measured_step(dataset)
    monkeypatch.setattr(tensors, "_step_peak_tracker", MemTracker)
    stock = t.measured_step(dataset)
    assert ours == stock
    assert ours["tensor_peak_gb"] > ours["tensor_parameters_gb"] > 0 and ours["tensor_optimizer_gb"] > 0


@pytest.mark.slow
def test_the_device_peak_is_measured_once_per_grid(tmp_path):
    """Three cells, each in its own process: the first measures this CPU's matmul peak, the others reuse it.
    Measured per cell, the best of 20 timed matmuls would differ in its last digits from cell to cell."""
    db = tmp_path / "grid.sqlite"
    cells = plan_grid(
        [resolve_model("vit", RULES)],
        RULES,
        ["sgd", "adam", "adamw"],
        ["standard"],
        1,
        RunConfig(preset="tiny", epochs=1, steps_per_epoch=2),
    )
    results = run_grid(cells, db, RULES)
    assert [r.status for r in results] == ["ok"] * 3, [r.error for r in results]
    conn = sqlite3.connect(db)
    ids = [r.run_id for r in results]
    peaks = conn.execute(
        "SELECT value, unit FROM metrics WHERE name = 'peak_gflops' AND run_id IN (?, ?, ?)", ids
    ).fetchall()
    assert len(peaks) == 3 and len(set(peaks)) == 1, peaks
    assert "measured" in peaks[0][1]
    # the first cell's data and FLOP count came back to the grid, for the cells after it (measuring.memo)
    from advisor.measuring.isolation import _memo

    kept = {k[-1] for k in _memo.data if k[:2] == ("vision", "vit")}
    assert {0, "test"} <= kept and any(k[0] == "vit" and k[4] == "standard" for k in _memo.flops)


@pytest.mark.slow
def test_a_cell_builds_every_grid_optimizer_from_what_the_fork_server_imported():
    """After the fork server's imports, making each optimizer of the families' grids imports nothing more
    (Adafactor's transformers.optimization pulled in peft and torchao: 0.6-1.8 s an Adafactor cell)."""
    import json
    import subprocess
    import sys

    from advisor.measuring.isolation import preload

    optimizers = sorted({o for spec in RULES.families.values() for o in spec.grid_optimizers})
    code = f"""
import importlib, json, sys, torch
for m in {preload(RULES)!r}:
    importlib.import_module(m)
from advisor.measuring.optimizers import make_optimizer
before = set(sys.modules)
for name in {optimizers!r}:
    make_optimizer(name, torch.nn.Linear(4, 4).parameters(), 1e-3, model=torch.nn.Linear(4, 4))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], imported


def tiny_cell(optimizer: str, seed: int = 0, strategy: str = "standard") -> GridCell:
    """A tiny ViT cell, resolved as run_cell resolves it."""
    (cell,) = plan_grid(
        [resolve_model("vit", RULES)],
        RULES,
        [optimizer],
        [strategy],
        1,
        RunConfig(preset="tiny"),
    )
    cfg = cell.config.resolved()
    return GridCell(replace(cfg, seed=seed, device=resolve_device(cfg.device)), cell.model)


def test_a_cell_given_the_grids_memo_records_what_it_would_have_worked_out(monkeypatch):
    """The second cell of a seed takes its data and FLOP count from what the first kept, computes neither,
    and records the same figures, to the bit, as the same cell working them out alone."""
    from advisor.measuring import trainer as trainer_module
    from advisor.measuring.memo import GridMemo
    from advisor.measuring.runner import train_cell

    memo = GridMemo()
    assert train_cell(tiny_cell("adam"), RULES, memo=memo, exiting=True).status == "ok"
    assert len(memo.data) == 2 and len(memo.flops) == 1 and memo.peaks  # training + held-out, one shape
    alone = train_cell(tiny_cell("adamw"), RULES, exiting=True)

    def recomputed(*args, **kwargs):
        raise AssertionError("worked out again, though the grid kept it")

    for name in ("load", "load_heldout", "forward_flops_per_position"):
        monkeypatch.setattr(trainer_module, name, recomputed)
    memo = pickle.loads(pickle.dumps(memo))  # as it reaches a cell's process
    given = Trainer(tiny_cell("adamw"), RULES, memo=memo)
    given.train()
    assert alone.status == "ok"
    for figure in ("model_flops", "loss", "eval_loss", "eval_accuracy"):
        assert [e[figure] for e in given.epochs] == [e[figure] for e in alone.epochs], figure
    assert given.epochs[0]["model_flops"] > 0
    # the sets it was given were held before its baseline: they count in its memory, as a built set does
    figures = {name: value for name, value, _ in given.metrics()}
    assert given.given_gb == sum(dataset.data.nbytes for dataset, _ in memo.data.values()) / 1e9 > 0
    assert figures["rss_baseline_gb"] == given.baseline_rss_gb - given.given_gb
    assert figures["rss_delta_gb"] == figures["peak_rss_gb"] - figures["rss_baseline_gb"]


def test_a_cell_of_another_seed_gets_only_the_held_out_set():
    """Training sets are per seed: a cell of seed 1 is not given seed 0's, builds its own, and sends back
    only what it added; a cell is given only its own model's sets of its split (what it is given counts in
    its memory); a set over the size the grid ships (KEPT_BYTES) is built but not kept."""
    from advisor.measuring import memo as memo_module
    from advisor.measuring.runner import train_cell

    memo = memo_module.GridMemo()
    train_cell(tiny_cell("adam", seed=0), RULES, memo=memo, exiting=True)
    given = memo.for_cell("vision", "vit", 1, "test")
    assert [k[-1] for k in given.data] == ["test"] and given.flops == memo.flops
    assert memo.for_cell("decoder", "llama", 0, "test").data == {}, "another model's sets never travel"
    tuning = memo.for_cell("vision", "vit", 0, "validation")
    assert [k[-1] for k in tuning.data] == [0], "a tuning cell is not given the test set"
    before = given.copy()
    train_cell(tiny_cell("adam", seed=1), RULES, memo=given, exiting=True)
    added = given.added_since(before)
    assert [k[-1] for k in added.data] == [1] and not added.peaks
    (seed0,) = [v for k, v in memo.data.items() if k[-1] == 0]
    (seed1,) = added.data.values()
    assert list(seed0[0]["label"]) != list(seed1[0]["label"])

    small = memo_module.GridMemo()
    key = memo_module.data_key("vision", "vit", "shape", 4, 0)
    built = small.dataset(key, lambda: seed0)
    assert built is seed0 and key in small.data
    memo_module.KEPT_BYTES, kept = 0, memo_module.KEPT_BYTES
    try:
        other = memo_module.data_key("vision", "vit", "shape", 4, 1)
        assert small.dataset(other, lambda: seed1) is seed1 and other not in small.data
    finally:
        memo_module.KEPT_BYTES = kept


def test_a_memo_that_cannot_be_sent_costs_the_cell_nothing():
    """The cell's result goes first; a memo that does not pickle is dropped (the cells after work it out)."""
    from advisor.measuring.isolation import _send_memo
    from advisor.measuring.memo import GridMemo

    sent = []
    memo = GridMemo(flops={("key",): lambda: None})  # a lambda does not pickle

    def send(message):
        sent.append(pickle.dumps(message))

    _send_memo(send, memo, GridMemo())
    assert sent == []
    _send_memo(send, GridMemo(flops={("key",): 1.0}), GridMemo())
    assert pickle.loads(sent[0]) == ("memo", GridMemo(flops={("key",): 1.0}))


def test_a_plan_charges_the_data_to_the_first_cell_the_grid_runs():
    """Data once per model and seed, the FLOP count once per strategy: charged to the first cell that runs,
    not to one the grid skips (done already, or too large to fit)."""
    from advisor.measuring.history import Figure
    from advisor.measuring.plan import CellCost, _once_per_grid

    def cost(optimizer, strategy, done=False, fits=True):
        cfg = replace(tiny_cell(optimizer, strategy=strategy).config)
        parts = {"build": 1.0, "data": 2.0, "flop count": 4.0}
        return CellCost(
            cfg,
            7.0 + 10,
            None,
            fits,
            "",
            done=done,
            startup=Figure(7.0, 0, "calibration"),
            startup_parts=dict(parts),
        )

    costs = [
        cost("sgd", "standard", done=True),
        cost("adam", "standard", fits=False),
        cost("adamw", "standard"),
        cost("sgd", "checkpointing"),
        cost("adam", "checkpointing"),
    ]
    _once_per_grid(costs)
    charged = [(c.startup_parts["data"], c.startup_parts["flop count"]) for c in costs]
    assert charged == [(2.0, 4.0), (2.0, 4.0), (2.0, 4.0), (0.0, 4.0), (0.0, 0.0)]
    assert [c.seconds for c in costs] == [17.0, 17.0, 17.0, 15.0, 11.0]
    assert [c.startup.value for c in costs] == [7.0, 7.0, 7.0, 5.0, 1.0]
