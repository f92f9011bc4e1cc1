"""`advisor report` against `python -c "import torch"`, interleaved in one run, as CPU-time ratios: the first
report of a data folder (cold: the chart script not yet kept) apart from the ones after it (warm).

    python bench/report_latency.py [--rounds 10] [--out bench/results/report-latency-cpu.json]

Each round runs, in turn, a cold report (a new, empty data folder), a warm report (a data folder an earlier
report used) and `import torch`, so machine noise hits them alike. Every report is the README's command,
`advisor report --out DIR` of the shipped KB into a new folder. Each is timed as the child's CPU time
(user + system, from getrusage), which a busy machine inflates far less than wall time, and by wall time
beside it. Prints min/median/max of each kind's ratio to import torch.
Target (issue 25): a warm report at most 1.0x import torch.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import (  # bench/machine.py: the script's own folder is on sys.path
    advisor_script,
    device,
    versions,
)

TARGET = 1.0
REPO = Path(__file__).resolve().parents[1]
# As an install runs: bytecode cached (a sandbox's PYTHONDONTWRITEBYTECODE would recompile every module,
# every run), the shipped KB read (no $ADVISOR_DB)
ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "ADVISOR_DB")}


def timed(cmd: list, env: dict | None = None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of cmd as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env or ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def report(advisor: str, scratch: Path, data: Path) -> tuple[float, float]:
    """One `advisor report --out DIR` into a new folder, with `data` as the user's data folder."""
    out = Path(tempfile.mkdtemp(dir=scratch, prefix="site-"))
    shutil.rmtree(out)  # a folder the report makes, as a user's first `--out site/`
    return timed([advisor, "report", "--out", str(out)], ENV | {"XDG_DATA_HOME": str(data)})


def summary(runs: list[tuple[float, float]], reference: list[tuple[float, float]]) -> dict:
    """Each run's CPU and wall time as a ratio to the import torch of its round, sorted."""
    cpu = sorted(c / r for (c, _), (r, _) in zip(runs, reference, strict=True))
    wall = sorted(w / r for (_, w), (_, r) in zip(runs, reference, strict=True))
    return {"cpu_ratio": cpu, "wall_ratio": wall, "median_cpu_ratio": statistics.median(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write the raw timings and ratios as JSON")
    args = parser.parse_args()
    advisor = advisor_script()
    torch = [sys.executable, "-c", "import torch"]
    runs: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": [], "import torch": []}
    with tempfile.TemporaryDirectory(prefix="report-latency-") as name:
        scratch = Path(name)
        warm = scratch / "warm-data"
        report(advisor, scratch, warm)  # keeps the chart script; warms the page cache and the bytecode
        timed(torch)
        for i in range(args.rounds):
            runs["cold"].append(report(advisor, scratch, scratch / f"cold-data-{i}"))
            runs["warm"].append(report(advisor, scratch, warm))
            runs["import torch"].append(timed(torch))
    reference = runs["import torch"]
    out = {
        "rounds": args.rounds,
        "device": device(),
        "versions": versions("torch", "altair", "vl-convert-python"),
        "target": TARGET,
        "runs": runs,
    }
    print(
        f"import torch: CPU {statistics.median(c for c, _ in reference):.3f} s median over {args.rounds} runs"
    )
    for kind in ("cold", "warm"):
        found = out[kind] = summary(runs[kind], reference)
        ratios, median = found["cpu_ratio"], found["median_cpu_ratio"]
        verdict = (
            f"  target {TARGET:.2f}: {'met' if median <= TARGET else 'MISSED'}" if kind == "warm" else ""
        )
        print(
            f"report, {kind} cache: CPU ratio min/median/max {ratios[0]:.3f}/{median:.3f}/{ratios[-1]:.3f}  "
            f"(wall {statistics.median(found['wall_ratio']):.3f}){verdict}"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
