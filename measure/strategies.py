"""Memory strategies: standard, checkpointing (transformers' own, non-reentrant), accumulation, and both.

One optimizer step consumes a window of micro-batches (1 without accumulation, k with it). The loss is
summed over every target (token, or image for classification) in the window and divided by the window's
target count, so accumulation computes the gradient of the large batch exactly, padded sequences of
unequal length included; dividing each micro-batch's mean by k instead is the bug transformers fixed in
October 2024 (gradients ~97 % off here). The logged loss is that unscaled per-target mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

STRATEGIES = ("standard", "checkpointing", "accumulation", "checkpointing+accumulation")
IGNORE = -100


def uses_checkpointing(strategy: str) -> bool:
    return strategy in ("checkpointing", "checkpointing+accumulation")


def window_size(strategy: str, accumulation_steps: int) -> int:
    """Micro-batches per optimizer step."""
    return accumulation_steps if strategy in ("accumulation", "checkpointing+accumulation") else 1


def prepare(model, strategy: str) -> None:
    """Switch transformers' activation checkpointing on (non-reentrant: RNG state and kwargs preserved)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if uses_checkpointing(strategy):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: torch.as_tensor(v).to(device) if k != "n_targets" else v for k, v in batch.items()}


def summed_loss(model, family: str, batch: dict) -> torch.Tensor:
    """Cross-entropy summed over the batch's targets (never averaged: the window divides once)."""
    labels = batch["labels"]
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "n_targets")}
    logits = model(**inputs).logits
    if family == "vision":
        return F.cross_entropy(logits.float(), labels, reduction="sum")  # (batch, classes)
    if family == "encoder":
        return F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum"
        )
    # causal LM and captioning: position t predicts token t+1
    shifted = logits[:, :-1].flatten(0, 1).float()  # (batch * (seq-1), vocab)
    return F.cross_entropy(shifted, labels[:, 1:].flatten(), ignore_index=IGNORE, reduction="sum")


def train_step(
    model,
    optimizer,
    family: str,
    window: list[dict],
    device: torch.device,
    before_micro_batch: Callable[[], None] | None = None,
) -> float:
    """One optimizer step over a window of micro-batches; returns the window's mean loss per target."""
    total_targets = sum(b["n_targets"] for b in window)
    if total_targets == 0:
        raise ValueError("a window of micro-batches without any target")
    batches = [to_device(b, device) for b in window]
    optimizer.zero_grad(set_to_none=True)
    summed = 0.0
    for batch in batches:
        if before_micro_batch:
            before_micro_batch()
        loss = summed_loss(model, family, batch)
        (loss / total_targets).backward()
        summed += loss.item()

    def closure():  # for line-searching optimizers (CGD): the same window's loss and gradient again
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for batch in batches:
            part = summed_loss(model, family, batch) / total_targets
            part.backward()
            total += part.detach()
        return total

    needs_closure = any(g.get("line_search", "fixed") != "fixed" for g in optimizer.param_groups)
    optimizer.step(closure if needs_closure else None)
    return summed / total_targets
