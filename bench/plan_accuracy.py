"""`advisor measure --plan` against the grid it prices: planned against actual wall time, and the plan's own.

    python bench/plan_accuracy.py [--models all] [--optimizers sgd,adam] [--strategies standard] [--preset tiny]
                                  [--rounds 3] [--threads N] [--out bench/results/plan-accuracy-cpu.json]

On a fresh machine's footing (an empty user data folder, a fresh KB as --db; the shipped KB is read, as
always), the tiny grid is planned `--rounds` times in two ways, interleaved: as a user gets it, `advisor
measure --preset tiny --plan --json` (past runs in every KB first: the shipped KB's where they were
measured on this hardware, else a calibration timed now), and by a calibration alone (the API,
`plan_cells(..., fresh=True)`, in a child process as the command is). Then the grid is run for real
into the fresh KB, one cell at a time (`advisor measure --preset tiny --db KB`: the local executor, one
worker). Printed per way of planning, min/median/max over the rounds: the planned total against the sum of
the cells' wall times (claim to finish, as the KB keeps them, in whole seconds: what a plan prices), the
planned makespan against the command's wall time (which adds what a plan leaves out: the grid's start, its
worker importing torch, and each cell's process), each model's planned/actual (its cells summed: whole
seconds average out), and the plan's own wall and CPU time (the child's, from getrusage). Target (issue 25):
the first plan of the tiny grid within 10 s wall, every cell priced (no unknown cost).

The whole tiny grid (81 cells) takes several minutes on 2 cores; `--models vit --optimizers sgd` and the
like run a part of it. Timings on a shared machine move with its load: the load average is kept with them,
and `--threads 1` takes out torch's two threads, which slow a tiny step 100x whenever another process runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from machine import (
    advisor_script,
    device,
    timed,  # bench/machine.py: the script's own folder is on sys.path
    versions,
)

TARGET_S = 10.0
REPO = Path(__file__).resolve().parent.parent
# As an install runs: bytecode cached (a sandbox's PYTHONDONTWRITEBYTECODE would recompile every module, every run)
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ADVISOR_DB")} | {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}
CALIBRATED = """
import json, sys
from advisor.measuring.recipe.config import RunConfig
from advisor.measuring.planning.plan import plan_cells
from advisor.measuring.grid.runner import plan_grid
from advisor.model_ref import reference_models, resolve_model
from advisor.rules import load_rules

names, optimizers, strategies, preset, db = json.loads(sys.argv[1])
rules = load_rules()
models = reference_models(rules) if names == ["all"] else [resolve_model(n, rules) for n in names]
cells = plan_grid(models, rules, optimizers, strategies, 1, RunConfig(preset=preset))
print(json.dumps(plan_cells(cells, rules, None, [1], db=db, fresh=True).as_dict()))
"""


def grid_args(args) -> list[str]:
    """The grid's options, as `advisor measure` takes them."""
    out = [a for m in args.models.split(",") for a in ("--model", m)]
    out += [a for o in filter(None, args.optimizers.split(",")) for a in ("--optimizer", o)]
    out += [a for s in filter(None, args.strategies.split(",")) for a in ("--strategy", s)]
    return [*out, "--preset", args.preset]


def plan_once(way: str, advisor: str, args, scratch: Path, db: Path) -> dict:
    """One plan in a fresh user data folder: its JSON, and its wall and CPU time."""
    home = Path(tempfile.mkdtemp(dir=scratch))
    env = ENV | {"XDG_DATA_HOME": str(home), "HOME": str(home)}
    if way == "command":
        cmd = [advisor, "measure", *grid_args(args), "--plan", "--json", "--db", str(db)]
    else:
        lists = [
            args.models.split(","),
            *(list(filter(None, a.split(","))) for a in (args.optimizers, args.strategies)),
        ]
        cmd = [sys.executable, "-c", CALIBRATED, json.dumps([*lists, args.preset, str(db)])]
    cpu, wall, done = timed(cmd, env)
    stdout = done.stdout
    plan = json.loads(stdout)
    return {"cpu_s": cpu, "wall_s": wall, "plan": plan}


def actual_cells(db: Path) -> dict[tuple, dict]:
    """(model, optimizer, strategy, seed) -> the run's status and wall time (claim to finish) in the KB."""
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT model, optimizer, strategy, seed, status, "
        "(julianday(finished_at) - julianday(started_at)) * 86400 FROM runs"
    ).fetchall()
    conn.close()
    return {tuple(r[:4]): {"status": r[4], "wall_s": r[5]} for r in rows}


def spread(values: list[float]) -> str:
    values = sorted(values)
    return f"{values[0]:.2f}/{statistics.median(values):.2f}/{values[-1]:.2f}"


