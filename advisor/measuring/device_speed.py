"""`advisor calibrate`: the speed model's rates measured on this device (a few seconds), recorded in the KB
with the device's identity, so that `advisor fit` prices a step on it from what it measured rather than a
datasheet (advisor/prediction/speed.py):

- a large matrix product (bf16 on CUDA, fp32 on a CPU): the FLOP/s a step's products reach;
- an elementwise update over 64 MB (an optimizer's step: two reads and a write a value): bytes/s;
- a tiny Llama's forward and backward, whose FLOPs are negligible: the fixed cost of a micro-batch.

A round times each once (the median of REPEATS timed samples after the warm-up, synchronized on CUDA).
Rounds repeat until, for each rate, the AGREE fastest rounds lie within the tolerance (20 %) of one another,
or until `rounds` rounds or the deadline: a busy machine's other load makes some rounds slow, never one
fast, so the fastest figure of each rate is the one kept, and how far its runners-up lie from it (the
spread) says how much to trust it. What is recorded beside the rates: the spread (`speed_spread`: its
value the worst rate's, its tolerance the one asked, passed when the rounds agreed) and the rounds run
(`speed_rounds`); kb/queries/for_prediction.speed_calibrations prefers a calibration that agreed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from advisor.errors import InputError
from advisor.kb import store
from advisor.kb.open import open_for_writing, release, writing
from advisor.kb.queries.for_prediction import speed_calibrations
from advisor.kb.store import Check
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.places import resolve_write_path

MATMUL = {"cuda": (4096, torch.bfloat16), "cpu": (1024, torch.float32)}  # side, dtype
STREAM_ELEMENTS = 16 * 2**20  # 64 MB of fp32
REPEATS = 5  # timed samples a round takes the median of
SAMPLE_S = (
    0.005  # a sample repeats a short call until it lasts about this long (a timer's and a tick's noise)
)
AGREE = 3  # the fastest rounds of each rate that must agree
ROUNDS = 8  # at most, by default
TOLERANCE = 0.2  # the relative spread they must agree within, by default
DEADLINE_S = 60.0  # no round starts after this long, and one under way is abandoned (the first completes)
SHORT = {"speed_matmul_flops": "matmul", "speed_stream_bytes": "stream", "speed_micro_batch_s": "micro-batch"}


@dataclass(frozen=True)
class _Bench:
    """One rate: a call to time, what one call does (FLOPs, bytes; None: the seconds are the figure)."""

    name: str
    call: Callable[[], object]
    work: float | None
    describe: Callable[[float], str]  # the figure, as the detail of its row says it
    calls: int  # a sample makes, back to back: chosen at the warm-up

    def figure(self, seconds: float) -> float:
        return seconds if self.work is None else self.work / seconds


@dataclass
class Calibration:
    """What `advisor calibrate` measured and recorded: the fastest figure of each rate (`rates`, as rows of
    `validations`), each rate's spread over its AGREE fastest rounds (the slowest of them took 1 + spread
    times the fastest's time), the rounds run, whether they agreed within the tolerance, and how long."""

    machine: dict
    rates: list[Check]
    spreads: dict[str, float]
    rounds: int
    agreed: bool
    tolerance: float
    seconds: float
    chosen: dict  # the calibration of this hardware `advisor fit` now prices from (kb.queries.for_prediction)

    @property
    def spread(self) -> float:
        """The worst rate's spread."""
        return max(self.spreads.values())

    def as_dict(self) -> dict:
        return {
            "hardware": self.machine["hardware"],
            "device": self.machine["device"],
            "rates": [r.as_dict() for r in self.rates],
            "agreed": self.agreed,
            "spread": self.spread,
            "spreads": self.spreads,
            "tolerance": self.tolerance,
            "rounds": self.rounds,
            "seconds": self.seconds,
            "chosen": self.chosen,
        }


