"""How exact is `advisor fit`? Ours, accelerate's estimator and the analytic formula of Korthikanti et al.
2022, each against real training steps.

    python bench/fit_accuracy.py                      # CPU: tiny and small models, real steps here
    python bench/fit_accuracy.py --prepare cases.json # the GPU cases, with advisor's predictions
    python bench/fit_accuracy.py --device cuda --cases cases.json --out results.json   # on a GPU
    python bench/fit_accuracy.py --report results.json [--db KB]  # compare; record validations in a KB

- ours: `advisor fit`'s prediction (advisor/measuring/tracer/engine.py): the tensor peak, and the total with the
  overheads of rules/fit.toml;
- accelerate: `accelerate estimate-memory`'s "Training using Adam" for the model's parameter bytes
  (parameters only, no activations);
- Korthikanti: bytes per parameter for weights, gradients and the optimizer's state, plus activations
  per layer s·b·h·34 (sdpa saves no s×s scores; 2·s·b·h with full recomputation, plus one layer's 34·s·b·h
  recomputed in backward), from "Reducing Activation Recomputation in Large Transformer Models" (Eq. 1-2);
- real: on the CPU, PyTorch's MemTracker (live tensor bytes) and the allocator's peak; on CUDA,
  torch.cuda.max_memory_allocated and max_memory_reserved, and the device memory in use (CUDA context
  included), plus timed steps for the utilization (MFU) they reach.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "measure"))

FIXTURES = REPO / "tests" / "fixtures" / "configs"
# (label, model: reference name or fixture folder, family, seq_len, batch, dtypes, optimizers, strategies)
CPU_CASES = [
    (
        f"{name}-{preset}",
        name,
        preset,
        64,
        4,
        ["fp32", "bf16-mixed"],
        ["sgd", "adamw"],
        ["standard", "checkpointing"],
    )
    for name in ("vision", "encoder", "decoder", "vlm")
    for preset in ("tiny", "small")
]
GPU_CASES = [
    (
        "llama-1b",
        "decoder",
        "paper",
        1024,
        4,
        ["bf16-mixed"],
        ["sgd", "adamw", "adafactor"],
        ["standard", "checkpointing", "accumulation"],
    ),
    ("llama-1b", "decoder", "paper", 1024, 4, ["fp32"], ["adamw"], ["standard", "checkpointing"]),
    (
        "llama-1b",
        "decoder",
        "paper",
        1024,
        4,
        ["bf16-mixed"],
        ["cgd", "adagrad", "adadelta", "sgd-momentum"],
        ["standard"],
    ),
    (
        "qwen2-0.5b",
        "Qwen2-0.5B",
        "decoder",
        2048,
        4,
        ["bf16-mixed"],
        ["adamw"],
        ["standard", "checkpointing"],
    ),
    (
        "vit-base",
        "vision",
        "paper",
        None,
        64,
        ["bf16-mixed", "fp32"],
        ["adamw", "sgd"],
        ["standard", "checkpointing"],
    ),
    (
        "modernbert-base",
        "encoder",
        "paper",
        512,
        16,
        ["bf16-mixed"],
        ["adamw"],
        ["standard", "checkpointing", "accumulation"],
    ),
    ("nanovlm", "vlm", "paper", 128, 16, ["bf16-mixed"], ["adamw"], ["standard", "checkpointing"]),
    (
        "llama-3.1-8b",
        "Llama-3.1-8B",
        "decoder",
        2048,
        1,
        ["bf16-mixed"],
        ["sgd"],
        ["standard", "checkpointing"],
    ),
]


def spec_of(model: str, preset_or_family: str, seq: int | None, dtype: str, device: str):
    """An advisor.measuring.tracer.spec.Spec for a reference model at a preset, or a fixture's published config."""
    from transformers import AutoConfig

    from advisor.measuring.model.families import family
    from advisor.measuring.tracer.spec import Spec
    from advisor.rules import load_rules

    if (FIXTURES / model).is_dir():
        fam = family(preset_or_family, load_rules())
        config = AutoConfig.from_pretrained(FIXTURES / model)
    else:
        fam = family(model, load_rules())
        config, _ = fam.reference_config(preset_or_family)
    sizes = fam.fit_sizes(config)
    return Spec(config, fam, seq if sizes["seq_len"] else None, sizes["image_size"], dtype, device)