def compare(plans: list[dict], actual: dict, command_wall: float) -> dict:
    """Per round: planned total / the cells' summed walls, planned makespan / the command's wall; per model
    (the first round's plan: a cell's wall is kept in whole seconds, a model's many cells average that
    out): planned / actual; and the plan's wall and CPU time."""
    cells_sum = sum(a["wall_s"] or 0.0 for a in actual.values())
    planned: dict[str, float] = {}
    ran: dict[str, float] = {}
    for cell in plans[0]["plan"]["cells"]:
        key = (cell["model"], cell["optimizer"], cell["strategy"], cell["seed"])
        if key in actual and cell["predicted_s"] is not None:
            planned[cell["model"]] = planned.get(cell["model"], 0.0) + cell["predicted_s"]
            ran[cell["model"]] = ran.get(cell["model"], 0.0) + (actual[key]["wall_s"] or 0.0)
    return {
        "planned_total_s": [p["plan"]["total_s"] for p in plans],
        "total_ratio": [p["plan"]["total_s"] / cells_sum for p in plans],
        "makespan_ratio": [p["plan"]["makespan_s"]["1"] / command_wall for p in plans],
        "model_ratio": {m: planned[m] / ran[m] for m in planned if ran[m]},
        "plan_wall_s": [p["wall_s"] for p in plans],
        "plan_cpu_s": [p["cpu_s"] for p in plans],
        "unknown_cost": [p["plan"]["unknown_cost"] for p in plans],
        "from": sorted({c["from"] for p in plans for c in p["plan"]["cells"]}),
        "calibrations": plans[0]["plan"]["calibrations"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default="all", help="comma-separated, as --model takes them (default: all)"
    )
    parser.add_argument("--optimizers", default="", help="comma-separated (default: each family's grid)")
    parser.add_argument("--strategies", default="", help="comma-separated (default: each family's grid)")
    parser.add_argument("--rounds", type=int, default=3, help="plans of each way (default: 3)")
    parser.add_argument("--preset", choices=("tiny", "small"), default="tiny", help="(default: tiny)")
    parser.add_argument(
        "--threads",
        type=int,
        help="OMP_NUM_THREADS for every child (default: unset, as users run): on a shared 2-core machine "
        "torch's two threads slow tiny steps 100x whenever another process runs; 1 takes that out",
    )
    parser.add_argument("--out", type=Path, help="write the raw timings and ratios as JSON")
    args = parser.parse_args()
    advisor = advisor_script()
    if args.threads:
        ENV["OMP_NUM_THREADS"] = str(args.threads)
    load = {"before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as scratch:
        db = Path(scratch) / "grid.sqlite"
        plans: dict[str, list[dict]] = {"command": [], "calibration": []}
        for _ in range(args.rounds):  # interleaved: the machine's load hits both ways alike
            for way in plans:
                plans[way].append(plan_once(way, advisor, args, Path(scratch), db))
        load["planned"] = os.getloadavg()
        home = Path(tempfile.mkdtemp(dir=scratch))
        env = ENV | {"XDG_DATA_HOME": str(home), "HOME": str(home)}
        cpu, wall, _ = timed([advisor, "measure", *grid_args(args), "--db", str(db), "--json"], env)
        load["ran"] = os.getloadavg()
        actual = actual_cells(db)
    out = {
        "grid": grid_args(args),
        "omp_num_threads": ENV.get("OMP_NUM_THREADS"),
        "cells": len(actual),
        "statuses": {
            s: sum(a["status"] == s for a in actual.values()) for s in {a["status"] for a in actual.values()}
        },
        "run": {
            "wall_s": wall,
            "cpu_s": cpu,
            "cells_wall_s": sum(a["wall_s"] or 0.0 for a in actual.values()),
        },
        "load_average": load,
        "device": device(),
        "versions": versions("torch"),
        "ways": {way: compare(p, actual, wall) for way, p in plans.items()},
        "actual": [{"cell": list(k), **v} for k, v in actual.items()],
    }
    print(
        f"{len(actual)} cells ran in {wall:.0f} s ({out['run']['cells_wall_s']:.0f} s claim to finish, summed); "
        f"load average {load['before'][0]:.1f} before, {load['ran'][0]:.1f} after"
    )
    for way, c in out["ways"].items():
        worst = max(c["plan_wall_s"])
        verdict = "met" if worst <= TARGET_S and not any(c["unknown_cost"]) else "MISSED"
        print(
            f"plan by {way:11s}: planned/actual total min/median/max {spread(c['total_ratio'])}, makespan/command "
            f"{spread(c['makespan_ratio'])}, per model {spread(list(c['model_ratio'].values()))}; "
            f"plan wall {spread(c['plan_wall_s'])} s, "
            f"CPU {spread(c['plan_cpu_s'])} s; unknown cost {max(c['unknown_cost'])}; target {TARGET_S:.0f} s "
            f"and every cell priced: {verdict}; from {', '.join(c['from'])}"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
