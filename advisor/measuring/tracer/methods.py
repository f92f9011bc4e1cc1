"""The step of each training method as its trainer runs it, for the tracer: Trainer's own loss, or TRL's
(SFTTrainer, DPOTrainer, RewardTrainer, GRPOTrainer) with TRL's own fused LM head, so that what TRL
allocates (its chunked log-probabilities instead of the [tokens, vocab] logits, DPO's reference forward
alongside the policy's activations, GRPO's generation with its KV cache) is traced, not modelled. The method's vocabulary (advisor/prediction/step.py Method)
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

from advisor.measuring.tracer.fused_loss import causal_lm_loss

DPO_BETA = 0.1  # DPOConfig's default; the loss's scale never changes memory
# The per-token fields each trainer asks TRL's fused head for (their metrics), as TRL 1.16 adds it
FUSED_OUTPUTS = {
    "sft": ("log_probs", "entropy", "is_top1"),
    "dpo": ("log_probs", "entropy", "mean_logits", "is_top1"),
    "grpo": ("log_probs", "entropy"),
}
GRPO_EPSILON = (0.2, 0.2)  # GRPOConfig's clipping range (epsilon, epsilon_high defaults to epsilon)


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
    """DPOTrainer's (GRPOTrainer's) reference model: frozen, in eval mode, with the fused head
    (log-probabilities only)."""
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
    if spec.method.kind == "grpo":  # prompt then completion; only the completion is scored
        batch["labels"][:, : -spec.method.completion] = -100
        batch["advantages"] = torch.zeros(rows)
    if spec.method.kind == "reward":
        batch.pop("labels", None)
    if spec.method.kind == "dpo" and spec.method.reference == "precomputed":
        batch["ref_logps"] = torch.zeros(rows)  # a column of the precomputed dataset
    return batch


def step_loss(spec, model, reference, batch: dict, start) -> torch.Tensor:
    """The micro-batch's loss as the method's trainer computes it (`start(phase)` marks where the reference's
    forward begins: its own phase of the step)."""
    kind = spec.method.kind
    if kind == "trainer" and spec.method.loss == "fused":
        return _fused_loss(model, batch)
    if kind == "trainer":
        # Written twice on purpose: this is the user's step as Trainer runs it (the model's own mean loss), whose
        # memory `fit` predicts; advisor measure's step (recipe/strategies.py, family.summed_loss) sums per
        # target so that accumulation divides by the window's tokens. Same tensors held, different arithmetic.
        return model(**batch).loss
    if kind == "sft":
        out = model(**batch, use_cache=False, fused_lm_head=True)
        return -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)
    if kind == "reward":
        chosen, rejected = model(**batch, use_cache=False).logits.squeeze(-1).chunk(2)
        return -F.logsigmoid(chosen - rejected).mean()
    if kind == "grpo":
        return _grpo_loss(spec, model, batch)
    return _dpo_loss(spec, model, reference, batch, start)


def _fused_loss(model, batch: dict) -> torch.Tensor:
    """Trainer's step with Liger's fused linear cross-entropy in the model's forward (its `lce_forward`): the
    decoder's hidden states, then the output layer and the loss in chunks (fused_loss.py), no logits."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = base.model(**inputs, use_cache=False)[0]
    return causal_lm_loss(hidden, base.get_output_embeddings().weight, batch["labels"])


def _grpo_loss(spec, model, batch: dict) -> torch.Tensor:
    """GRPOTrainer's loss as its defaults compute it (DAPO's token-level clipped ratio, the old
    log-probabilities the current ones detached; the KL to the reference's where they were scored)."""
    completion = spec.method.completion
    out = model(**_scored(batch), use_cache=False, fused_lm_head=True)
    logps = out.log_probs[:, -completion:]
    _ = out.entropy[:, -completion:]  # TRL keeps it for its metrics
    mask = batch["attention_mask"][:, -completion:]
    coef_1 = torch.exp(logps - logps.detach())
    coef_2 = torch.clamp(coef_1, 1 - GRPO_EPSILON[0], 1 + GRPO_EPSILON[1])
    advantages = batch["advantages"].unsqueeze(1)
    per_token = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if "ref_logps" in batch:
        ref = batch["ref_logps"]
        per_token = per_token + DPO_BETA * (torch.exp(ref - logps) - (ref - logps) - 1)
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def _scored(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}


def rollout(spec, model, reference, batch: dict, start, cast) -> dict:
    """What GRPOTrainer does before its loss, once per optimizer step, without gradients: the completions
    sampled (by the policy itself: its prefill over the prompts, then the last decoding step, the KV cache
    at its fullest; vLLM elsewhere: the policy's log-probabilities for its importance-sampling correction),
    then the reference's log-probabilities where the KL coefficient is not 0. `start(phase)` marks each
    phase ("filling": the cache grown to the last step's length, not a phase of the run); `cast()`, the
    autocast each forward of the prepared model runs in (accelerate wraps its forward in its own, and makes
    its outputs fp32). A peft model generates through its base model's forward, which accelerate never
    wrapped: in the base's own precision. Returns what the loss reads of it."""
    from trl.models.utils import disable_gradient_checkpointing

    completion = spec.method.completion
    ids, mask = batch["input_ids"], batch["attention_mask"]

    def forward(module, wrapped: bool = True, **inputs):
        with cast() if wrapped else nullcontext():
            out = module(**inputs)
        if wrapped and getattr(out, "logits", None) is not None and out.logits.dtype != torch.float32:
            out.logits = out.logits.float()  # accelerate's convert_outputs_to_fp32
        return out

    generating = {"wrapped": not hasattr(model, "get_base_model"), "use_cache": True, "logits_to_keep": 1}
    out = {}
    with torch.no_grad(), disable_gradient_checkpointing(model):
        if spec.method.generates:
            start("prefill")
            prompt = {"input_ids": ids[:, :-completion], "attention_mask": mask[:, :-completion]}
            _sample(forward(model, **prompt, **generating), [None, None])
            start("filling")
            grown = forward(model, input_ids=ids[:, :-2], attention_mask=mask[:, :-2], **generating)
            cache, last = grown.past_key_values, [None, None]
            _sample(grown, last)
            del grown
            start("decode")
            step = {"input_ids": ids[:, -2:-1], "attention_mask": mask[:, :-1], "past_key_values": cache}
            _sample(forward(model, **step, **generating), last)
            del cache, last
        else:
            start("scoring")
            forward(model, **_scored(batch), use_cache=False, fused_lm_head=True)
        if spec.method.reference is not None:
            start("reference")
            with _reference_of(spec, model, reference) as ref_model:
                logps = forward(ref_model, **_scored(batch), use_cache=False, fused_lm_head=True).log_probs
                out["ref_logps"] = logps[:, -completion:]
    return out


def _sample(out, last: list) -> None:
    """transformers' sampling step on a forward's last logits (GRPOConfig's defaults: temperature 1, no
    top-k or top-p: no logits processor runs): an fp32 copy, its softmax, one token drawn per row, the
    forward's output alive until the step ends. `last` holds the previous step's copy and probabilities, as
    generate's loop variables do until they are bound again."""
    last[0] = out.logits[:, -1].to(copy=True, dtype=torch.float32)
    last[1] = F.softmax(last[0], dim=-1)
    torch.multinomial(last[1], num_samples=1)


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
