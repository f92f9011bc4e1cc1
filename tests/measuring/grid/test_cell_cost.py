"""What a grid cell spends outside training (issue 25): the measured step's tracker keeps only the step's
peak, with PyTorch's own figures; the device's peak is measured once per grid, not per cell."""

import sqlite3
from dataclasses import replace

import pytest

from advisor.measuring.grid.local import run_grid
from advisor.measuring.grid.runner import plan_grid
from advisor.measuring.machine.hardware import resolve_device
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.training import tensors
from advisor.measuring.training.trainer import Trainer
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


@pytest.mark.slow
def test_a_cell_builds_every_grid_optimizer_from_what_the_fork_server_imported():
    """After the fork server's imports, making each optimizer of the families' grids imports nothing more
    (Adafactor's transformers.optimization pulled in peft and torchao: 0.6-1.8 s an Adafactor cell)."""
    import json
    import subprocess
    import sys

    from advisor.measuring.grid.isolation import preload

    optimizers = sorted({o for spec in RULES.families.values() for o in spec.grid_optimizers})
    code = f"""
import importlib, json, sys, torch
for m in {preload(RULES)!r}:
    importlib.import_module(m)
from advisor.measuring.recipe.optimizers import make_optimizer
before = set(sys.modules)
for name in {optimizers!r}:
    make_optimizer(name, torch.nn.Linear(4, 4).parameters(), 1e-3, model=torch.nn.Linear(4, 4))
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], imported
