"""A cold `advisor fit` (nothing cached) on the questions users ask first, timed beside `import torch`.

    python bench/fit_cold.py [--rounds 1] [--out bench/results/fit-cold-cpu.json]

Each round runs `python -c "import torch"`, then each question in a fresh data folder (so nothing is cached),
as a user runs it: the installed script, its stages on stderr. Each is timed by wall time and by the
child's CPU time (getrusage), and by its ratio to the import in the same round, so that a busy machine shows
as a higher import time, not as a slower trace. Targets (issue 34): the README's 8B menu about 40 s, and
Mixtral-8x7B's menu on 4 GPUs at most 90 s, on a quiet 2-core machine.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from machine import (
    advisor_script,
    device,
    timed,
    versions,
)  # bench/machine.py: the script's own folder is on sys.path

QUESTIONS = {
    "Llama-3.1-8B on an RTX 4090 (the README's menu)": ["--model", "llama-3.1-8b", "--gpu", "RTX4090"],
    "Mixtral-8x7B on 4 A100-80GB": ["--model", "mixtral-8x7b", "--gpu", "A100-80GB", "--gpus", "4"],
}
TARGETS = {"Llama-3.1-8B on an RTX 4090 (the README's menu)": 40.0, "Mixtral-8x7B on 4 A100-80GB": 90.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("ADVISOR_DB", None)
    results: dict = {name: {"wall_s": [], "cpu_s": [], "ratio": [], "stages": []} for name in QUESTIONS}
    imports = []
    for _ in range(args.rounds):
        _, torch_wall, _ = timed([sys.executable, "-c", "import torch"], env)
        imports.append(torch_wall)
        for name, question in QUESTIONS.items():
            with tempfile.TemporaryDirectory() as data:
                cpu, wall, done = timed([advisor_script(), "fit", *question], {**env, "XDG_DATA_HOME": data})
            stderr = done.stderr
            r = results[name]
            r["wall_s"].append(round(wall, 2))
            r["cpu_s"].append(round(cpu, 2))
            r["ratio"].append(round(wall / torch_wall, 2))
            r["stages"] = [line for line in stderr.splitlines() if line.startswith(("tracing", "["))]
            print(f"{name}: {wall:.1f} s wall ({cpu:.1f} s CPU, {wall / torch_wall:.1f}x import torch)")
    out = {
        "device": device(),
        "versions": versions("torch", "transformers", "peft", "bitsandbytes", "torchao"),
        "import_torch_s": imports,
        "questions": {
            name: {**r, "median_wall_s": statistics.median(r["wall_s"]), "target_s": TARGETS[name]}
            for name, r in results.items()
        },
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
