"""How long a traced step takes on an accelerator, from parts that each mean something (rules/fit.toml
[speed], each constant with its source; bench/fit_speed.py checks them against published runs):

- the step's executed FLOPs (recomputation included) at the share of the datasheet's dense peak that large
  matrix products reach on the accelerator's generation;
- a fixed cost per micro-batch (kernel launches, the framework's Python, the data loader's hand-off), which
  few tokens do not hide: a 1.8B model's step of 256 tokens costs about what a 7B one's does;
- a quantized base's dequantization: every quantized weight read packed and written in the compute dtype
  before each product that uses it (forward, backward, and the recomputed forward under checkpointing), at
  `dequant_efficiency` of the memory bandwidth: what makes QLoRA slower than LoRA, most at few tokens;
- the optimizer's traffic at `bandwidth_efficiency` of the memory bandwidth (its kernels are elementwise);
- GRPO's generation: the prompts' prefill as FLOPs, then each decoding step reading every weight and the
  KV cache once at `bandwidth_efficiency` of the bandwidth (decoding is bound by memory, not FLOPs); not
  checked against measured generation (no GPU here): transformers' generate adds a Python loop and a kernel
  launch per op, vLLM's batching hides much of both.
Torch-free: the answer side prices every row with it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from advisor.kb.queries.for_prediction import measured_values, speed_calibrations
from advisor.prediction import accelerators
from advisor.rules import Accelerator, Rules

if TYPE_CHECKING:
    from advisor.prediction.question import Question

COMPUTE_BYTES = 2  # a dequantized weight in bf16 or fp16
CALIBRATED = "calibrated on this device"  # how an answer priced from `advisor calibrate`'s rates says so


@dataclass(frozen=True)
class Utilization:
    """The share of peak FLOP/s a large step reaches, where it comes from, and whether the other parts of
    the model apply (not to a utilization the user gave or the KB measured: that is the whole step)."""

    value: float
    source: str
    modelled: bool = True
    flops_per_s: float | None = None  # measured on this device (`advisor calibrate`): replace the datasheet's
    bytes_per_s: float | None = None
    overhead_s: float | None = None

    @property
    def calibrated(self) -> bool:
        return self.flops_per_s is not None


def generation_efficiency(acc: Accelerator | None, rules: Rules) -> Utilization:
    """The large-matmul efficiency of the accelerator's generation, or the default where none is stated."""
    speed = rules.fit["speed"]
    fitted = speed.get("generations", {})
    if acc is not None and acc.generation in fitted:
        return Utilization(fitted[acc.generation], f"{acc.generation}: {speed['generations_source']}")
    return Utilization(speed["default_mfu"], speed["mfu_source"])


MIN_HELD_OUT = 5  # held-out published runs a generation needs before its band is printed


@dataclass(frozen=True)
class Band:
    """Where published tokens/s fell around the model's prediction on one generation's held-out runs: the 10th
    and 90th percentiles of predicted / published (`low`, `high`), over `rows` runs, and the median
    |ratio - 1| (what two rows' speeds must differ by before their order is decided by time)."""

    generation: str
    rows: int
    low: float
    high: float
    median: float

    def interval(self, predicted: float) -> tuple[float, float]:
        """The range the measured figure falls in for 8 held-out runs of 10: predicted / high to / low."""
        return predicted / self.high, predicted / self.low

    def as_dict(self) -> dict:
        return {
            "generation": self.generation,
            "held_out_rows": self.rows,
            "ratio_p10": self.low,
            "ratio_p90": self.high,
            "median_abs_error": self.median,
        }


def band(acc: Accelerator | None, use: Utilization, rules: Rules) -> Band | None:
    """The speed model's band on held-out published runs of this accelerator's generation, where the model
    stands for it (nothing given or measured in its place) and at least MIN_HELD_OUT runs tested it."""
    tested = rules.fit["speed"].get("held_out", {})
    if not use.modelled or use.calibrated or acc is None or acc.generation not in tested:
        return None
    t = tested[acc.generation]
    return (
        Band(acc.generation, t["rows"], t["low"], t["high"], t["median"])
        if t["rows"] >= MIN_HELD_OUT
        else None
    )


