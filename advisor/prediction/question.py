"""What `advisor fit` is asked: the options as the user gives them (`FitRequest`), checked against the
model and the accelerator into one `Question`, with the menu of configurations it asks about, that every
later step receives."""

from __future__ import annotations

from dataclasses import dataclass, replace
from importlib.util import find_spec

from advisor.errors import InputError
from advisor.model_ref import ResolvedModel
from advisor.prediction import accelerators
from advisor.prediction.fit_request import (
    ADAPTERS,
    ATTENTIONS,
    GENERATIONS,
    LOSSES,
    METHODS,
    OFFLOADS,
    REFERENCES,
    SHARDINGS,
    FitRequest,
    check_numbers,
    dtypes_asked,
    normalized,
)
from advisor.prediction.menu import Menu
from advisor.prediction.step import (
    Adapter,
    Config,
    Method,
)
from advisor.rules import Accelerator, Rules


@dataclass(frozen=True, kw_only=True)
class Question:
    """A fit question with every option checked and every default filled: the configurations to answer."""

    model: ResolvedModel
    accelerator: Accelerator | None
    budget_gb: float  # the memory a configuration must fit in
    batch_size: int | None  # the micro-batch as given; None: each row's largest that fits (recipe.py)
    seq_len: int | None
    image_size: int | None
    accumulation_steps: int | None  # as given; None: what reaches the effective batch
    configs: tuple[Config, ...]  # the menu asked, in the rules' order
    lora: Adapter = Adapter("lora")  # the rank, alpha, targets and base bits every adapter row uses
    attention: str = "sdpa"  # as asked: sdpa | eager | flash_attention_2
    mfu: float | None = None  # --mfu: overrides measured evidence and the default
    left_out: tuple[str, ...] = ()  # what the default menu left out, and why
    gpus: int = 1  # accelerators per node
    nodes: int = 1
    effective_batch: int = 16  # samples per optimizer step over every rank that a recipe reaches
    effective_source: str = ""  # where that figure comes from: --effective-batch, or the rules' default
    method: str = "trainer"  # trainer | sft | dpo | reward | grpo (fit_request.py METHODS)
    reference: str | None = None  # DPO's (GRPO's) reference as asked; None: per adapter (method_of)
    rollout: Rollout | None = None  # GRPO's generation settings, every default filled
    loss: str = "logits"  # Trainer's: logits | fused (Liger's fused linear cross-entropy)
    links: accelerators.Links = accelerators.Links(None, None)  # within a node and between nodes

    @property
    def world(self) -> int:
        """Ranks: one per accelerator."""
        return self.gpus * self.nodes

    @property
    def device(self) -> str:
        """cuda | cpu: which optimizer implementations and overheads apply."""
        return "cpu" if self.accelerator is not None and self.accelerator.key == "cpu" else "cuda"

    @property
    def reserved_gb(self) -> float:
        """Memory of each accelerator that training cannot use: vLLM's share where it runs beside it."""
        return self.rollout.reserved(self.budget_gb) if self.rollout else 0.0

    @property
    def rows_per_sample(self) -> int:
        """Sequences a sample is: a preference pair's two (DPO, reward), else one."""
        return 2 if Method(self.method).pairs else 1

    @property
    def traced_attention(self) -> str:
        """The attention traced: FlashAttention is modelled as sdpa, whose CUDA dispatch picks it (rules/fit.toml)."""
        return "sdpa" if self.attention == "flash_attention_2" else self.attention

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.dtype for c in self.configs))

    @property
    def optimizers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.optimizer for c in self.configs))

    def adapter_of(self, kind: str) -> Adapter:
        """The adapter a configuration's `adapter` names, with the question's LoRA settings."""
        return Adapter() if kind == "full" else replace(self.lora, kind=kind)

    def method_of(self, adapter: str) -> Method:
        """The step a configuration with this adapter trains with (Method.asked)."""
        r = self.rollout
        if r is None:
            return Method.asked(self.method, self.reference, adapter, loss=self.loss)
        return Method.asked(self.method, self.reference, adapter, r.beta, r.completion, r.generation)


VLLM_SHARE = 0.3  # GRPOConfig's vllm_gpu_memory_utilization: the share of each GPU vLLM colocated takes
COMPLETION = 512  # GRPOConfig's max_completion_length
GENERATIONS_PER_PROMPT = 8  # GRPOConfig's num_generations


