"""`advisor fit`: the user's model on the user's accelerator. Which optimizer × strategy fits, with the
memory of each (parameters, gradients, optimizer state, activations, temporaries, framework overhead),
the largest micro-batch that fits, FLOPs, step time and throughput, and the Trainer arguments to run it.

The numbers come from `measure/prediction.py` (a real training step traced under fake tensors), cached
in the user's KB by everything they depend on; evaluating a cached prediction needs no torch, so a
repeated question answers in a fraction of a second. What is not a tensor of the step (the CUDA context,
allocator slack, workspaces) is added from rules/fit.toml, each figure with its source.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from advisor import accelerators
from advisor.rules import Accelerator, Rules

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")  # measure.tracing's
ENGINE_VERSION = 2  # what a prediction means (measure/prediction.py); bump it to invalidate cached ones
DTYPES = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
MAX_BATCH = 1 << 20  # the largest micro-batch the search considers


class FitError(Exception):
    """A question fit cannot answer, with a sentence that says why and what to do."""


class FitInputError(FitError):
    """A bad value of one option (`param`): a usage error."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


# --- evaluating a prediction (torch-free) -------------------------------------------------------------


def _depth_combination(payload: dict, values: list[dict]) -> dict:
    """Values traced at the depth points (base, then each stack one block deeper) at the model's depths."""
    base, out = values[0], dict(values[0])
    for raised, full in zip(values[1:], payload["depth"].values(), strict=True):
        for k in out:
            out[k] += (full - 1) * (raised[k] - base[k])
    return out


def phase_bytes(payload: dict, phase: str, batch: int) -> dict[str, float]:
    """Bytes by category at the peak of one phase of the step, at a micro-batch size."""
    at_points = []
    for lines in payload["phases"][phase]:
        best = max(lines, key=lambda ln: sum(ln["a"].values()) + batch * sum(ln["b"].values()))
        at_points.append({c: best["a"][c] + batch * best["b"][c] for c in CATEGORIES})
    return _depth_combination(payload, at_points)


def tensor_peak(payload: dict, batch: int) -> tuple[str, dict[str, float]]:
    """The phase holding the step's peak of live tensor bytes, and the bytes by category there."""
    phases = {p: phase_bytes(payload, p, batch) for p in payload["phases"]}
    phase = max(phases, key=lambda p: sum(phases[p].values()))
    return phase, phases[phase]


def step_flops(payload: dict, batch: int) -> float:
    """FLOPs of one micro-batch's forward and backward (recomputation included)."""
    return _depth_combination(payload, [{"flops": a + batch * b} for a, b in payload["flops"]])["flops"]


def optimizer_traffic(payload: dict) -> float:
    """Bytes the optimizer step reads and writes (its kernels are bound by memory bandwidth)."""
    return _depth_combination(payload, [{"b": b} for b in payload["optimizer_traffic"]])["b"]


def n_params(payload: dict) -> int:
    return round(_depth_combination(payload, [{"n": n} for n in payload["n_params"]])["n"])


# --- the question --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """A model as fit needs it, read from its config.json without transformers."""

    name: str
    reference: bool  # one of the families' reference models, at the paper's size
    model_type: str | None
    family: str | None  # the family of rules/families.toml that lists the model_type
    task: str  # the family whose inputs and loss the traced step uses
    config_path: Path | None
    config_hash: str
    max_seq_len: int | None
    image_size: int | None
    text: bool  # takes text (seq_len applies)


@dataclass(frozen=True)
class Question:
    model: ModelInfo
    accelerator: Accelerator | None
    budget_gb: float  # the memory a configuration must fit in
    batch_size: int
    seq_len: int | None
    image_size: int | None
    dtype: str
    accumulation_steps: int
    optimizers: tuple[str, ...]
    strategies: tuple[str, ...]
    mfu: float | None = None  # --mfu: overrides measured evidence and the default

    @property
    def device(self) -> str:
        """cuda | cpu: which optimizer implementations and overheads apply."""
        return "cpu" if self.accelerator is not None and self.accelerator.key == "cpu" else "cuda"