def predicted(payload: dict, batch: int, device: str) -> dict:
    from advisor.prediction.step import tensor_peak
    from advisor.rules import load_rules

    fit = load_rules().fit
    phase, peak = tensor_peak(payload, batch)
    tensors = sum(peak.values())
    if device == "cuda":
        c = fit["cuda"]
        total = tensors * (1 + c["fragmentation"]) + (c["context_gb"] + c["workspace_gb"]) * 1e9
    else:
        total = tensors * (1 + fit["cpu"]["fragmentation"])
    return {"tensor_peak": tensors, "total": total, "phase": phase}


def accelerate_estimate(n_params: int, dtype: str) -> float:
    """accelerate estimate-memory's 'Training using Adam' for the model's fp32 bytes."""
    from accelerate.commands.estimate import estimate_training_usage

    precision = {"fp32": "float32", "bf16-mixed": "bfloat16", "fp16-mixed": "float16", "bf16": "bfloat16"}[
        dtype
    ]
    return float(max(estimate_training_usage(n_params * 4, precision).values()))


STATE_BYTES = {
    "sgd": 0,
    "sgd-momentum": 4,
    "adam": 8,
    "adamw": 8,
    "adagrad": 4,
    "adadelta": 8,
    "cgd": 8,
    "adafactor": 0,
}


def korthikanti(spec, n_params: int, optimizer: str, strategy: str, batch: int) -> float:
    """Static bytes per parameter + the paper's activations per layer (Korthikanti et al. 2022, Eq. 1-2),
    16-bit activations (x2 in fp32)."""
    text = getattr(spec.config, "text_config", spec.config)
    h = getattr(text, "hidden_size", getattr(text, "n_embd", 0))
    layers = getattr(text, "num_hidden_layers", getattr(text, "n_layer", 0))
    s = spec.seq_len or (spec.image_size // getattr(spec.config, "patch_size", 16)) ** 2 + 1
    width = 2 if spec.dtype in ("bf16-mixed", "fp16-mixed", "bf16") else 4
    per_layer = s * batch * h * (2 if strategy.startswith("checkpointing") else 34) * width / 2
    recompute = s * batch * h * 34 * width / 2 if strategy.startswith("checkpointing") else 0
    param_bytes = 2 if spec.dtype == "bf16" else 4
    static = n_params * (2 * param_bytes + STATE_BYTES[optimizer] * param_bytes / 4)
    return static + layers * per_layer + recompute


def cpu_bench() -> None:
    from realstep import real_step_peaks

    from advisor.measuring.tracer.payloads import predict
    from advisor.prediction.step import n_params

    rows = []
    for label, model, preset, seq, batch, dtypes, optimizers, strategies in CPU_CASES:
        for dtype in dtypes:
            spec = spec_of(model, preset, seq, dtype, "cpu")
            payloads = predict(spec, optimizers, strategies)
            for strategy in strategies:
                real = real_step_peaks(
                    spec, strategy, optimizers, batch, accumulation_steps=2, allocator=True
                )
                for optimizer in optimizers:
                    payload = payloads[(optimizer, strategy)]
                    n = n_params(payload)
                    ours = predicted(payload, batch, "cpu")["tensor_peak"]
                    rows.append(
                        dict(
                            case=f"{label} {dtype} {optimizer}+{strategy}",
                            tensors=real[optimizer].tensors,
                            allocator=real[optimizer].allocator,
                            ours=ours,
                            accelerate=accelerate_estimate(n, dtype),
                            korthikanti=korthikanti(spec, n, optimizer, strategy, batch),
                        )
                    )
    print_table(rows, truth="tensors", others=("allocator",))


def print_table(rows: list[dict], truth: str, others=()) -> None:
    print(
        f"{'case':52s} {'real':>10s} "
        + " ".join(f"{k:>12s}" for k in (*others, "ours", "accelerate", "korthikanti"))
    )
    errors = {k: [] for k in (*others, "ours", "accelerate", "korthikanti")}
    for r in rows:
        cells = []
        for k in errors:
            err = r[k] / r[truth] - 1
            errors[k].append(abs(err))
            cells.append(f"{err:+11.1%}")
        print(f"{r['case']:52s} {r[truth] / 1e6:9.2f}M " + " ".join(cells))
    print("median |error|: " + ", ".join(f"{k} {statistics.median(v):.2%}" for k, v in errors.items()))
    print("max |error|:    " + ", ".join(f"{k} {max(v):.2%}" for k, v in errors.items()))


def prepare(path: Path) -> None:
    """advisor's predictions for the GPU cases (traced here, on the CPU), for a GPU machine to check."""
    from advisor.measuring.tracer.payloads import predict
    from advisor.prediction.step import n_params

    cases = []
    for label, model, preset, seq, batch, dtypes, optimizers, strategies in GPU_CASES:
        for dtype in dtypes:
            spec = spec_of(model, preset, seq, dtype, "cuda")
            payloads = predict(spec, optimizers, strategies)
            for (optimizer, strategy), payload in payloads.items():
                cases.append(
                    dict(
                        label=label,
                        model=model,
                        preset=preset,
                        seq=seq,
                        batch=batch,
                        dtype=dtype,
                        optimizer=optimizer,
                        strategy=strategy,
                        payload=payload,
                        n_params=n_params(payload),
                        predicted=predicted(payload, batch, "cuda"),
                        accelerate=accelerate_estimate(n_params(payload), dtype),
                        korthikanti=korthikanti(spec, n_params(payload), optimizer, strategy, batch),
                    )
                )
    path.write_text(json.dumps(cases))
    print(f"{len(cases)} cases written to {path}")


def cuda_bench(cases_path: Path, out: Path) -> None:
    """Real steps on the GPU: peaks per case, the CUDA context, step times."""
    import torch

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    torch.zeros(1, device="cuda")  # the context and the allocator's first block exist from here
    free_after, _ = torch.cuda.mem_get_info()
    context = total - free_after - torch.cuda.memory_reserved()
    cases = json.loads(cases_path.read_text())
    groups = {}
    for c in cases:
        groups.setdefault(
            (c["label"], c["model"], c["preset"], c["seq"], c["batch"], c["dtype"], c["strategy"]), []
        ).append(c)
    results = []
    for key, members in groups.items():
        label, model, preset, seq, batch, dtype, strategy = key
        started = time.time()
        try:
            results += _cuda_group(model, preset, seq, batch, dtype, strategy, members)
        except Exception as e:  # one case failing (an OOM, an API this torch lacks) must not end the run
            results += [
                {**_id(c), "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"} for c in members
            ]
        print(f"{label} {dtype} {strategy}: {time.time() - started:.1f} s", flush=True)
        torch.cuda.empty_cache()
    out.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(0),
                "torch": torch.__version__,
                "total_memory": total,
                "context_bytes": context,
                "results": results,
            },
            indent=1,
        )
    )


