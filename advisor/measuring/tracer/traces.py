"""Traces: a forward/backward window of micro-batches at each batch size, live bytes by category after every
op, FLOPs, sizes (`Trace`); each optimizer's step on fake gradients; a model's parameters."""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field, replace

import torch

from advisor.errors import FitError
from advisor.measuring.recipe.optimizers import (
    make_optimizer,
    missing_package,
    paged_state_bytes,
    torchao_largest_quantized,
    traceable,
)
from advisor.measuring.tracer.fake_model import (
    _has_experts,
    autocast,
    build,
    cuda_kernels,
    fake_tensors,
    kernels,
)
from advisor.measuring.tracer.fsdp import blocks, fake_group, largest_module, root_parameters
from advisor.measuring.tracer.methods import batch_of, rollout, step_loss, trl_kernels
from advisor.measuring.tracer.spec import ONCE, PHASES, Spec, at_depth, depth_knobs
from advisor.measuring.tracer.tracing import LiveBytes, OpTraffic, ScalarOracle, ShardedLiveBytes
from advisor.prediction.step import CATEGORIES, depth_points, extrapolate_depth

TRACE_LR = 1e-3  # the rate never changes memory or FLOPs


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
