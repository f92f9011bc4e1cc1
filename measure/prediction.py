"""The engine of `advisor fit`: a model's training step traced under PyTorch's fake tensors, from its config
alone (no weight is allocated: an 8B model costs no RAM), with the real checkpointing and accumulation
mechanisms, autocast for mixed precision, the real optimizers (ours included) and the loss the model
computes itself, as a Hugging Face Trainer step does.

What is traced, per precision:
- a forward/backward window of two micro-batches, with checkpointing off and on: the first micro-batch's
  phases are standard training's (and checkpointing's); the second's, with the first's gradients alive,
  accumulation's (a longer window peaks no higher). FLOPs are counted by torch's own formulas;
- each optimizer's step on fake gradients: its state, and the peak of its step. The forward/backward peaks
  depend on the optimizer only through its state, which is alive throughout: added, not re-traced.

Deep models are traced at depth 1 and 2 of each stack of blocks (one stack for a text model, two for a
vision-language model), at micro-batch 2 and 3. Every op's live bytes are affine in the batch, so each
phase keeps the lines of its peak (the upper envelope of its ops' lines): the peak at any batch, not a
secant through two peaks, which would miss the peak moving as activations outgrow the gradients. Depth is
then a linear combination of the traced points. `tests/measure/test_prediction.py` checks the composite
against a full trace, and the prediction against a real step's live tensor bytes.
"""

from __future__ import annotations

import copy
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from unittest import mock

from advisor.errors import FitError
from advisor.prediction.question import Question
from advisor.prediction.step import (
    BATCHES,
    CATEGORIES,
    ENGINE_VERSION,
    depth_points,
    envelope,
    extrapolate_depth,
    line,
)
from advisor.rules import Rules
from measure.families import Family, family
from measure.families.base import from_config
from measure.models import model_config
from measure.optimizers import make_optimizer
from measure.strategies import STRATEGIES, enable_checkpointing, uses_checkpointing
from measure.tracing import InputValues, LiveBytes, OpFlops, OpTraffic, ScalarOracle

DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
SUB_CONFIGS = ("text_config", "vision_config")
TRACE_LR = 1e-3  # the rate never changes memory or FLOPs


@dataclass(frozen=True)
class Spec:
    """What is predicted: one model config at one shape and precision, for a CUDA or a CPU run."""

    config: object  # a transformers PretrainedConfig
    family: Family  # inputs and model class (measure.families)
    seq_len: int | None  # text tokens per sample (None for vision-only models)
    image_size: int | None
    dtype: str  # fp32 | bf16-mixed | fp16-mixed | bf16
    device: str = "cuda"  # which optimizer implementations a run gets (foreach/fused on CUDA)


def depth_knobs(config) -> dict[str, int]:
    """Each stack of blocks a config has, as 'key' or 'sub_config.key', with its depth."""
    out = {}
    for prefix, sub in [("", config)] + [(f"{s}.", getattr(config, s, None)) for s in SUB_CONFIGS]:
        if sub is None:
            continue
        key = next((k for k in DEPTH_KEYS if isinstance(getattr(sub, k, None), int)), None)
        if key:
            out[prefix + key] = getattr(sub, key)
    if not out:
        raise ValueError("the config names no number of layers (num_hidden_layers, n_layer, num_layers)")
    return out


def at_depth(config, depths: dict[str, int]):
    """A copy of the config with each stack at the given depth (per-layer lists cut to match)."""
    config = copy.deepcopy(config)
    for knob, depth in depths.items():
        owner, key = (
            (config, knob) if "." not in knob else (getattr(config, knob.split(".")[0]), knob.split(".")[1])
        )
        setattr(owner, key, depth)
        if isinstance(getattr(owner, "layer_types", None), list):
            owner.layer_types = owner.layer_types[:depth]
    return config


