"""Memory strategies: standard, checkpointing (transformers' own, non-reentrant), selective checkpointing
(torch's per-op policy: matrix products and attention saved, the cheap rest recomputed), accumulation, and
checkpointing with accumulation.

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
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

STRATEGIES = (
    "standard",
    "checkpointing",
    "accumulation",
    "checkpointing+accumulation",
    "selective-checkpointing",
    "accumulation-equal-samples",  # accumulation at a plain step's samples per epoch (config.updates_per_epoch)
    "lora",  # LoRA adapters on a frozen base (the trainer wraps the model: adapters.adapted), a plain step
)
# Selective checkpointing saves what is costly to recompute, the matrix products and attention (as
# torchtitan's per-op policy does), and recomputes the rest (norms, activations, elementwise products).
_aten = torch.ops.aten
SAVED_OPS = frozenset(
    op
    for op in (
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten.baddbmm.default,
        _aten.convolution.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    )
)


def checkpointing_of(strategy: str) -> str | None:
    """Which checkpointing a strategy uses: 'full', 'selective', or None."""
    if strategy == "selective-checkpointing":
        return "selective"
    return "full" if strategy in ("checkpointing", "checkpointing+accumulation") else None


def uses_checkpointing(strategy: str) -> bool:
    return checkpointing_of(strategy) is not None


def prepare(model, strategy: str) -> None:
    """Switch transformers' activation checkpointing on for the checkpointing strategies."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if uses_checkpointing(strategy):
        enable_checkpointing(model, selective=checkpointing_of(strategy) == "selective")


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts():
    """torch's selective-checkpoint contexts under the policy above (a fresh pair per checkpointed call)."""
    return create_selective_checkpoint_contexts(_selective_policy)


def enable_checkpointing(model, selective: bool = False) -> None:
    """transformers' activation checkpointing, non-reentrant (RNG state and kwargs preserved), of every block
    or, selective, of the cheap ops of every block. Releases before transformers 5.2x name it
    gradient_checkpointing_enable."""
    kwargs = {"use_reentrant": False, **({"context_fn": selective_contexts} if selective else {})}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: torch.as_tensor(v).to(device) if k != "n_targets" else v for k, v in batch.items()}


def autocast(device: torch.device, dtype: str):
    """The forward's precision: bf16-mixed autocasts to bfloat16 (weights, gradients and optimizer state
    stay fp32); fp32 and pure bf16 (weights in bf16) run as they are."""
    if dtype == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if dtype not in ("fp32", "bf16"):
        raise ValueError(f"unknown dtype {dtype!r}; choose from fp32, bf16-mixed, bf16")
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

    `family` (a `advisor.measuring.model.families.Family`) supplies the summed loss of a micro-batch."""
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
            # Not the fit trace's model(**batch).loss (tracer/methods.py step_loss), on purpose: a sum per target,
            # divided by the whole window's targets, so that accumulated and plain steps train the same model.
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