@dataclass(frozen=True)
class Rollout:
    """GRPO's generation as asked, TRL's defaults filled: tokens per completion, completions per prompt, the
    KL coefficient and who samples."""

    completion: int = COMPLETION
    generations: int = GENERATIONS_PER_PROMPT
    beta: float = 0.0
    generation: str = GENERATIONS[0]

    def reserved(self, budget_gb: float) -> float:
        return VLLM_SHARE * budget_gb if self.generation == "vllm-colocate" else 0.0


def question(
    model: ResolvedModel, options: FitRequest, rules: Rules, accelerator: Accelerator | None = None
) -> Question:
    """The whole question, every option checked against the model and the accelerator (`accelerator`: one
    already resolved, instead of options.gpu). InputError names the option to fix."""
    options = normalized(options)
    check_numbers(options)
    options, defaulted = _with_method(options, model)
    acc = accelerator or (accelerators.resolve(options.gpu, rules) if options.gpu else None)
    if acc is None and options.memory is None:
        raise InputError("pass --gpu NAME (e.g. A100-80GB, H100, RTX4090, cpu) or --memory GiB.", "gpu")
    budget = (
        options.memory * accelerators.GB_PER_GIB
        if options.memory is not None
        else accelerators.memory_gb(acc)
    )
    _check_names(options, rules)
    lora = _lora(options)
    _check_attention(options, acc)
    seq_len, image_size = _shape(model, options)
    _check_method(options, model)
    _check_loss(options, model, acc, rules)
    rollout = _rollout(options, seq_len)
    configs, left_out = Menu(options, rules, acc).configs()
    left_out += defaulted
    effective_batch, effective_source = _effective(options, model, rules, rollout)
    return Question(
        model=model,
        accelerator=acc,
        budget_gb=budget,
        batch_size=options.batch_size,
        seq_len=seq_len,
        image_size=image_size,
        accumulation_steps=options.accumulation_steps,
        configs=configs,
        lora=lora,
        attention=options.attention,
        mfu=options.mfu,
        left_out=left_out,
        gpus=options.gpus,
        nodes=options.nodes,
        effective_batch=effective_batch,
        effective_source=effective_source,
        method=options.method,
        reference=options.reference,
        rollout=rollout,
        loss=options.loss,
        links=accelerators.links(acc, options.interconnect, rules),
    )


def _check_loss(options: FitRequest, model: ResolvedModel, acc: Accelerator | None, rules: Rules) -> None:
    """A fused loss where Liger has one: Trainer's step of a model type Liger patches, on a CUDA GPU."""
    if options.loss == "logits":
        return
    if options.loss not in LOSSES:
        raise InputError(f"unknown loss {options.loss!r}. Choose from: {', '.join(LOSSES)}.", "loss")
    if options.method != "trainer":
        raise InputError(
            f"--method {options.method} computes TRL's loss in chunks already: drop --loss.", "loss"
        )
    if acc is not None and acc.key == "cpu":
        raise InputError("Liger's kernels are Triton's, for CUDA GPUs: pass a --gpu, not cpu.", "loss")
    supported = rules.fit["loss"]["fused"]["model_types"]
    if model.model_type not in supported:
        raise InputError(
            f"Liger has no fused loss for {model.name} ({model.model_type or 'no model_type'}); it patches "
            f"{', '.join(supported)}.",
            "loss",
        )


