"""Run configuration: one dataclass with its defaults (an option's with its help: `advisor measure` reads
them); presets fill what the user leaves unset. A grid cell is a configuration with its model, resolved once
where the grid was planned.

The CLI overrides fields with `dataclasses.replace`; every run row stores the resolved config as JSON and
hashes it (seed excluded) into the run's cell key.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from advisor.fields import option
from advisor.kb.identity import cell_key
from advisor.model_ref import ResolvedModel

# Per preset: micro-batch size, epochs, steps per epoch (optimizer updates under the fair protocol,
# micro-batches under the paper's), held-out examples. `paper` keeps the paper's batch sizes and 25
# epochs; its epoch is shortened to `steps_per_epoch` steps of generated data (MM-IMDb's 15,552 training
# examples where the hub is reachable and you ask for them).
PRESET_DEFAULTS = {
    "tiny": dict(batch_size=4, epochs=2, steps_per_epoch=4, eval_examples=16),
    "small": dict(batch_size=8, epochs=4, steps_per_epoch=8, eval_examples=64),
    "paper": dict(epochs=25, steps_per_epoch=20, eval_examples=256),
}
# Learning rates for the tiny and small presets, where the paper's per-model rate does not apply: each
# optimizer's conventional default (torch's own where it has one; SGD and CGD have none, these train the
# small models stably; Lion's authors advise a rate 3-10x below AdamW's). The paper preset uses the
# paper's one rate per model for every optimizer.
DEFAULT_LR = {
    "sgd": 0.1,
    "sgd-momentum": 0.01,
    "adam": 1e-3,
    "adamw": 1e-3,
    "adagrad": 1e-2,
    "adadelta": 1.0,
    "cgd": 0.05,
    "adafactor": 1e-3,
    "adamw_bnb_8bit": 1e-3,
    "paged_adamw_8bit": 1e-3,
    "adamw_torch_8bit": 1e-3,
    "adamw_torch_4bit": 1e-3,
    "lion_32bit": 1e-4,
    "lion_8bit": 1e-4,
    "schedule_free_adamw": 2.5e-3,
    "muon": 1e-3,
    "nadamw": 1e-3,
}
PROTOCOLS = ("fair", "paper")
# How each protocol runs conjugate gradient: the fair protocol's stochastic variant (Armijo backtracking on
# the step's own window, PR+ beta clipped to [0, 1], steepest descent every 10 steps and on non-descent);
# the paper's fixed step at the shared rate, beta unclipped, no restarts.
PROTOCOL_CGD = {
    "fair": dict(cgd_line_search="armijo", cgd_restart_every=10, cgd_beta_max=1.0),
    "paper": dict(cgd_line_search="fixed", cgd_restart_every=0, cgd_beta_max=math.inf),
}
PAPER = {  # arXiv 2608.08961, section 3: one learning rate per model, shared by every optimizer
    "vit": dict(lr=3e-4, batch_size=64),
    "modernbert": dict(lr=1e-4, batch_size=32),
    "llama": dict(lr=2e-5, batch_size=16, warmup_ratio=0.03),
    "nanovlm": dict(lr=5e-5, batch_size=32),
}


# Fields added with --data, at their defaults: what every run measured before them had.
DATA_DEFAULTS = dict(
    data="generated", data_path=None, data_id=None, data_note=None, seq_len=None, image_size=None
)


# Strategies that step on a window of micro-batches; EQUAL_SAMPLES is accumulation at a plain step's samples
# per epoch (k times fewer updates), the fair protocol's arm that separates accumulation from its data budget.
EQUAL_SAMPLES = "accumulation-equal-samples"
ACCUMULATING = ("accumulation", "checkpointing+accumulation", EQUAL_SAMPLES)
# Strategies that train LoRA adapters on a frozen base (rules/families.toml `adapters`), and the fields only
# they read: a run of any other strategy stores none of them, so its cell keeps the key it had before them.
ADAPTING = ("lora",)
ADAPTER_FIELDS = ("lora_r", "lora_alpha")


@dataclass(frozen=True)
class RunConfig:
    model: str = "vit"  # vit | modernbert | llama | nanovlm | a Hugging Face id | a local folder
    preset: str = option(  # tiny (tests) | small (CPU reference grid) | paper (real sizes)
        "small",
        "Model sizes: tiny (seconds), small (the CPU reference grid), paper (the paper's real sizes).",
    )
    optimizer: str = "adam"  # sgd | adam | adamw | adagrad | adadelta | cgd
    strategy: str = "standard"  # standard | checkpointing | accumulation | checkpointing+accumulation
    seed: int = 0  # model init, data generation and shuffling
    protocol: str = option(  # fair (advisor/measuring/training/protocol.py) | paper (the paper's)
        "fair",
        "fair: held-out loss, equal optimizer updates for every strategy, time to target (rules/protocol.toml). "
        "paper: the paper's, for reproduction (training loss, one rate per model at preset paper).",
    )
    dtype: str = option(  # what the trainer runs: fp32 | bf16-mixed (advisor/measuring/recipe/strategies.py)
        "fp32", "fp32, or bf16-mixed (autocast to bfloat16, fp32 weights and optimizer state)."
    )
    epochs: int | None = option(None, "Epochs per cell (default: the preset's).")
    # fair: optimizer updates per epoch, the same for every strategy (accumulation takes k micro-batches
    # per update: k times the data and compute); paper: micro-batches per epoch, the same for every strategy
    steps_per_epoch: int | None = option(
        None,
        "Optimizer updates per epoch under the fair protocol, micro-batches under the paper's (default: the "
        "preset's).",
    )
    batch_size: int | None = option(  # None: the preset's (paper: the paper's per model)
        None, "Micro-batch size (per_device_train_batch_size); default: the preset's."
    )
    accumulation_steps: int = option(  # the paper: 4
        4, "Micro-batches per optimizer step with accumulation."
    )
    lora_r: int = 16  # strategy lora: LoRA's rank (peft's r), on every linear layer of the blocks
    lora_alpha: int = 32  # strategy lora: LoRA's scaling numerator (peft's lora_alpha)
    lr: float | None = option(
        None,
        "Learning rate for every optimizer (default: the paper's per model at preset paper, else each "
        "optimizer's default).",
    )
    lr_grid: tuple[float, ...] | None = (
        None  # the rates --tune-lr tried on its tuning seed, where lr is the best
    )
    # Muon's AdamW part (embeddings, output layer, norms, biases): the rate --tune-lr chose for AdamW on the same
    # model and update; None: AdamW's default (a run without --tune-lr)
    adamw_lr: float | None = None
    role: str = "grid"  # grid | tuning (a --tune-lr run: stored under source measured:tuning, never answers)
    eval_examples: int | None = None  # held-out examples (fair protocol); None: the preset's
    target_loss: float | None = option(
        None,
        "Time to target: the held-out loss a run must reach (default: rules/protocol.toml's for the family and "
        "preset). Set it for your own or a pretrained model, whose loss the rules' targets do not know.",
    )
    warmup_ratio: float | None = None  # linear LR warm-up over this share of the steps (paper: 0.03 on llama)
    device: str = option("auto", "Where the cells train: auto (a GPU when there is one), cpu or cuda.")
    warmup_steps: int = 1  # optimizer steps excluded from timing at the start of a cell (stored apart)
    dropout: float | None = None  # None: the model config's own
    # The data (--data), resolved once per `advisor measure` before the grid (advisor/measuring/data/source.py), so that no
    # cell touches the network: generated (offline, deterministic) | mmimdb | a Hugging Face dataset id | a
    # local file or folder
    data: str = "generated"
    data_path: str | None = None  # the local file or folder the cells read (hub data: its snapshot)
    data_id: str | None = (
        None  # what it is: 'pranavmr/MM-IMDb@ad5b994', 'corpus.jsonl sha256:…'; None: generated
    )
    data_note: str | None = None  # what happened resolving it: a fallback to generated data, a cached copy
    seq_len: int | None = option(  # paper: 512, 128
        None,
        "Tokens per sample of a model that takes text (a VLM: per caption). Default: the model's or the preset's.",
    )
    image_size: int | None = option(  # paper: 224
        None,
        "Image side in pixels of a model that takes images (a multiple of its patch size). Default: the "
        "config's or the preset's.",
    )
    divergence_factor: float = 10.0  # a loss above this × the first step's loss (or NaN/inf) is 'diverged'
    memory_cap_gb: float | None = None  # CUDA: a per-process memory fraction; CPU: a host-RSS cap → 'oom'
    cgd_beta: str = "pr+"  # pr+ (Polak–Ribière+) | fr (Fletcher–Reeves)
    # None: the protocol's (PROTOCOL_CGD). Line search: armijo (backtracks on the step's window) | fixed |
    # secant; restart: steepest descent every n steps (0: never), and always on non-descent; beta clipped to
    # [0, beta_max] against minibatch noise (inf: unclipped)
    cgd_line_search: str | None = None
    cgd_restart_every: int | None = None
    cgd_beta_max: float | None = None

    def resolved(self) -> RunConfig:
        """Every None filled from the preset, the protocol, the paper's settings and the optimizer's default
        rate (the paper's one rate per model only under the paper's protocol)."""
        preset = dict(PRESET_DEFAULTS.get(self.preset, PRESET_DEFAULTS["small"]))
        paper = PAPER.get(self.model, {}) if self.preset == "paper" else {}
        if self.protocol != "paper":
            paper = {k: v for k, v in paper.items() if k != "lr"}
        fill = {**preset, **paper, **PROTOCOL_CGD.get(self.protocol, PROTOCOL_CGD["fair"])}
        fill.setdefault("batch_size", 8)
        fill.setdefault("lr", DEFAULT_LR[self.optimizer])
        fill.setdefault("warmup_ratio", 0.0)
        return replace(self, **{k: v for k, v in fill.items() if getattr(self, k) is None})

    def as_dict(self) -> dict:
        """The config as a run stores (and its cell key hashes) it; the data fields at their defaults, and the
        adapter's fields of a strategy that trains none, are left out, so that a cell keeps the key it had
        before they existed (a re-run skips it)."""
        out = {k: v for k, v in asdict(self).items() if k not in DATA_DEFAULTS or v != DATA_DEFAULTS[k]}
        if self.strategy not in ADAPTING:
            out = {k: v for k, v in out.items() if k not in ADAPTER_FIELDS}
        if out["adamw_lr"] is None:
            del out["adamw_lr"]  # every run before it (and every optimizer but Muon) keeps its cell key
        if out["cgd_beta_max"] == math.inf:
            out["cgd_beta_max"] = "inf"  # JSON has no infinity
        if out["lr_grid"] is not None:
            out["lr_grid"] = list(out["lr_grid"])
        return out

    def cell_key(self) -> str:
        """The key of the cell this configuration is (seed excluded): the same on every host. The data is keyed
        by its identity (data_id: a revision or a content hash); how it was asked for, where it was read and
        what happened resolving it (a path, a fallback's note) are recorded, not keyed: the same data keys the
        same cell at any path, and the generated corpus the same with or without a fallback."""
        recorded = ("data", "data_path", "data_note")
        return cell_key({k: v for k, v in self.as_dict().items() if k not in recorded})

    def settings(self) -> str:
        """What this (unresolved) configuration changes from its protocol's defaults, for the runs table.

        The model, preset, cell (optimizer, strategy), seed, device, protocol and data are not settings:
        the evidence group and the hardware already say them. A tuned rate is the protocol's own choice."""
        cell = {"model", "preset", "optimizer", "strategy", "seed", "device", "protocol", "role"}
        cell |= {"data", "data_path", "data_id", "data_note"}  # the evidence group says the data
        if self.lr_grid is not None:
            cell |= {"lr", "lr_grid"}
        default = RunConfig(protocol=self.protocol)
        changed = [f"{k}={v}" for k, v in asdict(self).items() if k not in cell and v != getattr(default, k)]
        if self.lr_grid is not None:
            changed.insert(0, "lr tuned")
        return ", ".join(changed) or "preset defaults"

    @property
    def window(self) -> int:
        """Micro-batches per optimizer update."""
        uses = self.strategy in ACCUMULATING
        return self.accumulation_steps if uses else 1

    @property
    def equal_samples(self) -> bool:
        """Whether an epoch's micro-batches are a plain step's (the paper's protocol, the equal-samples arm),
        so that accumulation makes k times fewer updates; else (the fair protocol) its updates are."""
        return self.protocol != "fair" or self.strategy == EQUAL_SAMPLES

    @property
    def drops_micro_batches(self) -> bool:
        """Whether equal samples would leave a partial window at the end of an epoch (resolved configs)."""
        return self.equal_samples and self.steps_per_epoch % self.window != 0

    @property
    def updates_per_epoch(self) -> int:
        """Optimizer updates per epoch (resolved configs): equal for every strategy under the fair protocol."""
        return self.steps_per_epoch // self.window if self.equal_samples else self.steps_per_epoch

    @property
    def train_examples(self) -> int:
        """The training set's size: under the fair protocol every strategy draws from the same set, the one
        accumulation needs for an epoch (a plain step samples a fresh part of it every epoch)."""
        if self.protocol == "fair":
            return self.steps_per_epoch * self.batch_size * self.accumulation_steps
        return self.steps_per_epoch * self.batch_size

    @property
    def label(self) -> str:
        return f"{self.model}/{self.preset} {self.optimizer}+{self.strategy} seed {self.seed}"


@dataclass(frozen=True)
class GridCell:
    """One cell of a grid: its run configuration and its model, resolved once where the grid was planned.
    The object travels to the cell's process (and to a Ray worker), never the model's name alone."""

    config: RunConfig  # as asked (its `settings()` say what the user changed); `resolved`: filled in
    model: ResolvedModel

    @cached_property
    def resolved(self) -> RunConfig:
        """The cell's configuration resolved (RunConfig.resolved), once per cell: planning, sharding, the
        data's checks and the run all read this one (a frozen dataclass without slots may cache it)."""
        return self.config.resolved()

    def on(self, device: str) -> GridCell:
        """The cell resolved and on `device` (cpu, cuda): the cell as it runs, is priced and is stored."""
        return GridCell(replace(self.resolved, device=device), self.model)

    def with_config(self, **changes) -> GridCell:
        """The same cell with some of its configuration changed (`dataclasses.replace` on the config)."""
        return GridCell(replace(self.config, **changes), self.model)
