"""Several accelerators: `advisor fit` for Llama-3.1-70B on 1, 2, 4, 8 and 16 H100s (16: two nodes of 8) across
every sharding and the default menu, cold (a fresh cache) and cached; Llama-3.1-8B on two RTX 4090s; ZeRO's
model states beside DeepSpeed's own estimators; and the per-rank peak beside real gloo runs on this CPU.

    python bench/fit_sharding.py [--out bench/results/fit-sharding-cpu.json] [--skip-gloo]

The GPU figures are predictions traced here on the CPU (FSDP2 under fake tensors and a fake process group):
no GPU checked them. The gloo runs are real: 2 and 4 processes on this machine, MemTracker in each rank.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "configs"
GLOO = ((2, "fsdp", "full"), (4, "fsdp", "full"), (2, "fsdp", "lora"), (2, "ddp", "full"))
SWEEP = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2))  # (GPUs per node, nodes)


def fit(db: Path, model: str, *args: str) -> tuple[float, dict]:
    """One `advisor fit --json` in its own process: (seconds, answer)."""
    start = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "advisor",
            "fit",
            "--model",
            str(FIXTURES / model),
            "--batch-size",  # its figures compare shardings at one micro-batch, not each at its largest
            "1",
            *args,
            "--db",
            str(db),
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, json.loads(run.stdout)


def summary(row: dict | None) -> dict | None:
    keys = ("adapter", "dtype", "optimizer", "strategy", "offload", "sharding", "gpus", "nodes", "fits")
    if row is None:
        return None
    return {k: row[k] for k in keys} | {
        "per_rank_gb": row["memory_gb"]["total"],
        "host_gb_per_node": row["host_gb_per_node"],
        "max_batch_size": row["max_batch_size"],
        "tokens_per_s": row["tokens_per_s"],
        "communication_gb_per_step": round(row["communication_bytes_per_step"] / 1e9, 2),
        "gpu_hours_per_billion_tokens": row["gpu_hours_per_billion_tokens"],
    }


def sweep(db: Path) -> dict:
    """Llama-3.1-70B on H100s: every count of the sweep cold in one fresh cache, then each cached (median of 5)."""
    out: dict = {"answers": {}}
    start = time.perf_counter()
    for gpus, nodes in SWEEP:
        seconds, answer = fit(
            db, "Llama-3.1-70B", "--gpu", "H100", "--gpus", str(gpus), "--nodes", str(nodes)
        )
        rows = answer["configurations"]
        best_full = next((r for r in rows if r["fits"] and r["adapter"] == "full"), None)
        out["answers"][f"{gpus * nodes} GPUs"] = {
            "seconds": round(seconds, 2),
            "configurations": len(rows),
            "fitting": sum(r["fits"] for r in rows),
            "pick": summary(rows[0] if rows[0]["fits"] else None),
            "best_full": summary(best_full),
            "ladder": [(r["rung"], r["configuration"], r["memory_gb"], r["fits"]) for r in answer["ladder"]],
        }
        print(f"{gpus * nodes:>2} GPUs: {seconds:6.1f} s, pick {answer['pick']}", flush=True)
    out["cold_s"] = round(time.perf_counter() - start, 2)
    for gpus, nodes in SWEEP:
        times = sorted(
            fit(db, "Llama-3.1-70B", "--gpu", "H100", "--gpus", str(gpus), "--nodes", str(nodes))[0]
            for _ in range(5)
        )
        out["answers"][f"{gpus * nodes} GPUs"]["cached_s"] = [round(t, 3) for t in times]
    out["cached_median_s"] = sorted(a["cached_s"][2] for a in out["answers"].values())
    return out


def two_4090s(db: Path) -> dict:
    """Llama-3.1-8B on two RTX 4090s: full AdamW as asked (every sharding) and LoRA with FSDP."""
    _, full = fit(
        db, "Llama-3.1-8B", "--gpu", "RTX4090", "--gpus", "2", "--adapter", "full", "--optimizer", "adamw"
    )
    _, lora = fit(
        db, "Llama-3.1-8B", "--gpu", "RTX4090", "--gpus", "2", "--adapter", "lora", "--sharding", "fsdp"
    )
    rows = full["configurations"]
    on_gpus = [r for r in rows if r["offload"] == "none"]
    return {
        "full_adamw_least_on_the_gpus": summary(min(on_gpus, key=lambda r: r["memory_gb"]["total"])),
        "full_adamw_fitting_on_the_gpus": sum(r["fits"] for r in on_gpus),
        "full_adamw_fitting_with_offload": summary(next((r for r in rows if r["fits"]), None)),
        "lora_fsdp_pick": summary(lora["configurations"][0]),
    }


def deepspeed_states() -> list[dict]:
    """ZeRO-2 and ZeRO-3 model states per rank (GB) for Llama-3.1-8B, AdamW: ours beside DeepSpeed's."""
    from dataclasses import replace

    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from advisor.measuring.tracer.engine import trace
    from advisor.model_ref import resolve_model
    from advisor.prediction.fit_request import FitRequest
    from advisor.prediction.question import question
    from advisor.prediction.sharding import zero_states
    from advisor.prediction.step import Config, n_params
    from advisor.rules import load_rules

    rules = load_rules()
    model = resolve_model(str(FIXTURES / "Llama-3.1-8B"), rules)
    options = FitRequest(
        gpu="H100",
        seq_len=16,
        adapters=("full",),
        dtype="bf16",
        optimizers=("adamw",),
        strategies=("standard",),
    )
    q = question(model, options, rules)
    base = Config("full", "bf16", "adamw", "standard")
    payload = trace(q, [base], rules)[base]
    params, largest = n_params(payload), payload["structure"]["largest_module"]
    rows = []
    for gpus in (1, 2, 4, 8, 16, 64):
        wide = replace(q, gpus=min(gpus, 8), nodes=max(1, gpus // 8))
        for stage in ("zero2", "zero3"):
            ours = sum(
                zero_states(
                    Config("full", "bf16-mixed", "adamw", "standard", sharding=stage), payload, wide, rules
                ).values()
            )
            theirs = (
                estimate_zero2_model_states_mem_needs(params, gpus, 1, cpu_offload=False)[1]
                if stage == "zero2"
                else estimate_zero3_model_states_mem_needs(params, largest, gpus, 1, cpu_offload=False)[1]
            )
            rows.append(
                {
                    "gpus": gpus,
                    "stage": stage,
                    "ours_gb": ours / 1e9,
                    "deepspeed_gb": theirs / 1e9,
                    "relative": ours / theirs - 1,
                }
            )
    return rows


def gloo(db: Path) -> list[dict]:
    """The 4-layer, 256-wide Llama at batch 2 x 128 (tests/measuring/tracer/test_sharding.py): real ranks against fit."""
    sys.path.insert(0, str(REPO))
    os.environ["ADVISOR_DB"] = str(db)  # the predictions' cache: not the user's KB
    from tests.measuring.tracer.distributed import run_ranks, tiny_llama
    from tests.measuring.tracer.test_sharding import BATCH, SEQ, predicted

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_llama(Path(tmp))
        for world, sharding, adapter in GLOO:
            real = run_ranks(folder, world, sharding, adapter, BATCH, SEQ)
            ours = predicted(folder, world, sharding, adapter)
            rows.append(
                {
                    "ranks": world,
                    "sharding": sharding,
                    "adapter": adapter,
                    "real_mb": [r / 1e6 for r in real],
                    "predicted_mb": ours / 1e6,
                    "worst_error": max(abs(ours / r - 1) for r in real),
                }
            )
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the raw figures here as JSON")
    parser.add_argument("--skip-gloo", action="store_true", help="leave out the real multi-process runs")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "bench"))
    from fit_menu import machine

    # bytecode as an installed package has it (pip compiles on install); this sandbox sets
    # PYTHONDONTWRITEBYTECODE, which would time a compile of every edited module in each cached answer
    compileall.compile_dir(REPO / "advisor", quiet=1)

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "kb.sqlite"
        result = {"machine": machine(), "llama_3_1_70b_h100": sweep(db)}
        print(
            f"cold sweep {result['llama_3_1_70b_h100']['cold_s']} s; cached medians "
            f"{result['llama_3_1_70b_h100']['cached_median_s']}",
            flush=True,
        )
        result["llama_3_1_8b_two_rtx4090"] = two_4090s(db)
        print(json.dumps(result["llama_3_1_8b_two_rtx4090"], indent=1), flush=True)
        result["zero_model_states"] = deepspeed_states()
        worst = max(abs(r["relative"]) for r in result["zero_model_states"])
        print(f"ZeRO states, worst relative difference from DeepSpeed's: {worst:.1e}", flush=True)
        if not args.skip_gloo:
            result["gloo"] = gloo(Path(tmp) / "gloo.sqlite")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
