"""What a configuration trains with beyond what fits: its micro-batch and accumulation, which reach the
question's effective batch (samples per optimizer step over every rank), and a learning rate and schedule
with where they come from. Every row of `advisor fit` is priced at its own recipe, and the printed code
carries it (rules/fit.toml [recipe])."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from advisor.kb.queries.for_prediction import tuned_rates
from advisor.prediction.question import Question
from advisor.prediction.step import Config
from advisor.rules import Rules


def accumulates(strategy: str) -> bool:
    """Whether a strategy steps once every several micro-batches (its gradients held between them)."""
    return strategy.endswith("accumulation")


def batches(q: Question, strategy: str, max_batch: int) -> tuple[int, int]:
    """(micro-batch, micro-batches per optimizer step) of a configuration whose largest fitting micro-batch is
    `max_batch` (0: none fits): each as given, else the micro-batch is the largest power of two that fits, at
    most the effective batch over the ranks, and an accumulating strategy makes up the rest (at least 2)."""
    share = math.ceil(q.effective_batch / q.world)  # samples one rank takes per optimizer step
    window = q.accumulation_steps if accumulates(strategy) else 1
    micro = q.batch_size
    if micro is None:
        least = window or 2  # an accumulating strategy takes at least two micro-batches to its share
        cap = max(1, share // least)
        micro = 1 << (min(max(max_batch, 1), cap).bit_length() - 1)  # the largest power of two at most both
    if accumulates(strategy) and window is None:
        window = max(2, math.ceil(share / micro))
    return micro, window


@dataclass(frozen=True)
class LearningRate:
    """A starting learning rate and schedule for a configuration, and what they rest on."""

    lr: float
    schedule: str  # TrainingArguments' lr_scheduler_type: constant | cosine | linear
    warmup_ratio: float
    source: str
    short: str = ""  # where it comes from in a few words: "QLoRA's default", "tuned in your KB"
    tuned: bool = False  # from the KB's runs of this model (advisor measure --tune-lr), not a default
    adamw_lr: float | None = (
        None  # AdamW's default beside it, for an optimizer that leaves some weights to AdamW
    )

    def arguments(self) -> dict:
        """TrainingArguments' keys for it (transformers 5: a float warmup_steps below 1 is a share of the steps;
        a constant rate warms up only as constant_with_warmup)."""
        schedule = (
            "constant_with_warmup" if self.schedule == "constant" and self.warmup_ratio else self.schedule
        )
        return {"learning_rate": self.lr, "lr_scheduler_type": schedule, "warmup_steps": self.warmup_ratio}

    def as_dict(self) -> dict:
        return {**self.arguments(), "source": self.source, "short": self.short, "tuned": self.tuned}


@dataclass(frozen=True)
class Recipe:
    """What the printed code trains a configuration with: the batch it was priced at, and its rate."""

    batch_size: int  # per_device_train_batch_size
    accumulation_steps: int  # gradient_accumulation_steps
    rate: LearningRate


def learning_rate(q: Question, c: Config, rules: Rules, tuned: dict | None = None) -> LearningRate:
    """The rate a configuration starts from: the KB's tuned rate for this model, optimizer and adapter where
    it has one (`tuned`, from `rates_tuned`), else the default of its adapter and family, scaled or replaced
    for an optimizer whose authors say so (rules/fit.toml [recipe.learning_rate], [recipe.optimizers])."""
    recipe = rules.fit["recipe"]
    base = _default(recipe["learning_rate"], c.adapter, q.model.family.name, q.method)
    free = c.optimizer.startswith("schedule_free")  # it schedules (and warms up) itself: a constant rate
    schedule, warmup = ("constant", 0.0) if free else (base["schedule"], base["warmup_ratio"])
    found = (tuned or {}).get(
        (c.optimizer, "lora" if c.adapter != "full" else "full", accumulates(c.strategy))
    )
    if found:
        lr, runs, batch = found
        source = (
            f"Tuned by advisor measure --tune-lr for {q.model.name} with {c.optimizer} at a batch of {batch} "
            f"({runs} runs in your KB); this recipe steps on {q.effective_batch}: a starting point where they differ."
        )
        return LearningRate(lr, schedule, warmup, source, "tuned in your KB", True, base["lr"])
    own = recipe.get("optimizers", {}).get(c.optimizer)
    lr, source, short = base["lr"], base["source"], base["short"]
    if own and "lr" in own:
        lr, source = own["lr"], f"{own['source']} (Default for {c.optimizer}; not tuned for this model.)"
        short = f"{c.optimizer}'s default"
    elif own and "lr_factor" in own:
        lr, source = base["lr"] * own["lr_factor"], f"{base['source']} {own['source']}"
        short = f"{short} x {own['lr_factor']:g} for {c.optimizer}"
    return LearningRate(float(f"{lr:.3g}"), schedule, warmup, source, short, False, base["lr"])


def _default(table: dict, adapter: str, family: str, method: str = "trainer") -> dict:
    """The learning-rate record for a TRL method with a default of its own (dpo, reward), else for an adapter
    (lora, qlora: 'lora') or full fine-tuning of a family."""
    if method in table:
        return table[method]
    if adapter != "full":
        return table["lora"]
    return table.get(f"full_{family}", table["full"])


def rates_tuned(kbs: list[sqlite3.Connection], q: Question) -> dict:
    """{(optimizer, 'full' | 'lora', accumulating): (lr, runs, effective batch)} the KBs' tuned runs of this
    model chose, the user's KB first (a reference model's at its preset only)."""
    out: dict = {}
    for conn in kbs:
        for key, value in tuned_rates(conn, q.model.name, q.model.preset, q.model.config_hash).items():
            out.setdefault(key, value)
    return out
