"""A cold `advisor fit` (nothing cached) on a sample of shipped models, timed beside `import torch`.

    python bench/fit_cold.py [--rounds 1] [--only NAME ...] [--out bench/results/fit-cold-cpu.json]

Each round runs `python -c "import torch"`, then each question in a fresh data folder (so nothing is cached),
as a user runs it: the installed script, its stages on stderr. Each is timed by wall time and by the
child's CPU time (getrusage), and by its ratio to the import in the same round, so that a busy machine shows
as a higher import time, not as a slower trace. The sample (issue 44): a dense model, mixtures of experts
(8 and 128 experts), Gemma-3 (mixed attention layers, a vision tower it does not run on text), several
GPUs (FSDP and ZeRO), and a question nothing fits (the levers traced too). Targets: at most 30 s on one GPU
and 60 s on several, on a quiet 2-core machine; load multiplies them.
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

ONE, SEVERAL = 30.0, 60.0  # seconds: the targets on one GPU and on several
QUESTIONS = {  # name -> (the question's options, its target)
    "Llama-3.1-8B on an RTX 4090 (the README's menu)": (["--model", "llama-3.1-8b", "--gpu", "RTX4090"], ONE),
    "Gemma-3-27B on an A100-80GB": (["--model", "gemma-3-27b", "--gpu", "A100-80GB"], ONE),
    "Mixtral-8x7B on an A100-80GB": (["--model", "mixtral-8x7b", "--gpu", "A100-80GB"], ONE),
    "Qwen3-30B-A3B on an H100": (["--model", "qwen3-30b-a3b", "--gpu", "H100"], ONE),
    "Qwen2.5-7B-Instruct LoRA on an L4 at 4,096 tokens, Trainer's step (nothing fits: the levers)": (
        ["--model", "qwen2.5-7b-instruct", "--gpu", "L4", "--adapter", "lora", "--seq-len", "4096"]
        + ["--method", "trainer"],
        ONE,
    ),
    "Mistral-7B on 2 RTX 3090": (["--model", "mistral-7b", "--gpu", "RTX3090", "--gpus", "2"], SEVERAL),
    "Mixtral-8x7B on 4 A100-80GB": (
        ["--model", "mixtral-8x7b", "--gpu", "A100-80GB", "--gpus", "4"],
        SEVERAL,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--only", action="append", default=[], help="a question's name begins so (repeatable)"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.pop("ADVISOR_DB", None)
    asked = {n: q for n, q in QUESTIONS.items() if not args.only or n.startswith(tuple(args.only))}
    results: dict = {name: {"wall_s": [], "cpu_s": [], "ratio": [], "stages": []} for name in asked}
    imports = []
    for _ in range(args.rounds):
        _, torch_wall, _ = timed([sys.executable, "-c", "import torch"], env)
        imports.append(torch_wall)
        for name, (question, _) in asked.items():
            with tempfile.TemporaryDirectory() as data:
                cpu, wall, done = timed([advisor_script(), "fit", *question], {**env, "XDG_DATA_HOME": data})
            stderr = done.stderr
            r = results[name]
            r["wall_s"].append(round(wall, 2))
            r["cpu_s"].append(round(cpu, 2))
            r["ratio"].append(round(wall / torch_wall, 2))
            r["stages"] = [
                line for line in stderr.splitlines() if line.startswith(("tracing", "[", "nothing"))
            ]
            target = QUESTIONS[name][1]
            print(
                f"{name}: {wall:.1f} s wall ({cpu:.1f} s CPU, {wall / torch_wall:.1f}x import torch; target "
                f"{target:.0f} s)",
                flush=True,
            )
    out = {
        "device": device(),
        "versions": versions("torch", "transformers", "peft", "bitsandbytes", "torchao"),
        "import_torch_s": imports,
        "questions": {
            name: {
                **r,
                "median_wall_s": statistics.median(r["wall_s"]),
                "target_s": QUESTIONS[name][1],
                "within": statistics.median(r["wall_s"]) <= QUESTIONS[name][1],
            }
            for name, r in results.items()
        },
    }
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
