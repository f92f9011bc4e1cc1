"""`advisor fit`'s answer: every optimizer × strategy on the user's model and accelerator, with the memory of
each (parameters, gradients, optimizer state, activations, temporaries, framework overhead), whether it
fits, the largest micro-batch that fits, FLOPs, step time and throughput, and the code to run it.

The numbers come from a traced training step (`advisor.prediction.step` reads it; the measurement side's
tracer makes it, passed in by the caller), cached in the KB. What is not a tensor of the step (the CUDA
context, allocator slack, workspaces) is added from rules/fit.toml, each figure with its source.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

from advisor.errors import FitError, KBError
from advisor.kb.reader import fit_validations
from advisor.kb.schema import connect_readonly
from advisor.places import shipped_kb_path
from advisor.prediction import accelerators
from advisor.prediction.cache import PredictionCache, prediction_key, software
from advisor.prediction.question import Question
from advisor.prediction.snippets import training_arguments
from advisor.prediction.step import CATEGORIES, n_params, optimizer_traffic, step_flops, tensor_peak
from advisor.rules import Accelerator, Rules

MAX_BATCH = 1 << 20  # the largest micro-batch the search considers
# The measurement side's tracer: (question, missing (optimizer, strategy) pairs, rules) -> payload of each
Tracer = Callable[[Question, list[tuple[str, str]], Rules], dict[tuple[str, str], dict]]


@dataclass
class Row:
    """One optimizer × strategy on the user's model and accelerator."""

    optimizer: str
    strategy: str
    fits: bool
    memory_gb: dict[str, float]  # the categories, overhead, tensor_peak, total (GB of 10^9 bytes)
    peak_phase: str
    max_batch_size: int
    step_flops: float
    predicted_step_s: float | None
    throughput: float | None  # samples/s
    tokens_per_s: float | None
    training_arguments: dict
    trainer_code: str

    @property
    def total(self) -> float:
        return self.memory_gb["total"]


@dataclass
class FitAnswer:
    question: Question
    n_params: int
    attention: str
    rows: list[Row]
    assumptions: list[str]
    mfu: float
    mfu_source: str
    computed: int  # predictions traced now (0: every one came from the cache)
    beyond: list[str] = field(default_factory=list)  # when nothing fits: what would

    @property
    def fitting(self) -> list[Row]:
        return [r for r in self.rows if r.fits]

    def as_dict(self) -> dict:
        q = self.question
        return {
            "model": {
                "name": q.model.name,
                "model_type": q.model.model_type,
                "family": q.model.family.name if q.model.listed else "unknown family",
                "parameters": self.n_params,
            },
            "accelerator": {
                "name": q.accelerator.name if q.accelerator else "custom budget",
                "memory_gb": round(q.budget_gb, 3),
            },
            "dtype": q.dtype,
            "batch_size": q.batch_size,
            "seq_len": q.seq_len,
            "image_size": q.image_size,
            "accumulation_steps": q.accumulation_steps,
            "attention": self.attention,
            "configurations": [
                {
                    "optimizer": r.optimizer,
                    "strategy": r.strategy,
                    "dtype": q.dtype,
                    "batch_size": q.batch_size,
                    "accumulation_steps": q.window(r.strategy),
                    "fits": r.fits,
                    "max_batch_size": r.max_batch_size,
                    "memory_gb": r.memory_gb,
                    "peak_phase": r.peak_phase,
                    "step_flops": r.step_flops,
                    "predicted_step_s": r.predicted_step_s,
                    "samples_per_s": r.throughput,
                    "tokens_per_s": r.tokens_per_s,
                    "training_arguments": r.training_arguments,
                }
                for r in self.rows
            ],
            "mfu": {"value": self.mfu, "source": self.mfu_source},
            "assumptions": self.assumptions,
            "beyond_this_grid": self.beyond,
            "cached": self.computed == 0,
        }