def unbanded(acc: Accelerator | None, use: Utilization, rules: Rules) -> str | None:
    """Why a modelled step time has no band (too few held-out runs on its generation); None where it has one
    or the time is not the model's."""
    if not use.modelled or use.calibrated or acc is None or acc.key == "cpu" or band(acc, use, rules):
        return None
    rows = rules.fit["speed"].get("held_out", {}).get(acc.generation, {}).get("rows", 0)
    return (
        f"No speed band on {(acc.generation or acc.name).capitalize()}: too few published runs to check it. "
        f"{rows} held-out published run{'s' * (rows != 1)} tested the speed model there ({MIN_HELD_OUT} needed; "
        "bench/speed_anchors.toml), so its step times are the model's alone."
    )


def overhead_seconds(micro_batches: int, use: Utilization, rules: Rules) -> float:
    """The fixed cost of the step's micro-batches (none on top of a utilization given or measured)."""
    if not use.modelled:
        return 0.0
    each = use.overhead_s if use.overhead_s is not None else rules.fit["speed"]["micro_batch_overhead_s"]
    return micro_batches * each


def dequant_passes(checkpointing: bool) -> int:
    """Products that use each frozen quantized weight per micro-batch: forward and the input's gradient in
    backward (a frozen weight gets none of its own), and the recomputed forward under checkpointing."""
    return 3 if checkpointing else 2


def bandwidth(acc: Accelerator | None, use: Utilization) -> float | None:
    """Bytes/s of the device's memory: measured on it, else its datasheet's."""
    if use.bytes_per_s:
        return use.bytes_per_s
    return acc.bandwidth_gbs * 1e9 if acc is not None and acc.bandwidth_gbs else None


def dequant_seconds(
    quantized: int, bits: int, passes: int, micro_batches: int, bytes_per_s: float, rules: Rules
) -> float:
    """A quantized base's dequantization over a step: each pass reads the packed weights (and their scales,
    about one byte per 32 weights) and writes them in the compute dtype."""
    per_weight = bits / 8 + 1 / 32 + COMPUTE_BYTES
    moved = quantized * per_weight * passes * micro_batches
    return moved / (bytes_per_s * rules.fit["speed"]["dequant_efficiency"])


def compute_seconds(flops: float, peak_tflops: float | None, use: Utilization) -> float:
    """Forward and backward: the executed FLOPs (checkpointing's recomputed forward included, at its full
    cost: bench/fit_speed.py finds the checkpointed anchors at the others' ratio) at the rate measured on the
    device, else at the utilization's share of the datasheet's peak."""
    if use.flops_per_s:
        return flops / use.flops_per_s
    return flops / (peak_tflops * 1e12 * use.value)


def traffic_seconds(traffic: float, bytes_per_s: float, use: Utilization, rules: Rules) -> float:
    """The optimizer's step: its traced bytes at the rate measured on the device (an elementwise update
    itself), else at the stated share of the datasheet's bandwidth."""
    share = 1.0 if use.bytes_per_s else rules.fit["speed"]["bandwidth_efficiency"]
    return traffic / (bytes_per_s * share)


def generation_seconds(
    weights: float,
    kv_row: float,
    rows: int,
    lengths: tuple[int, int],
    prefill_flops: float,
    compute_rate: tuple[float | None, Utilization],
    bytes_per_s: float,
    rules: Rules,
) -> float:
    """GRPO's generation for `rows` completions at once (`lengths`: prompt and completion tokens): the
    prefill's FLOPs, then `completion` decoding steps, each reading the weights (`weights` bytes) and every
    row's KV cache, which grows from the prompt to the full length (`kv_row`: a row's at full length)."""
    prompt, completion = lengths
    peak, use = compute_rate
    mean_cache = rows * kv_row * (prompt + completion / 2) / (prompt + completion)
    decode = completion * (weights + mean_cache) / (bytes_per_s * rules.fit["speed"]["bandwidth_efficiency"])
    return compute_seconds(prefill_flops, peak, use) + decode


