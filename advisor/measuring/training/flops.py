"""Model FLOPs of a training step and the rate the device could reach: what achieved FLOP/s and model
FLOPs utilization (MFU) are computed from.

Model FLOPs are 3x the forward's, counted by torch's FlopCounterMode on the cell's first micro-batch (the
backward takes twice the forward: PaLM's MFU convention; checkpointing's recomputed forward is not model
work and is not counted), scaled to each micro-batch by its positions (padding included: the hardware
computes it). The device's rate: the datasheet's dense peak for a GPU of rules/hardware.toml; on a CPU,
which no datasheet states, the best of a few dense matmuls, measured once per grid (the first cell measures
it; the grid hands it to the cells after, see `known_peak`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from advisor.measuring.recipe.strategies import autocast, to_device
from advisor.prediction import accelerators
from advisor.rules import Rules


@dataclass(frozen=True)
class DevicePeak:
    flops_per_s: float
    source: str  # where the rate comes from, for the run's record


def positions(batch: dict) -> int:
    """What a micro-batch computes over: its tokens (padding included) for text, else its samples."""
    ids = batch.get("input_ids")
    return int(ids.shape[0] * ids.shape[1]) if ids is not None else len(batch["labels"])


def forward_flops_per_position(model, family, batch: dict, device, dtype: str) -> float:
    """Forward FLOPs of one micro-batch, per position: counted on a forward without gradients."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter, autocast(device, dtype):
        family.summed_loss(model, to_device(batch, device))
    return counter.get_total_flops() / positions(batch)


def device_peak(device, dtype: str, rules: Rules) -> DevicePeak | None:
    """The dense FLOP/s the device could reach at the run's precision, and where that figure comes from."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        acc = accelerators.find(name, rules)
        tflops = accelerators.peak_tflops(acc, dtype) if acc else None
        return DevicePeak(tflops * 1e12, f"{acc.name} datasheet, rules/hardware.toml") if tflops else None
    return DevicePeak(
        matmul_rate(dtype), f"this CPU's best of {PEAK_REPEATS} dense matmuls (768x768), measured"
    )


# The best of many is a stable maximum (contention only ever slows a product down), so the peak's noise does
# not become noise in `mfu`. It costs ~0.2 s: once per grid, not per cell (issue 25).
PEAK_REPEATS = 20

Peaks = dict[tuple[str, str], DevicePeak]  # (device, dtype) -> its peak, as far as this grid measured


def known_peak(peaks: Peaks, device, dtype: str, rules: Rules) -> DevicePeak | None:
    """The device's peak at dtype: the one this grid already has, else measured now and kept in `peaks`."""
    key = (str(device), dtype)
    if key not in peaks:
        peak = device_peak(device, dtype, rules)
        if peak is None:
            return None
        peaks[key] = peak
    return peaks[key]


def matmul_rate(dtype: str, n: int = 768, repeats: int = PEAK_REPEATS) -> float:
    """FLOP/s of the best of `repeats` n×n dense matmuls on the CPU at the run's precision."""
    import torch

    kind = torch.bfloat16 if dtype == "bf16-mixed" else torch.float32
    a, b = torch.randn(n, n, dtype=kind), torch.randn(n, n, dtype=kind)
    a @ b  # warm the kernels
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best
