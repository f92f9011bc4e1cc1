"""What `advisor fit` is asked: the options as the user gives them (`FitOptions`), checked against the
model and the accelerator into one `Question` that every later step receives."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.errors import InputError
from advisor.model_ref import ResolvedModel
from advisor.prediction import accelerators
from advisor.prediction.step import DTYPES
from advisor.rules import Accelerator, Rules


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """The options of `advisor fit` (and of `recommend --model`, `measure --plan`, `advisor.fit`), as given."""

    gpu: str | None = None  # the accelerator by name: A100-80GB, H100, RTX4090, cpu (rules/hardware.toml)
    memory: float | None = None  # the memory budget in GB, instead of (or overriding) the accelerator's
    batch_size: int = 1  # micro-batch size (per_device_train_batch_size)
    seq_len: int | None = None  # tokens per sample; None: the family's default, capped at the model's maximum
    image_size: int | None = None  # image side in pixels; None: the config's
    dtype: str | None = None  # fp32 | bf16-mixed | fp16-mixed | bf16; None: the accelerator's best
    accumulation_steps: int = 4  # micro-batches per optimizer step with accumulation
    optimizers: tuple[str, ...] = ()  # only these; () every optimizer of the rules
    strategies: tuple[str, ...] = ()  # only these; () every strategy of the rules
    mfu: float | None = None  # fraction of peak FLOP/s a step reaches; None: measured, else the default


@dataclass(frozen=True)
class Question:
    """A fit question with every option checked and every default filled."""

    model: ResolvedModel
    accelerator: Accelerator | None
    budget_gb: float  # the memory a configuration must fit in
    batch_size: int
    seq_len: int | None
    image_size: int | None
    dtype: str
    accumulation_steps: int
    optimizers: tuple[str, ...]
    strategies: tuple[str, ...]
    mfu: float | None = None  # --mfu: overrides measured evidence and the default

    @property
    def device(self) -> str:
        """cuda | cpu: which optimizer implementations and overheads apply."""
        return "cpu" if self.accelerator is not None and self.accelerator.key == "cpu" else "cuda"

    def window(self, strategy: str) -> int:
        """Micro-batches per optimizer step under a strategy."""
        return self.accumulation_steps if strategy.endswith("accumulation") else 1


def question(
    model: ResolvedModel, options: FitOptions, rules: Rules, accelerator: Accelerator | None = None
) -> Question:
    """The whole question, every option checked against the model and the accelerator (`accelerator`: one
    already resolved, instead of options.gpu). InputError names the option to fix."""
    acc = accelerator or (accelerators.resolve(options.gpu, rules) if options.gpu else None)
    if acc is None and options.memory is None:
        raise InputError("pass --gpu NAME (e.g. A100-80GB, H100, RTX4090, cpu) or --memory GB.", "--gpu")
    budget = options.memory if options.memory is not None else accelerators.memory_gb(acc)
    dtype = options.dtype or _default_dtype(acc)
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}. Choose from: {', '.join(DTYPES)}.", "--dtype")
    if acc is not None and accelerators.peak_tflops(acc, dtype) is None and acc.key != "cpu":
        raise InputError(
            f"{acc.name} has no {accelerators.PRECISION[dtype]} support; use --dtype fp16-mixed or fp32.",
            "--dtype",
        )
    _check_names(options, rules)
    seq_len, image_size = _shape(model, options)
    return Question(
        model,
        acc,
        budget,
        options.batch_size,
        seq_len,
        image_size,
        dtype,
        options.accumulation_steps,
        tuple(options.optimizers) or tuple(rules.optimizers),
        tuple(options.strategies) or tuple(rules.strategies),
        options.mfu,
    )


def _shape(model: ResolvedModel, options: FitOptions) -> tuple[int | None, int | None]:
    """(tokens per sample, image side) for the model: what its family takes, the user's sizes checked."""
    family = model.family
    if not family.takes_text and options.seq_len is not None:
        raise InputError(f"{model.name} takes images, not text: --seq-len does not apply.", "--seq-len")
    if not family.takes_images and options.image_size is not None:
        raise InputError(f"{model.name} takes text, not images: --image-size does not apply.", "--image-size")
    longest = model.max_seq_len
    if options.seq_len is not None and longest and options.seq_len > longest:
        raise InputError(
            f"--seq-len {options.seq_len} is beyond {model.name}'s maximum of {longest} positions.",
            "--seq-len",
        )
    seq_len = options.seq_len
    if family.takes_text and seq_len is None:
        seq_len = min(family.fit_seq_len, longest or family.fit_seq_len)
    return seq_len, options.image_size or model.image_size


def _check_names(options: FitOptions, rules: Rules) -> None:
    for names, known, flag in (
        (options.optimizers, rules.optimizers, "--optimizer"),
        (options.strategies, rules.strategies, "--strategy"),
    ):
        for name in names:
            if name not in known:
                raise InputError(f"unknown {flag[2:]} {name!r}. Choose from: {', '.join(known)}.", flag)


def _default_dtype(acc: Accelerator | None) -> str:
    """bf16 mixed precision where the chip has bf16, fp16 mixed where it has only fp16, fp32 on a CPU."""
    if acc is None:
        return "bf16-mixed"
    if acc.key == "cpu":
        return "fp32"
    return "bf16-mixed" if "bf16" in acc.tflops else "fp16-mixed"
