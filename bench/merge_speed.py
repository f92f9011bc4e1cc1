"""`advisor kb merge` of two generated KBs into an empty KB, then the same merge again: what a merge that
adds nothing costs against a real one.

    python bench/merge_speed.py [--runs 20000] [--rounds 5] [--out bench/results/merge-speed-cpu.json]

Two KBs of --runs runs each (four figures and two epochs a run, distinct cells, written through the store
in bulk as `kb import` writes), then, each round, into a fresh empty KB: `advisor kb merge A B` (the first
merge) and the same command again (every run already there). Each is a child process, as a user runs it,
timed by its CPU time (user + system, from getrusage; a busy machine inflates it far less than wall time)
and by wall time beside it. Prints the medians and min/median/max of the ratio again / first.
Target (issue 25): the second merge at most 0.15x the first.
"""

import argparse
import json
import os
import random
import resource
import sqlite3
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

from advisor.kb import store
from advisor.kb.identity import cell_key
from advisor.kb.open import open_for_writing, release

TARGET = 0.15
# As an install runs: bytecode cached (a sandbox's PYTHONDONTWRITEBYTECODE would recompile every module, every run)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
OPTIMIZERS = ["sgd", "adam", "adagrad", "adadelta", "cgd"]
STRATEGIES = ["standard", "checkpointing", "accumulation", "checkpointing+accumulation"]


def bench_run(tag: str, i: int, rng: random.Random) -> dict:
    """One ok run of KB `tag`: its own cell, seed and hardware (no run of one KB repeats the other's)."""
    opt, strat = OPTIMIZERS[i % 5], STRATEGIES[i // 5 % 4]
    machine, seed = i // 20 % 5, i // 100
    loss = 1 + OPTIMIZERS.index(opt) * 0.1
    figures = (
        ("loss", loss * rng.uniform(0.9, 1.1), ""),
        ("epoch_time", rng.uniform(1, 3), "s"),
        ("peak_rss_gb", rng.uniform(1, 2), "GB"),
        ("cpu_util", rng.uniform(50, 99), "%"),
    )
    epochs = [dict(epoch=e, steps=10, loss=loss / (e + 1), wall_s=rng.uniform(1, 3)) for e in range(2)]
    return dict(
        cell_key=cell_key({"family": "encoder", "optimizer": opt, "strategy": strat}),
        uid=f"bench-{tag}-{i}",
        source="measured",
        model="modernbert",
        family="encoder",
        optimizer=opt,
        strategy=strat,
        preset="small",
        seed=seed,
        hardware=f"bench machine {tag}{machine}",
        device="cpu",
        host_memory_gb=24.0,
        status="ok",
        metrics=[dict(name=n, value=v, unit=u) for n, v, u in figures],
        epochs=epochs,
    )


def generate(path: Path, tag: str, n_runs: int, chunk: int = 5_000) -> None:
    """n_runs runs written through the store in bulk, as `kb import` writes them."""
    rng = random.Random(tag)
    conn = open_for_writing(path)
    for first in range(0, n_runs, chunk):
        store.write_runs(conn, [bench_run(tag, i, rng) for i in range(first, min(n_runs, first + chunk))])
    release(conn)


def timed(cmd: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of cmd as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def one_round(advisor: str, sources: list[Path], folder: Path) -> dict:
    """The first merge into a fresh empty KB and the same merge again, timed; the target checked."""
    target = folder / "target.sqlite"
    target.unlink(missing_ok=True)
    cmd = [advisor, "kb", "merge", *map(str, sources), "--db", str(target)]
    first = timed(cmd)
    again = timed(cmd)
    with sqlite3.connect(target) as conn:
        held = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    conn.close()
    return {"first": first, "again": again, "runs_in_target": held}


def summary(rounds: list[dict]) -> dict:
    def stats(values):
        values = sorted(values)
        return {"min": values[0], "median": statistics.median(values), "max": values[-1]}

    return {
        "first_cpu_s": stats(r["first"][0] for r in rounds),
        "again_cpu_s": stats(r["again"][0] for r in rounds),
        "first_wall_s": stats(r["first"][1] for r in rounds),
        "again_wall_s": stats(r["again"][1] for r in rounds),
        "cpu_ratio": stats(r["again"][0] / r["first"][0] for r in rounds),
        "wall_ratio": stats(r["again"][1] / r["first"][1] for r in rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs in each of the two KBs merged")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the raw timings and ratios as JSON")
    args = parser.parse_args()
    advisor = advisor_script()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sources = [folder / "a.sqlite", folder / "b.sqlite"]
        start = time.perf_counter()
        for tag, path in zip("ab", sources, strict=True):
            generate(path, tag, args.runs)
        print(f"2 KBs of {args.runs:,} runs generated in {time.perf_counter() - start:.1f} s")
        one_round(advisor, sources, folder)  # warms the page cache and the bytecode cache
        rounds = [one_round(advisor, sources, folder) for _ in range(args.rounds)]
    bad = [r["runs_in_target"] for r in rounds if r["runs_in_target"] != 2 * args.runs]
    if bad:
        sys.exit(f"a merge left {bad[0]} runs in its target, not {2 * args.runs}")
    out = {"runs_per_kb": args.runs, "rounds": rounds, "summary": summary(rounds)}
    out |= {"target": TARGET, "device": device(), "versions": versions()}
    s = out["summary"]
    print(
        f"first merge: CPU {s['first_cpu_s']['median']:.2f} s, wall {s['first_wall_s']['median']:.2f} s; "
        f"again: CPU {s['again_cpu_s']['median']:.2f} s, wall {s['again_wall_s']['median']:.2f} s "
        f"(medians of {args.rounds})"
    )
    ratio = s["cpu_ratio"]
    verdict = "met" if ratio["median"] <= TARGET else "MISSED"
    spread = f"{ratio['min']:.3f}/{ratio['median']:.3f}/{ratio['max']:.3f}"
    print(
        f"again / first: CPU ratio min/median/max {spread}  (wall {s['wall_ratio']['median']:.3f})  "
        f"target {TARGET:.2f}: {verdict}"
    )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
