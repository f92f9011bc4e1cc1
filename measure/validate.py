"""`advisor validate`: the harness checks itself on this machine.

- checkpointing vs standard: the same loss and gradients (dropout off: bit-identical; dropout on: equal
  given the same seed, since non-reentrant checkpointing restores the RNG state for the recomputation);
- accumulation of k micro-batches vs one batch of k·b, padded sequences of unequal length: the same
  gradient to float tolerance, and the same logged loss;
- conjugate gradient on a quadratic: exact steps converge in n iterations;
- the monitor's sampler: the CPU time it takes is within 1 % of the wall time.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from advisor.store import Check
from measure import strategies
from measure.data import batches, load
from measure.families.base import IGNORE
from measure.models import build_model, reference_shape
from measure.tokenizer import PAD

GRAD_RTOL = 1e-4  # float32 accumulation in a different order: relative error of the largest gradient
LOSS_RTOL = 1e-5
MONITOR_BUDGET = 0.01  # the sampler may take 1 % of the wall time
# CG is exact in n steps in exact arithmetic; in float64 at condition 100 the lost conjugacy leaves ~1e-7
CGD_RTOL = 1e-6


def run_checks(models: list[str], preset: str, accumulation_steps: int = 4) -> list[Check]:
    out = []
    for model in models:
        out += [
            check_checkpointing(model, preset, dropout=0.0),
            check_checkpointing(model, preset, dropout=0.1),
            *check_accumulation(model, preset, accumulation_steps),
        ]
    return out + [check_cgd(), check_monitor()]


def micro_window(model: str, preset: str, n: int, seed: int = 0):
    """(family, n micro-batches of 4 samples of the model's data); the model itself is not built."""
    family, shape = reference_shape(model, preset)
    dataset, _ = load(family, shape, 4 * n, seed)
    return family, list(batches(dataset, family, 4, seed, epoch=0))[:n]


def grads_after(
    model: str, preset: str, strategy: str, windows, family, dropout: float, rng_seed: int | None = None
):
    """Loss and gradients after one step with lr 0 (the gradients stay on the parameters)."""
    built = build_model(model, preset, dropout=dropout, seed=0)
    strategies.prepare(built.model, strategy)
    opt = torch.optim.SGD(built.model.parameters(), lr=0.0)
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    losses = [strategies.train_step(built.model, opt, family, w, torch.device("cpu")) for w in windows]
    grads = {n: p.grad.detach().clone() for n, p in built.model.named_parameters() if p.grad is not None}
    return losses, grads


def _max_rel_error(a: dict, b: dict) -> float:
    """Largest |a - b| over all parameters, relative to the largest |b| (0 when identical)."""
    if a.keys() != b.keys():
        return float("inf")
    scale = max(float(t.abs().max()) for t in b.values()) or 1.0
    return max(float((a[k] - b[k]).abs().max()) for k in b) / scale


def check_checkpointing(model: str, preset: str, dropout: float) -> Check:
    family, window = micro_window(model, preset, 1)
    plain_loss, plain = grads_after(model, preset, "standard", [window], family, dropout, rng_seed=1234)
    ckpt_loss, ckpt = grads_after(model, preset, "checkpointing", [window], family, dropout, rng_seed=1234)
    err = max(_max_rel_error(ckpt, plain), abs(ckpt_loss[0] - plain_loss[0]) / abs(plain_loss[0]))
    name = "checkpointing_dropout_off" if dropout == 0 else "checkpointing_dropout_on"
    detail = (
        f"loss {ckpt_loss[0]:.6g} vs {plain_loss[0]:.6g}; max relative gradient difference {err:.3g} "
        f"(dropout {dropout}, same seed)"
    )
    return Check(name, model, err == 0.0, err, 0.0, detail)


def concat_window(window: list[dict]) -> dict:
    """k micro-batches as one batch of k·b, padded to a common width (the same targets)."""
    out, width = {}, None
    if "input_ids" in window[0]:
        width = max(b["input_ids"].shape[1] for b in window)
    for key in window[0]:
        if key == "n_targets":
            out[key] = sum(b[key] for b in window)
            continue
        arrays = [b[key] for b in window]
        if width and key in ("input_ids", "attention_mask", "labels"):
            fill = {"input_ids": PAD, "attention_mask": 0, "labels": IGNORE}[key]
            arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in arrays]
        out[key] = np.concatenate(arrays)
    return out


def check_accumulation(model: str, preset: str, k: int) -> list[Check]:
    family, window = micro_window(model, preset, k)
    acc_loss, acc = grads_after(model, preset, "accumulation", [window], family, dropout=0.0)
    big_loss, big = grads_after(model, preset, "standard", [[concat_window(window)]], family, dropout=0.0)
    err = _max_rel_error(acc, big)
    loss_err = abs(acc_loss[0] - big_loss[0]) / abs(big_loss[0])
    targets = [b["n_targets"] for b in window]
    return [
        Check(
            "accumulation_gradient",
            model,
            err <= GRAD_RTOL,
            err,
            GRAD_RTOL,
            f"{k} micro-batches ({'/'.join(map(str, targets))} targets) vs one batch of {sum(targets)}: "
            f"max relative gradient error {err:.3g}",
        ),
        Check(
            "accumulation_logged_loss",
            model,
            loss_err <= LOSS_RTOL,
            loss_err,
            LOSS_RTOL,
            f"logged {acc_loss[0]:.6g} vs large batch {big_loss[0]:.6g}",
        ),
    ]


def check_cgd(n: int = 12) -> Check:
    from measure.optimizers import ConjugateGradient, minimize_quadratic, quadratic

    a, b, x_star = quadratic(n, condition=100.0)
    x = minimize_quadratic(lambda p: ConjugateGradient(p, lr=1e-3, line_search="secant"), a, b, steps=n)
    err = float(torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star))
    return Check(
        "cgd_quadratic",
        None,
        err < CGD_RTOL,
        err,
        CGD_RTOL,
        f"{n}-dimensional quadratic (condition 100), {n} exact steps: relative error {err:.3g}",
    )


def check_monitor(seconds: float = 2.0) -> Check:
    """The sampler's own CPU time as a share of the wall time, while the main thread trains."""
    from measure.monitor import Monitor

    family, window = micro_window("llama", "tiny", 1)
    built = build_model("llama", "tiny")
    opt = torch.optim.SGD(built.model.parameters(), lr=1e-3)
    with Monitor() as monitor:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            strategies.train_step(built.model, opt, family, window, torch.device("cpu"))
        wall = time.perf_counter() - start
    share = monitor.cpu_seconds / wall
    return Check(
        "monitor_overhead",
        None,
        share <= MONITOR_BUDGET,
        share,
        MONITOR_BUDGET,
        f"sampler CPU {monitor.cpu_seconds * 1000:.1f} ms over {wall:.1f} s of training "
        f"({len(monitor.samples)} samples)",
    )
