"""`advisor recommend` against `python -c "import torch"`, interleaved in one run, as CPU-time ratios.

    python bench/recommend_latency.py [--rounds 15] [--user-kb FILE] [--out bench/results/recommend-latency-cpu.json]

Each round runs every answer once and `import torch` once, in turn, so machine noise hits them alike; each
is timed as the child's CPU time (user + system, from getrusage), which a busy machine inflates far less
than wall time, and by wall time beside it. Every answer runs twice: with no KB of the user's (an empty data
folder), and with a copy of `--user-kb` (default: your own KB, where you have one) as the user's KB, read
beside the shipped one, its check remembered from the first answer on, as an install sees it; the paper
answer also with that check not remembered (its cache removed before each run). Prints min/median/max of
each answer's ratio to import torch. Target (issue 49): the default answer at most 0.08x import torch.

Cached fit answers are timed beside them (issue 49: at most 0.3 s), in a data folder of their own whose KB
the warm-up's cold trace fills: their seconds are printed, wall and CPU, with the same ratio.
"""

import argparse
import functools
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

from advisor.places import user_kb_path

TARGET = 0.08  # recommend's CPU time against import torch's
FIT_TARGET_S = 0.3  # a cached fit answer, wall seconds
REPO = Path(__file__).resolve().parent.parent
# As an install runs: bytecode cached (a sandbox's PYTHONDONTWRITEBYTECODE would recompile every module, every run)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
PAPER = ["recommend", "--arch", "encoder", "--optimize", "memory"]
ANSWERS = {
    "recommend (paper, single runs)": PAPER,
    "recommend (measured, 3 seeds, tests)": ["recommend", "--arch", "vit", "--source", "measured"],
    "frontier (measured)": ["frontier", "--arch", "vit", "--source", "measured"],
    "flowchart": ["flowchart"],
}
FITS = {  # advisor fit answers read from the cache (the warm-up traces them once)
    "fit llama-3.1-8b RTX4090 --json (cached)": [
        "fit",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "RTX4090",
        "--json",
    ],
    "fit llama-3.1-70b 8 H100 (cached)": ["fit", "--model", "llama-3.1-70b", "--gpu", "H100", "--gpus", "8"],
}
STILL_S = 2.5  # a KB file younger than this has its check redone, not remembered (advisor.kb.checks.STILL_NS)


def timed(cmd: list[str], env: dict, before_run=None) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of cmd as a child process."""
    if before_run:
        before_run()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def data_folders(scratch: Path, user_kb: Path | None) -> dict[str, Path]:
    """The user data folders the answers run with: an empty one, and one holding a copy of `user_kb`."""
    folders = {"no user KB": scratch / "none"}
    folders["no user KB"].mkdir()
    if user_kb is not None:
        mine = scratch / "mine"
        (mine / "advisor").mkdir(parents=True)
        shutil.copy(user_kb, mine / "advisor" / "kb.sqlite")
        folders[f"{user_kb.stat().st_size / 1e6:.1f} MB user KB"] = mine
        time.sleep(STILL_S)  # a file just copied is checked on every read until it has been still this long
    return folders


def runs_to_time(advisor: str, folders: dict[str, Path]) -> dict[str, tuple[list[str], dict, object]]:
    """name -> (command, environment, what to do before each run) of every answer with every data folder."""
    out = {}
    for kb, folder in folders.items():
        env = ENV | {"XDG_DATA_HOME": str(folder)}
        for name, argv in ANSWERS.items():
            out[f"{name}, {kb}"] = ([advisor, *argv], env, None)
        if kb != "no user KB":
            forget = functools.partial(shutil.rmtree, folder / "advisor" / "cache", ignore_errors=True)
            out[f"recommend (paper), {kb}, check not remembered"] = ([advisor, *PAPER], env, forget)
    fit_folder = next(iter(folders.values())).parent / "fits"
    fit_folder.mkdir(exist_ok=True)
    for name, argv in FITS.items():
        out[name] = ([advisor, *argv], ENV | {"XDG_DATA_HOME": str(fit_folder)}, None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--user-kb", type=Path, help="a KB to read as the user's (default: yours, if any)")
    parser.add_argument("--out", type=Path, help="write the raw timings and ratios as JSON")
    args = parser.parse_args()
    advisor = advisor_script()
    user_kb = args.user_kb or (user_kb_path() if user_kb_path().is_file() else None)
    torch = [sys.executable, "-c", "import torch"]
    with tempfile.TemporaryDirectory(prefix="recommend-latency-") as scratch:
        commands = runs_to_time(advisor, data_folders(Path(scratch), user_kb))
        for cmd, env, before_run in commands.values():  # warm the page cache; remember the KB's check
            timed(cmd, env, before_run)
        timed(torch, ENV)
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in [*commands, "import torch"]}
        for _ in range(args.rounds):
            for name, (cmd, env, before_run) in commands.items():
                runs[name].append(timed(cmd, env, before_run))
            runs["import torch"].append(timed(torch, ENV))
    reference = runs["import torch"]
    out = {"rounds": args.rounds, "device": device(), "versions": versions("torch"), "answers": {}}
    print(
        f"import torch: CPU {statistics.median(c for c, _ in reference):.3f} s median over {args.rounds} runs"
    )
    for name in commands:
        ratios = sorted(c / r for (c, _), (r, _) in zip(runs[name], reference, strict=True))
        walls = sorted(w / r for (_, w), (_, r) in zip(runs[name], reference, strict=True))
        median = statistics.median(ratios)
        seconds = sorted(w for _, w in runs[name])
        cpu_s = statistics.median(c for c, _ in runs[name])
        if name in FITS:
            verdict = f"target {FIT_TARGET_S} s wall: {'met' if statistics.median(seconds) <= FIT_TARGET_S else 'MISSED'}"
        else:
            verdict = f"target {TARGET:.2f}: {'met' if median <= TARGET else 'MISSED'}"
        print(
            f"{name:62s} CPU ratio min/median/max {ratios[0]:.3f}/{median:.3f}/{ratios[-1]:.3f}  "
            f"(wall {statistics.median(walls):.3f}; {statistics.median(seconds):.3f} s wall, {cpu_s:.3f} s CPU)  "
            f"{verdict}"
        )
        out["answers"][name] = {
            "cpu_ratio": ratios,
            "wall_ratio": walls,
            "median_cpu_ratio": median,
            "wall_s": seconds,
            "median_cpu_s": cpu_s,
        }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
