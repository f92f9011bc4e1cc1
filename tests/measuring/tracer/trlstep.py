"""A real TRL training step on the CPU, measured by PyTorch's own MemTracker: TRL's trainer (SFTTrainer,
DPOTrainer, RewardTrainer, GRPOTrainer) built on a real model, its own `training_step` (TRL's compute_loss:
its fused head, DPO's reference forward; GRPO's generation by transformers' generate, its reference's
log-probabilities, its loss) on a full-length batch as its collator gives one, then its optimizer's step.
The truth `advisor fit --method` is checked against (tests/measuring/tracer/test_methods.py, bench/fit_methods.py).

Nothing here is the tracer's: the loss is TRL's, the model transformers', the bytes MemTracker's."""

from __future__ import annotations

import copy
import tempfile
import warnings
from unittest import mock

import torch
from datasets import Dataset

from advisor.measuring.model.adapters import adapted
from advisor.measuring.model.families.base import token_ids
from advisor.measuring.recipe.optimizers import make_optimizer
from advisor.measuring.recipe.strategies import enable_checkpointing
from advisor.measuring.tracer.spec import Spec, precision

from ...prediction.test_snippets import tiny_tokenizer as tokenizer
from .realstep import FrozenOKMemTracker, real_model

TRAINERS = {
    "sft": ("SFTConfig", "SFTTrainer"),
    "dpo": ("DPOConfig", "DPOTrainer"),
    "reward": ("RewardConfig", "RewardTrainer"),
    "grpo": ("GRPOConfig", "GRPOTrainer"),
}
GRPO_BETA = 0.04  # a KL coefficient that loads the reference (TRL's default 0.0 loads none)


def length_reward(completions, **kwargs) -> list[float]:
    """A reward function of the kind GRPOTrainer takes (its value never changes memory)."""
    return [float(len(c)) for c in completions]


def _dataset(method: str) -> Dataset:
    """A few rows with the method's columns: what the trainer's init tokenizes (the step's batch is made apart)."""
    words = " ".join(f"w{i}" for i in range(8))
    rows = {
        "sft": {"text": [words] * 2},
        "dpo": {"prompt": [words] * 2, "chosen": [words] * 2, "rejected": [words] * 2},
        "reward": {"chosen": [words] * 2, "rejected": [words] * 2},
        "grpo": {"prompt": [words] * 2},
    }[method]
    return Dataset.from_dict(rows)


def _model(spec: Spec, strategy: str):
    """The policy as the trainer gets it; a reward model is a one-label sequence classifier."""
    if spec.method.kind != "reward":
        return real_model(spec, strategy)
    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(spec.config)
    config.num_labels, config.pad_token_id = 1, config.pad_token_id or 0
    weights, _ = precision(spec)
    model = AutoModelForSequenceClassification.from_config(
        config, dtype=weights, attn_implementation=spec.attention
    )
    if strategy.startswith("checkpointing"):
        enable_checkpointing(model)
    if spec.adapter.kind != "full":
        model = adapted(model, spec.adapter, spec.dtype)
    return model.train()


def _batch(spec: Spec, batch: int) -> dict:
    """A full-length micro-batch as the method's collator gives it (a pair's rows: chosen, then rejected)."""
    rows = 2 * batch if spec.method.pairs else batch
    ids = token_ids(spec.config, rows, spec.seq_len)
    ones = torch.ones_like(ids)
    if spec.method.kind == "sft":
        return {"input_ids": ids, "attention_mask": ones, "labels": ids.clone()}
    if spec.method.kind == "reward":
        return {"input_ids": ids, "attention_mask": ones}
    out = {"input_ids": ids, "attention_mask": ones, "completion_mask": ones.clone()}
    if spec.method.reference == "precomputed":
        out |= {"ref_chosen_logps": torch.zeros(batch), "ref_rejected_logps": torch.zeros(batch)}
    return out


def _prompts(spec: Spec, batch: int) -> list[dict]:
    """GRPO's batch as its dataloader gives it: prompts (each generated for), of the spec's prompt length in
    the word-level tokenizer's words."""
    length = spec.seq_len - spec.method.completion
    return [{"prompt": " ".join(f"w{i % 50}" for i in range(length))} for _ in range(batch)]