def _rollout(options: FitRequest, seq_len: int | None) -> Rollout | None:
    """GRPO's generation settings, checked (None for another method, which takes none of them)."""
    given = {
        "--completion-len": options.completion_len,
        "--generations": options.generations,
        "--beta": options.beta,
        "--generation": options.generation,
    }
    if options.method != "grpo":
        flag = next((f for f, v in given.items() if v is not None), None)
        if flag:
            raise InputError(
                f"{flag} is GRPO's: add --method grpo, or drop {flag}.", flag[2:].replace("-", "_")
            )
        return None
    beta = options.beta  # its range: check_numbers
    if options.generation is not None and options.generation not in GENERATIONS:
        raise InputError(
            f"unknown generation {options.generation!r}. Choose from: {', '.join(GENERATIONS)}.",
            "generation",
        )
    if options.reference is not None and not beta:
        raise InputError(
            "GRPO loads a reference only with a KL coefficient: add --beta (e.g. 0.04), or drop --reference.",
            "reference",
        )
    completion = options.completion_len or min(COMPLETION, seq_len // 2)
    if completion >= seq_len:
        raise InputError(
            f"--seq-len is prompt + completion: {seq_len} leaves no prompt for --completion-len {completion}; "
            "raise --seq-len or lower --completion-len.",
            "completion_len",
        )
    return Rollout(
        completion,
        options.generations or GENERATIONS_PER_PROMPT,
        float(beta or 0.0),
        options.generation or GENERATIONS[0],
    )


def _with_method(options: FitRequest, model: ResolvedModel) -> tuple[FitRequest, tuple[str, ...]]:
    """The method asked, else the default: TRL's SFT step for a causal language model (what fine-tuning one
    mostly runs now), Trainer's with --loss fused (Liger's loss is Trainer's) or where trl is not installed
    (said, in what the answer left out), Trainer's for any other model."""
    if options.method is not None:
        return options, ()
    if "sft" not in model.family.methods or options.loss == "fused":
        return replace(options, method="trainer"), ()
    if find_spec("trl") is None:
        why = "sft: TRL is not installed (pip install 'advisor[trainer]'), so Trainer's step is predicted"
        return replace(options, method="trainer"), (why,)
    return replace(options, method="sft"), ()


def _check_method(options: FitRequest, model: ResolvedModel) -> None:
    """A method and a reference that apply to the model and to what trains; TRL installed for TRL's."""
    if options.method not in METHODS:
        raise InputError(f"unknown method {options.method!r}. Choose from: {', '.join(METHODS)}.", "method")
    if options.reference is not None:
        if options.method not in ("dpo", "grpo"):
            raise InputError(
                "--reference is DPO's and GRPO's: add --method dpo, or drop --reference.", "reference"
            )
        if options.reference == "precomputed" and options.method == "grpo":
            raise InputError(
                "GRPO scores completions it samples during training: nothing to precompute. Use --reference "
                "model or adapter.",
                "reference",
            )
        if options.reference not in REFERENCES:
            raise InputError(
                f"unknown reference {options.reference!r}. Choose from: {', '.join(REFERENCES)}.",
                "reference",
            )
        if options.reference == "adapter" and set(options.adapters or ()) == {"full"}:
            raise InputError(
                "--reference adapter disables a LoRA adapter: with --adapter full, use --reference model or "
                "precomputed.",
                "reference",
            )
    if options.method == "trainer":
        return
    if options.method not in model.family.methods:
        raise InputError(
            f"--method {options.method} trains a causal language model with TRL; {model.name} is a "
            f"{model.family.name} model: drop --method (Trainer's step).",
            "method",
        )
    if find_spec("trl") is None:
        raise InputError(
            f"--method {options.method} traces TRL's own trainer: pip install 'advisor[trainer]' (trl).",
            "method",
        )


def _effective(
    options: FitRequest, model: ResolvedModel, rules: Rules, rollout: Rollout | None = None
) -> tuple[int, str]:
    """(samples per optimizer step over every rank, its source): --effective-batch, the product of a given
    micro-batch, accumulation and ranks, or the family's default (rules/fit.toml [recipe.effective_batch]);
    for GRPO, completions, a whole number of prompts' generations (TRL refuses another)."""
    effective, source = _samples(options, model, rules)
    if rollout is None or effective % rollout.generations == 0:
        return effective, source
    if source.startswith("the default"):  # the default in whole prompts
        prompts = -(-effective // rollout.generations)
        return prompts * rollout.generations, f"{prompts} prompts x {rollout.generations} generations"
    raise InputError(
        f"GRPO samples --generations {rollout.generations} completions per prompt: the effective batch "
        f"({source}: {effective}) must be a multiple of it.",
        "effective_batch" if options.effective_batch is not None else "generations",
    )


def _samples(options: FitRequest, model: ResolvedModel, rules: Rules) -> tuple[int, str]:
    world = options.gpus * options.nodes
    given = (options.batch_size, options.accumulation_steps)
    if options.effective_batch is not None:
        if None not in given:
            raise InputError(
                "--effective-batch is --batch-size x --accumulation-steps x GPUs: pass two of the three.",
                "effective_batch",
            )
        return options.effective_batch, "--effective-batch"
    if None not in given:
        return given[0] * given[1] * world, "--batch-size x --accumulation-steps x GPUs"
    table = rules.fit["recipe"]["effective_batch"]
    name = model.family.name
    return table.get(name, table["other"]), f"the default for {name} models (rules/fit.toml [recipe])"


def _check_attention(options: FitRequest, acc: Accelerator | None) -> None:
    """FlashAttention-2 needs an Ampere or newer GPU (bf16 is the proxy: the chips of rules/hardware.toml with
    bf16 are those) and half precision."""
    if options.attention != "flash_attention_2":
        return
    if acc is not None and (acc.key == "cpu" or "bf16" not in acc.tflops):
        where = "a CPU" if acc.key == "cpu" else acc.name
        raise InputError(
            f"FlashAttention-2 needs an Ampere or newer GPU, not {where}: use --attention sdpa.",
            "attention",
        )
    if "fp32" in dtypes_asked(options.dtype):
        raise InputError(
            "FlashAttention-2 computes in fp16 or bf16: drop --dtype fp32, or use --attention sdpa.",
            "attention",
        )


def _lora(options: FitRequest) -> Adapter:
    """The LoRA settings, checked: a positive rank and alpha, 4- or 8-bit base."""
    alpha = 2 * options.lora_r if options.lora_alpha is None else options.lora_alpha
    if alpha <= 0:
        raise InputError(f"--lora-alpha must be positive (got {alpha}); the default is 2 x r.", "lora_alpha")
    if options.base_bits not in (4, 8):
        raise InputError(f"--base-bits is 4 (NF4) or 8 (LLM.int8), not {options.base_bits}.", "base_bits")
    if options.base_bits != 4 and options.adapters and "qlora" not in options.adapters:
        raise InputError("--base-bits sets QLoRA's base: add --adapter qlora.", "base_bits")
    if options.adapters and set(options.adapters) == {"full"}:
        given = [
            f
            for f, v in (
                ("--lora-r", options.lora_r != 16),
                ("--lora-alpha", options.lora_alpha is not None),
                ("--lora-targets", bool(options.lora_targets)),
                ("--base-bits", options.base_bits != 4),
            )
            if v
        ]
        if given:
            raise InputError(
                f"{given[0]} applies to --adapter lora or qlora, not full.", given[0][2:].replace("-", "_")
            )
    targets = tuple(sorted({t.strip() for t in options.lora_targets if t.strip()}))
    return Adapter("lora", options.lora_r, alpha, targets, options.base_bits)


def _shape(model: ResolvedModel, options: FitRequest) -> tuple[int | None, int | None]:
    """(tokens per sample, image side) for the model: what its family takes, the user's sizes checked."""
    family = model.family
    if not family.takes_text and options.seq_len is not None:
        raise InputError(f"{model.name} takes images, not text: --seq-len does not apply.", "seq_len")
    if not family.takes_images and options.image_size is not None:
        raise InputError(f"{model.name} takes text, not images: --image-size does not apply.", "image_size")
    longest = model.max_seq_len
    if options.seq_len is not None and longest and options.seq_len > longest:
        raise InputError(
            f"--seq-len {options.seq_len} is beyond {model.name}'s maximum of {longest} positions.",
            "seq_len",
        )
    seq_len = options.seq_len
    default = family.text_seq_len if text_first(model) else family.fit_seq_len
    if family.takes_text and seq_len is None:
        seq_len = min(default, longest or default)
    if text_first(model) and options.image_size is None:
        return seq_len, None  # text alone: --image-size adds an image
    return seq_len, options.image_size or model.image_size


def text_first(model: ResolvedModel) -> bool:
    """A vision-language model people fine-tune on text first (rules/families.toml `text_first`: Gemma 3)."""
    return model.family.takes_images and model.model_type in model.family.text_first


def _check_names(options: FitRequest, rules: Rules) -> None:
    for names, known, flag, field in (
        (options.optimizers, rules.optimizers, "--optimizer", "optimizers"),
        (options.strategies, rules.strategies, "--strategy", "strategies"),
        (options.adapters, ADAPTERS, "--adapter", "adapters"),
        (options.offload, OFFLOADS, "--offload", "offload"),
        (options.shardings, SHARDINGS, "--sharding", "shardings"),
        ((options.attention,), ATTENTIONS, "--attention", "attention"),
    ):
        for name in names if flag == "--strategy" else ():
            if name in rules.arms:
                raise InputError(
                    f"--strategy {name} is a measured arm of {rules.arms[name]} (the same step, another data "
                    f"budget): for memory and speed ask for --strategy {rules.arms[name]}.",
                    "strategies",
                )
            if name in rules.adapters:
                raise InputError(
                    f"--strategy {name} is a measured strategy: advisor fit asks for it as --adapter {name} "
                    f"--strategy {rules.adapters[name]}.",
                    "strategies",
                )
        for name in names:
            if name not in known:
                raise InputError(f"unknown {flag[2:]} {name!r}. Choose from: {', '.join(known)}.", field)
