"""A real training step on the CPU, measured two independent ways: the peak of live tensor bytes by
PyTorch's own tracker (`torch.distributed._tools.mem_tracker.MemTracker`, not ours, on real tensors), and
the peak the allocator held (tensors plus kernel scratch buffers). The truth `advisor fit`'s predictions
are checked against; shared by tests/measuring/tracer/test_prediction.py, tests/measuring/tracer/test_menu.py and
bench/fit_accuracy.py.

The model is built as a Trainer run builds it: at the spec's precision, with its attention, checkpointing,
and, for an adapter, peft's LoRA on a frozen base (QLoRA's base loaded quantized by transformers'
bitsandbytes integration from saved weights, as `from_pretrained` loads a user's)."""

import atexit
import copy
import shutil
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from advisor.measuring.model.adapters import Gemm4bitDecomposed, adapted
from advisor.measuring.recipe.optimizers import make_optimizer
from advisor.measuring.recipe.strategies import checkpointing_of, enable_checkpointing
from advisor.measuring.tracer.fake_model import _has_experts, autocast, cuda_kernels, experts_of
from advisor.measuring.tracer.methods import step_loss
from advisor.measuring.tracer.spec import Spec, precision

COMPILED = ("adamw_torch_8bit", "adamw_torch_4bit")  # torchao's steps: checked by the allocator's peak only
_SAVED: dict[str, Path] = {}  # config -> a folder of saved weights, for from_pretrained's quantized load


@dataclass
class RealPeak:
    tensors: int | None  # peak live tensor bytes in the second step (MemTracker; None for a compiled step)
    allocator: int | None  # peak bytes the allocator held in the second step (profiler events), if asked


class _NoHandle:
    def remove(self):
        pass


class FrozenOKMemTracker(MemTracker):
    """MemTracker's pre-forward hook registers a gradient hook on every parameter, which raises for a frozen
    one (a LoRA base): a placeholder entry makes it skip them."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        for p in module.parameters():
            if not p.requires_grad:
                self._param_to_grad_hook_handles.setdefault(p, (_NoHandle(), _NoHandle()))
        return super()._track_module_params_and_buffers(module, install_grad_hooks)


def real_model(spec: Spec, strategy: str):
    """The model a run trains, for real: full, LoRA or QLoRA at the spec's precision, attention and the
    strategy's checkpointing, in train mode."""
    weights, half = precision(spec)
    config = copy.deepcopy(spec.config)  # from_config keeps it, and checkpointing changes it
    if spec.adapter.kind == "qlora":
        model = _quantized(spec, half or weights)
    else:
        model = spec.family.model_class().from_config(
            config, dtype=weights, attn_implementation=spec.attention, **experts_of(spec, config)
        )  # a mixture's experts as traced (rules/fit.toml [moe])
    if checkpointing_of(strategy):
        enable_checkpointing(model, selective=checkpointing_of(strategy) == "selective")
    if spec.adapter.kind != "full":
        model = adapted(model, spec.adapter, spec.dtype)
    return model.train()


def _quantized(spec: Spec, compute: torch.dtype):
    """The base loaded quantized, as QLoRA's `BitsAndBytesConfig` loads it."""
    from transformers import BitsAndBytesConfig

    key = spec.config.to_json_string()
    if key not in _SAVED:
        folder = Path(tempfile.mkdtemp(prefix="advisor-qlora-"))
        spec.family.model_class().from_config(spec.config, dtype=compute).save_pretrained(folder)
        _SAVED[key] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # tens of MB a model, one per session
    quant = (
        BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute,
        )
        if spec.adapter.base_bits == 4
        else BitsAndBytesConfig(load_in_8bit=True)
    )
    return spec.family.model_class().from_pretrained(
        _SAVED[key],
        quantization_config=quant,
        device_map="cpu",
        dtype=compute,
        attn_implementation=spec.attention,
    )


def quant_state_tensors(model) -> list[torch.Tensor]:
    """The tensors of 4-bit weights' quantization states and 8-bit weights' scales: neither parameters nor
    buffers of the real modules, so MemTracker is handed them."""
    out = []

    def walk(state):
        out.extend(t for t in (state.absmax, state.code, state.offset) if isinstance(t, torch.Tensor))
        if state.state2 is not None:
            walk(state.state2)

    for module in model.modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "quant_state", None) is not None:
            walk(weight.quant_state)
        if isinstance(getattr(weight, "SCB", None), torch.Tensor):
            out.append(weight.SCB)
    return out


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
        model = real_model(spec, strategy)
        window = accumulation_steps if strategy.endswith("accumulation") else 1
        for name in optimizers:
            spans[name], out[name] = _measured_step(spec, model, name, batch, window)
    if allocator:
        out = {n: RealPeak(p.tensors, _allocator_peak(prof, *spans[n])) for n, p in out.items()}
    return out


def _measured_step(spec: Spec, model, optimizer: str, batch: int, window: int):
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, trainable, 1e-4, cuda_defaults=spec.device == "cuda", model=model)
    for p in trainable:  # the optimizer's state, as after an earlier step (random gradients: zeros
        p.grad = (torch.randn_like(p.float()) * 1e-3).to(p.dtype)  # would make our CGD restart)
    opt.step()
    start = time.time_ns()
    compiled = optimizer in COMPILED  # torch.compile compiles nothing under a dispatch mode: no MemTracker
    tracker = FrozenOKMemTracker() if not compiled else None
    if tracker is not None:
        tracker.track_external(model, opt, *quant_state_tensors(model))
    decomposed = (
        Gemm4bitDecomposed()
        if spec.adapter.kind == "qlora" and spec.adapter.base_bits == 4
        else nullcontext()
    )
    routing = EvenRouting() if _has_experts(spec.config) else nullcontext()
    with tracker or nullcontext(), decomposed, routing, cuda_kernels(spec):  # CUDA's kernels, as predicted
        opt.zero_grad(set_to_none=True)
        for _ in range(window):
            if tracker is not None:
                tracker.reset_mod_stats()  # MemTracker's per-module stats take one forward at a time
            inputs = spec.family.fit_batch(spec.config, batch, spec.seq_len, spec.image_size)
            with autocast(spec):
                loss = step_loss(spec, model, None, inputs, lambda phase: None)  # the model's own, or Liger's
            loss.backward()
            del loss
        opt.step()  # `inputs`, the last micro-batch, is still held here, as a training loop holds it
    span = (start, time.time_ns())
    model.zero_grad(set_to_none=True)  # tensors are freed by reference counting: no collection needed
    if tracker is None:
        return span, RealPeak(None, None)
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    return span, RealPeak(snapshot["Total"], None)


class EvenRouting(TorchDispatchMode):
    """A real router's top-k indices replaced by the trace's even spread (token t to experts (t·k + j) mod E,
    advisor.measuring.tracer.tracing.InputValues._routed): what is compared is the prediction at that routing, not one random
    router's imbalance."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.topk.default:
            _, indices = out
            experts, k = args[0].shape[-1], indices.shape[-1]
            rows = torch.arange(indices.numel() // k).unsqueeze(1) * k + torch.arange(k)
            with _disable_current_modes():
                indices.copy_(rows.remainder(experts).reshape(indices.shape))
        return out


def _allocator_peak(prof, start: int, end: int) -> int:
    live = peak = 0
    for event in sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns()):
        if event.name() == "[memory]":
            live += event.nbytes()
            if start <= event.start_ns() <= end:
                peak = max(peak, live)
    return peak
