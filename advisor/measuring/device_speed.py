"""`advisor calibrate`: the speed model's rates measured on this device (a few seconds), recorded in the KB
with the device's identity, so that `advisor fit` prices a step on it from what it measured rather than a
datasheet (advisor/prediction/speed.py):

- a large matrix product (bf16 on CUDA, fp32 on a CPU): the FLOP/s a step's products reach;
- an elementwise update over 64 MB (an optimizer's step: two reads and a write a value): bytes/s;
- a tiny Llama's forward and backward, whose FLOPs are negligible: the fixed cost of a micro-batch.
Each is the median of five timed repeats after one warm-up, synchronized on CUDA.
"""

from __future__ import annotations

import statistics
import time

import torch

from advisor.errors import InputError
from advisor.kb import store
from advisor.kb.store import Check
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.places import resolve_write_path

MATMUL = {"cuda": (4096, torch.bfloat16), "cpu": (1024, torch.float32)}  # side, dtype
STREAM_ELEMENTS = 16 * 2**20  # 64 MB of fp32
REPEATS = 5


def calibrate_here(db=None, device: str = "auto") -> tuple[dict, list[Check]]:
    """Measure the three rates on the device and record them in the KB a write goes to (`db`: a path, else
    $ADVISOR_DB, else the user's); (machine, rates). A CPU is recorded as the `cpu` accelerator of
    rules/hardware.toml (its name kept as the device), a GPU by the name CUDA reports."""
    try:
        device = resolve_device(device)
    except ValueError as e:
        raise InputError(f"{e}.", "--device") from None
    path = resolve_write_path(db)
    store.release(store.open_for_writing(path))  # an unusable KB fails before the timing
    machine = describe(device)
    if device == "cpu":
        machine = {**machine, "hardware": "cpu", "device": machine["hardware"]}
    rates = [_matmul(device), _stream(device), _micro_batch(device)]
    with store.writing(path) as conn:
        store.add_validations(conn, machine, "", rates)
    return machine, rates


def _rate(name: str, value: float, detail: str) -> Check:
    """A measured rate as `validations` keeps it: a check that passes (a measurement, not a test)."""
    return Check(name, None, True, value, None, detail)


def _timed(fn, device: str) -> float:
    """The median seconds of REPEATS calls after a warm-up."""
    fn()
    times = []
    for _ in range(REPEATS):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _matmul(device: str) -> Check:
    n, dtype = MATMUL[device]
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    seconds = _timed(lambda: a @ b, device)
    flops = 2 * n**3 / seconds
    return _rate("speed_matmul_flops", flops, f"{n}x{n} {dtype} product: {flops / 1e9:.1f} GFLOP/s")


def _stream(device: str) -> Check:
    p, g = (torch.randn(STREAM_ELEMENTS, device=device) for _ in range(2))
    seconds = _timed(lambda: p.add_(g, alpha=-1e-3), device)
    moved = 3 * STREAM_ELEMENTS * 4 / seconds  # read p and g, write p
    return _rate("speed_stream_bytes", moved, f"p += a*g over 64 MB fp32: {moved / 1e9:.1f} GB/s")


def _micro_batch(device: str) -> Check:
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

    seconds = _timed(step, device)
    return _rate(
        "speed_micro_batch_s",
        seconds,
        f"a 2-layer Llama's forward and backward of 8 tokens: {seconds * 1e3:.1f} ms",
    )
