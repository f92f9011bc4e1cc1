"""Memory strategies: standard, checkpointing (transformers' own, non-reentrant), accumulation, and both.

One optimizer step consumes a window of micro-batches (1 without accumulation, k with it). The loss is
summed over every target (token, or image for classification) in the window and divided by the window's
target count, so accumulation computes the gradient of the large batch exactly, padded sequences of
unequal length included; dividing each micro-batch's mean by k instead is the bug transformers fixed in
October 2024 (`advisor validate` finds it 6 % off on Llama and 20 % on ModernBERT at preset tiny). The
logged loss is that unscaled per-target mean.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch

STRATEGIES = ("standard", "checkpointing", "accumulation", "checkpointing+accumulation")


def uses_checkpointing(strategy: str) -> bool:
    return strategy in ("checkpointing", "checkpointing+accumulation")


def prepare(model, strategy: str) -> None:
    """Switch transformers' activation checkpointing on for the checkpointing strategies."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if uses_checkpointing(strategy):
        enable_checkpointing(model)


def enable_checkpointing(model) -> None:
    """transformers' activation checkpointing, non-reentrant (RNG state and kwargs preserved). Releases
    before transformers 5.2x name it gradient_checkpointing_enable."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: torch.as_tensor(v).to(device) if k != "n_targets" else v for k, v in batch.items()}


def autocast(device: torch.device, dtype: str):
    """The forward's precision: bf16-mixed autocasts to bfloat16 (weights, gradients and optimizer state
    stay fp32); fp32 runs as is."""
    if dtype == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if dtype != "fp32":
        raise ValueError(f"unknown dtype {dtype!r}; choose from fp32, bf16-mixed")
    return nullcontext()


def train_step(
    model,
    optimizer,
    family,
    window: list[dict],
    device: torch.device,
    before_micro_batch: Callable[[], None] | None = None,
    dtype: str = "fp32",
) -> float:
    """One optimizer step over a window of micro-batches; returns the window's mean loss per target.

    `family` (a `measure.families.Family`) supplies the summed loss of a micro-batch."""
    total_targets = sum(b["n_targets"] for b in window)
    if total_targets == 0:
        raise ValueError("a window of micro-batches without any target")
    batches = [to_device(b, device) for b in window]
    optimizer.zero_grad(set_to_none=True)
    summed = 0.0
    for batch in batches:
        if before_micro_batch:
            before_micro_batch()
        with autocast(device, dtype):
            loss = family.summed_loss(model, batch)
        (loss / total_targets).backward()
        summed += loss.item()
    computed = [True]  # the loss and gradients at the step's start are already here

    def closure():  # for line-searching optimizers (CGD): the same window's loss and gradient
        if computed[0]:  # the optimizer's first call, at the point just evaluated: no second pass
            computed[0] = False
            return torch.tensor(summed / total_targets, device=device)
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for batch in batches:
            if before_micro_batch:
                before_micro_batch()
            with autocast(device, dtype):
                part = family.summed_loss(model, batch) / total_targets
            part.backward()
            total += part.detach()
        return total

    needs_closure = any(g.get("line_search", "fixed") != "fixed" for g in optimizer.param_groups)
    optimizer.step(closure if needs_closure else None)
    return summed / total_targets
