"""`advisor recommend` against `python -c "import torch"`, interleaved in one run, as CPU-time ratios.

    python bench/recommend_latency.py [--rounds 15] [--out bench/results/recommend-latency.json]

Each round runs every answer once and `import torch` once, in turn, so machine noise hits them alike; each
is timed as the child's CPU time (user + system, from getrusage), which a busy machine inflates far less
than wall time, and by wall time beside it. Prints min/median/max of each answer's ratio to import torch.
Target (issue 25): the default answer at most 0.10x import torch.
"""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 0.10
# As an install runs: bytecode cached (a sandbox's PYTHONDONTWRITEBYTECODE would recompile every module, every run)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ANSWERS = {
    "recommend (paper, single runs)": ["recommend", "--arch", "encoder", "--optimize", "memory"],
    "recommend (measured, 3 seeds, tests)": ["recommend", "--arch", "vit", "--source", "measured"],
    "frontier (measured)": ["frontier", "--arch", "vit", "--source", "measured"],
    "flowchart": ["flowchart"],
}


def timed(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of cmd as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, help="write the raw timings and ratios as JSON")
    args = parser.parse_args()
    advisor = shutil.which("advisor") or sys.exit("advisor is not on PATH: install the project first")
    commands = {name: [advisor, *argv] for name, argv in ANSWERS.items()}
    torch = [sys.executable, "-c", "import torch"]
    for cmd in (*commands.values(), torch):  # warm the page cache for every one
        timed(cmd)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in [*commands, "import torch"]}
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            runs[name].append(timed(cmd))
        runs["import torch"].append(timed(torch))
    reference = runs["import torch"]
    out = {
        "rounds": args.rounds,
        "python": platform.python_version(),
        "machine": platform.processor(),
        "answers": {},
    }
    print(
        f"import torch: CPU {statistics.median(c for c, _ in reference):.3f} s median over {args.rounds} runs"
    )
    for name in commands:
        ratios = sorted(c / r for (c, _), (r, _) in zip(runs[name], reference, strict=True))
        walls = sorted(w / r for (_, w), (_, r) in zip(runs[name], reference, strict=True))
        median = statistics.median(ratios)
        verdict = "met" if median <= TARGET else "MISSED"
        print(
            f"{name:40s} CPU ratio min/median/max {ratios[0]:.3f}/{median:.3f}/{ratios[-1]:.3f}  "
            f"(wall {statistics.median(walls):.3f})  target {TARGET:.2f}: {verdict}"
        )
        out["answers"][name] = {"cpu_ratio": ratios, "wall_ratio": walls, "median_cpu_ratio": median}
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
