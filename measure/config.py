"""Run configuration: one dataclass with commented defaults; presets fill what the user leaves unset.

The CLI overrides fields with `dataclasses.replace`; every run row stores the resolved config as JSON and
hashes it (seed excluded) into the run's cell key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from measure.optimizers import DEFAULT_LR

# Sizes per preset: micro-batch size, epochs, micro-batches per epoch. `paper` keeps the paper's batch
# sizes, learning rates and 25 epochs; its epoch is shortened to `steps_per_epoch` micro-batches of
# generated data (MM-IMDb's 15,552 training examples where the hub is reachable and you ask for them).
PRESET_DEFAULTS = {
    "tiny": dict(batch_size=4, epochs=2, steps_per_epoch=8),
    "small": dict(batch_size=8, epochs=4, steps_per_epoch=24),
    "paper": dict(epochs=25, steps_per_epoch=20),
}
PAPER = {  # arXiv 2608.08961, section 3: one learning rate per model, shared by every optimizer
    "vit": dict(lr=3e-4, batch_size=64),
    "modernbert": dict(lr=1e-4, batch_size=32),
    "llama": dict(lr=2e-5, batch_size=16, warmup_ratio=0.03),
    "nanovlm": dict(lr=5e-5, batch_size=32),
}


@dataclass(frozen=True)
class RunConfig:
    model: str = "vit"  # vit | modernbert | llama | nanovlm | a Hugging Face id | a local folder
    preset: str = "small"  # tiny (tests) | small (CPU reference grid) | paper (real sizes)
    optimizer: str = "adam"  # sgd | adam | adamw | adagrad | adadelta | cgd
    strategy: str = "standard"  # standard | checkpointing | accumulation | checkpointing+accumulation
    seed: int = 0  # model init, data generation and shuffling
    epochs: int | None = None  # None: the preset's
    steps_per_epoch: int | None = None  # micro-batches per epoch, the same for every strategy (same data)
    batch_size: int | None = None  # micro-batch size; None: the preset's (paper: the paper's per model)
    accumulation_steps: int = 4  # micro-batches per optimizer step with accumulation (the paper: 4)
    lr: float | None = None  # None: the paper's per-model rate (paper preset), else the optimizer's default
    warmup_ratio: float | None = None  # linear LR warm-up over this share of the steps (paper: 0.03 on llama)
    device: str = "auto"  # auto | cpu | cuda
    warmup_steps: int = 1  # optimizer steps excluded from timing at the start of a cell (stored apart)
    dropout: float | None = None  # None: the model config's own
    divergence_factor: float = 10.0  # a loss above this × the first step's loss (or NaN/inf) is 'diverged'
    memory_cap_gb: float | None = None  # CUDA: a per-process memory fraction; CPU: a host-RSS cap → 'oom'
    cgd_line_search: str = "fixed"  # fixed (the paper: the shared lr) | armijo | secant
    cgd_beta: str = "pr+"  # pr+ (Polak–Ribière+) | fr (Fletcher–Reeves)

    def resolved(self) -> RunConfig:
        """Every None filled from the preset, the paper's settings and the optimizer's default rate."""
        preset = dict(PRESET_DEFAULTS.get(self.preset, PRESET_DEFAULTS["small"]))
        paper = PAPER.get(self.model, {}) if self.preset == "paper" else {}
        fill = {**preset, **paper}
        fill.setdefault("batch_size", 8)
        fill.setdefault("lr", DEFAULT_LR[self.optimizer])
        fill.setdefault("warmup_ratio", 0.0)
        return replace(self, **{k: v for k, v in fill.items() if getattr(self, k) is None})

    def as_dict(self) -> dict:
        return asdict(self)

    def protocol(self) -> str:
        """What this (unresolved) configuration changes from the preset's defaults, for the runs table.

        The model, preset, cell (optimizer, strategy), seed and device are not protocol: the evidence
        group and the hardware already say them."""
        cell = {"model", "preset", "optimizer", "strategy", "seed", "device"}
        default = RunConfig()
        changed = [f"{k}={v}" for k, v in asdict(self).items() if k not in cell and v != getattr(default, k)]
        return ", ".join(changed) or "preset defaults"

    @property
    def label(self) -> str:
        return f"{self.model}/{self.preset} {self.optimizer}+{self.strategy} seed {self.seed}"
