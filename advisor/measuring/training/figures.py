"""What a cell's measurements become in the KB: one row per epoch (the `epochs` table) and the run-level
figures (the `metrics` table, named as the measures of rules/metrics.toml). NULL-free: what a machine
cannot measure is absent, never zero."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


@dataclass
class EpochWork:
    """What an epoch's steps did and how long each took (post-warm-up), for its throughput and spread."""

    micro_batches: int = 0
    samples: int = 0
    tokens: int | None = None  # input tokens, padding excluded; None for models without text
    positions: int = 0  # what the model computed over: tokens with padding, or samples
    step_s: list[float] = field(default_factory=list)

    def add(self, batch: dict, positions: int) -> None:
        self.micro_batches += 1
        self.samples += len(batch["labels"])
        self.positions += positions
        mask = batch.get("attention_mask")
        if mask is not None:
            self.tokens = (self.tokens or 0) + int(mask.sum())

    @property
    def step_time_cv(self) -> float | None:
        if len(self.step_s) < 3:
            return None
        mean = statistics.fmean(self.step_s)
        return statistics.stdev(self.step_s) / mean if mean > 0 else None


def epoch_row(
    epoch: int,
    losses: list[float],
    wall: float | None,
    warm: float,
    stats,
    gpu: dict,
    work: EpochWork,
    flops_per_position: float | None,
    evaluation=None,
) -> dict:
    """The `epochs` row of one epoch: its steps' mean loss, timing, the monitor's window `stats`, what its
    steps computed, and the held-out evaluation after it (fair protocol).

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
        "eval_loss": evaluation.loss if evaluation else None,
        "eval_accuracy": evaluation.accuracy if evaluation else None,
        "micro_batches": work.micro_batches,
        "samples": work.samples,
        "tokens": work.tokens,
        "model_flops": 3 * flops_per_position * work.positions if flops_per_position else None,
        "step_time_cv": work.step_time_cv,
        "others_cpu": stats.others_cpu,
    }


# measure name, epochs column, aggregate over epochs, unit
PER_EPOCH = (
    ("peak_rss_gb", "peak_rss_gb", max, "GB"),
    ("gpu_mem_peak_gb", "peak_gpu_allocated_gb", max, "GB"),
    ("gpu_mem_reserved_gb", "peak_gpu_reserved_gb", max, "GB"),
    ("gpu_device_mem_gb", "gpu_device_mem_gb", max, "GB"),
    ("gpu_util", "gpu_util", statistics.fmean, "%"),
    ("energy_j", "energy_j", sum, "J"),
    ("step_time_cv", "step_time_cv", statistics.median, "std / mean of step times, median over epochs"),
    ("others_cpu", "others_cpu", max, "cores other processes used, most in an epoch"),
)


def run_metrics(epochs: list[dict]) -> list[tuple[str, float, str]]:
    """Run-level figures (name, value, unit) from the finished epochs."""
    if not epochs:
        return []

    def col(k):
        return [r[k] for r in epochs if r.get(k) is not None]

    out = [
        ("loss", statistics.fmean(r["loss"] for r in epochs), "nats/target, training, mean over epochs"),
        ("loss_final", epochs[-1]["loss"], "nats/target, training, last epoch"),
    ]
    if epochs[-1].get("eval_loss") is not None:
        out.append(("eval_loss", epochs[-1]["eval_loss"], "nats/target, held-out, after the last epoch"))
        out.append(("eval_accuracy", 100 * epochs[-1]["eval_accuracy"], "% of held-out targets, top-1"))
    if col("wall_s"):  # absent when every step was a warm-up step
        # the median epoch: one epoch slowed by another process on a shared machine does not move it
        out.append(
            ("epoch_time", statistics.median(col("wall_s")), "s/epoch, median over epochs, warm-up excluded")
        )
    out += [(name, agg(col(key)), unit) for name, key, agg, unit in PER_EPOCH if col(key)]
    out += _rates(epochs)
    return out


def _rates(epochs: list[dict]) -> list[tuple[str, float, str]]:
    """Throughput and achieved FLOP/s over the timed epochs, and CPU use weighted by their wall time."""
    timed = [e for e in epochs if e.get("wall_s")]
    wall = sum(e["wall_s"] for e in timed)
    if not timed or wall <= 0:
        return []
    out = [("samples_per_s", sum(e["samples"] or 0 for e in timed) / wall, "samples/s")]
    if all(e.get("tokens") is not None for e in timed):
        out.append(("tokens_per_s", sum(e["tokens"] for e in timed) / wall, "tokens/s, padding excluded"))
    if all(e.get("model_flops") is not None for e in timed):
        out.append(("achieved_gflops", sum(e["model_flops"] for e in timed) / wall / 1e9, "GFLOP/s"))
    if all(e.get("cpu_util") is not None for e in timed):
        util = sum(e["cpu_util"] * e["wall_s"] for e in timed) / wall
        out.append(("cpu_util", util, "% of the cores used, from CPU time"))
    return out


def peak_only(peak_gb: float | None, device: str) -> list[tuple[str, float, str]]:
    """The one figure of a cell that ended before its first epoch did: the memory peak it reached."""
    if not peak_gb:
        return []
    return [("gpu_mem_peak_gb" if device == "cuda" else "peak_rss_gb", peak_gb, "GB")]
