"""The peak of live tensor bytes in one real training step, by category: device-independent, what
`advisor fit` predicts, and what the memory metric ranks on a CPU (where RSS holds the interpreter, the
allocator's caches and every library's pages).

Measured with PyTorch's own tracker (torch.distributed._tools.mem_tracker.MemTracker, not advisor fit's
tracer: an independent check of it) on one extra step after the last epoch, the optimizer's state
already there, as in any step of training.
"""

from __future__ import annotations

from collections.abc import Callable

TOTAL = "Total"  # MemTracker's key of a snapshot's sum over categories
MEMTRACKER_MEASURES = {  # MemTracker's categories -> the measures stored (GB, at the step's peak)
    "Parameter": "tensor_parameters_gb",
    "Gradient": "tensor_gradients_gb",
    "Optstate": "tensor_optimizer_gb",
    "Activation": "tensor_activations_gb",
}


def measured_step(model, optimizer, step: Callable[[Callable[[], None]], object]) -> dict[str, float]:
    """Run `step` (one training step, given a function to call before each micro-batch's forward) under
    MemTracker: the peak of live tensor bytes and its breakdown, and the activations live at the end of
    each forward (their most), in GB."""
    tracker = _step_peak_tracker()
    tracker.track_external(model, optimizer)
    held = [0]

    def after_forward(module, args, output):
        current = tracker.get_tracker_snapshot("current")
        held[0] = max(held[0], sum(d.get("Activation", 0) for d in current.values()))

    hook = model.register_forward_hook(after_forward)
    try:
        with tracker:
            step(tracker.reset_mod_stats)  # its per-module stats take one forward at a time
    finally:
        hook.remove()
    peak = tracker.get_tracker_snapshot("peak")
    out = {"tensor_peak_gb": sum(d.get(TOTAL, 0) for d in peak.values()) / 1e9}
    for category, name in MEMTRACKER_MEASURES.items():
        out[name] = sum(d.get(category, 0) for d in peak.values()) / 1e9
    out["forward_activations_gb"] = held[0] / 1e9
    return out


class _NoHook:
    """A hook handle with nothing to remove (see StepPeakTracker)."""

    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _step_peak_tracker():
    """A MemTracker that keeps only the step's peak, over the whole model (what a run stores). MemTracker
    also keeps each module's own peak, which costs every operator a pass over all modules and a deep copy:
    10x to 100x a tiny model's step, most of a tiny grid cell's time (issue 25). Its other bookkeeping, the
    categories and the snapshot it returns, are MemTracker's own (tests/measure/test_tensors.py: the same
    figures as the stock tracker's)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepPeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state) -> None:  # noqa: ARG002 (which pass: per module only)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[TOTAL]:
                    self._peak_mem[dev] = snap[TOTAL]
                    self._peak_mem_snap[dev] = dict(snap)  # category -> bytes: a flat copy is a whole one

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # A frozen parameter (LoRA's base) gets no gradient, and torch's tracker would register a
            # gradient hook on it and raise ("cannot register a hook on a tensor that doesn't require
            # gradient"): a handle that removes nothing tells it the hook is there. Its bytes still count.
            for p in module.parameters():
                if not p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                    self._param_to_grad_hook_handles[p] = (_NO_HOOK, _NO_HOOK)
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    return StepPeakTracker()
