"""`make bench`'s table: each benchmark's figure as a ratio against the reference it was measured beside, read
from the raw results the benchmarks just wrote into bench/results/.

    python bench/table.py [--results bench/results]

One row per figure: what was timed, against what (in the same run, interleaved), min/median/max over the
rounds, and the target it is held to. A result file that is missing is said, not skipped silently.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def spread(values) -> str:
    """min / median / max of a bench's list of ratios, as the table prints them."""
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def recommend_rows(d: dict) -> list[tuple]:
    """An answer's CPU time against import torch's (target 0.08, issue 49); a cached fit's wall seconds (0.3)."""
    rows = []
    for name, figures in d["answers"].items():
        if name.startswith("fit ") and "wall_s" in figures:
            rows.append((name, "seconds (wall)", spread(figures["wall_s"]), "≤ 0.3 s"))
        else:
            rows.append((name, "import torch (CPU time)", spread(figures["cpu_ratio"]), "≤ 0.08"))
    return rows


def report_rows(d: dict) -> list[tuple]:
    return [
        (f"advisor report, {kind} cache", "import torch (CPU time)", spread(d[kind]["cpu_ratio"]), target)
        for kind, target in (("warm", "≤ 1.0"), ("cold", "(first report only)"))
    ]


def merge_rows(d: dict) -> list[tuple]:
    s = d["summary"]["cpu_ratio"]
    what = f"kb merge again (2 × {d['runs_per_kb']:,} runs held)"
    return [
        (what, "the first merge (CPU time)", f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}", "≤ 0.15")
    ]


def cell_rows(d: dict) -> list[tuple]:
    rows = []
    for model, s in d["summary"].items():
        share = f"{s['share_min']:.2f} / {s['share_median']:.2f} / {s['share_max']:.2f}"
        rows.append((f"{d['preset']} cell's training, {model}", "the cell's wall time", share, "≥ 0.70"))
    grid = f"the {d['preset']} grid, {len(d['cells']) + 1} cells"
    rows.append((grid, "seconds, wall", f"{d['grid_s']:.0f} s", ""))
    return rows


def plan_rows(d: dict) -> list[tuple]:
    rows, preset = [], d["grid"][d["grid"].index("--preset") + 1]
    models = ", ".join(m for flag, m in zip(d["grid"], d["grid"][1:], strict=False) if flag == "--model")
    for way, said in (("command", "history first"), ("calibration", "a fresh machine: calibrated")):
        w = d["ways"][way]
        grid = f"--plan of the {preset} grid ({models}), {said}"
        rows.append((grid, "the cells' own wall time, summed", spread(w["total_ratio"]), ""))
        rows.append((grid + ", makespan", "the command's wall time", spread(w["makespan_ratio"]), ""))
        rows.append(
            (f"--plan's own time, {preset}, {said}", "seconds, wall", spread(w["plan_wall_s"]), "≤ 10 s")
        )
    return rows


def fit_cold_rows(d: dict) -> list[tuple]:
    return [
        (f"a cold advisor fit: {name}", "seconds, wall", spread(q["wall_s"]), f"≤ {q['target_s']:g} s")
        for name, q in d["questions"].items()
    ]


def fit_speed_rows(d: dict) -> list[tuple]:
    out = []
    for split, said in (("fit", "the rows fitted"), ("held-out", "held-out rows")):
        got = d["summary"].get(split)
        if got:
            figure = f"advisor fit's tokens/s, {said} ({got['rows']})"
            spread_ = f"median {got['median_abs_error']:.3f} / worst {got['worst']:.3f}"
            out.append((figure, "abs(predicted / published - 1)", spread_, "≤ 0.15 / ≤ 0.35"))
    return out


BENCHES = {
    "recommend-latency-cpu.json": recommend_rows,
    "report-latency-cpu.json": report_rows,
    "merge-speed-cpu.json": merge_rows,
    "cell-time-cpu.json": cell_rows,
    "cell-time-small-cpu.json": cell_rows,
    "plan-accuracy-cpu.json": plan_rows,
    "plan-accuracy-small-cpu.json": plan_rows,
    "fit-cold-cpu.json": fit_cold_rows,
    "fit-speed.json": fit_speed_rows,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    print("| figure | against | min / median / max | target |")
    print("| --- | --- | --- | --- |")
    for name, rows in BENCHES.items():
        path = args.results / name
        if not path.exists():
            print(f"| {name}: not measured (run its benchmark) | | | |")
            continue
        for row in rows(json.loads(path.read_text())):
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