def utilization(q: Question, rules: Rules, read: sqlite3.Connection | None) -> Utilization:
    """The share of peak FLOP/s a step reaches: --mfu, else measured on this accelerator, else its
    generation's (rules/fit.toml [speed])."""
    if q.mfu is not None:
        return Utilization(q.mfu, "--mfu", modelled=False)
    calibrated = _calibrated(read, q.accelerator, rules)
    if calibrated is not None:
        return calibrated
    if read is not None and q.accelerator is not None:
        measured = _measured_mfu(read, q.accelerator, rules)
        if measured:
            value, n, hardware = measured
            return Utilization(value, f"median of {n} runs measured on {hardware} in the KB", modelled=False)
    return generation_efficiency(q.accelerator, rules)


def _calibrated(read: sqlite3.Connection | None, acc: Accelerator | None, rules: Rules) -> Utilization | None:
    """The rates `advisor calibrate` measured on this accelerator, in the user's KB, or None."""
    if read is None or acc is None:
        return None
    found = [(h, r) for h, r in speed_calibrations(read).items() if accelerators.find(h, rules) == acc]
    if not found:
        return None
    _, r = max(found, key=lambda hr: hr[1]["at"])
    if not all(r.get(k) for k in ("speed_matmul_flops", "speed_stream_bytes")):
        return None
    source = (
        f"{CALIBRATED} ({r['device']}, advisor calibrate of {r['at'][:16].replace('T', ' ')} UTC, "
        f"{_age(r['at'])} old; {_noise(r)}): "
        f"{r['speed_matmul_flops'] / 1e9:.1f} GFLOP/s, {r['speed_stream_bytes'] / 1e9:.1f} GB/s, "
        f"{(r.get('speed_micro_batch_s') or 0) * 1e3:.0f} ms a micro-batch"
    )
    return Utilization(
        1.0,
        source,
        flops_per_s=r["speed_matmul_flops"],
        bytes_per_s=r["speed_stream_bytes"],
        overhead_s=r.get("speed_micro_batch_s"),
    )


def _age(at: str) -> str:
    """How long ago an ISO UTC time was, in the largest whole unit: '3 days', '5 hours', 'under an hour'."""
    from datetime import UTC, datetime

    try:
        then = datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return "of unknown age"
    hours = (datetime.now(UTC) - (then if then.tzinfo else then.replace(tzinfo=UTC))).total_seconds() / 3600
    if hours < 1:
        return "under an hour"
    return f"{hours / 24:.0f} days" if hours >= 48 else f"{hours:.0f} hours"


def _noise(r: dict) -> str:
    """How far a calibration's rounds agreed, and how many calibrations it was chosen from."""
    of = f", the latest that agreed of {r['calibrations']}" if r.get("calibrations", 1) > 1 else ""
    if r.get("agreed") is None:
        return "one round of medians, its noise not recorded"
    if r["agreed"]:
        return f"the fastest of {r['rounds']} rounds, agreeing within {r['spread']:.0%}{of}"
    return (
        f"the fastest of {r['rounds']} rounds, which did NOT agree (spread {r['spread']:.0%}): "
        "calibrate again on a quiet machine"
    )


def _measured_mfu(conn: sqlite3.Connection, acc: Accelerator, rules: Rules):
    try:
        rows = measured_values(conn, "mfu")
    except sqlite3.DatabaseError:
        return None
    values = sorted(v / 100 for h, v in rows if accelerators.find(h, rules) == acc)  # stored in %
    if not values:
        return None
    hardware = next(h for h, _ in rows if accelerators.find(h, rules) == acc)
    return values[len(values) // 2], len(values), hardware
