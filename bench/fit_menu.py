"""The fine-tuning menu beside the figures practitioners quote: `advisor fit` at the settings each anchor
states, next to the anchor, accelerate's estimator and DeepSpeed's model-state formulas; then the default
menu's answer for Llama-3.1-8B on three GPUs, with the time a cold and a cached answer take here.

    python bench/fit_menu.py [--out bench/results/fit-menu-cpu.json]

Anchors (settings from their sources' git history; /tmp notes of issue 20 quote them):
- LLaMA-Factory's README "Hardware Requirement" table for 7B (Llama-2-7B), "* estimated", no settings
  stated; the maintainer named 1024 tokens (issue #4956). LLaMA-Factory turns gradient checkpointing on by
  default, and its LoRA default is rank 8 on every linear layer.
- axolotl's examples/llama-3/README.md: "LoRA ... Single GPU @ 11GB VRAM" for lora-8b.yml as it was then
  (an 8-bit base, r 32, alpha 16, every linear layer, 4096 tokens packed, micro-batch 2, adamw_bnb_8bit,
  checkpointing, flash attention); the yaml's base_model was still Llama-2-7B the day the figure was written.
- accelerate's `estimate-memory` "Training using Adam" in bf16: 8 bytes per parameter (Adam's step), no
  activations, the same for every method.
- DeepSpeed: mixed-precision Adam's model states, 16 bytes per parameter (ZeRO paper, Rajbhandari et al.
  2020, section 3.1); ZeRO-Offload on one GPU: 2 bytes per parameter on the GPU
  (`estimate_zero2_model_states_mem_needs`, offload_optimizer).

Every figure of ours is the predicted total (tensors, CUDA context, workspaces, allocator slack: rules/fit.toml),
traced here on the CPU; no GPU checked these menu rows (state it when quoting them).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "configs"
BIG = 10_000  # GB: a budget nothing exceeds, so every row is predicted, fitting or not


@dataclass
class Anchor:
    source: str
    label: str
    figure_gb: float
    model: str  # a fixture folder
    options: dict  # advisor.fit's options for the settings the source states
    settings: str  # those settings in words


def llama_factory(label: str, figure: float, **options) -> Anchor:
    base = dict(seq_len=1024, batch_size=1, strategies=("checkpointing",), offload=("none",))
    return Anchor(
        "LLaMA-Factory README (7B)",
        label,
        figure,
        "Llama-2-7b-hf",
        base | options,
        "Llama-2-7B, batch 1 x 1024 tokens (the maintainer's figure), checkpointing (LLaMA-Factory's default)",
    )


ANCHORS = [
    llama_factory(
        "Full (bf16 or fp16), 32-bit", 120, adapters=("full",), dtype="bf16-mixed", optimizers=("adamw",)
    ),
    llama_factory("Full (pure_bf16), 16-bit", 60, adapters=("full",), dtype="bf16", optimizers=("adamw",)),
    llama_factory(
        "LoRA, 16-bit", 16, adapters=("lora",), lora_r=8, dtype="bf16-mixed", optimizers=("adamw",)
    ),
    llama_factory(
        "QLoRA, 8-bit",
        10,
        adapters=("qlora",),
        base_bits=8,
        lora_r=8,
        dtype="bf16-mixed",
        optimizers=("adamw",),
    ),
    llama_factory(
        "QLoRA, 4-bit", 6, adapters=("qlora",), lora_r=8, dtype="bf16-mixed", optimizers=("adamw",)
    ),
]
for model in ("Llama-3.1-8B", "Llama-2-7b-hf"):
    ANCHORS.append(
        Anchor(
            "axolotl examples/llama-3/README.md",
            f"LoRA on {model} (lora-8b.yml, 2024-04-18)",
            11,
            model,
            dict(
                seq_len=4096,
                batch_size=2,
                adapters=("qlora",),
                base_bits=8,
                lora_r=32,
                lora_alpha=16,
                dtype="bf16-mixed",
                optimizers=("adamw_bnb_8bit",),
                strategies=("checkpointing",),
                offload=("none",),
                attention="flash_attention_2",
            ),
            "8-bit base, r 32, alpha 16, every linear layer, micro-batch 2 x 4096 tokens, adamw_bnb_8bit, "
            "checkpointing, flash attention",
        )
    )
MENU_GPUS = ("RTX4090", "A100-40GB", "H100")


def ours(anchor: Anchor) -> dict:
    import advisor

    answer = advisor.fit(str(FIXTURES / anchor.model), memory=BIG, **anchor.options)
    row = answer.rows[0]
    return {
        "configuration": row.label,
        "total_gb": row.total,
        "tensor_peak_gb": row.memory_gb["tensor_peak"],
        "breakdown_gb": {
            k: row.memory_gb[k]
            for k in ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "overhead")
        },
        "n_params": answer.n_params,
        "trainable": row.trainable_parameters,
    }


def accelerate_gb(n_params: int) -> float:
    """accelerate estimate-memory's 'Training using Adam' peak in bf16 mixed precision: its function takes the
    fp32 size and returns the largest of weights, gradients and Adam's step (8 bytes per parameter), whatever
    is trained."""
    from accelerate.commands.estimate import estimate_training_usage

    return max(estimate_training_usage(n_params * 4, "bfloat16").values()) / 1e9


def deepspeed_gb(n_params: int) -> float:
    """DeepSpeed's model states of mixed-precision Adam on one GPU: 16 bytes per parameter (ZeRO paper, 3.1)."""
    return 16 * n_params / 1e9


