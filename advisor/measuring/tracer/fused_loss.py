"""Liger's fused linear cross-entropy (liger-kernel 0.8.5, `LigerForCausalLMLoss` on its CUDA path) in torch,
for the tracer: the output layer and the loss in chunks of tokens, the full [tokens, vocabulary] logits never
made. Written here because Liger's kernels are Triton's alone (they neither import nor run without it), and
a trace needs the same allocations, in the same order, made by torch ops:

- in the forward, the gradients of the hidden states ([tokens, hidden], their dtype) and, for a trained
  output layer, of its weight ([vocabulary, hidden], the parameter's dtype) are made, then each chunk's
  logits ([chunk, vocabulary] in the compute dtype): Liger's kernel turns them into their gradient in place
  (here: in-place torch ops, a column of temporaries a row), which is projected back into both gradients;
- the chunk is `next_power_of_2(ceil(tokens / ceil(vocabulary / hidden)))` tokens: about [tokens, hidden]
  of logits at a time;
- both gradients are saved for the backward, which scales them in place by the loss's upstream gradient
  (Trainer's division by the tokens of the batch) and returns them.

`tests/measuring/tracer/test_fused_loss.py` checks the trace of it against the same loss run for real."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IGNORE = -100


def causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Liger's `LigerForCausalLMLoss` as Trainer calls it (its token count passed): the labels padded and
    shifted, the hidden states flattened, the summed loss over the scored tokens."""
    labels = F.pad(labels, (0, 1), value=IGNORE)
    shifted = labels[..., 1:].contiguous().view(-1)
    flat = hidden.view(-1, hidden.shape[-1])
    return FusedLinearCrossEntropy.apply(flat, weight, shifted) / (shifted != IGNORE).sum()


def chunk_tokens(tokens: int, hidden: int, vocabulary: int) -> int:
    """Liger's chunk: the tokens whose logits hold about as many numbers as the hidden states of all."""
    factor = -(-vocabulary // hidden)
    return min(1 << max(0, math.ceil(math.log2(-(-tokens // factor)))), tokens)


class FusedLinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of `hidden @ weight.T` against `target`, its gradients made in the forward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        tokens, width = hidden.shape
        size = chunk_tokens(tokens, width, weight.shape[0])
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        losses = torch.zeros(tokens, dtype=torch.float32, device=hidden.device)
        # operands already in the compute dtype: one logits buffer, products written in place (Liger's mm out=)
        storage = (
            torch.empty((size, weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
            if _in_place(hidden, weight)
            else None
        )
        for start in range(0, tokens, size):
            end = min(start + size, tokens)
            part = hidden[start:end]
            if storage is not None:
                logits = torch.mm(part, weight.t(), out=storage[: end - start])
            else:
                logits = part @ weight.t()  # the compute dtype under autocast
            _cross_entropy_in_place(logits, target[start:end], losses[start:end])
            if storage is not None:
                torch.mm(logits, weight, out=grad_hidden[start:end])
            else:
                grad_hidden[start:end] = logits @ weight
            if grad_weight is not None:  # Liger's fp32 accumulation straight from the half-precision gradient
                rows = part.to(logits.dtype) if part.dtype != logits.dtype else part
                if grad_weight.dtype != logits.dtype:
                    torch.addmm(grad_weight, logits.t(), rows, out_dtype=grad_weight.dtype, out=grad_weight)
                else:
                    grad_weight.addmm_(logits.t(), rows)
                del rows
            del logits, part
        del storage
        ctx.save_for_backward(grad_hidden.detach(), grad_weight.detach() if grad_weight is not None else None)
        return losses.sum()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_hidden.mul_(grad_output)  # Liger's element_mul kernel, in place
        if grad_weight is not None:
            grad_weight.mul_(grad_output)
        return grad_hidden, grad_weight, None


def _in_place(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Liger's `_can_use_mm_out`: operands of one dtype that autocast would not cast."""
    if hidden.dtype != weight.dtype:
        return False
    return not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") == hidden.dtype


def _cross_entropy_in_place(logits: torch.Tensor, target: torch.Tensor, losses: torch.Tensor) -> None:
    """Liger's cross-entropy kernel: each row's loss written to `losses`, and the row turned into the loss's
    gradient in place (softmax less the target's one-hot; rows of ignored targets zero), no [rows, vocabulary]
    tensor made."""
    scored = target != IGNORE
    picked = target.clamp(min=0).unsqueeze(1)
    chosen = logits.gather(1, picked).float()
    top = logits.amax(1, keepdim=True)
    logits.sub_(top).exp_()
    total = logits.sum(1, keepdim=True, dtype=torch.float32)
    losses.copy_((total.log() + top.float() - chosen).squeeze(1) * scored)
    logits.div_(total.to(logits.dtype))
    logits.scatter_add_(1, picked, -torch.ones_like(picked, dtype=logits.dtype))
    logits.mul_(scored.unsqueeze(1).to(logits.dtype))