def fit(q: Question, rules: Rules, cache: PredictionCache, tracer: Tracer | None = None) -> FitAnswer:
    """Every asked optimizer × strategy: from the cache, tracing (and caching) what it lacks with `tracer`
    (the measurement side's, passed by the caller: this side never imports torch)."""
    soft = software()
    pairs = [(o, s) for o in q.optimizers for s in q.strategies]
    keys = {p: prediction_key(q, *p, soft) for p in pairs}
    found = cache.get(list(keys.values()))
    missing = [p for p in pairs if keys[p] not in found]
    if missing:
        if tracer is None:
            raise FitError(f"{q.model.name} is not traced yet at this shape, and no tracer was given.")
        fresh = tracer(q, missing, rules)
        cache.put(q, fresh, keys, soft)
        found.update({keys[p]: payload for p, payload in fresh.items()})
    payloads = {p: found[keys[p]] for p in pairs}
    mfu, mfu_source = utilization(q, rules, cache.read)
    checked = validated_on(cache.read)
    rows = [_row(q, o, s, payloads[(o, s)], rules, mfu) for o, s in pairs]
    rows.sort(key=lambda r: (not r.fits, r.predicted_step_s or 0, r.total))
    first = next(iter(payloads.values()))
    answer = FitAnswer(
        q,
        n_params(first),
        first["attention"],
        rows,
        assumptions(q, rules) + checked,
        mfu,
        mfu_source,
        len(missing),
    )
    if not answer.fitting:
        answer.beyond = beyond_the_grid(answer)
    return answer


def overhead_gb(q: Question, tensor_peak_gb: float, rules: Rules) -> float:
    """Memory a run holds beyond the step's tensors (rules/fit.toml)."""
    if q.device == "cpu":
        cpu = rules.fit["cpu"]
        return cpu["process_gb"] + cpu["fragmentation"] * tensor_peak_gb
    cuda = rules.fit["cuda"]
    return cuda["context_gb"] + cuda["workspace_gb"] + cuda["fragmentation"] * tensor_peak_gb


def usable_gb(q: Question, rules: Rules) -> float:
    return q.budget_gb * (1 - rules.fit["fits"]["headroom"])


def memory_at(q: Question, payload: dict, batch: int, rules: Rules) -> tuple[str, dict[str, float]]:
    """(peak phase, GB by category plus overhead, tensor_peak and total) at a micro-batch size."""
    phase, peak = tensor_peak(payload, batch)
    gb = {c: peak[c] / 1e9 for c in CATEGORIES}
    tensors = sum(gb.values())
    gb["overhead"] = overhead_gb(q, tensors, rules)
    gb["tensor_peak"] = tensors
    gb["total"] = tensors + gb["overhead"]
    return phase, {k: round(v, 4) for k, v in gb.items()}


def max_batch(q: Question, payload: dict, rules: Rules) -> int:
    """The largest micro-batch whose total fits (0: not even one sample)."""
    usable = usable_gb(q, rules)

    def fits(b: int) -> bool:
        return memory_at(q, payload, b, rules)[1]["total"] <= usable

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= MAX_BATCH and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _row(q: Question, optimizer: str, strategy: str, payload: dict, rules: Rules, mfu: float) -> Row:
    phase, gb = memory_at(q, payload, q.batch_size, rules)
    k = q.window(strategy)
    flops = step_flops(payload, q.batch_size) * k
    step_s = step_seconds(q, flops, optimizer_traffic(payload), mfu, rules)
    samples = q.batch_size * k / step_s if step_s else None
    args, code = training_arguments(q, optimizer, strategy)
    return Row(
        optimizer,
        strategy,
        gb["total"] <= usable_gb(q, rules),
        gb,
        phase,
        max_batch(q, payload, rules),
        flops,
        step_s,
        samples,
        samples * q.seq_len if samples and q.seq_len else None,
        args,
        code,
    )


def step_seconds(q: Question, flops: float, traffic: float, mfu: float, rules: Rules) -> float | None:
    """Forward and backward at `mfu` of the peak FLOP/s, plus the optimizer step's traffic at the stated
    share of the memory bandwidth; None where the accelerator states neither."""
    peak = accelerators.peak_tflops(q.accelerator, q.dtype) if q.accelerator else None
    bandwidth = q.accelerator.bandwidth_gbs if q.accelerator else None
    if not peak or not bandwidth:
        return None
    efficiency = rules.fit["speed"]["bandwidth_efficiency"]
    return flops / (peak * 1e12 * mfu) + traffic / (bandwidth * 1e9 * efficiency)


def validated_on(read: sqlite3.Connection | None) -> list[str]:
    """How predictions were checked against real steps on accelerators (KB validations named fit_*)."""
    found = []
    for conn in (read, _open_quietly(shipped_kb_path(), connect_readonly, KBError)):
        if conn is not None:
            found += [v for v in fit_validations(conn) if v not in found]
    return [
        f"Checked on {v['hardware']}: {v['checks']} configurations against torch.cuda.max_memory_allocated, "
        f"median |error| {v['median']:.1%}, worst {v['worst']:.1%} (bench/fit_accuracy.py)."
        for v in found
    ]