def trainer_of(spec: Spec, strategy: str, folder: str):
    """The method's TRL trainer on a real model (DPO's reference: a frozen copy passed as ref_model, the
    disabled adapter, or precomputed), its AdamW made as Trainer makes it."""
    import trl

    config_name, trainer_name = TRAINERS[spec.method.kind]
    weights, half = precision(spec)
    kwargs = {}
    if spec.method.kind == "dpo":
        kwargs["precompute_ref_log_probs"] = spec.method.reference == "precomputed"
    if spec.method.kind == "grpo":
        kwargs |= {
            "num_generations": 2,
            "max_completion_length": spec.method.completion,
            "beta": GRPO_BETA if spec.method.reference else 0.0,
        }
    else:
        kwargs["max_length"] = spec.seq_len
    args = getattr(trl, config_name)(
        output_dir=folder,
        use_cpu=True,
        per_device_train_batch_size=2,
        activation_checkpointing=strategy.startswith("checkpointing"),
        bf16=half is torch.bfloat16,
        report_to=[],
        **kwargs,
    )
    model = _model(spec, strategy)
    extra = {}
    if spec.method.kind == "dpo" and spec.method.reference == "model":
        reference = copy.deepcopy(model)
        extra["ref_model"] = reference
    if spec.method.kind == "grpo":
        extra["reward_funcs"] = length_reward
    # GRPO loads its reference from the policy's Hub id: here, a copy of the policy as built
    loads = mock.patch(
        "trl.trainer.grpo_trainer.create_model_from_path", lambda *a, **k: copy.deepcopy(model)
    )
    with warnings.catch_warnings(), loads:
        warnings.simplefilter("ignore")
        trainer = getattr(trl, trainer_name)(
            model=model,
            args=args,
            train_dataset=_dataset(spec.method.kind),
            processing_class=tokenizer(),
            **extra,
        )
    # the optimizer the prediction steps (tests/measuring/tracer/test_menu.py checks each against its real step): what
    # is compared here is TRL's forward and backward, and what it holds beside them
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = make_optimizer("adamw", trained, 1e-4, model=trainer.model)
    trainer.current_gradient_accumulation_steps = 1  # what train() sets before its first step
    # and as train() prepares the model: under mixed precision, its forward wrapped in autocast with its
    # outputs made fp32 (accelerate's prepare_model), where generate calls it
    trainer.model_wrapped = trainer.accelerator.prepare_model(trainer.model)
    return trainer


def real_trl_peak(spec: Spec, strategy: str = "standard", batch: int = 2) -> int:
    """Peak live tensor bytes of a TRL micro-batch (TRL's `training_step`: its loss, the reference's forward,
    the backward; GRPO's generation and scoring before them) in the second optimizer step, the first's
    optimizer state held. The optimizer's own step is Trainer's whatever the method, and left out."""
    return real_trl_peaks(spec, strategy, batch)[0]


def real_trl_peaks(spec: Spec, strategy: str = "standard", batch: int = 2) -> tuple[int, int | None]:
    """(the step's peak as real_trl_peak measures it, GRPO's rollout's alone: what `_prepare_inputs` holds at
    its peak while it generates and scores, in a third step; None for another method)."""
    torch.manual_seed(0)
    grpo = spec.method.kind == "grpo"
    with tempfile.TemporaryDirectory() as folder:
        trainer = trainer_of(spec, strategy, folder)
        model, opt = trainer.model, trainer.optimizer
        held = [trainer.ref_model] if getattr(trainer, "ref_model", None) is not None else []
        trackers = {}  # made once the optimizer's state exists (MemTracker counts what it holds when told)
        prepare = trainer._prepare_inputs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step in range(3 if grpo else 2):  # the step's peak in the second, the rollout's in the third
                opt.zero_grad(set_to_none=True)
                if step:
                    trackers[step] = StepMemTracker()
                    trackers[step].track_external(model, opt, *held)
                if step == 2:
                    trainer._prepare_inputs = lambda inputs: _within(trackers[2], prepare, inputs)
                inputs = _prompts(spec, batch) if grpo else _batch(spec, batch)
                with trackers[1] if step == 1 else _Nothing():
                    trainer.training_step(model, inputs, None)
                opt.step()
    return _total(trackers[1]), _total(trackers[2]) if grpo else None


def _within(tracker, call, inputs):
    with tracker:
        return call(inputs)


def _total(tracker) -> int:
    (snapshot,) = tracker.get_tracker_snapshot("peak").values()
    return snapshot["Total"]


class StepMemTracker(FrozenOKMemTracker):
    """DPO's reference forward with the adapter off runs the policy model a second time in one step: a root
    module called again, which MemTracker takes for a new iteration and refuses. Only the step's peak is
    read here (kept across), not per-module statistics, so the second call starts the module's afresh."""

    def _pre_fw_hook(self, module, inputs):
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.memory_tracking.pop(module)
        return super()._pre_fw_hook(module, inputs)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