def calibrate_here(
    db=None,
    device: str = "auto",
    rounds: int = ROUNDS,
    tolerance: float = TOLERANCE,
    deadline_s: float = DEADLINE_S,
) -> Calibration:
    """Measure the three rates on the device, in rounds until they agree (or `rounds`, or `deadline_s`), and
    record the fastest of each, with the spread and the rounds, in the KB a write goes to (`db`: a path, else
    $ADVISOR_DB, else the user's). A CPU is recorded as the `cpu` accelerator of rules/hardware.toml (its
    name kept as the device), a GPU by the name CUDA reports."""
    if not (isinstance(rounds, int) and rounds >= AGREE):
        raise InputError(f"rounds must be a whole number of at least {AGREE}, not {rounds!r}.", "rounds")
    if not (isinstance(tolerance, int | float) and math.isfinite(tolerance) and 0 < tolerance <= 1):
        raise InputError(f"tolerance must be above 0 and at most 1, not {tolerance!r}.", "tolerance")
    try:
        device = resolve_device(device)
    except ValueError as e:
        raise InputError(f"{e}.", "device") from None
    path = resolve_write_path(db)
    release(open_for_writing(path))  # an unusable KB fails before the timing
    machine = describe(device)
    if device == "cpu":
        machine = {**machine, "hardware": "cpu", "device": machine["hardware"]}
    start = time.perf_counter()
    benches = [_matmul(device), _stream(device), _micro_batch(device)]
    seconds: dict[str, list[float]] = {b.name: [] for b in benches}  # per rate, a figure a round
    deadline = start + deadline_s
    while True:
        timed = _round(benches, device, deadline if seconds[benches[0].name] else math.inf)
        if timed is None:  # past the deadline mid-round: that round is not counted
            break
        for name, s in timed.items():
            seconds[name].append(s)
        done = len(seconds[benches[0].name])
        spreads = {name: _spread(s) for name, s in seconds.items()}
        agreed = done >= AGREE and all(s <= tolerance for s in spreads.values())
        if agreed or done >= rounds or time.perf_counter() >= deadline:
            break
    done = len(seconds[benches[0].name])
    took = time.perf_counter() - start
    rates = [_rate(b, min(seconds[b.name]), spreads[b.name], done) for b in benches]
    worst = max(spreads.values())
    said = ", ".join(f"{SHORT[b.name]} {spreads[b.name]:.0%}" for b in benches)
    verdict = "agreed" if agreed else "did not agree"
    rows = [
        *rates,
        Check(
            "speed_spread",
            None,
            agreed,
            worst,
            tolerance,
            f"the fastest {min(AGREE, done)} of {done} rounds {verdict} within {tolerance * 100:g}%: {said}",
        ),
        Check("speed_rounds", None, True, float(done), None, f"{done} rounds in {took:.1f} s"),
    ]
    with writing(path) as conn:
        store.add_validations(conn, machine, "", rows)
        chosen = speed_calibrations(conn).get(machine["hardware"], {})
    return Calibration(machine, rates, spreads, done, agreed, tolerance, took, chosen)


def _spread(seconds: list[float]) -> float:
    """How far the AGREE fastest figures lie apart: the slowest of them over the fastest, less one (0 for a
    single round: nothing to compare, and agreement needs AGREE rounds)."""
    fastest = sorted(seconds)[:AGREE]
    return fastest[-1] / fastest[0] - 1


def _rate(bench: _Bench, seconds: float, spread: float, rounds: int) -> Check:
    """A measured rate as `validations` keeps it: a check that passes (a measurement, not a test)."""
    value = bench.figure(seconds)
    detail = f"{bench.describe(value)}, the fastest of {rounds} round{'s' if rounds > 1 else ''}"
    if rounds > 1:
        detail += f" (spread {spread:.0%})"
    return Check(bench.name, None, True, value, None, detail)


def _round(benches: list[_Bench], device: str, deadline: float) -> dict[str, float] | None:
    """One round: each bench's median seconds a call; None when the deadline passed before it was done."""
    out = {}
    for bench in benches:
        times = []
        for _ in range(REPEATS):
            if time.perf_counter() >= deadline:
                return None
            times.append(_sample(bench.call, device, bench.calls))
        out[bench.name] = statistics.median(times)
    return out


def _sample(call: Callable[[], object], device: str, n: int) -> float:
    """The seconds one call takes, over n calls back to back (synchronized on CUDA)."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n


def _bench(name: str, call, work, describe, device: str) -> _Bench:
    """A bench warmed up (twice: the first call pays one-time costs), with the calls a sample makes chosen
    so that it lasts about SAMPLE_S."""
    _sample(call, device, 1)
    once = _sample(call, device, 1)
    calls = max(1, min(1000, math.ceil(SAMPLE_S / max(once, 1e-9))))
    return _Bench(name, call, work, describe, calls)


def _matmul(device: str) -> _Bench:
    n, dtype = MATMUL[device]
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return _bench(
        "speed_matmul_flops",
        lambda: a @ b,
        2 * n**3,
        lambda flops: f"{n}x{n} {dtype} product: {flops / 1e9:.1f} GFLOP/s",
        device,
    )


def _stream(device: str) -> _Bench:
    p, g = (torch.randn(STREAM_ELEMENTS, device=device) for _ in range(2))
    return _bench(
        "speed_stream_bytes",
        lambda: p.add_(g, alpha=-1e-3),
        3 * STREAM_ELEMENTS * 4,  # read p and g, write p
        lambda moved: f"p += a*g over 64 MB fp32: {moved / 1e9:.1f} GB/s",
        device,
    )


def _micro_batch(device: str) -> _Bench:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=256,
    )
    model = LlamaForCausalLM(config).to(device)
    ids = torch.randint(0, 256, (1, 8), device=device)

    def step():
        model(input_ids=ids, labels=ids).loss.backward()

    return _bench(
        "speed_micro_batch_s",
        step,
        None,
        lambda seconds: f"a 2-layer Llama's forward and backward of 8 tokens: {seconds * 1e3:.1f} ms",
        device,
    )
