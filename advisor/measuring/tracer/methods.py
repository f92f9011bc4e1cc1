"""The step of each training method as its trainer runs it, for the tracer: Trainer's own loss, or TRL's
(SFTTrainer, DPOTrainer, RewardTrainer) with TRL's own fused LM head, so that what TRL allocates (its
chunked log-probabilities instead of the [tokens, vocab] logits, DPO's reference forward alongside the
policy's activations) is traced, not modelled. The method's vocabulary (advisor/prediction/step.py Method)
is the answer side's; this module imports TRL.

On a CUDA spec, TRL's chunked log-probabilities take their CUDA path (`trl_kernels`): only the scored
positions are projected, each tile folded by a Triton kernel in place (no temporaries: a no-op here), the
gradient GEMMs accumulated in fp32 straight from bf16 (`addmm` with `out_dtype`). On a CPU spec TRL's own
torch fold runs as it would.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext
from types import SimpleNamespace
from unittest import mock

import torch
import torch.nn.functional as F

DPO_BETA = 0.1  # DPOConfig's default; the loss's scale never changes memory
# The per-token fields each trainer asks TRL's fused head for (their metrics), as TRL 1.16 adds it
FUSED_OUTPUTS = {
    "sft": ("log_probs", "entropy", "is_top1"),
    "dpo": ("log_probs", "entropy", "mean_logits", "is_top1"),
}


def model_class(spec):
    """The transformers class the method trains: a reward model is a one-label sequence classifier."""
    if spec.method.kind == "reward":
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification
    return spec.family.model_class()


def configured(spec, config):
    """The config as the method's trainer loads it (a copy is changed): a reward model scores with one label,
    and finds each sequence's last token by its pad token (RewardTrainer sets the tokenizer's)."""
    if spec.method.kind == "reward":
        config.num_labels = 1
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0
    return config


def prepare(spec, model) -> None:
    """TRL's fused LM head on the model (on peft's base model under an adapter), as the trainer adds it."""
    outputs = FUSED_OUTPUTS.get(spec.method.kind)
    if outputs is None:
        return
    from trl.trainer.utils import add_fused_lm_head

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    add_fused_lm_head(base, outputs=outputs)


def prepare_reference(reference) -> None:
    """DPOTrainer's reference model: frozen, in eval mode, with the fused head (log-probabilities only)."""
    from trl.trainer.utils import add_fused_lm_head

    reference.requires_grad_(False)
    reference.eval()
    add_fused_lm_head(reference)


def batch_of(spec, config, batch_size: int) -> dict:
    """One micro-batch as the method's collator gives it, full length (torch tensors): a pair's chosen and
    rejected rows one after the other (2 x the micro-batch); every token after the first a scored
    completion token (the most TRL's head projects)."""
    rows = 2 * batch_size if spec.method.pairs else batch_size
    batch = spec.family.fit_batch(config, rows, spec.seq_len, spec.image_size, spec.images)
    if spec.method.kind == "reward":
        batch.pop("labels", None)
    if spec.method.kind == "dpo" and spec.method.reference == "precomputed":
        batch["ref_logps"] = torch.zeros(rows)  # a column of the precomputed dataset
    return batch


def step_loss(spec, model, reference, batch: dict, start) -> torch.Tensor:
    """The micro-batch's loss as the method's trainer computes it (`start(phase)` marks where the reference's
    forward begins: its own phase of the step)."""
    kind = spec.method.kind
    if kind == "trainer":
        return model(**batch).loss
    if kind == "sft":
        out = model(**batch, use_cache=False, fused_lm_head=True)
        return -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)
    if kind == "reward":
        chosen, rejected = model(**batch, use_cache=False).logits.squeeze(-1).chunk(2)
        return -F.logsigmoid(chosen - rejected).mean()
    return _dpo_loss(spec, model, reference, batch, start)


def _dpo_loss(spec, model, reference, batch: dict, start) -> torch.Tensor:
    """DPOTrainer's sigmoid loss: the policy's forward, then the reference's without gradients while the
    policy's activations are alive (TRL 1.16's order), then the loss on the four sums of log-probabilities."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    labels = batch["labels"]
    policy = model(**inputs, labels=labels, use_cache=False, fused_lm_head=True).log_probs.sum(1)
    if spec.method.reference == "precomputed":
        ref = batch["ref_logps"]
    else:
        start("reference")
        with torch.no_grad(), _reference_of(spec, model, reference) as ref_model:
            ref = ref_model(**inputs, labels=labels, use_cache=False, fused_lm_head=True).log_probs.sum(1)
    chosen, rejected = policy.chunk(2)
    ref_chosen, ref_rejected = ref.chunk(2)
    return -F.logsigmoid(DPO_BETA * ((chosen - ref_chosen) - (rejected - ref_rejected))).mean()


@contextmanager
def _reference_of(spec, model, reference):
    """The model that scores the reference: the frozen copy, or the policy with its adapter disabled."""
    if spec.method.reference == "adapter":
        with model.disable_adapter():
            yield model
    else:
        yield reference


def trl_kernels(spec):
    """TRL's chunked log-probabilities on their CUDA path, for a CUDA spec with TRL's head (nothing else)."""
    if spec.device != "cuda" or spec.method.kind not in FUSED_OUTPUTS:
        return nullcontext()
    from trl.kernels import chunked_logprob
    from trl.trainer import utils

    stack = ExitStack()
    in_place = _InPlaceKernel()
    for target, name, value in (
        (chunked_logprob, "_use_triton", _on_gpu),
        (utils, "_use_triton", _on_gpu),
        (chunked_logprob, "_forward_kernel", in_place),
        (chunked_logprob, "_backward_kernel", in_place),
        (chunked_logprob, "_addmm_fp32", _addmm_fp32),
        (chunked_logprob, "triton", SimpleNamespace(cdiv=lambda a, b: -(-a // b))),
    ):
        stack.enter_context(mock.patch.object(target, name, value, create=True))
    return stack


def _on_gpu(device) -> bool:
    return True


class _InPlaceKernel:
    """A Triton kernel launched as `kernel[grid](...)` that writes its tile and statistics in place: no
    bytes allocated, nothing to trace."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _addmm_fp32(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """TRL's CUDA accumulation: bf16/fp16 products summed into fp32 without an fp32 copy of either."""
    if a.dtype in (torch.float16, torch.bfloat16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())