def _id(c: dict) -> dict:
    return {k: c[k] for k in ("label", "model", "preset", "seq", "batch", "dtype", "optimizer", "strategy")}


def _cuda_group(model, preset, seq, batch, dtype, strategy, members) -> list[dict]:
    import torch

    from advisor.measuring.recipe.optimizers import make_optimizer
    from advisor.measuring.recipe.strategies import enable_checkpointing, uses_checkpointing

    spec = spec_of(model, preset, seq, dtype, "cuda")
    with torch.device("cuda"):
        net = spec.family.model_class().from_config(
            spec.config,
            dtype=torch.bfloat16 if dtype == "bf16" else torch.float32,
            attn_implementation="sdpa",
        )
    if uses_checkpointing(strategy):
        enable_checkpointing(net)
    net.train()
    window = 4 if strategy.endswith("accumulation") else 1
    autocast = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(dtype)
    out = []

    def step(opt):
        opt.zero_grad(set_to_none=True)
        for _ in range(window):
            real = spec.family.fit_batch(spec.config, batch, spec.seq_len, spec.image_size)
            inputs = {k: v.cuda() for k, v in real.items()}
            with torch.autocast("cuda", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
                loss = net(**inputs).loss
            loss.backward()
            del loss
        opt.step()

    for c in members:
        opt = make_optimizer(c["optimizer"], net.parameters(), 1e-5, cuda_defaults=True)
        step(opt)  # warm-up: the optimizer's state, cuBLAS workspaces, kernels
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(opt)
        torch.cuda.synchronize()
        allocated, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        times = []
        for _ in range(3):
            start = time.perf_counter()
            step(opt)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out.append(
            {
                **_id(c),
                "allocated": allocated,
                "reserved": reserved,
                "device_used": total - free,
                "step_s": statistics.median(times),
            }
        )
        del opt
        net.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
    return out


def report(results_path: Path, cases_path: Path, db: Path | None) -> None:
    """Predictions against the GPU's measurements; with --db, recorded as validations of that hardware."""
    from advisor.prediction.step import step_flops
    from advisor.rules import load_rules

    data = json.loads(results_path.read_text())
    cases = {json.dumps(_id(c), sort_keys=True): c for c in json.loads(cases_path.read_text())}
    rules = load_rules()
    peak = {"bf16-mixed": "bf16", "fp32": "fp32"}
    from advisor.prediction.accelerators import find

    acc = find(data["device"], rules)
    rows, checks = [], []
    for r in data["results"]:
        c = cases[json.dumps(_id(r), sort_keys=True)]
        if "error" in r:
            print(f"{c['label']} {c['dtype']} {c['optimizer']}+{c['strategy']}: {r['error']}")
            continue
        window = 4 if c["strategy"].endswith("accumulation") else 1
        flops = step_flops(c["payload"], c["batch"]) * window
        mfu = flops / r["step_s"] / (acc.tflops[peak[c["dtype"]]] * 1e12) if acc else None
        row = dict(
            case=f"{c['label']} {c['dtype']} {c['optimizer']}+{c['strategy']}",
            allocated=r["allocated"],
            reserved=r["reserved"],
            ours=c["predicted"]["tensor_peak"],
            accelerate=c["accelerate"],
            korthikanti=c["korthikanti"],
            total=c["predicted"]["total"],
            device_used=r["device_used"],
            mfu=mfu,
            fragmentation=r["reserved"] / r["allocated"] - 1,
        )
        rows.append(row)
        checks.append(row)
    print(f"{data['device']}, torch {data['torch']}; CUDA context {data['context_bytes'] / 1e9:.2f} GB")
    print_table(rows, truth="allocated", others=("reserved",))
    totals = [abs(r["total"] / r["device_used"] - 1) for r in rows]
    print(
        f"ours with overheads vs device memory in use: median |error| {statistics.median(totals):.2%}, max {max(totals):.2%}"
    )
    frags = [r["fragmentation"] for r in rows]
    print(f"reserved / allocated - 1: median {statistics.median(frags):.1%}, max {max(frags):.1%}")
    mfus = [r["mfu"] for r in rows if r["mfu"]]
    if mfus:
        print(
            f"achieved MFU (forward, backward and optimizer step): median {statistics.median(mfus):.1%}, range {min(mfus):.1%}-{max(mfus):.1%}"
        )
    if db is not None:
        record(db, data, rows)


def record(db: Path, data: dict, rows: list[dict]) -> None:
    """One validation per case: ours against max_memory_allocated, within 5 %."""
    from advisor.kb import store
    from advisor.kb.open import open_for_writing
    from advisor.kb.store import Check

    checks = [
        Check(
            "fit_tensor_peak_vs_cuda_allocated",
            r["case"].split()[0],
            abs(r["ours"] / r["allocated"] - 1) <= 0.05,
            r["ours"] / r["allocated"] - 1,
            0.05,
            f"{r['case']}: predicted tensor peak {r['ours'] / 1e9:.3f} GB, max_memory_allocated "
            f"{r['allocated'] / 1e9:.3f} GB, reserved {r['reserved'] / 1e9:.3f} GB (bench/fit_accuracy.py)",
        )
        for r in rows
    ]
    machine = {"hardware": data["device"], "device": "cuda", "software": {"torch": data["torch"]}}
    conn = open_for_writing(db)
    store.add_validations(conn, machine, "paper", checks)
    conn.close()
    print(f"recorded {len(checks)} validations in {db}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--prepare", type=Path, metavar="CASES", help="write the GPU cases with predictions")
    parser.add_argument("--cases", type=Path, help="the cases --prepare wrote (with --device cuda, --report)")
    parser.add_argument("--out", type=Path, default=Path("fit-accuracy-cuda.json"))
    parser.add_argument("--report", type=Path, metavar="RESULTS", help="compare a GPU run's results")
    parser.add_argument("--db", type=Path, help="with --report: record the comparison as validations here")
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
    elif args.report:
        report(args.report, args.cases, args.db)
    elif args.device == "cuda":
        cuda_bench(args.cases, args.out)
    else:
        cpu_bench()


if __name__ == "__main__":
    main()
