"""One row of `advisor fit`'s answer: a configuration of the menu with its predicted memory, speed and code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from advisor.prediction.question import Question
from advisor.prediction.step import Adapter, Config
from advisor.prediction.training_code.recipe import LearningRate
from advisor.prediction.training_code.snippets import keyword_arguments


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
    code_of: Callable[[], tuple[dict, str, dict | None]] = field(repr=False, compare=False)  # made when read
    adamw: bool  # an AdamW-class optimizer (rules/optimizers.toml)
    bits: int  # bits of the optimizer's state per moment
    trade: str | None = None  # what a non-AdamW optimizer gives up, with the KB's quality evidence
    communication_bytes: float = 0.0  # a rank's collectives per optimizer step (within and across nodes)
    gpus: int = 1  # accelerators per node the configuration runs on
    nodes: int = 1
    adapter_trade: str | None = (
        None  # what its adapter (LoRA) gives up against full fine-tuning, with evidence
    )
    adapter_evidence: str | None = None  # of that, the KB's measured loss alone (None: the KB has none)
    batch_size: int = 1  # the micro-batch it is priced at (the recipe's: recipe.batches)
    accumulation_steps: int = 1  # micro-batches per optimizer step
    rate: LearningRate | None = None  # the learning rate and schedule the code starts from
    repriced: Callable[[int, int], Row] | None = field(default=None, repr=False, compare=False)
    phases_gb: dict[str, float] = field(default_factory=dict)  # each phase's peak of tensors (GB), by name
    generation_tokens_s: float | None = (
        None  # GRPO: completion tokens/s of its generation (a bound: speed.py)
    )
    collectives_s: tuple[float, float] | None = None  # its collectives' seconds a step, and those not hidden

    def at(self, batch_size: int, accumulation_steps: int) -> Row:
        """The same configuration priced at another micro-batch and accumulation (to compare two rows alike)."""
        return self.repriced(batch_size, accumulation_steps) if self.repriced else self

    optimizer = property(lambda self: self.config.optimizer)
    strategy = property(lambda self: self.config.strategy)
    dtype = property(lambda self: self.config.dtype)
    offload = property(lambda self: self.config.offload)
    sharding = property(lambda self: self.config.sharding)
    world = property(lambda self: self.gpus * self.nodes)

    @cached_property
    def _code(self) -> tuple[dict, str, dict | None]:
        return self.code_of()

    @property
    def training_arguments(self) -> dict:
        """TrainingArguments' keyword arguments, as the printed snippet passes them (output_dir 'out'), from
        the dict the snippet is written from: `TrainingArguments(**row.training_arguments)`. A fresh copy each
        read, so changing it changes no snippet; HSDP's parallelism_config an accelerate ParallelismConfig."""
        return keyword_arguments(self._code[0])

    @property
    def trainer_code(self) -> str:
        """The Python that trains it."""
        return self._code[1]

    @property
    def launch(self) -> dict | None:
        """For several accelerators: the launch command and its configs."""
        return self._code[2]

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step over every rank."""
        return self.batch_size * self.accumulation_steps * self.world

    @property
    def total(self) -> float:
        return self.memory_gb["total"]

    @property
    def label(self) -> str:
        """The configuration in a few words: 'lora r16 · bf16-mixed · adamw · checkpointing'."""
        a = self.adapter
        adapter = {"full": "full", "lora": f"lora r{a.r}", "qlora": f"qlora{a.base_bits} r{a.r}"}[a.kind]
        offload = {"none": "", "optimizer": " · offload", "optimizer+params": " · offload+params"}[
            self.offload
        ]
        sharding = "" if self.sharding == "none" else f" · {self.sharding} on {self.world} GPUs"
        return f"{adapter} · {self.dtype} · {self.optimizer} · {self.strategy}{sharding}{offload}"

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
            "batch_size": self.batch_size,
            "accumulation_steps": self.accumulation_steps,
            "effective_batch": self.effective_batch,
            "learning_rate": self.rate.as_dict() if self.rate else None,
            "fits": self.fits,
            "max_batch_size": self.max_batch_size,
            "memory_gb": self.memory_gb,
            "host_gb": round(self.host_gb, 4),
            "host_gb_per_node": round(self.host_gb, 4) if self.sharding != "none" else None,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "sharding": self.sharding,
            "per_rank": self.sharding != "none",
            "communication_bytes_per_step": self.communication_bytes,
            "communication_s_per_step": self.collectives_s[0] if self.collectives_s else None,
            "communication_exposed_s_per_step": self.collectives_s[1] if self.collectives_s else None,
            "gpu_hours_per_billion_tokens": (
                self.world * 1e9 / self.tokens_per_s / 3600 if self.tokens_per_s else None
            ),
            "launch": self.launch,
            "peak_phase": self.peak_phase,
            "phases_gb": {p: round(v, 4) for p, v in self.phases_gb.items()},
            "step_flops": self.step_flops,
            "predicted_step_s": self.predicted_step_s,
            "samples_per_s": self.throughput,
            "tokens_per_s": self.tokens_per_s,
            "generation_tokens_per_s": self.generation_tokens_s,
            "adamw_class": self.adamw,
            "trade": self.trade,
            "adapter_trade": self.adapter_trade,
            "adapter_evidence": self.adapter_evidence,
            "training_arguments": self._code[0],  # as --json prints it: parallelism_config as its fields
            "code": self.trainer_code,
        }
