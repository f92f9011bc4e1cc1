"""`advisor validate`: the harness checks itself on this machine.

- checkpointing vs standard: the same loss and gradients (dropout off: bit-identical; dropout on: equal
  given the same seed, since non-reentrant checkpointing restores the RNG state for the recomputation);
- accumulation of k micro-batches vs one batch of k·b, padded sequences of unequal length: the same
  gradient to float tolerance, and the same logged loss;
- conjugate gradient on a quadratic: exact steps converge in n iterations;
- conjugate gradient as the grid runs it, on stochastic least squares: every step decreases the loss of its
  own minibatch, and the full-data loss falls well below its start;
- the monitor's sampler: the CPU time it takes is within 1 % of the wall time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from advisor.errors import InputError
from advisor.kb import store
from advisor.kb.open import open_for_writing, release, writing
from advisor.kb.store import Check
from advisor.measuring.data.corpus import batches, load
from advisor.measuring.data.tokenizer import PAD
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.measuring.machine.monitor import Monitor
from advisor.measuring.model.builder import build_model, reference_shape
from advisor.measuring.model.families.base import IGNORE
from advisor.measuring.recipe import strategies
from advisor.measuring.recipe.config import DEFAULT_LR, RunConfig
from advisor.measuring.recipe.optimizers import (
    ConjugateGradient,
    make_optimizer,
    minimize_quadratic,
    quadratic,
)
from advisor.model_ref import ResolvedModel, reference_model, reference_models
from advisor.places import resolve_write_path
from advisor.rules import Rules

GRAD_RTOL = 1e-4  # float32 accumulation in a different order: relative error of the largest gradient
LOSS_RTOL = 1e-5
MONITOR_BUDGET = 0.01  # the sampler may take 1 % of the wall time
# CG is exact in n steps in exact arithmetic; in float64 at condition 100 the lost conjugacy leaves ~1e-7
CGD_RTOL = 1e-6
# the grid's CGD on stochastic least squares: the full-data loss must end below this share of its start (it
# reaches ~1e-4 at seed 0 in float64; a fixed step at the grid's rate diverges on the problem's stiff features)
CGD_STOCHASTIC_RATIO = 0.01


def run_checks(
    models: list[ResolvedModel], preset: str, rules: Rules, accumulation_steps: int = 4
) -> list[Check]:
    out = []
    for model in models:
        out += [
            check_checkpointing(model, preset, rules, dropout=0.0),
            check_checkpointing(model, preset, rules, dropout=0.1),
            *check_accumulation(model, preset, rules, accumulation_steps),
        ]
    return out + [check_cgd(), check_cgd_stochastic(), check_monitor(rules)]


def micro_window(model: ResolvedModel, preset: str, rules: Rules, n: int, seed: int = 0):
    """(family, n micro-batches of 4 samples of the model's data); the model itself is not built."""
    family, shape = reference_shape(model, preset, rules)
    dataset, _ = load(family, shape, 4 * n, seed)
    return family, list(batches(dataset, family, 4, seed, epoch=0))[:n]


def grads_after(
    model: ResolvedModel,
    preset: str,
    rules: Rules,
    strategy: str,
    windows,
    family,
    dropout: float,
    rng_seed: int | None = None,
):
    """Loss and gradients after one step with lr 0 (the gradients stay on the parameters)."""
    built = build_model(model, preset, rules, dropout=dropout, seed=0)
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


def check_checkpointing(model: ResolvedModel, preset: str, rules: Rules, dropout: float) -> Check:
    family, window = micro_window(model, preset, rules, 1)
    run = (model, preset, rules)
    plain_loss, plain = grads_after(*run, "standard", [window], family, dropout, rng_seed=1234)
    ckpt_loss, ckpt = grads_after(*run, "checkpointing", [window], family, dropout, rng_seed=1234)
    err = max(_max_rel_error(ckpt, plain), abs(ckpt_loss[0] - plain_loss[0]) / abs(plain_loss[0]))
    name = "checkpointing_dropout_off" if dropout == 0 else "checkpointing_dropout_on"
    detail = (
        f"loss {ckpt_loss[0]:.6g} vs {plain_loss[0]:.6g}; max relative gradient difference {err:.3g} "
        f"(dropout {dropout}, same seed)"
    )
    return Check(name, model.name, err == 0.0, err, 0.0, detail)


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


def check_accumulation(model: ResolvedModel, preset: str, rules: Rules, k: int) -> list[Check]:
    family, window = micro_window(model, preset, rules, k)
    run = (model, preset, rules)
    acc_loss, acc = grads_after(*run, "accumulation", [window], family, dropout=0.0)
    big_loss, big = grads_after(*run, "standard", [[concat_window(window)]], family, dropout=0.0)
    err = _max_rel_error(acc, big)
    loss_err = abs(acc_loss[0] - big_loss[0]) / abs(big_loss[0])
    targets = [b["n_targets"] for b in window]
    return [
        Check(
            "accumulation_gradient",
            model.name,
            err <= GRAD_RTOL,
            err,
            GRAD_RTOL,
            f"{k} micro-batches ({'/'.join(map(str, targets))} targets) vs one batch of {sum(targets)}: "
            f"max relative gradient error {err:.3g}",
        ),
        Check(
            "accumulation_logged_loss",
            model.name,
            loss_err <= LOSS_RTOL,
            loss_err,
            LOSS_RTOL,
            f"logged {acc_loss[0]:.6g} vs large batch {big_loss[0]:.6g}",
        ),
    ]


def check_cgd(n: int = 12) -> Check:
    a, b, x_star = quadratic(n, condition=100.0)

    def exact(params):  # unclipped, never restarted: linear CG's beta, which exactness needs
        return ConjugateGradient(params, lr=1e-3, line_search="secant", restart_every=None, beta_max=None)

    x = minimize_quadratic(exact, a, b, steps=n)
    err = float(torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star))
    return Check(
        "cgd_quadratic",
        None,
        err < CGD_RTOL,
        err,
        CGD_RTOL,
        f"{n}-dimensional quadratic (condition 100), {n} exact steps: relative error {err:.3g}",
    )


