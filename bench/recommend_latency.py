"""Median wall time of `advisor recommend` against `python -c "import torch"`, interleaved in one run.

    python bench/recommend_latency.py [--rounds 15]

Prints both medians and their ratio. Target: recommend under 0.3 s on a 2-core CPU machine.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    advisor = shutil.which("advisor") or sys.exit("advisor is not on PATH: install the project first")
    recommend = [advisor, "recommend", "--arch", "encoder", "--optimize", "memory"]
    torch = [sys.executable, "-c", "import torch"]
    wall(recommend), wall(torch)  # warm the page cache for both
    a, b = [], []
    for _ in range(args.rounds):  # interleaved, so machine noise hits both alike
        a.append(wall(recommend))
        b.append(wall(torch))
    ma, mb = statistics.median(a), statistics.median(b)
    print(
        f"advisor recommend: median {ma:.3f} s over {args.rounds} runs (min {min(a):.3f}, max {max(a):.3f})"
    )
    print(
        f"import torch:      median {mb:.3f} s over {args.rounds} runs (min {min(b):.3f}, max {max(b):.3f})"
    )
    print(
        f"ratio recommend / import torch: {ma / mb:.3f}   target: recommend < 0.300 s -> "
        f"{'met' if ma < 0.3 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
