"""What a cell's measurements become in the KB: one row per epoch (the `epochs` table) and the run-level
figures (the `metrics` table, named as the measures of rules/metrics.toml). NULL-free: what a machine
cannot measure is absent, never zero."""

from __future__ import annotations

import statistics


def epoch_row(epoch: int, losses: list[float], wall: float | None, warm: float, stats, gpu: dict) -> dict:
    """The `epochs` row of one epoch: its steps' mean loss, timing, and the monitor's window `stats`.

    gpu: peak allocated and reserved GB since the epoch began (empty on CPU)."""
    return {
        "epoch": epoch,
        "steps": len(losses),
        "loss": sum(losses) / len(losses),
        "wall_s": wall,
        "warmup_s": warm if epoch == 0 else None,
        "peak_rss_gb": stats.peak_rss_gb,
        "peak_gpu_allocated_gb": gpu.get("allocated"),
        "peak_gpu_reserved_gb": gpu.get("reserved"),
        "gpu_device_mem_gb": stats.gpu_mem_gb,
        "gpu_util": stats.gpu_util,
        "cpu_util": stats.cpu_util,
        "energy_j": stats.energy_j,
    }


# measure name, epochs column, aggregate over epochs, unit
PER_EPOCH = (
    ("peak_rss_gb", "peak_rss_gb", max, "GB"),
    ("gpu_mem_peak_gb", "peak_gpu_allocated_gb", max, "GB"),
    ("gpu_mem_reserved_gb", "peak_gpu_reserved_gb", max, "GB"),
    ("gpu_device_mem_gb", "gpu_device_mem_gb", max, "GB"),
    ("gpu_util", "gpu_util", statistics.fmean, "%"),
    ("cpu_util", "cpu_util", statistics.fmean, "% of one core"),
    ("energy_j", "energy_j", sum, "J"),
)


def run_metrics(epochs: list[dict]) -> list[tuple[str, float, str]]:
    """Run-level figures (name, value, unit) from the finished epochs."""
    if not epochs:
        return []

    def col(k):
        return [r[k] for r in epochs if r[k] is not None]

    out = [
        ("loss", statistics.fmean(r["loss"] for r in epochs), "nats/target, mean over epochs"),
        ("loss_final", epochs[-1]["loss"], "nats/target, last epoch"),
    ]
    if col("wall_s"):  # absent when every step was a warm-up step
        # the median epoch: one epoch slowed by another process on a shared machine does not move it
        out.append(
            ("epoch_time", statistics.median(col("wall_s")), "s/epoch, median over epochs, warm-up excluded")
        )
    out += [(name, agg(col(key)), unit) for name, key, agg, unit in PER_EPOCH if col(key)]
    return out


def peak_only(peak_gb: float | None, device: str) -> list[tuple[str, float, str]]:
    """The one figure of a cell that ended before its first epoch did: the memory peak it reached."""
    if not peak_gb:
        return []
    return [("gpu_mem_peak_gb" if device == "cuda" else "peak_rss_gb", peak_gb, "GB")]
