"""`advisor recommend` and `advisor frontier` on a generated KB of 100,000 runs (or a million).

    python bench/large_kb.py [--runs 1000000] [--rounds 5]

Two layouts: runs spread over 4 families × 5 machines × 25 configurations (seeds fill the rest), and
the worst case, every run in one evidence group. The KB is written as any import is, in bulk through
the store, which maintains the summaries answers read. Prints the time to write it and median wall
times of the answers (subprocess, as a user runs them). Target: under 1 s.
"""

import argparse
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from machine import advisor_script  # bench/machine.py: the script's own folder is on sys.path

from advisor.kb import store
from advisor.kb.identity import cell_key
from advisor.kb.open import open_for_writing, release

FAMILIES = {"vision": "vit", "encoder": "modernbert", "decoder": "llama", "vlm": "nanovlm"}
OPTIMIZERS = ["sgd", "adam", "adagrad", "adadelta", "cgd"]
STRATEGIES = ["standard", "checkpointing", "accumulation", "checkpointing+accumulation", "standard"]


def generate(path: Path, n_runs: int, families: list[str], machines: int, chunk: int = 50_000) -> None:
    """n_runs ok runs with four figures each, written through the store in bulk, as `kb import` writes."""
    rng = random.Random(0)
    conn = open_for_writing(path)
    cells = [
        (f, m, o, s) for f in families for m in range(machines) for o in OPTIMIZERS for s in set(STRATEGIES)
    ]
    for first in range(0, n_runs, chunk):
        runs = []
        for i in range(first, min(n_runs, first + chunk)):
            family, machine, opt, strat = cells[i % len(cells)]
            base = 1 + OPTIMIZERS.index(opt) * 0.1
            figures = (
                ("loss", base * rng.uniform(0.9, 1.1), ""),
                ("epoch_time", rng.uniform(1, 3), "s"),
                ("peak_rss_gb", rng.uniform(1, 2), "GB"),
                ("cpu_util", rng.uniform(50, 99), "%"),
            )
            runs.append(
                dict(
                    cell_key=cell_key(
                        {"family": family, "machine": machine, "optimizer": opt, "strategy": strat}
                    ),
                    uid=f"bench-{i}",
                    source="measured",
                    model=FAMILIES[family],
                    family=family,
                    optimizer=opt,
                    strategy=strat,
                    preset="small",
                    seed=i // len(cells),
                    hardware=f"bench machine {machine}",
                    device="cpu",
                    host_memory_gb=24.0,
                    status="ok",
                    metrics=[dict(name=n, value=v, unit=u) for n, v, u in figures],
                )
            )
        store.write_runs(conn, runs)
    release(conn)


def median_wall(cmd: list[str], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    advisor = advisor_script()
    with tempfile.TemporaryDirectory() as tmp:
        for label, families, machines in (
            ("spread over 20 groups per family", list(FAMILIES), 5),
            ("all in one group", ["encoder"], 1),
        ):
            path = Path(tmp) / f"{machines}.sqlite"
            start = time.perf_counter()
            generate(path, args.runs, families, machines)
            print(f"{args.runs:,} runs, {label}: generated in {time.perf_counter() - start:.1f} s")
            for cmd in (
                ["recommend", "--arch", "encoder", "--optimize", "time"],
                ["frontier", "--arch", "encoder"],
            ):
                t = median_wall([advisor, *cmd, "--db", str(path)], args.rounds)
                print(
                    f"  advisor {' '.join(cmd)}: median {t:.3f} s  (target < 1 s: {'met' if t < 1 else 'MISSED'})"
                )


if __name__ == "__main__":
    main()
