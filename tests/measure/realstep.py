"""A real training step on the CPU, measured two independent ways: the peak of live tensor bytes by
PyTorch's own tracker (`torch.distributed._tools.mem_tracker.MemTracker`, not ours, on real tensors), and
the peak the allocator held (tensors plus kernel scratch buffers). The truth `advisor fit`'s predictions
are checked against; shared by tests/measure/test_prediction.py and bench/fit_accuracy.py."""

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from measure.optimizers import make_optimizer
from measure.prediction import Spec, autocast, cuda_attention
from measure.strategies import enable_checkpointing, uses_checkpointing


@dataclass
class RealPeak:
    tensors: int  # peak live tensor bytes in the second step (MemTracker)
    allocator: int | None  # peak bytes the allocator held in the second step (profiler events), if asked


def real_step_peaks(
    spec: Spec,
    strategy: str,
    optimizers: list[str],
    batch: int,
    accumulation_steps: int = 4,
    allocator: bool = False,
) -> dict[str, RealPeak]:
    """A real training step as a Trainer takes it (zero the gradients, k micro-batches forward and backward
    with the model's own loss, one optimizer step), the optimizer's state already there; its peaks, for
    each optimizer in turn on one model.

    With `allocator`, the profiler records every allocation and free with its size from before the model
    is built, so the running sum of its events is the bytes the allocator held at each moment."""
    torch.manual_seed(0)
    profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True) if allocator else nullcontext()
    out, spans = {}, {}
    with profiler as prof:
        model = spec.family.model_class().from_config(
            spec.config, dtype=_param_dtype(spec), attn_implementation="sdpa"
        )
        if uses_checkpointing(strategy):
            enable_checkpointing(model)
        model.train()
        window = accumulation_steps if strategy.endswith("accumulation") else 1
        for name in optimizers:
            spans[name], out[name] = _measured_step(spec, model, name, batch, window)
    if allocator:
        out = {n: RealPeak(p.tensors, _allocator_peak(prof, *spans[n])) for n, p in out.items()}
    return out


def _measured_step(spec: Spec, model, optimizer: str, batch: int, window: int):
    from torch.distributed._tools.mem_tracker import MemTracker

    opt = make_optimizer(optimizer, model.parameters(), 1e-4, cuda_defaults=spec.device == "cuda")
    for p in model.parameters():  # the optimizer's state, as after an earlier step (random gradients:
        p.grad = torch.randn_like(p) * 1e-3  # zeros would make our CGD restart, a branch of its own)
    opt.step()
    start = time.time_ns()
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker, cuda_attention(spec):  # a CUDA prediction is checked against CUDA's kernel choice
        opt.zero_grad(set_to_none=True)
        for _ in range(window):
            tracker.reset_mod_stats()  # MemTracker's per-module stats take one forward at a time
            inputs = spec.family.fit_batch(spec.config, batch, spec.seq_len, spec.image_size)
            with autocast(spec):
                loss = model(**inputs).loss
            loss.backward()
            del loss
        opt.step()  # `inputs`, the last micro-batch, is still held here, as a training loop holds it
    span = (start, time.time_ns())
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    model.zero_grad(set_to_none=True)  # tensors are freed by reference counting: no collection needed
    return span, RealPeak(snapshot["Total"], None)


def _allocator_peak(prof, start: int, end: int) -> int:
    live = peak = 0
    for event in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if event.name() == "[memory]":
            live += event.nbytes()
            if start <= event.start_ns() <= end:
                peak = max(peak, live)
    return peak


def _param_dtype(spec: Spec):
    return torch.bfloat16 if spec.dtype == "bf16" else torch.float32