def model_info(name: str, rules: Rules) -> ModelInfo:
    """Resolve --model offline: a reference name, a folder with config.json, or a cached Hugging Face id."""
    from advisor.model_ref import ModelNotResolved, config_path_of, read_config

    reference = rules.reference_models().get(name.lower())
    if reference:
        key = hashlib.sha256(f"reference:{name.lower()}:paper".encode()).hexdigest()
        return ModelInfo(
            name.lower(), True, None, reference, reference, None, key, None, None, reference != "vision"
        )
    path = config_path_of(name)
    if path is None:
        raise ModelNotResolved(
            f"cannot find a config for {name!r} offline: not one of {', '.join(rules.reference_models())}, "
            "not a folder with a config.json, and not in the local Hugging Face cache. Pass a folder that "
            "holds the model's config.json (the weights are not needed)."
        )
    config = read_config(path)
    if "auto_map" in config:
        raise FitError(
            f"{name} needs trust_remote_code (its config.json maps to code in the model's repository): "
            "advisor fit builds only architectures transformers itself defines, never downloaded code."
        )
    model_type = config.get("model_type")
    if not model_type:
        raise FitError(f"{path} has no model_type: it is not a transformers model config.")
    family = rules.family_of_model_type(model_type)
    task = family.name if family else _task_of(config, rules)
    if task is None:
        archs = ", ".join(config.get("architectures") or []) or "none"
        raise FitError(
            f"cannot tell what {name} trains on: model_type {model_type!r} is in no family of "
            f"rules/families.toml and its architectures ({archs}) end in none of "
            f"{', '.join(rules.architectures)}. Add the model_type to a family in rules/families.toml."
        )
    text = config.get("text_config") or config
    vision = config.get("vision_config") or config
    longest = next((text.get(k) for k in ("max_position_embeddings", "n_positions") if text.get(k)), None)
    image = vision.get("image_size") if task in ("vision", "vlm") else None
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    return ModelInfo(
        name,
        False,
        model_type,
        family.name if family else None,
        task,
        path,
        digest,
        longest,
        image,
        task != "vision",
    )


def _task_of(config: dict, rules: Rules) -> str | None:
    for arch in config.get("architectures") or []:
        for suffix, task in rules.architectures.items():
            if arch.endswith(suffix):
                return task
    return None


def question(
    info: ModelInfo,
    rules: Rules,
    gpu: str | None = None,
    memory: float | None = None,
    batch_size: int = 1,
    seq_len: int | None = None,
    image_size: int | None = None,
    dtype: str | None = None,
    accumulation_steps: int = 4,
    optimizers: tuple[str, ...] = (),
    strategies: tuple[str, ...] = (),
    mfu: float | None = None,
) -> Question:
    """The whole question, every option checked against the model and the accelerator."""
    acc = accelerators.resolve(gpu, rules) if gpu else None
    if acc is None and memory is None:
        raise FitInputError("pass --gpu NAME (e.g. A100-80GB, H100, RTX4090, cpu) or --memory GB.", "--gpu")
    budget = memory if memory is not None else accelerators.memory_gb(acc)
    dtype = dtype or _default_dtype(acc)
    if acc is not None and accelerators.peak_tflops(acc, dtype) is None and acc.key != "cpu":
        raise FitInputError(
            f"{acc.name} has no {accelerators.PRECISION[dtype]} support; use --dtype fp16-mixed or fp32.",
            "--dtype",
        )
    if not info.text and seq_len is not None:
        raise FitInputError(f"{info.name} takes images, not text: --seq-len does not apply.", "--seq-len")
    if info.task not in ("vision", "vlm") and image_size is not None:
        raise FitInputError(
            f"{info.name} takes text, not images: --image-size does not apply.", "--image-size"
        )
    if seq_len is not None and info.max_seq_len and seq_len > info.max_seq_len:
        raise FitInputError(
            f"--seq-len {seq_len} is beyond {info.name}'s maximum of {info.max_seq_len} positions.",
            "--seq-len",
        )
    if info.text and seq_len is None:
        seq_len = 128 if info.task == "vlm" else min(2048, info.max_seq_len or 2048)
    return Question(
        info,
        acc,
        budget,
        batch_size,
        seq_len,
        image_size or info.image_size,
        dtype,
        accumulation_steps,
        tuple(optimizers) or tuple(rules.optimizers),
        tuple(strategies) or tuple(rules.strategies),
        mfu,
    )


