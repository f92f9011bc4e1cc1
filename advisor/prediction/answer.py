"""`advisor fit`'s answer: every configuration of the fine-tuning menu (adapter, precision, optimizer,
strategy, offload) on the user's model and accelerator, with the memory of each (parameters, gradients,
optimizer state, activations, temporaries, framework overhead; host memory apart), whether it fits, the
largest micro-batch that fits, FLOPs, step time and tokens/s, and the code to run it, ranked as a
practitioner picks (advisor.prediction.ranking).

The numbers come from a traced training step (`advisor.prediction.step` reads it; the measurement side's
tracer makes it, passed in by the caller), cached in the KB. What is not a tensor of the step (the CUDA
context, allocator slack, workspaces) is added from rules/fit.toml, each figure with its source.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from advisor.errors import FitError, KBError
from advisor.kb.open import connect_kb_readonly
from advisor.kb.queries.for_prediction import fit_validations
from advisor.places import shipped_kb_path
from advisor.prediction import accelerators, ranking, speed
from advisor.prediction.cache import PredictionCache, Traced, keys_of, software
from advisor.prediction.quality import Trades
from advisor.prediction.question import Question
from advisor.prediction.ranking import Lever, picked
from advisor.prediction.row import Row
from advisor.prediction.sharding import (
    basis,
    communication,
    communication_seconds,
    communication_share,
    distributed_assumptions,
    fp32_factor,
    hidden_share,
    host_per_node,
    overlapped,
    per_rank,
    shard_size,
    sharded_offload_seconds,
)
from advisor.prediction.speed import Utilization, utilization
from advisor.prediction.step import (
    CATEGORIES,
    Config,
    at_generation,
    host_bytes,
    host_traffic,
    n_params,
    optimizer_traffic,
    peak_total,
    per_row,
    phase_bytes,
    phase_peaks,
    step_flops,
    tensor_peak,
    trainable,
)
from advisor.prediction.training_code.recipe import Recipe, accumulates, batches, learning_rate, rates_tuned
from advisor.prediction.training_code.snippets import launch, training_code
from advisor.rules import Accelerator, Rules

MAX_BATCH = 1 << 20  # the largest micro-batch the search considers
# The measurement side's tracer: (question, configurations to trace, rules) -> payload of each
TraceFn = Callable[[Question, list[Config], Rules], dict[Config, dict]]


@dataclass
class FitAnswer:
    question: Question
    n_params: int
    attention: str  # as traced, with the kernel CUDA picks
    rows: list[Row]  # ranked: what a practitioner picks first
    assumptions: list[str]
    mfu: float
    mfu_source: str
    computed: int  # predictions traced now (0: every one came from the cache)
    ladder: list[ranking.Rung] = field(default_factory=list)  # when nothing as asked fits: what would
    mfu_modelled: bool = True  # the generation's efficiency with the speed model's parts (speed.py)
    speed_band: speed.Band | None = None  # the speed model's interval on held-out runs (None: not tested)
    band_note: str | None = None  # why a modelled step time has no band
    levers: list[Lever] = field(default_factory=list)  # when no AdamW-class one fits: what would
    not_cached: str | None = None  # why what was traced now is not cached: a KB that cannot be written

    @property
    def fitting(self) -> list[Row]:
        return [r for r in self.rows if r.fits]

    @property
    def pick(self) -> Row | None:
        """The answer: the first configuration that fits, AdamW-class; where none of those fits as asked, the
        first lever that makes one fit on the asked hardware (`pick_lever`), else what fits (SGD, Adafactor)."""
        first = self.rows[0] if self.rows and self.rows[0].fits else None
        lever = self.pick_lever
        return lever.row if lever is not None else first

    @property
    def pick_lever(self) -> Lever | None:
        """The lever the pick pulls (None: the pick is a configuration as asked)."""
        first = self.rows[0] if self.rows and self.rows[0].fits else None
        return None if first is not None and first.adamw else picked(self.levers)

    @property
    def best(self) -> Row | None:
        """The pick, by the name a one-liner reads: `TrainingArguments(**advisor.fit(...).best.training_arguments)`;
        None when nothing fits one accelerator (then `.several`)."""
        return self.pick

    @property
    def several(self) -> Row | None:
        """When nothing fits one accelerator: the ladder's last rung, the fewest that hold it, if any do."""
        last = self.ladder[-1] if self.ladder else None
        return last.row if last is not None and last.name == "several GPUs" and last.fits else None

    def shown(self, everything: bool = False) -> list[Row]:
        """The rows a reader needs (the ladder, the pick, the best of each adapter), or every one."""
        return self.rows if everything else ranking.shown(self.rows, self.ladder)

    def time_ties(self, rows: list[Row]) -> list[bool]:
        """For ranked `rows`, whether each is placed below the one above by a tokens/s difference within the
        speed model's error band: the order between the two is undecided by time."""
        band = self.speed_band.median if self.speed_band else None
        return ranking.time_ties(rows, band, self.question.effective_batch)

    def as_dict(self) -> dict:
        q = self.question
        return {
            "model": {
                "name": q.model.name,
                "model_type": q.model.model_type,
                "family": q.model.family.name if q.model.listed else "unknown family",
                "parameters": self.n_params,
                "hub_id": q.model.hub_id,
                "architecture_of": q.model.architecture_of,  # a variant: the shipped model it shares a config with
            },
            "accelerator": {
                "name": q.accelerator.name if q.accelerator else "custom budget",
                "memory_gb": round(q.budget_gb, 3),
                "memory_gib": round(accelerators.gib(q.budget_gb), 3),  # the unit on the box
            },
            "dtypes": list(q.dtypes),
            "batch_size": q.batch_size,  # as asked (None: each configuration's largest that fits)
            "seq_len": q.seq_len,
            "image_size": q.image_size,
            "accumulation_steps": q.accumulation_steps,  # as asked (None: what reaches the effective batch)
            "effective_batch": {"samples": q.effective_batch, "source": q.effective_source},
            "method": {
                "name": q.method,
                "reference": q.reference,
                "sequences_per_sample": q.rows_per_sample,
                "rollout": asdict(q.rollout) if q.rollout else None,
                "loss": q.loss,
            },
            "gpus": q.gpus,
            "nodes": q.nodes,
            "attention": q.attention,
            "traced_attention": self.attention,
            "lora": q.lora.key(),
            "pick": self.pick.label if self.pick else None,
            "pick_lever": self.pick_lever.as_dict() if self.pick_lever else None,
            "configurations": [
                {**r.as_dict(q), "time_tie_with_above": tie}
                for r, tie in zip(self.rows, self.time_ties(self.rows), strict=True)
            ],
            "ladder": [r.as_dict() for r in self.ladder],
            "levers": [x.as_dict() for x in self.levers],
            "several_gpus": self.several.as_dict(q) if self.several else None,
            "left_out": list(q.left_out),
            "mfu": {
                "value": self.mfu,
                "source": self.mfu_source,
                "modelled": self.mfu_modelled,
                "band": self.speed_band.as_dict() if self.speed_band else None,
                "band_note": self.band_note,
            },
            "assumptions": self.assumptions,
            "cached": self.computed == 0,
            "not_cached": self.not_cached,
        }


