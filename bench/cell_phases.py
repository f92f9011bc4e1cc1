"""Where a grid cell's own time goes, phase by phase: each cell of a model's grid run in this process (imports
already done, no fork), its phases timed by wrapping the functions that do them.

    python bench/cell_phases.py [--model vit] [--preset tiny] [--out bench/results/cell-phases-cpu.json]

The phases: the model's build and the optimizer (setup), the training and held-out data, the FLOP count,
the held-out evaluations, the training steps, the measured step (PyTorch's MemTracker), the resource
monitor's start and the KB's writes. `training` is what bench/cell_time.py counts as training: the epochs'
loops without their evaluations. A first cell, run before and left out, warms the process. Prints each
phase's median milliseconds over the grid's cells and its share of the median cell, and the most training
could be of a cell if every phase but the measured step took no time: what bounds issue 25's target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

import advisor.measuring.training.trainer as trainer
from advisor.kb import lease, store
from advisor.kb.open import open_for_writing
from advisor.measuring.grid import runner
from advisor.measuring.request import request
from advisor.measuring.training.heldout import HeldOut
from advisor.model_ref import resolve_model
from advisor.rules import load_rules

spent: dict[str, float] = defaultdict(float)
calls: dict[str, int] = defaultdict(int)


def timed(owner, name: str, phase: str) -> None:
    """Wrap owner.name so that its calls add their seconds to `phase`."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - start
            calls[phase] += 1

    setattr(owner, name, wrapper)


PHASES = [
    (trainer.Trainer, "setup", "setup: model build, strategy, optimizer"),
    (trainer, "load", "training data"),
    (HeldOut, "__init__", "held-out data"),
    (trainer, "forward_flops_per_position", "FLOP count"),
    (HeldOut, "evaluate", "held-out evaluations"),
    (trainer.Trainer, "train_epoch", "epochs (with their evaluations)"),
    (trainer, "measured_step", "measured step (MemTracker)"),
    (trainer.Monitor, "__enter__", "resource monitor start"),
    (lease, "claim_run", "KB: claim"),
    (store, "update_run", "KB: built"),
    (store, "add_epoch", "KB: epochs"),
    (store, "finish_run", "KB: finish"),
]


def measure(model: str, preset: str) -> list[dict]:
    """Every cell of the model's grid (one seed) in this process: its wall seconds and each phase's."""
    for owner, name, phase in PHASES:
        timed(owner, name, phase)
    rules = load_rules()
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        asked = request(
            (resolve_model(model, rules),), preset=preset, seeds=1, db=str(Path(tmp) / "warm.sqlite")
        )
        grid = asked.grid(rules).cells
        peaks: dict = {}
        conn = open_for_writing(Path(tmp) / "warm.sqlite")
        runner.run_cell(grid[0], conn, rules, peaks=peaks, exiting=True)  # warms the process, left out
        conn.close()
        conn = open_for_writing(Path(tmp) / "kb.sqlite")
        for cell in grid:
            spent.clear()
            calls.clear()
            start = time.perf_counter()
            result = runner.run_cell(cell, conn, rules, peaks=peaks, exiting=True)
            wall = time.perf_counter() - start
            phases = dict(spent)
            epochs = phases.pop("epochs (with their evaluations)", 0.0)
            evals = phases.get("held-out evaluations", 0.0)
            initial = evals / max(calls["held-out evaluations"], 1)  # the one before the epochs, as the mean
            phases["training"] = epochs - (evals - initial)  # the epochs' loops without their evaluations
            cells.append(
                {
                    "optimizer": cell.config.optimizer,
                    "strategy": cell.config.strategy,
                    "status": result.status,
                    "wall_s": wall,
                    "phases_s": phases,
                }
            )
        conn.close()
    return cells


def summary(cells: list[dict]) -> dict:
    """Each phase's median seconds, the median cell, and training's most possible share without the rest."""
    names = sorted({p for c in cells for p in c["phases_s"]})
    medians = {p: statistics.median(c["phases_s"].get(p, 0.0) for c in cells) for p in names}
    bound = [
        c["phases_s"]["training"]
        / (c["phases_s"]["training"] + c["phases_s"].get("measured step (MemTracker)", 0.0))
        for c in cells
    ]
    return {
        "cell_median_s": statistics.median(c["wall_s"] for c in cells),
        "phase_median_s": medians,
        "share_bound_median": statistics.median(bound),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit", choices=("vit", "modernbert", "llama", "nanovlm"))
    parser.add_argument("--preset", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--out", type=Path, help="write the raw figures here (JSON)")
    args = parser.parse_args()
    cells = measure(args.model, args.preset)
    result = {
        "model": args.model,
        "preset": args.preset,
        "cells": cells,
        "summary": summary(cells),
        "device": device(),
        "versions": versions("torch"),
    }
    s = result["summary"]
    print(
        f"{args.model}/{args.preset}: {len(cells)} cells, median cell {1000 * s['cell_median_s']:.0f} ms in-process"
    )
    for phase, seconds in sorted(s["phase_median_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {phase:42s} {1000 * seconds:7.1f} ms  {seconds / s['cell_median_s']:5.0%}")
    print(
        f"training's share if only the measured step remained beside it: {s['share_bound_median']:.2f} (median)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