def _default_dtype(acc: Accelerator | None) -> str:
    """bf16 mixed precision where the chip has bf16, fp16 mixed where it has only fp16, fp32 on a CPU."""
    if acc is None:
        return "bf16-mixed"
    if acc.key == "cpu":
        return "fp32"
    return "bf16-mixed" if "bf16" in acc.tflops else "fp16-mixed"


# --- the cache -----------------------------------------------------------------------------------------


def software() -> dict:
    out = {"engine": ENGINE_VERSION}
    for pkg in ("torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def prediction_key(q: Question, optimizer: str, strategy: str, soft: dict) -> str:
    """Everything a prediction depends on, hashed: the config, shape, precision, implementations, versions."""
    parts = {
        "config": q.model.config_hash,
        "seq_len": q.seq_len,
        "image_size": q.image_size,
        "dtype": q.dtype,
        "device": q.device,
        "optimizer": optimizer,
        "strategy": strategy,
        **soft,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cached(conn: sqlite3.Connection | None, keys: list[str]) -> dict[str, dict]:
    """key -> payload of the predictions a KB holds."""
    if conn is None or not keys:
        return {}
    marks = ",".join("?" * len(keys))
    rows = conn.execute(f"SELECT key, payload FROM predictions WHERE key IN ({marks})", keys)
    return {k: json.loads(p) for k, p in rows}


def open_cache(db) -> tuple[sqlite3.Connection | None, Path]:
    """Predictions are read from and cached in the KB a write would go to (--db, $ADVISOR_DB, the user's)."""
    from advisor.kb import resolve_write_path
    from advisor.schema import KBError, connect_readonly

    path = resolve_write_path(db)
    if not path.exists():
        return None, path
    try:
        return connect_readonly(path), path
    except KBError:
        return None, path  # an older or foreign KB: fit still answers, and caching will say what is wrong


def needs_tracing(q: Question, read: sqlite3.Connection | None) -> bool:
    """Whether answering imports torch: some prediction is not in the cache."""
    soft = software()
    keys = [prediction_key(q, o, s, soft) for o in q.optimizers for s in q.strategies]
    return len(cached(read, keys)) < len(keys)


def compute(q: Question, pairs: list[tuple[str, str]], rules: Rules) -> dict[tuple[str, str], dict]:
    """Trace the missing (optimizer, strategy) pairs: the one step that imports torch and transformers."""
    from measure.families import family
    from measure.prediction import Spec, predict

    config = _transformers_config(q.model, rules)
    spec = Spec(config, family(q.model.task, rules), q.seq_len, q.image_size, q.dtype, q.device)
    optimizers = sorted({o for o, _ in pairs}, key=list(rules.optimizers).index)
    strategies = sorted({s for _, s in pairs}, key=list(rules.strategies).index)
    try:
        out = predict(spec, optimizers, strategies)
    except (ValueError, NotImplementedError, RuntimeError, TypeError) as e:
        raise FitError(f"cannot trace a training step of {q.model.name}: {_first_line(e)}") from e
    return {p: out[p] for p in pairs}


def _transformers_config(info: ModelInfo, rules: Rules):
    from measure.families import family

    if info.reference:
        return family(info.family, rules).reference_config("paper")[0]
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(info.config_path.parent), local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        raise FitError(f"transformers cannot build {info.name} from its config: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


# --- the answer ----------------------------------------------------------------------------------------


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
                "family": q.model.family or "unknown family",
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
                    "accumulation_steps": window(q, r.strategy),
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


def window(q: Question, strategy: str) -> int:
    return q.accumulation_steps if strategy.endswith("accumulation") else 1


def fit(q: Question, rules: Rules, read: sqlite3.Connection | None, write_path: Path | None) -> FitAnswer:
    """Every asked optimizer × strategy: from the cache, tracing (and caching) what it lacks."""
    soft = software()
    pairs = [(o, s) for o in q.optimizers for s in q.strategies]
    keys = {p: prediction_key(q, *p, soft) for p in pairs}
    found = cached(read, list(keys.values()))
    missing = [p for p in pairs if keys[p] not in found]
    if missing:
        fresh = compute(q, missing, rules)
        if write_path is not None:
            _store(write_path, q, fresh, keys, soft)
        found.update({keys[p]: payload for p, payload in fresh.items()})
    payloads = {p: found[keys[p]] for p in pairs}
    mfu, mfu_source = utilization(q, rules, read)
    checked = validated_on(q, rules, read)
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


def _store(path: Path, q: Question, fresh: dict, keys: dict, soft: dict) -> None:
    from advisor import store

    rows = [
        {
            "key": keys[(o, s)],
            "model": q.model.name,
            "config_hash": q.model.config_hash,
            "model_type": q.model.model_type,
            "family": q.model.family,
            "optimizer": o,
            "strategy": s,
            "dtype": q.dtype,
            "seq_len": q.seq_len,
            "image_size": q.image_size,
            "device": q.device,
            "software": soft,
            "payload": payload,
        }
        for (o, s), payload in fresh.items()
    ]
    with store.writing(path) as conn:
        store.add_predictions(conn, rows)


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
    k = window(q, strategy)
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


def validated_on(q: Question, rules: Rules, read: sqlite3.Connection | None) -> list[str]:
    """How predictions were checked against real steps on accelerators (KB validations named fit_*)."""
    from advisor.kb import fit_validations, shipped_kb_path
    from advisor.schema import KBError, connect_readonly

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


TRAINER_OPTIM = {  # optimizer -> (optim, optim_args, weight_decay) as Trainer names them
    "sgd": ("sgd", None, None),
    "sgd-momentum": ("sgd", "momentum=0.9", None),
    "adam": ("adamw_torch_fused", None, 0.0),
    "adamw": ("adamw_torch_fused", None, 0.01),
    "adagrad": ("adagrad", None, None),
    "adafactor": ("adafactor", None, None),
}
CUSTOM_OPTIMIZER = {  # optimizers Trainer does not name: passed as optimizers=(optimizer, scheduler)
    "adadelta": "torch.optim.Adadelta(model.parameters(), lr=1.0)",
    "cgd": "ConjugateGradient(model.parameters(), lr=0.05)  # from measure.optimizers import ConjugateGradient",
}


def training_arguments(q: Question, optimizer: str, strategy: str) -> tuple[dict, str]:
    """The configuration as Hugging Face TrainingArguments, and the Python that builds it."""
    args = {"per_device_train_batch_size": q.batch_size, "gradient_accumulation_steps": window(q, strategy)}
    if strategy.startswith("checkpointing"):
        args["gradient_checkpointing"] = True
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    args.update({"bf16-mixed": {"bf16": True}, "fp16-mixed": {"fp16": True}}.get(q.dtype, {}))
    if optimizer in TRAINER_OPTIM:
        optim, optim_args, decay = TRAINER_OPTIM[optimizer]
        if q.device == "cpu" and optim == "adamw_torch_fused":
            optim = "adamw_torch"
        args["optim"] = optim
        if optim_args:
            args["optim_args"] = optim_args
        if decay is not None:
            args["weight_decay"] = decay
    if q.device == "cpu":
        args["use_cpu"] = True
    lines = ["args = TrainingArguments(", '    output_dir="out",']
    lines += [f"    {k}={v!r}," for k, v in args.items()] + [")"]
    if q.dtype == "bf16":
        lines.insert(
            0, "model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16)  # pure bf16"
        )
    if optimizer in CUSTOM_OPTIMIZER:
        lines += [
            f"optimizer = {CUSTOM_OPTIMIZER[optimizer]}",
            "trainer = Trainer(model=model, args=args, train_dataset=..., optimizers=(optimizer, None))",
        ]
    else:
        lines.append("trainer = Trainer(model=model, args=args, train_dataset=...)")
    return args, "\n".join(lines)


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