def grid_cgd(params) -> torch.optim.Optimizer:
    """CGD as the grid builds it: the fair protocol's cgd options at the optimizer's default rate."""
    cfg = RunConfig(model="llama", optimizer="cgd").resolved()
    options = dict(beta=cfg.cgd_beta, restart_every=cfg.cgd_restart_every, beta_max=cfg.cgd_beta_max)
    return make_optimizer("cgd", params, DEFAULT_LR["cgd"], line_search=cfg.cgd_line_search, **options)


def stochastic_least_squares(seed: int, n: int = 512, dim: int = 20):
    """(features, targets, generator): features of scale 0.3 to 10 (curvature 0.1 to 100, too stiff for a
    fixed step of 0.05), targets linear in them plus noise; float64, so rounding cannot fake a decrease."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-0.5, 1, dim, dtype=torch.float64)
    features = torch.randn(n, dim, generator=gen, dtype=torch.float64) * scale
    weights = torch.randn(dim, generator=gen, dtype=torch.float64)
    targets = features @ weights + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    return features, targets, gen


def descend_minibatches(build, steps: int, batch: int, seed: int) -> tuple[float, float, int]:
    """(full-data loss before, after, steps that decreased their own minibatch's loss) for the optimizer
    build([w]) returns, on stochastic least squares."""
    features, targets, gen = stochastic_least_squares(seed)
    w = torch.zeros(features.shape[1], dtype=torch.float64, requires_grad=True)
    opt = build([w])

    def loss_on(rows):  # ½ mean squared residual
        return 0.5 * ((features[rows] @ w - targets[rows]) ** 2).mean()

    with torch.no_grad():
        start = float(loss_on(slice(None)))
    decreased = sum(
        step_decreases(opt, loss_on, torch.randint(len(targets), (batch,), generator=gen))
        for _ in range(steps)
    )
    with torch.no_grad():
        end = float(loss_on(slice(None)))
    return start, end, decreased


def step_decreases(opt, loss_on, rows) -> bool:
    """One step on this minibatch as train_step takes it (gradient, then step with a closure over the same
    rows); whether the minibatch's loss went down."""

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = loss_on(rows)
        loss.backward()
        return loss.detach()

    before = float(closure())
    opt.step(closure)
    with torch.no_grad():
        return float(loss_on(rows)) < before  # a NaN is not a decrease


def check_cgd_stochastic(build=grid_cgd, steps: int = 100, batch: int = 32, seed: int = 0) -> Check:
    """The grid's CGD descends on every minibatch (Armijo's guarantee) and converges on the full data.

    value: the full-data loss at the end over the start, against CGD_STOCHASTIC_RATIO; the check also fails
    if any step left its own minibatch's loss where it was or higher. `build` swaps the optimizer (tests)."""
    start, end, decreased = descend_minibatches(build, steps, batch, seed)
    ratio = end / start
    return Check(
        "cgd_stochastic_descent",
        None,
        decreased == steps and ratio <= CGD_STOCHASTIC_RATIO,
        ratio,
        CGD_STOCHASTIC_RATIO,
        f"least squares (20 features, curvature 0.1 to 100), {steps} steps on minibatches of {batch}: "
        f"{decreased}/{steps} decreased their minibatch loss; full-data loss {start:.4g} -> {end:.4g}",
    )


def check_monitor(rules: Rules, seconds: float = 2.0) -> Check:
    """The sampler's own CPU time as a share of the wall time, while the main thread trains (tiny Llama)."""
    llama = reference_model("llama", rules)
    family, window = micro_window(llama, "tiny", rules, 1)
    built = build_model(llama, "tiny", rules)
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


@dataclass(frozen=True)
class Validation:
    """What `advisor validate` found on this machine, as it was recorded in the KB."""

    hardware: str
    preset: str
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def as_dict(self) -> dict:
        return {
            "passed": self.passed,
            "hardware": self.hardware,
            "preset": self.preset,
            "checks": [c.as_dict() for c in self.checks],
        }


def validate_here(models: tuple[ResolvedModel, ...], preset: str, db, rules: Rules) -> Validation:
    """Every check on this machine's CPU, on the reference models asked for (all of them by default),
    recorded in the KB a write goes to, so that answers from this hardware can say it was validated."""
    unknown = [m.name for m in models if not m.reference]
    if unknown:
        raise InputError(
            f"advisor validate checks the reference models ({', '.join(rules.reference_models())}), not "
            f"{', '.join(unknown)}.",
            "models",
        )
    path = resolve_write_path(db)
    release(open_for_writing(path))  # fail on an unusable KB before minutes of checks
    checks = run_checks(list(models) or reference_models(rules), preset, rules)
    machine = describe(resolve_device("cpu"))
    with writing(path) as conn:
        store.add_validations(conn, machine, preset, checks)
    return Validation(machine["hardware"], preset, checks)
