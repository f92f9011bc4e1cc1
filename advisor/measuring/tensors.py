"""The peak of live tensor bytes in one real training step, by category: device-independent, what
`advisor fit` predicts, and what the memory metric ranks on a CPU (where RSS holds the interpreter, the
allocator's caches and every library's pages).

Measured with PyTorch's own tracker (torch.distributed._tools.mem_tracker.MemTracker, not advisor fit's
tracer: an independent check of it) on one extra step after the last epoch, the optimizer's state
already there, as in any step of training.
"""

from __future__ import annotations

from collections.abc import Callable

CATEGORIES = {  # MemTracker's categories -> the measures stored (GB, at the step's peak)
    "Parameter": "tensor_parameters_gb",
    "Gradient": "tensor_gradients_gb",
    "Optstate": "tensor_optimizer_gb",
    "Activation": "tensor_activations_gb",
}


def measured_step(model, optimizer, step: Callable[[Callable[[], None]], object]) -> dict[str, float]:
    """Run `step` (one training step, given a function to call before each micro-batch's forward) under
    MemTracker: the peak of live tensor bytes and its breakdown, and the activations live at the end of
    each forward (their most), in GB."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
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
    out = {"tensor_peak_gb": sum(d.get("Total", 0) for d in peak.values()) / 1e9}
    for category, name in CATEGORIES.items():
        out[name] = sum(d.get(category, 0) for d in peak.values()) / 1e9
    out["forward_activations_gb"] = held[0] / 1e9
    return out