def fit(q: Question, rules: Rules, cache: PredictionCache, tracer: TraceFn | None = None) -> FitAnswer:
    """Every configuration asked: from the cache, tracing (and caching) what it lacks with `tracer` (the
    measurement side's, passed by the caller: this side never imports torch)."""
    soft = software()
    bases = {c: basis(c) for c in q.configs}  # what each row is read from (sharding.py)
    keys = keys_of(q, rules, soft)
    found = cache.get(list(keys.values()))
    missing = [c for c in keys if keys[c] not in found]
    if missing:
        if tracer is None:
            raise FitError(f"{q.model.name} is not traced yet at this shape, and no tracer was given.")
        fresh = tracer(q, missing, rules)
        cache.put(q, fresh, keys, soft)
        found.update({keys[c]: payload for c, payload in fresh.items()})
    use = utilization(q, rules, cache.read)
    shipped = _open_quietly(shipped_kb_path(), connect_kb_readonly, KBError)
    kbs = [conn for conn in (cache.read, shipped) if conn is not None]  # the user's first
    trades = Trades.read(kbs, q, rules)
    tuned = rates_tuned(kbs, q)
    rows = ranking.ranked(
        [_row(q, c, found[keys[bases[c]]], rules, use, trades, tuned) for c in q.configs], q.effective_batch
    )
    first = found[keys[bases[q.configs[0]]]]
    steps = ranking.ladder(rows)
    if q.rollout is not None:  # GRPO is predicted under DDP alone: its levers ask a second GPU so
        steps = [s for s in steps if s.name != "several GPUs"]
    if steps and steps[-1].row is None:  # several GPUs: the fewest that fit, from the traces at hand
        steps[-1] = ranking.Rung(
            "several GPUs", several_gpus(q, rows, found, soft, rules, use, trades, tuned)
        )
    talking = next((r for r in rows if r.fits and r.collectives_s), None)
    return FitAnswer(
        q,
        n_params(first),
        first["attention"],
        rows,
        assumptions(q, rules, experts=bool(first.get("experts")))
        + communication_share(talking)
        + validated_on(kbs),
        use.value,
        use.source,
        len(missing),
        steps,
        use.modelled,
        speed.band(q.accelerator, use, rules),
        speed.unbanded(q.accelerator, use, rules),
        not_cached=cache.unwritten if missing else None,
    )


