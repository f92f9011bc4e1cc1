"""Where a tiny grid cell's time goes: its training against its wall time, as the grid sees it.

    python bench/cell_time.py [--model vit ...] [--preset tiny] [--seeds 1] [--out bench/results/cell-time-cpu.json]

Runs the tiny grid (or --preset small's; default: the four reference models, each family's grid, one seed) as `advisor measure`
does, each cell forked from the fork server, into a fresh KB. A cell's wall time is the time from the end of
the cell before it to its own end, in the grid's process: fork, the KB's claim and writes, model build, data,
held-out evaluations, training, the measured step. The first cell, which waits for the fork server's imports,
is left out of the shares. Training is what each run records: over its epochs, the timed steps and the
warm-up steps. Prints the median share of training per model and overall, and the
grid's whole wall time (the README's figure for the tiny grid). Target (issue 25): training is at least
0.70 of a cell's wall time on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

from advisor.measuring.request import request
from advisor.measuring.training.progress import Reporter
from advisor.model_ref import resolve_model
from advisor.rules import load_rules

MODELS = ("vit", "modernbert", "llama", "nanovlm")


class Clock(Reporter):
    """The grid's reporter that notes when each cell ended (seconds since the grid started)."""

    def __init__(self):
        self.start, self.ends = time.perf_counter(), []

    def cell_end(self, result, key=None) -> None:
        self.ends.append((time.perf_counter() - self.start, result.run_id, result.status))


def trained_seconds(db: Path) -> dict[int, tuple[str, float]]:
    """run id -> (model, seconds it spent training): over its epochs, the timed steps and the warm-up ones.
    An epoch's `wall_s` is its timed steps' rate over all its steps; the warm-up steps (config.warmup_steps,
    in the first epoch) took `warmup_s` instead."""
    conn = sqlite3.connect(db)
    runs = {i: (m, json.loads(c or "{}")) for i, m, c in conn.execute("SELECT id, model, config FROM runs")}
    out: dict[int, tuple[str, float]] = {}
    for run_id, wall, warm, steps in conn.execute("SELECT run_id, wall_s, warmup_s, steps FROM epochs"):
        model, config = runs[run_id]
        warm_steps = config.get("warmup_steps", 1) if warm else 0
        seconds = (wall or 0) * (steps - warm_steps) / steps + (warm or 0) if steps else 0
        out[run_id] = (model, out.get(run_id, (model, 0.0))[1] + seconds)
    conn.close()
    return out


def measure(models: list[str], preset: str, seeds: int) -> dict:
    """Run the preset's grid into a fresh KB; every cell's wall and training seconds, and the grid's wall."""
    rules = load_rules()
    resolved = tuple(resolve_model(m, rules) for m in models)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "kb.sqlite"
        asked = request(resolved, preset=preset, seeds=seeds, db=str(db))
        grid = asked.grid(rules)
        clock = Clock()
        asked.run(rules, clock, grid=grid)
        grid_s = time.perf_counter() - clock.start
        trained = trained_seconds(db)
    cells, before = [], None
    for end, run_id, status in clock.ends:
        if before is not None and run_id in trained:
            model, seconds = trained[run_id]
            cells.append({"model": model, "status": status, "wall_s": end - before, "trained_s": seconds})
        before = end
    first = clock.ends[0][0] if clock.ends else None
    return {"preset": preset, "grid_s": grid_s, "first_cell_end_s": first, "cells": cells}


def summary(cells: list[dict]) -> dict:
    """Median training share (min/max too) and wall seconds, per model and over every cell."""
    out = {}
    for model in sorted({c["model"] for c in cells}) + ["all"]:
        mine = [c for c in cells if model in ("all", c["model"])]
        shares = [c["trained_s"] / c["wall_s"] for c in mine]
        outside = [c["wall_s"] - c["trained_s"] for c in mine]
        out[model] = {
            "cells": len(mine),
            "share_min": min(shares),
            "share_median": statistics.median(shares),
            "share_max": max(shares),
            "wall_median_s": statistics.median(c["wall_s"] for c in mine),
            "outside_median_s": statistics.median(outside),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=MODELS, help="default: all four")
    parser.add_argument("--preset", choices=("tiny", "small"), default="tiny")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the raw figures here (JSON)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    result = measure(args.model or list(MODELS), args.preset, args.seeds)
    result["summary"] = summary(result["cells"])
    result |= {"device": device(), "versions": versions("torch")}
    for model, s in result["summary"].items():
        print(
            f"{model:11s} {s['cells']:3d} cells  training share {s['share_min']:.2f}/{s['share_median']:.2f}/"
            f"{s['share_max']:.2f} (min/median/max)  cell {s['wall_median_s']:.2f} s, "
            f"{s['outside_median_s']:.2f} s outside training"
        )
    print(f"the {args.preset} grid: {len(result['cells']) + 1} cells in {result['grid_s']:.0f} s wall")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
