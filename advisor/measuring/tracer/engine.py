"""The engine of `advisor fit`: a model's training step traced under PyTorch's fake tensors, from its config
alone (no weight is allocated: an 8B model costs no RAM), with the real checkpointing (full or selective)
and accumulation mechanisms, autocast for mixed precision, peft's LoRA and bitsandbytes' quantized base for
QLoRA, the real optimizers (bitsandbytes', torchao's, schedule-free's, Muon and ours included) and the loss
the model computes itself, as a Hugging Face Trainer step does.

What is traced, per adapter and precision:
- a forward/backward window of two micro-batches, with each checkpointing (none, full, selective): the
  first micro-batch's phases are standard training's (and checkpointing's); the second's, with the first's
  gradients alive, accumulation's (a longer window peaks no higher). FLOPs are counted by torch's formulas;
- each optimizer's step on fake gradients of what trains: its state, and the peak of its step. The
  forward/backward peaks depend on the optimizer only through its state, alive throughout: added, not
  re-traced. Offloading the optimizer (its state and the fp32 master weights on the host) is composed from
  the half-precision window and the optimizer's state, which then counts on the host.

Deep models are traced at one and two blocks of each stack and of each kind of block a stack mixes (Gemma's
sliding and full attention, DeepSeek's dense and mixture-of-experts layers), at micro-batch 2 and 3. Every
op's live bytes are affine in the batch, so each phase keeps the lines of its peak (the upper envelope of
its ops' lines): the peak at any batch, not a secant through two peaks, which would miss the peak moving
as activations outgrow the gradients. Depth is then a linear combination of the traced points.
`tests/measuring/tracer/test_prediction.py` and `tests/measuring/tracer/test_menu.py` check the composite against full traces,
and predictions against real steps' live tensor bytes.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import itertools
import logging
import math
import os
import sys
import time
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, fake_tensor_tls
from transformers import PreTrainedModel
from transformers.utils import import_utils
from transformers.utils import logging as hf_logging

from advisor.errors import FitError, InputError
from advisor.measuring.model.adapters import Gemm4bitDecomposed, adapted, quantize
from advisor.measuring.model.builder import model_config
from advisor.measuring.model.families import Family, family_of
from advisor.measuring.model.families.base import from_config
from advisor.measuring.recipe.optimizers import (
    make_optimizer,
    missing_package,
    paged_state_bytes,
    torchao_largest_quantized,
    traceable,
)
from advisor.measuring.recipe.strategies import STRATEGIES, checkpointing_of, enable_checkpointing
from advisor.measuring.tracer.fsdp import (
    TRACED_WORLD,
    blocks,
    fake_group,
    largest_module,
    root_parameters,
    shard,
    sharded_points,
)
from advisor.measuring.tracer.methods import (
    batch_of,
    configured,
    model_class,
    prepare,
    prepare_reference,
    rollout,
    step_loss,
    trl_kernels,
)
from advisor.measuring.tracer.tracing import (
    InputValues,
    LiveBytes,
    OpTraffic,
    ScalarOracle,
    ShardedLiveBytes,
)
from advisor.measuring.tracer.workers import unordered
from advisor.prediction.question import Question, text_first
from advisor.prediction.step import (
    BATCHES,
    CATEGORIES,
    ENGINE_VERSION,
    EXPERTS,
    Adapter,
    Config,
    Method,
    coefficients,
    depth_points,
    envelope,
    extrapolate_depth,
    line,
)
from advisor.rules import Rules

DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
SUB_CONFIGS = ("text_config", "vision_config")
TRACE_LR = 1e-3  # the rate never changes memory or FLOPs
HALF = {"bf16-mixed": "bf16"}  # a mixed precision whose optimizer can be offloaded: its device half
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
PHASES = ("forward", "reference", "backward")  # a micro-batch's traced phases, in order (reference: DPO's)
# GRPO's phases once per optimizer step, before its first micro-batch (methods.rollout; step.py ROLLOUT)
ONCE = ("prefill", "decode", "scoring", "reference")


@dataclass(frozen=True)
class Spec:
    """What is predicted: one model config at one shape and precision, with what trains, for a CUDA or a CPU
    run."""

    config: object  # a transformers PretrainedConfig
    family: Family  # inputs and model class (advisor.measuring.model.families)
    seq_len: int | None  # text tokens per sample (None for vision-only models)
    image_size: int | None
    dtype: str  # fp32 | bf16-mixed | fp16-mixed | bf16 (rules/fit.toml [precision])
    device: str = "cuda"  # which optimizer implementations and kernels a run gets
    adapter: Adapter = field(default_factory=Adapter)
    attention: str = "sdpa"  # sdpa | eager
    images: bool = True  # a model that takes images given one (False: a text-first VLM on text alone)
    method: Method = field(default_factory=Method)  # Trainer's step, or TRL's (methods.py)


def precision(spec: Spec) -> tuple[torch.dtype, torch.dtype | None]:
    """(the weights' dtype, autocast's dtype or None). Mixed precision trains fp32 and multiplies in half:
    full fine-tuning keeps fp32 weights; an adapter keeps its frozen base in half (nothing to update there)
    and its adapters in fp32 (peft's default). Pure bf16 keeps everything in bf16."""
    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(spec.dtype)
    if spec.dtype == "bf16":
        return torch.bfloat16, None
    if half is None:
        return torch.float32, None
    return (torch.float32 if spec.adapter.kind == "full" else half), half


# --- depth: the stacks of blocks, and the kinds of block each mixes ---------------------------------------


def depth_knobs(config) -> dict[str, int]:
    """Each stack of blocks a config has ('key' or 'sub_config.key'), split by the kinds of block it mixes
    ('key@kind': its per-layer `layer_types`, or DeepSeek's dense first layers and mixture-of-experts rest),
    with how many blocks of each."""
    out = {}
    for prefix, sub in [("", config)] + [(f"{s}.", getattr(config, s, None)) for s in SUB_CONFIGS]:
        if sub is None:
            continue
        key = next((k for k in DEPTH_KEYS if isinstance(getattr(sub, k, None), int)), None)
        if key:
            kinds = _kinds(sub, getattr(sub, key))
            out |= {prefix + key + (f"@{k}" if len(kinds) > 1 else ""): n for k, n in kinds.items()}
            units = _expert_units(sub)
            if units:
                out[prefix + EXPERTS] = units
    if not out:
        raise ValueError("the config names no number of layers (num_hidden_layers, n_layer, num_layers)")
    return out


def _expert_units(config) -> int | None:
    """A mixture's experts as a knob like depth: E experts of which each token picks k are g = gcd(E, k)
    units of E/g experts picking k/g, and every expert's bytes and FLOPs (its weights, its routed tokens, its
    share of the router) scale with the units at a fixed number of tokens per expert; traced at 1 and 2
    units, evaluated at g, as blocks are (tests/measuring/tracer/test_menu.py checks it against a trace of all of
    them). Worth a knob past 2 units (Qwen3's 128 experts picking 8: 8 units of 16); None otherwise, and for
    routing in groups of experts (DeepSeek's n_group), which no unit divides."""
    experts = next((getattr(config, k) for k in MOE_KEYS if isinstance(getattr(config, k, None), int)), None)
    picks = getattr(config, "num_experts_per_tok", None)
    grouped = getattr(config, "n_group", None)
    if not (isinstance(experts, int) and isinstance(picks, int) and experts > 1 and picks > 0):
        return None
    if isinstance(grouped, int) and grouped > 1:
        return None
    units = math.gcd(experts, picks)
    return units if units > 2 else None


def _kinds(config, depth: int) -> dict[str, int]:
    """Blocks of a stack by kind, in the order the kinds first appear."""
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and len(types) >= depth:
        kinds: dict[str, int] = {}
        for t in types[:depth]:
            kinds[t] = kinds.get(t, 0) + 1
        return kinds
    dense = getattr(config, "first_k_dense_replace", None)
    if isinstance(dense, int) and 0 < dense < depth:
        return {"dense": dense, "moe": depth - dense}
    return {"all": depth}


def at_depth(config, depths: dict[str, int]):
    """A copy of the config with each stack (and each kind of block in it) at the given depth; per-layer
    lists rebuilt to match."""
    config = copy.deepcopy(config)
    stacks: dict[str, dict[str, int]] = {}
    for knob, depth in depths.items():
        if knob.rpartition(".")[2] == EXPERTS:
            _with_units(config if "." not in knob else getattr(config, knob.split(".")[0]), depth)
            continue
        stack, _, kind = knob.partition("@")
        stacks.setdefault(stack, {})[kind or "all"] = depth
    for stack, kinds in stacks.items():
        owner, key = (
            (config, stack)
            if "." not in stack
            else (getattr(config, stack.split(".")[0]), stack.split(".")[1])
        )
        total = sum(kinds.values())
        setattr(owner, key, total)
        if isinstance(getattr(owner, "layer_types", None), list):
            owner.layer_types = (
                owner.layer_types[:total]
                if set(kinds) == {"all"}
                else [k for k, n in kinds.items() for _ in range(n)]
            )
        if "dense" in kinds:
            owner.first_k_dense_replace = kinds["dense"]
    return config


def _with_units(owner, units: int) -> None:
    """A mixture's experts and picks at `units` of its expert units (_expert_units), in place."""
    full = _expert_units(owner)
    key = next(k for k in MOE_KEYS if isinstance(getattr(owner, k, None), int))
    setattr(owner, key, getattr(owner, key) // full * units)
    owner.num_experts_per_tok = owner.num_experts_per_tok // full * units


# --- the model under fake tensors --------------------------------------------------------------------------


@contextmanager
def fake_tensors(experts: bool = False):
    """A fake-tensor session: (mode, input values; `experts`: a mixture's routing spread evenly). Transformers treats FakeTensors as tracing and then
    takes branches a real run never takes (materialized attention masks instead of is_causal); here the
    fakes stand for real tensors and InputValues supplies the values those branches read, so transformers
    is told they are not fake."""
    mode = FakeTensorMode()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' notices about a config ("loss_type=None ..."): not news
    try:
        with mock.patch.object(import_utils, "is_fake_tensor", lambda x: False), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # libraries' deprecation notices about their own calls
            yield mode, InputValues(mode, experts)
    finally:
        hf_logging.set_verbosity(verbosity)


@contextmanager
def cuda_kernels(spec: Spec):
    """What CUDA runs, for a trace on the CPU. Attention: FlashAttention for fp16/bf16 without a mask,
    grouped-query attention included; otherwise the memory-efficient kernel, which takes masks and fp32 but
    not grouped-query attention; otherwise the math kernel, which materializes the seq x seq scores.
    Transformers asks for grouped-query attention whenever there is no mask, so an fp32 step of a GQA model
    (Llama's 8 KV heads) gets the math kernel on CUDA: 21 % more memory on Llama-3.2-1B, measured on an H200.
    Dropout: CUDA's fused kernel keeps a bool mask, the CPU's a mask in the input's dtype."""
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

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        return torch.native_dropout(input, p, True)[0]

    with (
        mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa),
        mock.patch.object(torch.nn.functional, "dropout", dropout),
    ):
        yield


def build(spec: Spec, config, mode, checkpointing: str | None = None, mesh=None, frozen: bool = False):
    """The model under fake tensors, weights uninitialised (their values never matter), quantized and adapted
    as the spec says, with the checkpointing asked for ('full', 'selective' or None), in train mode, as the
    method's trainer prepares it; with a device mesh, built on the meta device and sharded as FSDP2
    (advisor/measuring/tracer/fsdp.py), then materialized. `frozen`: DPO's reference model (the policy's
    weights as loaded, quantized under QLoRA, no adapter, nothing trains, in eval mode)."""
    weights, half = precision(spec)
    # from_config keeps the object, and checkpointing changes it: never share one
    config = configured(spec, copy.deepcopy(config))
    kwargs = experts_of(spec, config, sharded=mesh is not None)
    meta = _on_meta() if mesh is not None else nullcontext()
    with mode, meta, mock.patch.object(PreTrainedModel, "initialize_weights", lambda self: None):
        try:
            model = from_config(
                model_class(spec), config, dtype=weights, attn_implementation=spec.attention, **kwargs
            )
        except (ValueError, ImportError):  # an architecture without SDPA support: its eager attention
            model = from_config(
                model_class(spec), config, dtype=weights, attn_implementation="eager", **kwargs
            )
    if spec.adapter.kind == "qlora":
        quantize(model, spec.adapter.base_bits, half or weights, mode)
    if frozen:
        prepare_reference(model)
    else:
        if checkpointing:
            enable_checkpointing(model, selective=checkpointing == "selective")
        if spec.adapter.kind != "full":
            model = adapted(model, spec.adapter, spec.dtype, mode)
        prepare(spec, model)
    if mesh is not None:
        with mode:
            shard(model, mesh, spec.dtype)
            model.to_empty(device="cpu")
    if not frozen:
        model.train()
    return model


@contextmanager
def _on_meta():
    """The meta device inside fake tensors, for a model FSDP shards before it is materialized. A constant a
    model makes from a Python number (Gemma's `torch.tensor(embed_scale)` buffer) is a meta tensor there that
    a CPU-only build does not lift into the fake mode (it lifts CPU tensors only): let the mode take it in,
    for the model's construction alone."""
    fake_tensor_tls.allow_non_fake_inputs_override = True
    try:
        with torch.device("meta"):
            yield
    finally:
        fake_tensor_tls.allow_non_fake_inputs_override = None


def experts_of(spec: Spec, config, sharded: bool = False) -> dict:
    """How a mixture's experts run (from_config's keyword; none for a dense model): grouped GEMM, transformers'
    default, where they compute in bf16 (its kernel takes bf16 alone: pure bf16, an adapter's bf16 base, FSDP's
    bf16 gathers), else the eager loop over experts (the printed code asks for it then: rules/fit.toml [moe])."""
    if not _has_experts(config):
        return {}
    weights, _ = precision(spec)
    bf16 = weights == torch.bfloat16 or (sharded and spec.dtype == "bf16-mixed")
    return {"experts_implementation": "grouped_mm" if bf16 else "eager"}


def _has_experts(config) -> bool:
    subs = [config] + [getattr(config, s, None) for s in SUB_CONFIGS]
    return any(
        isinstance(getattr(c, k, None), int) and getattr(c, k) > 1
        for c in subs
        if c is not None
        for k in MOE_KEYS
    )


def autocast(spec: Spec):
    _, half = precision(spec)
    if half is not None:
        return torch.autocast("cpu", dtype=half)  # traced on the CPU: CPU autocast's op lists
    return ExitStack()


def kernels(spec: Spec):
    """CUDA's kernels a trace decomposes to see their temporaries and FLOPs: bitsandbytes' 4-bit product as
    CUDA computes it for training-sized inputs. Entered inside the counters, which then see its parts."""
    return (
        Gemm4bitDecomposed() if spec.adapter.kind == "qlora" and spec.adapter.base_bits == 4 else ExitStack()
    )


# --- traces ---------------------------------------------------------------------------------------------


@dataclass
class Trace:
    """What one traced configuration (depth point, batch) gave: live bytes by category after every op of
    each phase, FLOPs, size."""

    timeline: dict[str, list[tuple[str, tuple[int, ...]]]]  # phase -> (op, bytes by category) per op
    flops: int = 0  # of one micro-batch's forward and backward
    n_params: int = 0  # the model's parameters (a quantized base counted unquantized; adapters not counted)
    trainable: int = 0  # what the optimizer updates
    attention: str = ""
    inputs: int = 0  # bytes of one micro-batch's inputs
    param_bytes: int = 0  # the weights (and a quantized base's state) as held
    grad_bytes: int = 0  # the gradients of what trains, as held
    structure: dict = field(default_factory=dict)  # hidden size, largest module, root parameters
    graded: frozenset[str] = frozenset()  # the parameters that got a gradient (a VLM's unused tower does not)
    reference_bytes: int = 0  # DPO's reference model, held through the step (its optimizer step included)


def trace_window(
    spec: Spec,
    config,
    batch_size: int,
    checkpointing,
    micro_batches: int = 2,
    sharded: bool = False,
    warm_up=None,
    derived: bool = True,
) -> Trace:
    """Forward and backward of two micro-batches at one batch size (trace_windows)."""
    return trace_windows(
        spec, config, (batch_size,), checkpointing, micro_batches, sharded, warm_up, derived
    )[batch_size]


def trace_windows(
    spec: Spec,
    config,
    batch_sizes: tuple[int, ...],
    checkpointing,
    micro_batches: int = 2,
    sharded: bool = False,
    warm_up=None,
    derived: bool = True,
) -> dict[int, Trace]:
    """Forward and backward of two micro-batches, gradients accumulating (none before the first); one where
    no accumulation is asked; at each batch size, on one model built once (its gradients dropped between
    them, as a zero_grad does). `checkpointing`: 'full', 'selective' or None (True means 'full'). `sharded`:
    one rank of FSDP2 at TRACED_WORLD ranks; `warm_up`, a config (the model at its shallowest), is stepped
    first unless this process traced the same ops before (DTensor's sharding propagation is cached
    process-wide, by op and shapes, which no block count changes). `derived`: the second micro-batch made
    from the first (`accumulating`), not traced: equal op by op in one process; an FSDP rank's (each
    micro-batch's gradients reduce-scattered into its shard) runs a few ops more (FSDP's first-forward set-up,
    the shards' accumulation) and equals a traced one in every phase's peak at any batch."""
    checkpointing = "full" if checkpointing is True else checkpointing or None
    derive = derived and micro_batches == 2
    out = {}
    with (
        fake_group() if sharded else nullcontext() as mesh,
        fake_tensors(_has_experts(config)) as (mode, values),
    ):
        if sharded and warm_up is not None:
            real = batch_of(spec, config, batch_sizes[0])
            _warm_up(spec, build(spec, warm_up, mode, checkpointing, mesh), real, mode, values)
        model = build(spec, config, mode, checkpointing, mesh)
        reference = _reference(spec, config, mode, mesh)
        for batch_size in batch_sizes:  # one model serves each: checked equal to one built for each, op by op
            for p in model.parameters():
                p.grad = None
            real = batch_of(spec, config, batch_size)
            tracker = ShardedLiveBytes if sharded else LiveBytes
            live = tracker(timeline=True, flops=True, values=values)  # the input values' work done in it
            handles = live.track_module(model)
            if reference is not None:
                live.track_module(reference, gradients=False)
            flops = []
            with mode, live, kernels(spec), cuda_kernels(spec), trl_kernels(spec):
                for i in range(1 if derive else micro_batches):
                    batch = {k: values.add(mode.from_tensor(v), v) for k, v in real.items()}
                    for t in batch.values():
                        live.track(t, "activations")
                    if i == 0 and spec.method.kind == "grpo":
                        batch |= rollout(spec, model, reference, batch, live.start, lambda: autocast(spec))
                        live.flops = 0  # the generation's FLOPs are not the training step's
                    live.start(f"forward{i}")
                    with autocast(spec) if not sharded else nullcontext():  # FSDP casts by its policy
                        loss = step_loss(
                            spec, model, reference, batch, lambda p, i=i, live=live: live.start(f"{p}{i}")
                        )
                    live.start(f"backward{i}")
                    loss.backward()
                    del loss, batch
                    flops.append(live.flops)
                live.start("done")
            for h in handles:
                h.remove()
            out[batch_size] = _traced(spec, config, model, live, real, flops[0], derive)
            if reference is not None:
                out[batch_size] = replace(out[batch_size], reference_bytes=_held_bytes(reference))
    return out


def _traced(spec: Spec, config, model, live: LiveBytes, real: dict, flops: int, derive: bool) -> Trace:
    """What a window gave (its model as the window left it: its gradients held)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    adapters = sum(p.numel() for p in trainable) if spec.adapter.kind != "full" else 0
    # what trains is what gets a gradient: a text-only step leaves a VLM's vision tower without one, and the
    # optimizer keeps no state for it
    graded = {n: p for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}
    structure = {
        "hidden": _hidden(config),
        "largest_module": largest_module(model),
        "root": root_parameters(model) if blocks(model) else 0,
    }
    timeline = {p: t for p, t in live.timeline.items() if p.startswith(PHASES) or p in ONCE}
    if derive:
        timeline |= accumulating(timeline, live.timeline["done"][0][1])
    return Trace(
        timeline,
        flops,
        _parameters(model) - adapters,  # the model's own: an adapter's are `trainable`
        sum(p.numel() for p in graded.values()),
        model.config._attn_implementation,
        sum(v.untyped_storage().nbytes() for v in real.values()),
        live.now["parameters"],
        sum(p.numel() * p.element_size() for p in graded.values()),
        structure,
        frozenset(graded),
    )


def accumulating(first: dict, after: tuple[int, ...]) -> dict:
    """An accumulation window's second micro-batch from its first (`first`: forward0's and backward0's live
    bytes op by op; `after`: the bytes once its backward is done). It runs the same ops on tensors of the same
    sizes, with the first micro-batch's gradients alive throughout: forward1 is forward0 with them held, and
    backward1 is backward0 with them held whole (each new gradient is added into its own and freed where the
    first micro-batch's became it: a temporary either way until then). Derived rather than traced, it halves
    a window's cost; tests/measuring/tracer/test_prediction.py checks it equal to a traced second micro-batch, op by op."""
    g = CATEGORIES.index("gradients")
    held = after[g]

    def holding(entries):
        return [(op, (*v[:g], held, *v[g + 1 :])) for op, v in entries]

    return {p[:-1] + "1": holding(t) for p, t in first.items() if p.endswith("0")}


def _warm_up(spec: Spec, model, real: dict, mode, values) -> None:
    """One forward and backward of a shallow copy before a sharded trace: DTensor's sharding-propagation
    cache filled (a cold one counts phantom temporaries) at a quarter of the traced depth's cost."""
    with mode, values, kernels(spec), cuda_kernels(spec), trl_kernels(spec):
        batch = {k: values.add(mode.from_tensor(v), v) for k, v in real.items()}
        step_loss(spec, model, model, batch, lambda phase: None).backward()


def _held_bytes(module) -> int:
    """Bytes a module's parameters and buffers hold (a DTensor's: its local shard)."""
    tensors = [*module.parameters(), *module.buffers()]
    local = [getattr(t, "_local_tensor", t) for t in tensors]
    return sum(t.untyped_storage().nbytes() for t in {id(t): t for t in local}.values())


def _reference(spec: Spec, config, mode, mesh):
    """DPO's (GRPO's) reference model where it is one of its own (`reference = "model"`), sharded as the
    policy is (TRL prepares it with the same FSDP or ZeRO-3 plugin); None otherwise."""
    if spec.method.reference != "model":
        return None
    return build(spec, config, mode, None, mesh, frozen=True)


def _hidden(config) -> int:
    text = getattr(config, "text_config", None) or config
    return next(
        (
            getattr(text, k)
            for k in ("hidden_size", "n_embd", "d_model")
            if isinstance(getattr(text, k, None), int)
        ),
        0,
    )


def _parameters(model) -> int:
    """Parameters as the model has them unquantized (a 4-bit weight's storage holds two per byte)."""
    total = 0
    for p in model.parameters():
        shape = getattr(getattr(p, "quant_state", None), "shape", None)
        total += shape.numel() if shape is not None else p.numel()
    return total


def trace_optimizers(
    spec: Spec, config, names: list[str], fit_rules: dict | None = None, graded: frozenset | None = None
) -> dict[str, dict]:
    """Two steps of each optimizer on fake gradients of what trains (one model, a fresh optimizer each): the
    bytes by category at the second step's peak ("peak"), the bytes its ops read and write ("traffic"), and
    the state a paged optimizer keeps in unified memory ("paged"). torchao's compiled step cannot run on fake
    tensors: its state is traced (eagerly), its temporaries are rules/fit.toml's. `graded`: the names of the
    parameters a window gave a gradient (None: every trainable one); an optimizer skips the others."""
    out = {}
    with fake_tensors() as (mode, _):
        model = build(spec, config, mode)
        with mode:
            params = [
                p for n, p in model.named_parameters() if p.requires_grad and (graded is None or n in graded)
            ]
            for p in params:
                p.grad = torch.zeros_like(p)
        for name in names:
            out[name] = _trace_optimizer(spec, model, params, name, mode, fit_rules or {})
    return out


def _trace_optimizer(spec: Spec, model, params, name: str, mode, fit_rules: dict) -> dict:
    if missing_package(name):
        raise FitError(f"{name} needs {missing_package(name)}: pip install 'advisor[measure]'.")
    modelled = fit_rules.get("optimizers", {}).get(name, {}).get("temporaries_per_element")
    with traceable(name, mode, update=modelled is None):
        with mode:
            optimizer = make_optimizer(
                name, params, TRACE_LR, cuda_defaults=spec.device == "cuda", model=model
            )
        live = LiveBytes()
        live.track_module(model, gradients=False)
        for p in params:
            live.track(p.grad, "gradients")
        traffic = OpTraffic()
        steps = 1 if modelled is not None else 2  # a modelled step needs only the state the first one makes
        with mode, ScalarOracle(), live:
            for step in range(steps):
                live.start(f"step{step}")
                with traffic if step == 1 else ExitStack():
                    optimizer.step()
                live.track_optimizer(optimizer)
            live.start("done")
    peak, moved = dict(live.peaks[f"step{steps - 1}"][1]), traffic.total
    if modelled is not None:  # a compiled step: its state once made, its scratch per element of its largest
        peak = dict(live.now)  # quantized tensor, and one pass over its tensors
        peak["temporaries"] = modelled * torchao_largest_quantized(optimizer)
        weights = sum(p.numel() * p.element_size() for p in params)
        moved = (
            3 * weights + 2 * peak["optimizer_state"]
        )  # weights and state read and written, gradients read
    paged = (
        paged_state_bytes(optimizer) if spec.device == "cuda" else 0
    )  # on a CPU, host memory is the device's
    return {"peak": peak, "traffic": moved, "paged": paged}


def parameter_count(spec: Spec) -> int:
    """The model's parameters, counted on fake models at depth 1 and 2 and extrapolated (exact: every
    block of a kind has the same parameters)."""
    knobs = depth_knobs(spec.config)
    counts = {}
    for d in depth_points(knobs):
        with fake_tensors() as (mode, _):
            model = build(spec, at_depth(spec.config, dict(zip(knobs, d, strict=True))), mode)
            counts[d] = _parameters(model)
    return extrapolate_depth(counts, knobs)


# --- payloads ------------------------------------------------------------------------------------------------


class Tracer:
    """The traces a question needs, each made once: windows by (spec, depth, batch, checkpointing, sharded),
    optimizer steps by (spec, depth), then the payload of every (optimizer, strategy[, offload])."""

    def __init__(self, spec: Spec, fit_rules: dict | None = None):
        self.spec, self.fit_rules = spec, fit_rules or {}
        self.knobs = depth_knobs(spec.config)
        self._configs: dict = {}
        self._windows: dict = {}
        self._steps: dict = {}
        self._graded: dict = {}  # (adapter, images) -> names of the parameters the windows gave a gradient
        self._extra: dict = {}  # a dormant block's held bytes and parameters (_held)
        self._largest: dict = {}  # adapter -> the largest module with every expert (_largest_module)

    def points(self, sharded: bool = False) -> list[tuple[int, ...]]:
        """Depth points: 1 and 2 blocks of each stack; a sharded trace's deeper ones (advisor/measuring/tracer/fsdp.py)."""
        return sharded_points(self.knobs) if sharded else depth_points(self.knobs)

    def config(self, point) -> object:
        if point not in self._configs:
            self._configs[point] = at_depth(self.spec.config, dict(zip(self.knobs, point, strict=True)))
        return self._configs[point]

    @staticmethod
    def _key(spec: Spec) -> tuple:
        """What tells specs of one model apart (its config is the tracer's own)."""
        return (
            spec.dtype,
            spec.device,
            spec.adapter,
            spec.attention,
            spec.seq_len,
            spec.image_size,
            spec.images,
            spec.method,
        )

    def window(
        self, spec: Spec, point, batch: int, checkpointing: str | None, micro_batches: int = 2, sharded=False
    ) -> Trace:
        """A traced window, of `micro_batches` or more (two serve where one is asked; a second micro-batch
        costs nothing: it is derived)."""
        micro_batches = 2
        key = (self._key(spec), point, batch, checkpointing, sharded)
        for n in range(micro_batches, 3):
            if (*key, n) in self._windows:
                return self._windows[(*key, n)]
        below = self._dormant(point, sharded)
        if below is not None:  # a stack the step never runs, one block deeper: its parameters alone added
            base = self.window(spec, below, batch, checkpointing, micro_batches, sharded)
            held, count = self._held(spec, point, below, sharded)
            return replace(
                base,
                timeline={p: _with_parameters(t, held) for p, t in base.timeline.items()},
                n_params=base.n_params + count,
                param_bytes=base.param_bytes + held,
            )
        warm = any(k[0] == key[0] and k[3:5] == key[3:] for k in self._windows)  # another depth's
        shallow = None if warm or not sharded else self.config(depth_points(self.knobs)[0])
        # every batch a payload reads, on one model (an FSDP rank's model one per batch: its first forward
        # initializes FSDP's state, which a window at another batch would then skip)
        sizes = (batch,) if sharded else tuple(dict.fromkeys((batch, *BATCHES)))
        traced = trace_windows(
            spec, self.config(point), sizes, checkpointing, micro_batches, sharded, shallow
        )
        graded = self._graded.setdefault((spec.adapter, spec.images), set())
        for size, trace in traced.items():
            self._windows[(self._key(spec), point, size, checkpointing, sharded, micro_batches)] = trace
            graded |= trace.graded  # a deeper point's names hold a shallower one's
        return traced[batch]

    def _largest_module(self, spec: Spec) -> int:
        """The most parameters one module holds (DeepSpeed's L) with every expert: the traced points hold a
        unit of them, and a mixture's experts are its largest module."""
        if spec.adapter not in self._largest:
            depths = {k: full if k.rpartition(".")[2] == EXPERTS else 1 for k, full in self.knobs.items()}
            with fake_tensors() as (mode, _):
                self._largest[spec.adapter] = largest_module(
                    build(spec, at_depth(self.spec.config, depths), mode)
                )
        return self._largest[spec.adapter]

    def _dormant(self, point, sharded: bool) -> tuple | None:
        """The point below this one, where it raises only a stack the step never runs (a VLM's vision tower on
        text alone: its blocks hold parameters and nothing else); None: a point to trace."""
        base = self.points(sharded)[0]
        if self.spec.images or point == base:
            return None
        raised = [i for i, (p, b) in enumerate(zip(point, base, strict=True)) if p != b]
        if all(list(self.knobs)[i].startswith("vision_config.") for i in raised):
            return base
        return None

    def _held(self, spec: Spec, point, below, sharded: bool) -> tuple[int, int]:
        """(bytes, parameters of the model's own) that the model at `point` holds beyond the one at `below`
        (a dormant stack's block and its adapters), each model built once under fake tensors."""
        key = (spec.dtype, spec.adapter, point, below, sharded)
        if key not in self._extra:
            held = []
            for at in (point, below):
                with fake_group() if sharded else nullcontext() as mesh, fake_tensors() as (mode, _):
                    model = build(spec, self.config(at), mode, None, mesh)
                    live = LiveBytes()
                    live.track_module(model, gradients=False)
                    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
                    own = _parameters(model) - (trained if spec.adapter.kind != "full" else 0)
                    held.append((live.now["parameters"], own))
            self._extra[key] = (held[0][0] - held[1][0], held[0][1] - held[1][1])
        return self._extra[key]

    def steps(self, spec: Spec, point, names: list[str]) -> dict[str, dict]:
        """Each optimizer's step at a depth point: traced at 1 and 2 blocks, affine in depth beyond (a sharded
        trace's deeper points: the step's bytes and traffic are sums over tensors, or the largest one's)."""
        singles = depth_points(self.knobs)
        if point not in singles:
            by_point = {d: self.steps(spec, d, names) for d in singles}
            return {n: _affine({d: by_point[d][n] for d in singles}, point, self.knobs) for n in names}
        below = self._dormant(point, sharded=False)
        if below is not None:  # the dormant block's parameters take no step: they get no gradient
            held, _ = self._held(spec, point, below, False)
            base = self.steps(spec, below, names)
            return {
                n: {**st, "peak": {**st["peak"], "parameters": st["peak"]["parameters"] + held}}
                for n, st in base.items()
            }
        key = self._key(spec)
        todo = [n for n in names if (key, point, n) not in self._steps]
        if todo:
            graded = self._graded.get((spec.adapter, spec.images))
            graded = frozenset(graded) if graded else None  # no window yet: every trainable parameter
            traced_steps = trace_optimizers(spec, self.config(point), todo, self.fit_rules, graded)
            for n, traced in traced_steps.items():
                self._steps[(key, point, n)] = traced
        return {n: self._steps[(key, point, n)] for n in names}

    def payloads(
        self, spec: Spec, optimizers: list[str], strategies: list[str], offload: bool = False, sharded=False
    ) -> dict:
        """(optimizer, strategy) -> payload. Offloaded: the device runs the half-precision window without the
        optimizer's state, which (with the fp32 master weights and gradients) is counted on the host. Sharded:
        one rank of FSDP2 at TRACED_WORLD ranks; its optimizer step is the single-process step over a shard."""
        device_spec = replace(spec, dtype=HALF[spec.dtype]) if offload else spec
        points = self.points(sharded)
        windows = {}  # first: the optimizer's step needs to know which parameters get a gradient
        for ckpt in sorted({checkpointing_of(s) for s in strategies}, key=str):
            asked = [s for s in strategies if checkpointing_of(s) == ckpt]
            micro = 2 if any(s.endswith("accumulation") for s in asked) else 1
            windows[ckpt] = (
                asked,
                {
                    (d, b): self.window(device_spec, d, b, ckpt, micro, sharded)
                    for d in points
                    for b in BATCHES
                },
            )
        steps = {d: self.steps(spec, d, optimizers) for d in points}
        if sharded:
            steps = {d: {n: _over_shard(st) for n, st in by.items()} for d, by in steps.items()}
        first = next(iter(windows.values()))[1]
        steps = {d: _with_reference(by, first[(d, BATCHES[0])].reference_bytes) for d, by in steps.items()}
        out = {}
        for asked, traces in windows.values():
            lines = {d: _window_lines(traces[(d, BATCHES[0])], traces[(d, BATCHES[1])]) for d in points}
            common = self._common(device_spec, traces, points, sharded)
            for strategy in asked:
                micro = (0, 1) if strategy.endswith("accumulation") else (0,)
                names = [p for p in ONCE if p in lines[points[0]]]
                names += [f"{p}{i}" for i in micro for p in PHASES if f"{p}{i}" in lines[points[0]]]
                for name in optimizers:
                    by_point = {d: steps[d][name] for d in points}
                    out[(name, strategy)] = self._payload(
                        common, lines, names, by_point, traces, offload, points
                    )
        return out

    def _common(self, spec: Spec, traces: dict, points: list, sharded: bool) -> dict:
        one, two = BATCHES
        first = traces[(points[0], one)]
        structure = dict(first.structure)
        if any(k.rpartition(".")[2] == EXPERTS for k in self.knobs):  # traced on a unit of the experts
            structure["largest_module"] = self._largest_module(spec)
        out = {
            "engine": ENGINE_VERSION,
            "depth": self.knobs,
            "knobs": list(self.knobs),  # the order of the points' depths (a stored payload's keys are sorted)
            "points": [list(d) for d in points],
            "n_params": [traces[(d, one)].n_params for d in points],
            "trainable": [traces[(d, one)].trainable for d in points],
            "attention": first.attention,
            "experts": _has_experts(self.spec.config),
            "flops": [line(traces[(d, one)].flops, traces[(d, two)].flops) for d in points],
            "inputs": line(first.inputs, traces[(points[0], two)].inputs),
            "structure": structure,
            "grad_bytes_per_param": first.grad_bytes / max(first.trainable, 1),
        }
        if sharded:
            out["sharded"] = {"world": TRACED_WORLD}  # grad_bytes counts a DTensor's global size already
        return out

    def _payload(self, common, lines, names, steps, traces, offload: bool, points) -> dict:
        one = BATCHES[0]
        traffic = [steps[d]["traffic"] for d in points]
        if offload:  # the device holds no optimizer state; the step is the host's
            device_steps = {d: _offloaded_step(traces[(d, one)]) for d in points}
            host = [_host_bytes(steps[d], traces[(d, one)].trainable) for d in points]
            payload = {
                **common,
                "optimizer_traffic": [0] * len(points),
                "host": host,
                "host_traffic": traffic,
            }
        else:
            device_steps = {d: _on_device(steps[d]) for d in points}
            payload = {**common, "optimizer_traffic": traffic, "host": [steps[d]["paged"] for d in points]}
        payload["phases"] = {
            **{p: [_with_state(lines[d][p], device_steps[d]) for d in points] for p in names},
            "optimizer_step": [[_step_line(device_steps[d], common["inputs"])] for d in points],
        }
        return payload


def _with_reference(steps: dict[str, dict], held: int) -> dict[str, dict]:
    """Each optimizer's step with DPO's reference model held beside it (nothing to add without one)."""
    if not held:
        return steps
    return {
        n: {**st, "peak": {**st["peak"], "parameters": st["peak"]["parameters"] + held}}
        for n, st in steps.items()
    }


def _with_parameters(entries: list, held: int) -> list:
    """A phase's live bytes, op by op, with `held` more bytes of parameters throughout."""
    i = CATEGORIES.index("parameters")
    return [(op, (*v[:i], v[i] + held, *v[i + 1 :])) for op, v in entries]


def _affine(values: dict, point: tuple[int, ...], knobs: dict):
    """A step's figures (nested dicts of numbers) at a depth point, from the depth points at base 1 (step.py's
    combination, at any depth)."""
    weights = coefficients(knobs, [d - 1 for d in point])
    return _weighted(list(values.values()), weights)


def _weighted(values: list, weights: list):
    if isinstance(values[0], dict):
        return {k: _weighted([v[k] for v in values], weights) for k in values[0]}
    return sum(w * v for w, v in zip(weights, values, strict=True))


def _over_shard(step: dict) -> dict:
    """A single-process optimizer step over one rank's shard: every byte and its traffic / TRACED_WORLD (an
    elementwise update; `sharded` optimizers only, rules/optimizers.toml)."""
    peak = {c: v // TRACED_WORLD for c, v in step["peak"].items()}
    return {**step, "peak": peak, "traffic": step["traffic"] / TRACED_WORLD, "paged": 0}


def _on_device(step: dict) -> dict:
    """The step's bytes by category on the accelerator: a paged optimizer's unified memory is the host's to
    hold (the driver moves it there when the device runs out)."""
    peak = dict(step["peak"])
    peak["optimizer_state"] -= step["paged"]
    return peak


def _offloaded_step(window: Trace) -> dict:
    """The device at an offloaded step: the half-precision weights and gradients, nothing else."""
    return {**dict.fromkeys(CATEGORIES, 0), "parameters": window.param_bytes, "gradients": window.grad_bytes}


def _host_bytes(step: dict, trainable: int) -> int:
    """The host's bytes for an offloaded optimizer: its state, the fp32 master weights and fp32 gradients."""
    return step["peak"]["optimizer_state"] + 8 * trainable


def predict(
    spec: Spec, optimizers: list[str], strategies: list[str] = STRATEGIES, fit_rules: dict | None = None
) -> dict[tuple[str, str], dict]:
    """The prediction of every (optimizer, strategy): a payload the answer side evaluates at any batch size
    without torch (advisor/prediction/step.py): per phase and depth point, the lines of its peak in the batch."""
    return Tracer(spec, fit_rules).payloads(spec, list(optimizers), list(strategies))


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


# --- advisor fit's tracer ------------------------------------------------------------------------------------

# Loggers of libraries a trace imports and runs, whose notices are about the libraries, not the user's question:
# torchao's absent CUDA kernels on a CPU, bitsandbytes' `kernels` trust check when the Hub is offline, torch's
# notices of torchao's registrations, DeepSpeed's accelerator probe
NOISY = ("torchao", "bitsandbytes", "kernels", "deepspeed", "DeepSpeed", "torch.utils._pytree")
# Loggers that repeat, as a traceback, an error the trace then says in one sentence (FitError): fake tensors' log
# of a kernel that failed on a model's shapes (an odd head width, a partial rotary part the model ignores)
REPEATING = ("torch._subclasses.fake_tensor",)


@contextmanager
def quiet_libraries():
    """The libraries' notices (NOISY) kept off the user's terminal while a trace runs (errors still show); the
    loggers' levels restored after, the user's own process left as it was."""
    loggers = [logging.getLogger(name) for name in NOISY + REPEATING]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL if logger.name in REPEATING else logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# Imported before a trace with the Hugging Face hub off: bitsandbytes' CPU backend asks the Hub for a kernel as
# it is imported (`kernels.get_kernel`, with `kernels` installed, on a CPU with AVX512-BF16), and nothing
# bounds that wait; peft imports bitsandbytes. Offline, `kernels` takes a kernel from the cache or none.
HUB_ASKING = ("bitsandbytes", "peft")


@contextmanager
def hub_off():
    """The Hugging Face hub off for the block, then as it was: HF_HUB_OFFLINE (what huggingface_hub reads as
    it is first imported) and huggingface_hub's own flag (what it and `kernels`, which has no switch of its
    own, read at every call: a request raises at once instead of waiting)."""
    from huggingface_hub import constants

    env, flag = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], constants.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = flag
        if env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = env


def import_offline(names: tuple[str, ...] = HUB_ASKING) -> None:
    """Import the libraries a trace needs that ask the Hub as they are imported, with the hub off for the
    imports only (a trace reads no file from the network): before the workers fork, so they inherit them."""
    wanted = [name for name in names if name not in sys.modules and importlib.util.find_spec(name)]
    if not wanted:
        return
    with hub_off():
        for name in wanted:
            try:
                importlib.import_module(name)
            except Exception:  # a broken install fails where it is used, with that place's sentence
                pass


def trace(
    q: Question, configs: list[Config], rules: Rules, say=lambda line: None, workers: int | None = None
) -> dict[Config, dict]:
    """advisor fit's tracer: the payload of each configuration of a question, traced on the model's config
    (a reference model at its preset, a user's from its config.json as read); `say` hears one line a stage.
    The stages (an adapter, precision, offload and sharding each) run on `workers` cores (default: all;
    advisor/measuring/tracer/workers.py), the dearest first; each result is the same on any number."""
    try:
        model_cfg = model_config(q.model, rules)
    except (ValueError, KeyError, OSError) as e:
        raise FitError(f"transformers cannot build {q.model.name} from its config: {_first_line(e)}") from e
    base = Spec(
        model_cfg,
        family_of(q.model, rules),
        q.seq_len,
        q.image_size,
        "fp32",
        q.device,
        attention=q.traced_attention,
        images=q.image_size is not None or not text_first(q.model),
    )
    tracer = Tracer(base, rules.fit)
    tasks = sorted(_tasks(configs), key=lambda task: -_cost(tracer, task))
    run = next(_RUN_IDS)
    _RUNNING[run] = [(q, rules, base, tracer, task) for task in tasks]  # what forked workers inherit
    stages = sum(len(task) for task in tasks)
    say(f"tracing {q.model.name}: {len(configs)} configurations in {stages} stages (then cached)")
    out, done = {}, 0
    try:
        with quiet_libraries():
            import_offline()
            pieces = [(run, i) for i in range(len(tasks))]
            for _, traced, timings in unordered(_task, pieces, workers):
                out |= traced
                for (adapter, dtype, offload, sharding), group, seconds in timings:
                    done += 1
                    where = "" if sharding == "none" else f", {sharding}"
                    off = "" if offload == "none" else f", offload {offload}"
                    n_opt, n_strategies = len({c.optimizer for c in group}), len({c.strategy for c in group})
                    say(
                        f"[{done}/{stages}] {adapter} {dtype}{where}{off}: {n_opt} optimizers x "
                        f"{n_strategies} strategies, {seconds:.1f} s"
                    )
    finally:
        del _RUNNING[run]
    return out


# Each trace running in this process (several threads may trace at once): its id -> (question, rules, base
# spec, tracer, task) per task (a task: stages, each a stage key and its configurations); forked workers
# inherit it.
_RUNNING: dict[int, list] = {}
_RUN_IDS = itertools.count()


def _task(piece: tuple[int, int]) -> tuple[int, dict, list]:
    """One task of a running trace (`piece`: its run and index), its stages one after another in one process
    (they share windows): (the index, {configuration: payload}, (stage key, configurations, seconds) per
    stage); an error that says the model cannot be traced is a FitError, which crosses from a worker as is."""
    run, index = piece
    q, rules, base, tracer, task = _RUNNING[run][index]
    out, timings = {}, []
    for (adapter, dtype, offload, sharding), group in task:
        start = time.perf_counter()
        spec = replace(base, dtype=dtype, adapter=q.adapter_of(adapter), method=q.method_of(adapter))
        optimizers = sorted({c.optimizer for c in group}, key=list(rules.optimizers).index)
        strategies = sorted({c.strategy for c in group}, key=list(rules.strategies).index)
        try:
            traced = tracer.payloads(spec, optimizers, strategies, offload != "none", sharding == "fsdp")
        except InputError:
            raise
        except (
            ValueError,
            NotImplementedError,
            RuntimeError,
            TypeError,
            AttributeError,
            AssertionError,
            LookupError,
            ArithmeticError,
        ) as e:
            # AssertionError: what a library asserts of its inputs (torch's optimizers of their devices);
            # LookupError, ArithmeticError: a model's code on a config value its class let through (a name
            # ACT2FN lacks, a size that overflows)
            raise FitError(f"cannot trace a training step of {q.model.name}: {_first_line(e)}") from e
        out |= {c: traced[(c.optimizer, c.strategy)] for c in group}
        timings.append(((adapter, dtype, offload, sharding), group, time.perf_counter() - start))
    return index, out, timings


def _cost(tracer: Tracer, task) -> int:
    """A task's work, roughly: the blocks its windows trace (a sharded stage's points are deeper), each
    window once however many of its stages read it."""
    windows = {(sharding, checkpointing_of(c.strategy)) for (_, _, _, sharding), group in task for c in group}
    return sum(sum(sum(point) for point in tracer.points(sharded == "fsdp")) for sharded, _ in windows)


def _tasks(configs: list[Config]) -> list[list[tuple[tuple, list[Config]]]]:
    """The stages (an adapter, precision, offload and sharding each) in tasks of those that trace the same
    windows: an offloaded stage runs its precision's half on the device, the pure-bf16 stage's windows."""
    groups: dict[tuple, list[Config]] = {}
    for c in configs:
        groups.setdefault((c.adapter, c.dtype, c.offload, c.sharding), []).append(c)
    tasks: dict[tuple, list] = {}
    for key, group in groups.items():
        adapter, dtype, offload, sharding = key
        device = HALF.get(dtype, dtype) if offload != "none" else dtype
        tasks.setdefault((adapter, device, sharding), []).append((key, group))
    return list(tasks.values())


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