SEVERAL = (2, 4, 8, 16, 32, 64)  # accelerators the ladder's last rung tries; 8 per node beyond 8


def several_gpus(
    q: Question, rows, found: dict, soft: dict, rules: Rules, use: Utilization, trades: Trades, tuned: dict
) -> Row | None:
    """The ladder's last rung: the configuration as asked (full fine-tuning, AdamW, no checkpointing) on the
    fewest accelerators that hold it, with ZeRO-2 or ZeRO-3 (composed from the pure-bf16 trace at hand:
    no new trace); None where no such trace is at hand or even 64 do not hold it."""
    asked = next((r.config for r in rows if ranking.rung(r) == 0 and r.adamw), None)
    if asked is None:
        return None
    for n in SEVERAL:
        wide = replace(q, gpus=min(n, 8), nodes=max(1, n // 8))
        for sharding in ("zero2", "zero3"):
            c = replace(
                asked, sharding=sharding, dtype=asked.dtype if asked.dtype != "fp32" else "bf16-mixed"
            )
            key = keys_of(replace(wide, configs=(c,)), rules, soft).get(basis(c))
            if key in found:
                row = _row(wide, c, found[key], rules, use, trades, tuned)
                if row.fits:
                    return row
    return None


def overhead_gb(q: Question, tensor_peak_gb: float, rules: Rules) -> float:
    """Memory a run holds beyond the step's tensors (rules/fit.toml)."""
    if q.device == "cpu":
        cpu = rules.fit["cpu"]
        return cpu["process_gb"] + cpu["fragmentation"] * tensor_peak_gb
    cuda = rules.fit["cuda"]
    return cuda["context_gb"] + cuda["workspace_gb"] + cuda["fragmentation"] * tensor_peak_gb


def usable_gb(q: Question, rules: Rules) -> float:
    """What a configuration may hold: the budget less the headroom kept free, and less vLLM's share where it
    generates beside training."""
    return q.budget_gb * (1 - rules.fit["fits"]["headroom"]) - q.reserved_gb


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
        tensors = peak_total(payload, b) / 1e9
        return round(tensors + overhead_gb(q, tensors, rules), 4) <= usable

    if not fits(1):
        return 0
    slope = peak_total(payload, 2) - peak_total(payload, 1)
    guess = (
        int((usable * 1e9 / (1 + rules.fit["cuda"]["fragmentation"]) - peak_total(payload, 1)) / slope)
        if slope > 0
        else MAX_BATCH
    )
    low, high = 1, 2
    if 2 <= guess <= MAX_BATCH and fits(guess):  # the peak is nearly linear in the batch: start there
        low, high = guess, guess + 1
    while high <= MAX_BATCH and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _row(
    q: Question,
    c: Config,
    traced: dict,
    rules: Rules,
    use: Utilization,
    trades: Trades,
    tuned=None,
    batch=None,
) -> Row:
    """A configuration priced at its recipe's micro-batch and accumulation (`batch`: at these instead)."""
    rank = per_rank(c, traced, q, rules)
    payload = _generating(q, c, rank)
    largest = max_batch(q, payload, rules)
    b, k = batch or batches(q, c.strategy, largest)  # the recipe's micro-batch and accumulation
    phase, gb = memory_at(q, payload, b, rules)
    flops = step_flops(payload, b) * k
    trained = trainable(payload)
    rank_host = host_bytes(payload)  # one process's: an offloaded or paged optimizer's
    on_host = host_per_node(c, traced, q) if c.sharding != "none" else None
    host = on_host if on_host is not None else rank_host  # what the JSON and the table say: per node
    volume = communication(c, traced, q, k)
    with_host_gb = gb["total"] + rank_host / 1e9
    step_s, talk = _step_seconds(q, c, traced, payload, (b, k), flops, with_host_gb, volume, use, rules)
    generated = b * k if accumulates(c.strategy) else b  # GRPO's completions per generation on a rank
    generation_s = _generation_seconds(q, c, rank, generated, use, rules)
    if step_s is not None and generation_s is not None:
        step_s += generation_s  # GRPO's optimizer step waits for its completions
    samples = q.world * b * k / step_s if step_s else None  # the job's: every rank a micro-batch
    adapter = q.adapter_of(c.adapter)
    info = rules.optimizer_info[c.optimizer]
    rate = learning_rate(q, c, rules, tuned)

    def code_of():
        recipe = Recipe(b, k, rate)
        sharded = launch(q, c, adapter, rules) if c.sharding != "none" else None
        args, code = training_code(q, c, adapter, rules, recipe, sharded)
        return args, code, sharded

    return Row(
        c,
        adapter,
        gb["total"] <= usable_gb(q, rules),
        gb,
        phase,
        largest,
        flops,
        step_s,
        samples,
        samples * q.seq_len * q.rows_per_sample if samples and q.seq_len else None,
        trained,
        host / 1e9,
        code_of,
        info.adamw,
        info.bits,
        trades.optimizers.get(c.optimizer),
        volume["sent"],
        q.gpus,
        q.nodes,
        trades.adapters.get(c.adapter),
        trades.adapter_evidence.get(c.adapter),
        b,
        k,
        rate,
        lambda micro, window: _row(q, c, traced, rules, use, trades, tuned, (micro, window)),
        {p: v / 1e9 for p, v in phase_peaks(payload, b).items()},
        generation_s and q.rollout.completion * generated / generation_s,
        talk,
    )


def _generating(q: Question, c: Config, payload: dict) -> dict:
    """GRPO's rollout at the completions a rank generates at once: with accumulation, every micro-batch of
    the window's (the effective batch's share of this rank, TRL's steps_per_generation); without, the
    micro-batch's own (the payload's lines as they are)."""
    if q.rollout is None or not accumulates(c.strategy):
        return payload
    return at_generation(payload, -(-q.effective_batch // q.world))


def _generation_seconds(
    q: Question, c: Config, payload: dict, rows: int, use: Utilization, rules: Rules
) -> float | None:
    """GRPO's generation of a rank's `rows` completions (speed.generation_seconds): the policy's weights read
    per token as it holds them (not a reference copy beside it) and its KV cache as traced, a quantized base
    dequantized for every forward (bitsandbytes' batched products); vLLM's bf16 weights and cache; None for
    another method, or where the accelerator states no peak or bandwidth."""
    r, acc = q.rollout, q.accelerator
    memory = speed.bandwidth(acc, use)
    peak = accelerators.peak_tflops(acc, c.dtype) if acc else None
    if r is None or not memory or not (peak or use.calibrated):
        return None
    if "decode" in payload["phases"]:
        copies = 2 if q.method_of(c.adapter).reference == "model" else 1
        weights = phase_bytes(payload, "decode", 0)["parameters"] / copies
        kv_row = per_row(payload, "decode")
    else:  # vLLM's own copy, in bf16
        weights = 2 * n_params(payload)
        kv_row = kv_bytes_per_token(q.model.config) * q.seq_len
    flops = 2 * n_params(payload) * rows * (q.seq_len - r.completion)
    lengths = (q.seq_len - r.completion, r.completion)
    seconds = speed.generation_seconds(weights, kv_row, rows, lengths, flops, (peak, use), memory, rules)
    adapter = q.adapter_of(c.adapter)
    if adapter.kind == "qlora" and r.generation == "transformers":
        quantized = n_params(payload) - payload.get("structure", {}).get("root", 0)
        seconds += speed.dequant_seconds(quantized, adapter.base_bits, 1, r.completion + 1, memory, rules)
    return seconds


def kv_bytes_per_token(config: dict | None) -> float:
    """A token's KV cache in bf16 from a config.json (its text model's): keys and values of every layer's
    KV heads, or a multi-head latent attention's compressed latent and rotary key; 0 where the config is not
    at hand (a reference model, built by its family)."""
    text = (config or {}).get("text_config") or config or {}
    layers = text.get("num_hidden_layers", 0)
    if "kv_lora_rank" in text:
        return 2 * layers * (text["kv_lora_rank"] + text.get("qk_rope_head_dim", 0))
    heads = text.get("num_attention_heads") or 1
    head_dim = text.get("head_dim") or text.get("hidden_size", 0) // heads
    return 2 * 2 * layers * text.get("num_key_value_heads", heads) * head_dim


def _step_seconds(
    q: Question,
    c: Config,
    traced: dict,
    payload: dict,
    recipe,
    flops,
    with_host_gb: float,
    volume,
    use,
    rules,
) -> tuple[float | None, tuple[float, float] | None]:
    """A rank's optimizer step: its compute (with the optimizer's traffic) and the part of its collectives that
    does not hide behind it (sharding.overlapped), plus an offload's transfers and host step, or a paged
    state's round trip when device and paged state together outgrow the device; and its collectives'
    (seconds, seconds exposed), None on one rank or where a link is unknown."""
    traffic = _optimizer_traffic(c, traced, q, rules)
    sharded_offload = c.offload != "none" and c.sharding != "none"  # the host steps it, not the device
    step_s = step_seconds(q, c, payload, recipe, flops, 0.0 if sharded_offload else traffic, use, rules)
    talk = communication_seconds(volume, q, rules, c.sharding)
    if step_s is None:
        return None, None
    collectives = None
    if talk:
        overlapped_s = overlapped(step_s, talk, hidden_share(c, rules))
        collectives = (talk, overlapped_s - step_s)
        step_s = overlapped_s
    if sharded_offload:
        return step_s + sharded_offload_seconds(c, traced, q, traffic, rules), collectives
    if c.offload != "none":
        return step_s + offload_seconds(trainable(payload), host_traffic(payload), rules), collectives
    paged = host_bytes(payload)
    if paged and with_host_gb > usable_gb(q, rules):  # paged state evicted, brought back
        return step_s + 2 * paged / (rules.fit["offload"]["pcie_gbs"] * 1e9), collectives
    return step_s, collectives


def _optimizer_traffic(c: Config, traced: dict, q: Question, rules: Rules) -> float:
    """Bytes one rank's optimizer step moves: the traced step's, over its shard where the state is
    partitioned (ZeRO: fp32 states, twice a pure-bf16 basis's; FSDP: traced at its own number of ranks)."""
    traffic = optimizer_traffic(traced)
    if c.sharding.startswith("zero"):
        return fp32_factor(c, rules) * traffic / q.world
    if c.sharding in ("fsdp", "hsdp"):
        return traffic * traced["sharded"]["world"] / shard_size(c, q)
    return traffic


def step_seconds(
    q: Question,
    c: Config,
    payload: dict,
    recipe,
    flops: float,
    traffic: float,
    use: Utilization,
    rules: Rules,
) -> float | None:
    """Forward and backward of the recipe's micro-batches (`recipe`: micro-batch, count) and the optimizer's
    step, by the speed model's parts (advisor/prediction/speed.py); None where the accelerator states no
    peak FLOP/s or bandwidth."""
    acc = q.accelerator
    peak = accelerators.peak_tflops(acc, c.dtype) if acc else None
    memory = speed.bandwidth(acc, use)
    if not (peak or use.calibrated) or not memory:
        return None
    _, count = recipe
    seconds = speed.compute_seconds(flops, peak, use) + speed.overhead_seconds(count, use, rules)
    seconds += speed.traffic_seconds(traffic, memory, use, rules)
    adapter = q.adapter_of(c.adapter)
    if adapter.kind == "qlora" and use.modelled:
        quantized = n_params(payload) - payload.get("structure", {}).get("root", 0)
        passes = speed.dequant_passes(c.strategy.startswith("checkpointing"))
        seconds += speed.dequant_seconds(quantized, adapter.base_bits, passes, count, memory, rules)
    return seconds


def offload_seconds(trained: int, host_traffic_bytes: float, rules: Rules) -> float:
    """An offloaded optimizer's step: bf16 gradients down and bf16 weights up over PCIe, and the host's step
    at its memory bandwidth (rules/fit.toml [offload]), not overlapped with compute."""
    off = rules.fit["offload"]
    return 4 * trained / (off["pcie_gbs"] * 1e9) + host_traffic_bytes / (off["host_bandwidth_gbs"] * 1e9)


def validated_on(kbs: list[sqlite3.Connection]) -> list[str]:
    """How predictions were checked against real steps on accelerators (KB validations named fit_*)."""
    found = []
    for conn in kbs:
        found += [v for v in fit_validations(conn) if v not in found]
    return [
        f"Checked on {v['hardware']}: {v['checks']} configurations of Trainer's step against "
        "torch.cuda.max_memory_allocated, "
        f"median |error| {v['median']:.1%}, worst {v['worst']:.1%} (bench/fit_accuracy.py)."
        for v in found
    ]


def _open_quietly(path, connect, error):
    try:
        return connect(path)
    except error:
        return None


def assumptions(q: Question, rules: Rules, experts: bool = False) -> list[str]:
    """What the figures rest on, each with its source (rules/fit.toml)."""
    fit = rules.fit
    out = [
        f"Traced: one training step of {q.model.name} built from its config under fake tensors (no weight "
        "allocated), the model computing its own loss as Trainer does; sequences of the full length, no padding.",
        f"Fits: a total within {1 - fit['fits']['headroom']:.0%} of {accelerators.gib(q.budget_gb):.4g} GiB. "
        + fit["fits"]["source"],
    ]
    if q.device == "cpu":
        cpu = fit["cpu"]
        out += [f"Process: {cpu['process_gb']} GB. {cpu['process_source']}", cpu["fragmentation_source"]]
    else:
        cuda = fit["cuda"]
        out += [
            f"CUDA context: {cuda['context_gb']} GB. {cuda['context_source']}",
            f"Workspaces: {cuda['workspace_gb']} GB. {cuda['workspace_source']}",
            f"Allocator: +{cuda['fragmentation']:.0%} of the tensor peak. {cuda['fragmentation_source']}",
            "Optimizers as a CUDA run builds them: torch's foreach kernels, Trainer's fused AdamW "
            "(adamw_torch_fused, its default), bitsandbytes' 8-bit layouts (embeddings kept in 32-bit state, as "
            "Trainer registers them); checkpointing's saved RNG states are host memory.",
            "Attention: transformers' sdpa as CUDA runs it: FlashAttention in bf16/fp16, the memory-efficient "
            "kernel in fp32, and the math kernel (seq x seq scores kept) for grouped-query attention in fp32.",
        ]
    out += [fit["precision"][d] for d in q.dtypes]
    kinds = {c.adapter for c in q.configs}
    if "lora" in kinds or "qlora" in kinds:
        out.append(fit["adapters"]["lora"])
    if "qlora" in kinds:
        out += [fit["adapters"][f"qlora_{q.lora.base_bits}"], fit["adapters"]["prepare"]]
    if any(c.offload != "none" for c in q.configs):
        off = fit["offload"]
        out += [off["source"], off["pcie_source"], off["host_bandwidth_source"]]
    if any(c.optimizer.startswith("paged_") for c in q.configs):
        out.append(fit["paged"]["source"])
    for name in dict.fromkeys(c.optimizer for c in q.configs):
        modelled = fit.get("optimizers", {}).get(name)
        if modelled:
            out.append(
                f"{name}'s step scratch: {modelled['temporaries_per_element']} bytes per element of its "
                f"largest quantized tensor, modelled (a compiled step cannot run on fake tensors). {modelled['source']}"
            )
    if q.attention == "flash_attention_2":
        out.append(fit["attention"]["flash_attention_2"])
    if experts:
        out.append(fit["moe"]["source"])
    if q.accelerator is not None and q.accelerator.key != "cpu":
        out.append(f"Peak FLOP/s and bandwidth: {q.accelerator.source}")
        out.append(f"Optimizer step: {fit['speed']['bandwidth_source']}")
    if q.world > 1:
        out += distributed_assumptions(q, rules)
    out += [f"Left out of the menu: {x}." for x in q.left_out]
    return out


# advisor fit's answers for one traced model and shape: each accelerator with its answer, or the sentence
# that says why there is none (what the report's fit section shows; api.traced_fits makes it)
TracedFits = tuple[Traced, list[tuple[Accelerator, FitAnswer | str]]]
