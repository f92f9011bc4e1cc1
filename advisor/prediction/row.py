"""One row of `advisor fit`'s answer: a configuration of the menu with its predicted memory, speed and code."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.prediction.question import Question
from advisor.prediction.step import Adapter, Config


@dataclass
class Row:
    """One configuration of the menu on the user's model and accelerator."""

    config: Config
    adapter: Adapter  # with the question's rank, alpha, targets and base bits
    fits: bool
    memory_gb: dict[str, float]  # the categories, overhead, tensor_peak, total (GB of 10^9 bytes)
    peak_phase: str
    max_batch_size: int
    step_flops: float
    predicted_step_s: float | None
    throughput: float | None  # samples/s
    tokens_per_s: float | None
    trainable_parameters: int
    host_gb: float  # host memory an offloaded or paged optimizer holds
    training_arguments: dict
    trainer_code: str
    adamw: bool  # an AdamW-class optimizer (rules/optimizers.toml)
    bits: int  # bits of the optimizer's state per moment
    trade: str | None = None  # what a non-AdamW optimizer gives up, with the KB's quality evidence

    optimizer = property(lambda self: self.config.optimizer)
    strategy = property(lambda self: self.config.strategy)
    dtype = property(lambda self: self.config.dtype)
    offload = property(lambda self: self.config.offload)

    @property
    def total(self) -> float:
        return self.memory_gb["total"]

    @property
    def label(self) -> str:
        """The configuration in a few words: 'lora r16 · bf16-mixed · adamw · checkpointing'."""
        a = self.adapter
        adapter = {"full": "full", "lora": f"lora r{a.r}", "qlora": f"qlora{a.base_bits} r{a.r}"}[a.kind]
        offload = " · offload" if self.offload != "none" else ""
        return f"{adapter} · {self.dtype} · {self.optimizer} · {self.strategy}{offload}"

    def as_dict(self, q: Question) -> dict:
        return {
            "adapter": self.adapter.kind,
            "lora": None if self.adapter.kind == "full" else self.adapter.key(),
            "base_bits": self.adapter.base_bits if self.adapter.kind == "qlora" else None,
            "trainable_parameters": self.trainable_parameters,
            "optimizer": self.optimizer,
            "strategy": self.strategy,
            "dtype": self.dtype,
            "attention": q.attention,
            "offload": self.offload,
            "batch_size": q.batch_size,
            "accumulation_steps": q.window(self.strategy),
            "fits": self.fits,
            "max_batch_size": self.max_batch_size,
            "memory_gb": self.memory_gb,
            "host_gb": round(self.host_gb, 4),
            "peak_phase": self.peak_phase,
            "step_flops": self.step_flops,
            "predicted_step_s": self.predicted_step_s,
            "samples_per_s": self.throughput,
            "tokens_per_s": self.tokens_per_s,
            "adamw_class": self.adamw,
            "trade": self.trade,
            "training_arguments": self.training_arguments,
            "code": self.trainer_code,
        }
