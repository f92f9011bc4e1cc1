"""A real TRL training step on the CPU, measured by PyTorch's own MemTracker: TRL's trainer (SFTTrainer,
DPOTrainer, RewardTrainer) built on a real model, its own `training_step` (TRL's compute_loss: its fused
head, DPO's reference forward) on a full-length batch as its collator gives one, then its optimizer's step.
The truth `advisor fit --method` is checked against (tests/measure/test_methods.py, bench/fit_methods.py).

Nothing here is the tracer's: the loss is TRL's, the model transformers', the bytes MemTracker's."""

from __future__ import annotations

import copy
import tempfile
import warnings

import torch
from datasets import Dataset

from advisor.measuring.model.adapters import adapted
from advisor.measuring.model.families.base import token_ids
from advisor.measuring.recipe.optimizers import make_optimizer
from advisor.measuring.recipe.strategies import enable_checkpointing
from advisor.measuring.tracer.engine import Spec, precision

from ..advisor.test_snippets import tiny_tokenizer as tokenizer
from .realstep import FrozenOKMemTracker, real_model

TRAINERS = {
    "sft": ("SFTConfig", "SFTTrainer"),
    "dpo": ("DPOConfig", "DPOTrainer"),
    "reward": ("RewardConfig", "RewardTrainer"),
}


def _dataset(method: str) -> Dataset:
    """A few rows with the method's columns: what the trainer's init tokenizes (the step's batch is made apart)."""
    words = " ".join(f"w{i}" for i in range(8))
    rows = {
        "sft": {"text": [words] * 2},
        "dpo": {"prompt": [words] * 2, "chosen": [words] * 2, "rejected": [words] * 2},
        "reward": {"chosen": [words] * 2, "rejected": [words] * 2},
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


def trainer_of(spec: Spec, strategy: str, folder: str):
    """The method's TRL trainer on a real model (DPO's reference: a frozen copy passed as ref_model, the
    disabled adapter, or precomputed), its AdamW made as Trainer makes it."""
    import trl

    config_name, trainer_name = TRAINERS[spec.method.kind]
    weights, half = precision(spec)
    kwargs = {}
    if spec.method.kind == "dpo":
        kwargs["precompute_ref_log_probs"] = spec.method.reference == "precomputed"
    args = getattr(trl, config_name)(
        output_dir=folder,
        use_cpu=True,
        per_device_train_batch_size=2,
        max_length=spec.seq_len,
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = getattr(trl, trainer_name)(
            model=model,
            args=args,
            train_dataset=_dataset(spec.method.kind),
            processing_class=tokenizer(),
            **extra,
        )
    # the optimizer the prediction steps (tests/measure/test_menu.py checks each against its real step): what
    # is compared here is TRL's forward and backward, and what it holds beside them
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = make_optimizer("adamw", trained, 1e-4, model=trainer.model)
    trainer.current_gradient_accumulation_steps = 1  # what train() sets before its first step
    return trainer


def real_trl_peak(spec: Spec, strategy: str = "standard", batch: int = 2) -> int:
    """Peak live tensor bytes of a TRL micro-batch (TRL's `training_step`: its loss, the reference's forward,
    the backward) in the second optimizer step, the first's optimizer state held. The optimizer's own step is
    Trainer's whatever the method, and left out."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        trainer = trainer_of(spec, strategy, folder)
        model, opt = trainer.model, trainer.optimizer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step in range(2):
                opt.zero_grad(set_to_none=True)
                tracker = StepMemTracker() if step else None
                if tracker is not None:
                    held = [trainer.ref_model] if getattr(trainer, "ref_model", None) is not None else []
                    tracker.track_external(model, opt, *held)
                with tracker if tracker is not None else _Nothing():
                    trainer.training_step(model, _batch(spec, batch))
                opt.step()
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