def menu_timings(model: Path) -> dict:
    """The default menu on each GPU: cold (a fresh cache: the trace) and cached (no torch), in subprocesses."""
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "kb.sqlite"
        for i, gpu in enumerate(MENU_GPUS):
            for attempt in ("cold", "cached") if i == 0 else ("cached",):
                start = time.perf_counter()
                run = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "advisor",
                        "fit",
                        "--model",
                        str(model),
                        "--gpu",
                        gpu,
                        "--db",
                        str(db),
                        "--json",
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                seconds = time.perf_counter() - start
                data = json.loads(run.stdout)
                out[f"{gpu} {attempt}"] = {
                    "seconds": round(seconds, 2),
                    "pick": data["pick"],
                    "first": {k: data["configurations"][0][k] for k in ("memory_gb", "tokens_per_s", "fits")},
                    "ladder": [(r["rung"], r["memory_gb"], r["fits"]) for r in data["ladder"]],
                    "configurations": len(data["configurations"]),
                    "fitting": sum(c["fits"] for c in data["configurations"]),
                }
        cached = []
        for _ in range(5):
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "advisor",
                    "fit",
                    "--model",
                    str(model),
                    "--gpu",
                    "H100",
                    "--db",
                    str(db),
                ],
                capture_output=True,
                check=True,
            )
            cached.append(time.perf_counter() - start)
        out["cached, 5 runs (s)"] = sorted(round(c, 3) for c in cached)
    return out


def machine() -> dict:
    return {
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()} (CPU only: traces run here)",
        "python": platform.python_version(),
        **{p: version(p) for p in ("torch", "transformers", "peft", "bitsandbytes", "torchao", "accelerate")},
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the raw figures here as JSON")
    args = parser.parse_args()
    rows = []
    print(f"{'anchor':58s} {'stated':>7s} {'ours':>7s} {'accel.':>7s} {'DeepSp.':>7s}")
    for a in ANCHORS:
        mine = ours(a)
        full = a.options["adapters"] == ("full",)
        row = {
            "source": a.source,
            "anchor": a.label,
            "settings": a.settings,
            "stated_gb": a.figure_gb,
            "ours": mine,
            "accelerate_gb": accelerate_gb(mine["n_params"]),
            "deepspeed_gb": deepspeed_gb(mine["n_params"]) if full else None,
        }
        rows.append(row)
        ds = f"{row['deepspeed_gb']:7.1f}" if row["deepspeed_gb"] else "      -"
        print(
            f"{a.source.split()[0] + ': ' + a.label:58s} {a.figure_gb:7.1f} {mine['total_gb']:7.1f} "
            f"{row['accelerate_gb']:7.1f} {ds}",
            flush=True,
        )
    timings = menu_timings(FIXTURES / "Llama-3.1-8B")
    for k, v in timings.items():
        print(k, json.dumps(v))
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "anchors": rows, "menu": timings}, indent=1))
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