@contextmanager
def fake_tensors():
    """A fake-tensor session: (mode, input values). Transformers treats FakeTensors as tracing and then
    takes branches a real run never takes (materialized attention masks instead of is_causal); here the
    fakes stand for real tensors and InputValues supplies the values those branches read, so transformers
    is told they are not fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers.utils import import_utils

    mode = FakeTensorMode()
    with mock.patch.object(import_utils, "is_fake_tensor", lambda x: False):
        yield mode, InputValues(mode)


@contextmanager
def cuda_attention(spec: Spec):
    """Scaled-dot-product attention as CUDA would run it, for a trace on the CPU (whose flash kernel takes
    anything): FlashAttention for fp16/bf16 without a mask, grouped-query attention included; otherwise the
    memory-efficient kernel, which takes masks and fp32 but not grouped-query attention; otherwise the math
    kernel, which materializes the seq x seq scores. Transformers asks for grouped-query attention whenever
    there is no mask, so an fp32 step of a GQA model (Llama's 8 KV heads) gets the math kernel on CUDA:
    21 % more memory on Llama-3.2-1B, measured on an H200."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if spec.device != "cuda":
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        head_dim = query.shape[-1]
        dtype = (
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
        )  # as it runs
        flash = dtype in (torch.float16, torch.bfloat16) and attn_mask is None and head_dim <= 256
        efficient = not enable_gqa
        backend = nullcontext() if flash or efficient else sdpa_kernel([SDPBackend.MATH])
        with backend:
            return original(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa):
        yield


def build(spec: Spec, config, mode, checkpointing: bool = False):
    """The model under fake tensors, weights uninitialised (their values never matter), in train mode."""
    import torch
    from transformers import PreTrainedModel

    dtype = torch.bfloat16 if spec.dtype == "bf16" else torch.float32
    with mode, mock.patch.object(PreTrainedModel, "initialize_weights", lambda self: None):
        try:
            model = from_config(spec.family.model_class(), config, dtype=dtype, attn_implementation="sdpa")
        except (ValueError, ImportError):  # an architecture without SDPA support: its eager attention
            model = from_config(spec.family.model_class(), config, dtype=dtype, attn_implementation="eager")
    if checkpointing:
        enable_checkpointing(model)
    model.train()
    return model


def autocast(spec: Spec):
    import torch

    if spec.dtype in ("bf16-mixed", "fp16-mixed"):
        dtype = torch.bfloat16 if spec.dtype == "bf16-mixed" else torch.float16
        return torch.autocast("cpu", dtype=dtype)  # traced on the CPU: CPU autocast's op lists
    return ExitStack()


@dataclass
class Trace:
    """What one traced configuration (depth point, batch) gave: live bytes by category after every op of
    each phase, FLOPs, size."""

    timeline: dict[str, list[tuple[str, tuple[int, ...]]]]  # phase -> (op, bytes by category) per op
    flops: int = 0  # of one micro-batch's forward and backward
    n_params: int = 0
    attention: str = ""
    inputs: int = 0  # bytes of one micro-batch's inputs


def trace_window(spec: Spec, config, batch_size: int, checkpointing: bool) -> Trace:
    """Forward and backward of two micro-batches, gradients accumulating (none before the first)."""
    with fake_tensors() as (mode, values):
        model = build(spec, config, mode, checkpointing)
        live = LiveBytes(timeline=True)
        handles = live.track_module(model)
        counter, flops = OpFlops(), []
        real = spec.family.fit_batch(config, batch_size, spec.seq_len, spec.image_size)
        with mode, values, live, counter, cuda_attention(spec):
            for i in range(2):
                batch = {k: values.add(mode.from_tensor(v), v) for k, v in real.items()}
                for t in batch.values():
                    live.track(t, "activations")
                live.start(f"forward{i}")
                with autocast(spec):
                    loss = model(**batch).loss
                live.start(f"backward{i}")
                loss.backward()
                del loss
                flops.append(counter.total)
            live.start("done")
        for h in handles:
            h.remove()
    return Trace(
        {p: t for p, t in live.timeline.items() if p.startswith(("forward", "backward"))},
        flops[0],
        sum(p.numel() for p in model.parameters()),
        model.config._attn_implementation,
        sum(v.untyped_storage().nbytes() for v in real.values()),
    )


def trace_optimizers(spec: Spec, config, names: list[str]) -> dict[str, dict]:
    """Two steps of each optimizer on fake gradients (one model, a fresh optimizer each): the bytes by
    category at the second step's peak ("peak"), and the bytes its ops read and write ("traffic")."""
    import torch

    out = {}
    with fake_tensors() as (mode, _):
        model = build(spec, config, mode)
        with mode:
            params = [p for p in model.parameters() if p.requires_grad]
            for p in params:
                p.grad = torch.zeros_like(p)
        for name in names:
            with mode:
                optimizer = make_optimizer(name, params, TRACE_LR, cuda_defaults=spec.device == "cuda")
            live = LiveBytes()
            live.track_module(model, gradients=False)
            for p in params:
                live.track(p.grad, "gradients")
            traffic = OpTraffic()
            with mode, ScalarOracle(), live:
                for step in range(2):
                    live.start(f"step{step}")
                    with traffic if step == 1 else ExitStack():
                        optimizer.step()
                    live.track_optimizer(optimizer)
                live.start("done")
            out[name] = {"peak": live.peaks["step1"][1], "traffic": traffic.total}
            del optimizer
    return out


def parameter_count(spec: Spec) -> int:
    """The model's parameters, counted on fake models at depth 1 and 2 and extrapolated (exact: every
    block of a stack has the same parameters)."""
    knobs = depth_knobs(spec.config)
    counts = {}
    for d in depth_points(knobs):
        with fake_tensors() as (mode, _):
            model = build(spec, at_depth(spec.config, dict(zip(knobs, d, strict=True))), mode)
            counts[d] = sum(p.numel() for p in model.parameters())
    return extrapolate_depth(counts, knobs)


def predict(
    spec: Spec, optimizers: list[str], strategies: list[str] = STRATEGIES
) -> dict[tuple[str, str], dict]:
    """The prediction of every (optimizer, strategy): a payload the answer side evaluates at any batch size
    without torch (advisor/prediction/fit.py): per phase and depth point, the lines of its peak in the batch."""
    knobs = depth_knobs(spec.config)
    points = depth_points(knobs)
    configs = {d: at_depth(spec.config, dict(zip(knobs, d, strict=True))) for d in points}
    windows = {
        ckpt: {(d, b): trace_window(spec, configs[d], b, ckpt) for d in points for b in BATCHES}
        for ckpt in sorted({uses_checkpointing(s) for s in strategies})
    }
    by_depth = {d: trace_optimizers(spec, configs[d], optimizers) for d in points}
    steps = {name: {d: by_depth[d][name]["peak"] for d in points} for name in optimizers}
    out = {}
    for ckpt, traces in windows.items():
        one, two = BATCHES
        phases = {d: _window_lines(traces[(d, one)], traces[(d, two)]) for d in points}
        common = {
            "engine": ENGINE_VERSION,
            "depth": knobs,
            "points": [list(d) for d in points],
            "n_params": [traces[(d, one)].n_params for d in points],
            "attention": traces[(points[0], one)].attention,
            "flops": [line(traces[(d, one)].flops, traces[(d, two)].flops) for d in points],
        }
        inputs = line(traces[(points[0], one)].inputs, traces[(points[0], two)].inputs)
        for strategy in [s for s in strategies if uses_checkpointing(s) == ckpt]:
            names = ["forward0", "backward0"] + (
                ["forward1", "backward1"] if strategy.endswith("accumulation") else []
            )
            for name in optimizers:
                out[(name, strategy)] = {
                    **common,
                    "optimizer_traffic": [by_depth[d][name]["traffic"] for d in points],
                    "phases": {
                        **{p: [_with_state(phases[d][p], steps[name][d]) for d in points] for p in names},
                        "optimizer_step": [[_step_line(steps[name][d], inputs)] for d in points],
                    },
                }
    return out


def _window_lines(one: Trace, two: Trace) -> dict[str, list[dict]]:
    return {p: envelope(one.timeline[p], two.timeline[p]) for p in one.timeline}


def _with_state(lines: list[dict], step: dict[str, int]) -> list[dict]:
    """The optimizer's state is alive through forward and backward: added to every line."""
    state = step["optimizer_state"]
    return [
        {"a": {**ln["a"], "optimizer_state": ln["a"]["optimizer_state"] + state}, "b": ln["b"]}
        for ln in lines
    ]


def _step_line(step: dict[str, int], inputs: tuple[int, int]) -> dict:
    """The step: parameters, gradients, state and its temporaries, and the last micro-batch's inputs,
    which the training loop still holds."""
    return {
        "a": {**step, "activations": step["activations"] + inputs[0]},
        "b": {**dict.fromkeys(CATEGORIES, 0), "activations": inputs[1]},
    }


def trace(q: Question, pairs: list[tuple[str, str]], rules: Rules) -> dict[tuple[str, str], dict]:
    """advisor fit's tracer: the payload of each (optimizer, strategy) pair of a question, traced on the
    model's config (a reference model at its preset, a user's from its config.json as read)."""
    try:
        config = model_config(q.model, rules)
    except (ValueError, KeyError, OSError) as e:
        raise FitError(f"transformers cannot build {q.model.name} from its config: {_first_line(e)}") from e
    spec = Spec(config, family(q.model.family.name, rules), q.seq_len, q.image_size, q.dtype, q.device)
    optimizers = sorted({o for o, _ in pairs}, key=list(rules.optimizers).index)
    strategies = sorted({s for _, s in pairs}, key=list(rules.strategies).index)
    try:
        out = predict(spec, optimizers, strategies)
    except (ValueError, NotImplementedError, RuntimeError, TypeError) as e:
        raise FitError(f"cannot trace a training step of {q.model.name}: {_first_line(e)}") from e
    return {p: out[p] for p in pairs}


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
