"""The vocabulary of a traced training step, and its arithmetic: what `advisor.measuring.tracer.engine` records of a step
(a payload) and what the answer side reads from it at any micro-batch and depth, without torch.

A payload holds, per phase of the step (forward, backward, optimizer step) and per traced depth point,
the lines of the phase's peak of live bytes in the micro-batch size (every op's live bytes are affine in
the batch, so a phase's peak at any batch is the upper envelope of its ops' lines), FLOPs and the
optimizer's memory traffic as lines too, and the parameter count. Depth is a linear combination of the
traced points (every block of a stack holds the same bytes). Imports nothing of ours: the tracer below
it and the answer above it share it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction

# What a traced step's live bytes are split into (a payload's lines, an answer's memory breakdown); PyTorch's
# MemTracker has its own categories (advisor/measuring/training/tensors.py MEMTRACKER_MEASURES).
CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
ENGINE_VERSION = 7  # what a prediction means: bump it when that changes, and cached ones are traced again
# GRPO's phases that run the whole generation batch at once (every micro-batch of an optimizer step's
# completions, sampled together), not one micro-batch: read at the generation batch (at_generation)
ROLLOUT = ("prefill", "decode")
BATCHES = (2, 3)  # traced micro-batch sizes: no size-1 dimension, whose contiguity shortcuts skip copies


@dataclass(frozen=True)
class Adapter:
    """What trains: the whole model (full), or LoRA adapters on a frozen base (lora) that is quantized to
    `base_bits` (qlora: 4-bit NF4 with double quantization, or 8-bit LLM.int8)."""

    kind: str = "full"  # full | lora | qlora
    r: int = 16  # LoRA's rank
    alpha: int = 32  # LoRA's scaling numerator (lora_alpha)
    targets: tuple[
        str, ...
    ] = ()  # module names LoRA adapts; (): every linear layer of the blocks (all-linear)
    base_bits: int = 4  # qlora's base: 4 (NF4) or 8 (LLM.int8)

    def key(self) -> dict:
        """What a prediction of this adapter depends on."""
        if self.kind == "full":
            return {"adapter": "full"}
        out = {"adapter": self.kind, **{k: v for k, v in asdict(self).items() if k != "kind"}}
        if self.kind == "lora":
            out.pop("base_bits")
        return out


@dataclass(frozen=True)
class Method:
    """The step a configuration trains with: `trainer`, a Hugging Face Trainer step on the model's own loss
    (full logits); TRL's `sft` (SFTTrainer: the same batch, TRL's chunked log-probabilities instead of the
    logits); `dpo` (DPOTrainer: chosen and rejected in one forward of 2 x the micro-batch, then the
    reference's forward without gradients, from `reference`); `reward` (RewardTrainer: a one-label
    sequence-classification head scoring both of each pair); `grpo` (GRPOTrainer: `completion` tokens sampled
    per prompt by `generation`, the reference's log-probabilities where its KL coefficient is not 0, then the
    policy's forward and backward on prompt and completion with TRL's chunked log-probabilities)."""

    kind: str = "trainer"  # trainer | sft | dpo | reward | grpo
    reference: str | None = (
        None  # model (a frozen copy) | adapter (the base, adapter off) | precomputed (DPO)
    )
    completion: int = 0  # grpo: tokens generated per completion (max_completion_length)
    generation: str | None = None  # grpo: transformers (the policy's generate) | vllm-colocate | vllm-server
    loss: str = (
        "logits"  # trainer: logits (the model's own loss) | fused (Liger's fused linear cross-entropy)
    )

    @classmethod
    def asked(
        cls,
        kind: str,
        reference: str | None,
        adapter: str,
        beta: float = 0.0,
        completion: int = 0,
        generation: str | None = None,
        loss: str = "logits",
    ) -> Method:
        """The method a configuration trains with, as asked: DPO's reference as given, else a frozen copy for
        full fine-tuning and the disabled adapter for LoRA and QLoRA (what DPOTrainer does without a
        ref_model); GRPO's the same where its KL coefficient `beta` is not 0, none where it is (TRL's default:
        no reference loaded)."""
        default = reference or ("model" if adapter == "full" else "adapter")
        if kind == "dpo":
            return cls("dpo", default)
        if kind == "grpo":
            return cls(
                "grpo", default if beta else None, completion, generation or "transformers"
            )  # the policy's
        return cls(kind, loss=loss if kind == "trainer" else "logits")

    @property
    def generates(self) -> bool:
        """GRPO sampled by the policy itself on the training GPU (its rollout phases traced)."""
        return self.kind == "grpo" and self.generation == "transformers"

    @property
    def pairs(self) -> bool:
        """Each sample is a pair (chosen, rejected) run as two rows of one batch."""
        return self.kind in ("dpo", "reward")

    def key(self) -> dict:
        """What a prediction of this method depends on (nothing for Trainer's step: the keys it always had)."""
        if self.kind == "trainer":
            return {} if self.loss == "logits" else {"loss": self.loss}
        if self.kind == "grpo":
            return {
                "method": "grpo",
                "reference": self.reference,
                "completion": self.completion,
                "generation": self.generation,
            }
        return {"method": self.kind, **({"reference": self.reference} if self.kind == "dpo" else {})}


@dataclass(frozen=True, order=True)
class Config:
    """One configuration of the fine-tuning menu, as a prediction is keyed and a row of the answer shows it."""

    adapter: str  # full | lora | qlora (its rank, targets and base bits are the question's)
    dtype: str  # fp32 | bf16-mixed | fp16-mixed | bf16 (see rules/fit.toml [precision])
    optimizer: str
    strategy: (
        str  # standard | checkpointing | selective-checkpointing | accumulation | checkpointing+accumulation
    )
    offload: str = "none"  # none | optimizer (state and fp32 master weights on the host) | optimizer+params
    sharding: str = "none"  # none (one accelerator) | ddp | zero1 | zero2 | zero3 | fsdp | hsdp


# --- depth: traced at 1 and 2 blocks of each stack -----------------------------------------------------

EXPERTS = "experts"  # the knob of a mixture's expert units (a stack's `experts`: each unit is in every layer)


def interactions(knobs) -> list[tuple[int, int]]:
    """Pairs of knobs whose counts multiply: a mixture's expert units and each kind of block of their stack
    (every unit of experts is in every layer, so their bytes and FLOPs grow as layers x units)."""
    names = list(knobs)
    out = []
    for j, name in enumerate(names):
        stack, _, last = name.rpartition(".")
        if last == EXPERTS:
            out += [(i, j) for i, other in enumerate(names) if i != j and other.rpartition(".")[0] == stack]
    return out


def depth_points(knobs: dict[str, int], base: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """The depth points traced: every knob at its base (1 block, or a sharded trace's deeper base), then
    each one higher in turn, then each pair that multiplies (interactions) both higher."""
    base = base or tuple(1 for _ in knobs)
    raised = [tuple(b + (i == j) for i, b in enumerate(base)) for j in range(len(knobs))]
    both = [tuple(b + (k in pair) for k, b in enumerate(base)) for pair in interactions(knobs)]
    return [base] + raised + both


def coefficients(knobs, steps: list[int]) -> list[int]:
    """The weight of each depth point (depth_points' order) in a quantity at `steps` beyond the base: exact
    for any quantity affine in each knob, plus a product term for each pair that multiplies. With s the
    steps: the base 1 - sum(s) + sum of the pairs' s_i s_j; a knob raised alone s_j less its pairs' products;
    a pair raised together s_i s_j (the closed form of interpolating on those points)."""
    pairs = interactions(knobs)
    products = [steps[i] * steps[j] for i, j in pairs]
    alone = [
        s - sum(p for (i, j), p in zip(pairs, products, strict=True) if k in (i, j))
        for k, s in enumerate(steps)
    ]
    return [1 - sum(steps) + sum(products)] + alone + products


def extrapolate_depth(values: dict, knobs: dict[str, int]) -> int:
    """A quantity known at the depth points, at the full depths: affine in each stack's depth (with the
    products of the pairs that multiply)."""
    points = depth_points(knobs)
    weights = coefficients(knobs, [full - 1 for full in knobs.values()])
    return sum(w * values[p] for w, p in zip(weights, points, strict=True))


def _depth_combination(payload: dict, values: list[dict]) -> dict:
    """Values at the depth points (base, then each stack one block deeper), at the model's depths."""
    base, out = values[0], dict(values[0])
    for raised, steps in zip(values[1:], _coefficients(payload)[1:], strict=False):
        for k in out:
            out[k] += steps * (raised[k] - base[k])
    return out


def _knobs(payload: dict) -> list[str]:
    """The knobs in the order the points give their depths: as traced ("knobs"), for the KB stores a payload
    with its keys sorted, which reorders "depth" (Gemma's full-attention kind before its sliding one)."""
    return payload["knobs"]


def _steps(payload: dict) -> list[int]:
    """Blocks each stack's full depth is beyond the base point's (a sharded trace's base is deeper than 1;
    a trace of the full depth has no raised points)."""
    depths = [payload["depth"][k] for k in _knobs(payload)]
    return [full - b for full, b in zip(depths, payload["points"][0], strict=True)]


# --- lines in the batch: what a trace at the two BATCHES records ---------------------------------------


def line(low: int, high: int) -> tuple[int, int]:
    """(value at batch 0, per sample) of a quantity affine in the batch, from its values at the BATCHES."""
    slope = (high - low) // (BATCHES[1] - BATCHES[0])
    return low - BATCHES[0] * slope, slope


def envelope(low: list, high: list) -> list[dict]:
    """A phase traced at the two BATCHES as lines in the batch (every op's live bytes are affine in it), cut
    to those that are the phase's maximum for some batch >= 1: the peak at any batch."""
    lines = {}
    for v1, v2 in _aligned(low, high):
        slope = tuple((b - a) // (BATCHES[1] - BATCHES[0]) for a, b in zip(v1, v2, strict=True))
        start = tuple(a - BATCHES[0] * s for a, s in zip(v1, slope, strict=True))  # the value at batch 0
        key = sum(slope)
        if key not in lines or sum(start) > sum(lines[key][0]):
            lines[key] = (start, slope)
    hull: list[tuple[tuple, tuple]] = []
    for ln in sorted(lines.values(), key=lambda ln: sum(ln[1])):
        while len(hull) >= 2 and _cross(hull[-2], ln) <= _cross(hull[-2], hull[-1]):
            hull.pop()
        hull.append(ln)
    # hull[i] is the maximum between its crossings with hull[i-1] and hull[i+1]: keep those reaching batch 1
    kept = [ln for i, ln in enumerate(hull) if i == len(hull) - 1 or _cross(ln, hull[i + 1]) >= 1]
    return [
        {"a": dict(zip(CATEGORIES, a, strict=True)), "b": dict(zip(CATEGORIES, b, strict=True))}
        for a, b in kept
    ]


def _aligned(low: list, high: list):
    """Pairs of live-byte vectors op by op. Where one batch size runs an op the other does not (a copy a
    contiguous layout makes unnecessary), the other's previous vector stands in for it."""
    if [op for op, _ in low] == [op for op, _ in high]:
        return [(a, b) for (_, a), (_, b) in zip(low, high, strict=True)]
    import difflib  # only where a trace is made

    pairs = []
    matcher = difflib.SequenceMatcher(a=[op for op, _ in low], b=[op for op, _ in high], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs += [(low[i][1], high[j][1]) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            a = low[min(i1 + k, i2 - 1)][1] if i2 > i1 else low[i1 - 1][1]
            b = high[min(j1 + k, j2 - 1)][1] if j2 > j1 else high[j1 - 1][1]
            pairs.append((a, b))
    return pairs


def _cross(low, high) -> Fraction:
    """The batch at which line `high` (the larger slope) overtakes line `low`."""
    return Fraction(sum(low[0]) - sum(high[0]), sum(high[1]) - sum(low[1]))


# --- reading a payload at a micro-batch ----------------------------------------------------------------


def phase_bytes(payload: dict, phase: str, batch: int) -> dict[str, float]:
    """Bytes by category at the peak of one phase of the step, at a micro-batch size."""
    at_points = []
    for lines in payload["phases"][phase]:
        best = max(lines, key=lambda ln: sum(ln["a"].values()) + batch * sum(ln["b"].values()))
        at_points.append({c: best["a"][c] + batch * best["b"][c] for c in CATEGORIES})
    return _depth_combination(payload, at_points)


def tensor_peak(payload: dict, batch: int) -> tuple[str, dict[str, float]]:
    """The phase holding the step's peak of live tensor bytes, and the bytes by category there (the phase
    found from the lines' sums, its breakdown made once)."""
    totals = _phase_totals(payload, batch)
    phase = list(payload["phases"])[totals.index(max(totals))]
    return phase, phase_bytes(payload, phase, batch)


def peak_total(payload: dict, batch: int) -> float:
    """The step's peak of live tensor bytes at a micro-batch size: `tensor_peak`'s total, without its
    breakdown (the max-batch search calls it a few dozen times per configuration)."""
    return max(_phase_totals(payload, batch), default=0.0)


def phase_peaks(payload: dict, batch: int) -> dict[str, float]:
    """Each phase's peak of live tensor bytes at a micro-batch size, a phase of every micro-batch as one
    ('backward0', 'backward1' -> 'backward'; 'optimizer_step' kept): what an answer names per phase."""
    out: dict[str, float] = {}
    for phase, total in zip(payload["phases"], _phase_totals(payload, batch), strict=True):
        name = phase.rstrip("0123456789")
        out[name] = max(out.get(name, 0.0), total)
    order = (*ROLLOUT, "scoring", "forward", "reference", "backward", "optimizer_step")  # stored: sorted
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def per_row(payload: dict, phase: str) -> float:
    """Bytes a phase's peak grows by per row of its batch (GRPO's decoding step: a completion's KV cache at
    full length, with its few per-row temporaries)."""
    return sum(phase_bytes(payload, phase, 2).values()) - sum(phase_bytes(payload, phase, 1).values())


def at_generation(payload: dict, rows: int) -> dict:
    """A GRPO payload with its rollout phases (ROLLOUT: the whole generation batch sampled at once) fixed at
    `rows` completions, whatever the micro-batch: an accumulating step generates for every micro-batch of
    its window together (TRL's steps_per_generation defaults to the accumulation). A payload without them is
    returned as it is."""
    if not any(p in payload["phases"] for p in ROLLOUT):
        return payload
    phases = dict(payload["phases"])
    for p in ROLLOUT:
        if p in phases:
            phases[p] = [[_fixed(lines, rows)] for lines in phases[p]]
    fixed = {k: v for k, v in payload.items() if k not in ("_sums", "_totals", "phases")}
    return {**fixed, "phases": phases}


def _fixed(lines: list[dict], rows: int) -> dict:
    """A phase's peak at `rows` as a line with no slope in the micro-batch."""
    best = max(lines, key=lambda ln: sum(ln["a"].values()) + rows * sum(ln["b"].values()))
    return {
        "a": {c: best["a"][c] + rows * best["b"][c] for c in CATEGORIES},
        "b": dict.fromkeys(CATEGORIES, 0),
    }


def _phase_totals(payload: dict, batch: int) -> list[float]:
    """Each phase's peak of live tensor bytes at a micro-batch size, in the payload's order of phases (kept
    on the payload by batch: a row's max-batch search, its memory and its phases ask the same batches)."""
    memo = payload.setdefault("_totals", {})
    if batch not in memo:
        coefficients = _coefficients(payload)
        out = []
        for points in _line_sums(payload):
            total = 0.0
            for c, lines in zip(coefficients, points, strict=True):
                if c:
                    total += c * max([a + batch * b for a, b in lines])
            out.append(total)
        memo[batch] = out
    return memo[batch]


def _line_sums(payload: dict) -> list:
    """Each phase's lines as (bytes at batch 0, per sample) summed over categories, per depth point; kept on
    the payload (a max-batch search reads them a few dozen times)."""
    if "_sums" not in payload:
        payload["_sums"] = [
            [[(sum(ln["a"].values()), sum(ln["b"].values())) for ln in lines] for lines in points]
            for points in payload["phases"].values()
        ]
    return payload["_sums"]


def _coefficients(payload: dict) -> list[int]:
    """The weight of each depth point in the combination at the model's depths (kept on the payload)."""
    if "_coefficients" not in payload:
        single = len(payload.get("points", payload["n_params"])) == 1  # a trace of the full depth
        payload["_coefficients"] = [1] if single else coefficients(_knobs(payload), _steps(payload))
    return payload["_coefficients"]


def step_flops(payload: dict, batch: int) -> float:
    """FLOPs of one micro-batch's forward and backward (recomputation included)."""
    return _depth_combination(payload, [{"flops": a + batch * b} for a, b in payload["flops"]])["flops"]


def optimizer_traffic(payload: dict) -> float:
    """Bytes the optimizer step reads and writes (its kernels are bound by memory bandwidth)."""
    return _depth_combination(payload, [{"b": b} for b in payload["optimizer_traffic"]])["b"]


def n_params(payload: dict) -> int:
    return round(_depth_combination(payload, [{"n": n} for n in payload["n_params"]])["n"])


def trainable(payload: dict) -> int:
    """Parameters the optimizer updates (all of them, or an adapter's)."""
    return round(_depth_combination(payload, [{"n": n} for n in payload["trainable"]])["n"])


def host_bytes(payload: dict) -> float:
    """Bytes held in host memory: an offloaded optimizer's state, master weights and gradients, or a paged
    optimizer's state."""
    return _depth_combination(payload, [{"b": b} for b in payload["host"]])["b"]


def host_traffic(payload: dict) -> float:
    """Bytes an offloaded optimizer's step reads and writes in host memory."""
    return _depth_combination(
        payload, [{"b": b} for b in payload.get("host_traffic", [0] * len(payload["host"]))]
    )["b"]