def _open_quietly(path, connect, error):
    try:
        return connect(path)
    except error:
        return None


def utilization(q: Question, rules: Rules, read: sqlite3.Connection | None) -> tuple[float, str]:
    """The fraction of peak FLOP/s a step achieves: --mfu, else measured on this accelerator, else the default."""
    if q.mfu is not None:
        return q.mfu, "--mfu"
    if read is not None and q.accelerator is not None:
        measured = _measured_mfu(read, q.accelerator, rules)
        if measured:
            value, n, hardware = measured
            return value, f"median of {n} runs measured on {hardware} in the KB"
    return rules.fit["speed"]["default_mfu"], rules.fit["speed"]["mfu_source"]


def _measured_mfu(conn: sqlite3.Connection, acc: Accelerator, rules: Rules):
    try:
        rows = conn.execute(
            "SELECT r.hardware, m.value FROM metrics m JOIN runs r ON r.id = m.run_id "
            "WHERE m.name = 'mfu' AND r.status = 'ok'"
        ).fetchall()
    except sqlite3.DatabaseError:
        return None
    values = sorted(v / 100 for h, v in rows if accelerators.find(h, rules) == acc)  # stored in %
    if not values:
        return None
    hardware = next(h for h, _ in rows if accelerators.find(h, rules) == acc)
    return values[len(values) // 2], len(values), hardware


def assumptions(q: Question, rules: Rules) -> list[str]:
    """What the figures rest on, each with its source."""
    out = [
        f"Traced: one training step of {q.model.name} built from its config under fake tensors (no weight "
        "allocated), the model computing its own loss as Trainer does; sequences of the full length, no padding.",
        f"Fits: a total within {1 - rules.fit['fits']['headroom']:.0%} of {q.budget_gb:.1f} GB. "
        + rules.fit["fits"]["source"],
    ]
    if q.device == "cpu":
        cpu = rules.fit["cpu"]
        out += [f"Process: {cpu['process_gb']} GB. {cpu['process_source']}", cpu["fragmentation_source"]]
    else:
        cuda = rules.fit["cuda"]
        out += [
            f"CUDA context: {cuda['context_gb']} GB. {cuda['context_source']}",
            f"Workspaces: {cuda['workspace_gb']} GB. {cuda['workspace_source']}",
            f"Allocator: +{cuda['fragmentation']:.0%} of the tensor peak. {cuda['fragmentation_source']}",
            "Optimizers as a CUDA run builds them: torch's foreach kernels, Trainer's fused AdamW "
            "(adamw_torch_fused, its default); checkpointing's saved RNG states are host memory.",
            "Attention: transformers' sdpa as CUDA runs it: FlashAttention in bf16/fp16, the memory-efficient "
            "kernel in fp32, and the math kernel (seq x seq scores kept) for grouped-query attention in fp32.",
        ]
    if q.dtype in ("bf16-mixed", "fp16-mixed"):
        out.append(
            "Mixed precision: fp32 weights, gradients and optimizer state; autocast traced with the CPU's op "
            "lists, which cast matrix products as CUDA's do."
        )
    if q.accelerator is not None and q.accelerator.key != "cpu":
        out.append(f"Peak FLOP/s and bandwidth: {q.accelerator.source}")
        out.append(f"Optimizer step: {rules.fit['speed']['bandwidth_source']}")
    return out


def beyond_the_grid(answer: FitAnswer) -> list[str]:
    """When no configuration fits: the smallest, and what would take it below the budget."""
    q = answer.question
    smallest = min(answer.rows, key=lambda r: r.total)
    m = smallest.memory_gb
    out = [
        f"Nothing fits in {q.budget_gb:.1f} GB. The smallest is {smallest.optimizer} + {smallest.strategy} at "
        f"{m['total']:.1f} GB (parameters {m['parameters']:.1f}, gradients {m['gradients']:.1f}, optimizer "
        f"state {m['optimizer_state']:.1f}, activations {m['activations']:.1f} GB).",
        "Parameter-efficient fine-tuning (LoRA with peft) trains a few million adapter parameters: the base "
        "model's gradients and optimizer state disappear, and a frozen base can stay in bf16.",
        '8-bit optimizer states (bitsandbytes, optim="adamw_bnb_8bit") keep 2 bytes per parameter of '
        "Adam's state instead of 8.",
        "Offloading optimizer state and gradients to host memory (DeepSpeed ZeRO-Offload, FSDP CPU offload) "
        "moves them off the accelerator at the cost of PCIe transfers.",
    ]
    return out
