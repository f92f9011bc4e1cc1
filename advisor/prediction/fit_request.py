"""What `advisor fit` is asked, as given (`FitRequest`: each field's default and help declared once), the
choices its words may take (DTYPES, ADAPTERS, ...) and the ranges its numbers may take (WHOLE, NUMBERS: the
command line's types and the Python API's checks are made from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from advisor.errors import InputError
from advisor.fields import option

# What each choice of a fit may be (the command line's choices and the API's checks; prediction/step.py reads them)
DTYPES = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
ADAPTERS = ("full", "lora", "qlora")
OFFLOADS = ("none", "optimizer", "optimizer+params")
SHARDINGS = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")  # none: one accelerator
ATTENTIONS = ("sdpa", "eager", "flash_attention_2")  # flash_attention_2 is traced as sdpa (rules/fit.toml)
METHODS = (
    "trainer",
    "sft",
    "dpo",
    "reward",
    "grpo",
)  # the step traced: Trainer's own loss, or TRL's trainers
REFERENCES = (
    "model",
    "adapter",
    "precomputed",
)  # where DPO's (and GRPO's) reference log-probabilities come from
GENERATIONS = ("transformers", "vllm-colocate", "vllm-server")  # who samples GRPO's completions
LOSSES = ("logits", "fused")  # Trainer's loss: on the whole logits, or Liger's fused linear cross-entropy

MAX_NODES = 16_384  # past the largest clusters built (about 100,000 GPUs, 8 a node): a larger count is a typo


MOST_SAMPLES = 1 << 20  # a micro-batch, an effective batch, micro-batches per step: past any recipe, a typo


MOST_MEMORY_GIB = 1 << 20  # 1 PiB, past any accelerator or host built (1e308 overflows the arithmetic)


@dataclass(frozen=True, kw_only=True)
class FitRequest:
    """What `advisor fit` is asked (and the menu of `recommend --model`, `measure --plan`, `advisor.fit`), as
    given: each field's default and help declared here once, the command line's options read from them. An
    empty tuple means the default menu of that axis."""

    gpu: str | None = option(
        None,
        "The accelerator: A100-40GB, A100-80GB, H100, H200, L4, L40S, A10G, T4, V100, RTX3090, RTX4090, RTX5090, "
        "MI300X, cpu (`advisor fit --list-gpus`).",
    )
    memory: float | None = option(
        None,
        'The accelerator memory to fit in, in GiB as the box states it (a "24 GB" card: 24), instead of (or '
        "overriding) --gpu's: fit and recommend exclude configurations above it (never compared with host RAM); "
        "measure treats memory above it as out of memory (CUDA: a per-process fraction; CPU: host RSS).",
    )
    batch_size: int | None = option(
        None,
        "Micro-batch size (per_device_train_batch_size); default: each configuration's largest that fits, a "
        "power of two up to the effective batch.",
    )
    seq_len: int | None = option(
        None, "Tokens per sample of a model that takes text (a VLM: per caption). Default: the model's."
    )
    image_size: int | None = option(
        None,
        "Image side in pixels of a model that takes images (a multiple of its patch size). Default: the config's.",
    )
    dtype: str | tuple[str, ...] | None = option(
        (),
        "fp32, bf16-mixed (autocast, fp32 weights and state), fp16-mixed, or bf16 (pure: weights, gradients and "
        "state in bf16) (repeatable). Default: bf16-mixed and pure bf16 where the chip has bf16 (an adapter: "
        "bf16-mixed), else fp16-mixed; fp32 on a CPU.",
    )
    accumulation_steps: int | None = option(
        None, "Micro-batches per optimizer step with accumulation; default: what reaches the effective batch."
    )
    effective_batch: int | None = option(
        None,
        "Samples per optimizer step over every GPU that the recipe reaches (micro-batch x accumulation x GPUs). "
        "Default: 16 for decoders and VLMs, 32 for encoders, 64 for vision (rules/fit.toml [recipe]).",
    )
    optimizers: tuple[str, ...] = option(
        (),
        "Only these optimizers (repeatable), as Trainer's optim names them (adamw_bnb_8bit, adamw_torch_4bit, "
        "lion_8bit, ...). Default: the menu of rules/optimizers.toml.",
    )
    strategies: tuple[str, ...] = option(
        (),
        "Only these strategies (repeatable): standard, checkpointing, selective-checkpointing, accumulation, "
        "checkpointing+accumulation. Default: all.",
    )
    adapters: tuple[str, ...] = option(
        (),
        "What trains (repeatable): full (every weight), lora (peft's LoRA on a frozen base), qlora (LoRA on a "
        "4-bit NF4 base). Default: every one that applies (no QLoRA on a CPU).",
    )
    lora_r: int = option(16, "LoRA's rank.")
    lora_alpha: int | None = option(None, "LoRA's alpha (the update is scaled by alpha / r). Default: 2 x r.")
    lora_targets: tuple[str, ...] = option(
        (),
        "Comma-separated module names LoRA adapts, e.g. q_proj,v_proj. Default: every linear layer of the "
        "blocks (peft's all-linear).",
    )
    base_bits: int = option(4, "QLoRA's base: 4 (NF4, double quantization, bf16 compute) or 8 (LLM.int8).")
    offload: tuple[str, ...] = option(
        (),
        "Where the optimizer lives (repeatable): none; optimizer (its state, fp32 master weights and gradients "
        "on the host: ZeRO-Offload on one GPU, ZeRO-2/3); optimizer+params (ZeRO-3, FSDP's CPU offload). "
        "Default: every one that applies.",
    )
    gpus: int = option(
        1,
        "Accelerators per node. Above one, every rank's memory is predicted per rank, with the communication "
        "each sharding costs and the config to launch it.",
    )
    nodes: int = option(1, f"Nodes of --gpus each (at most {MAX_NODES:,}, past the largest clusters built).")
    shardings: tuple[str, ...] = option(
        (),
        "How the ranks share the work (repeatable: each one compared, not combined): ddp, zero1, zero2, zero3 "
        "(DeepSpeed), fsdp (FSDP2 full shard), hsdp (FSDP within a node, replicated across nodes). Default: all "
        "that apply.",
    )
    attention: str = option(
        "sdpa",
        "The attention implementation (attn_implementation); flash_attention_2 is predicted as sdpa's "
        "FlashAttention kernel.",
    )
    mfu: float | None = option(
        None,
        "Fraction of peak FLOP/s a step reaches, for step times (default: measured on this accelerator, else "
        "0.35).",
    )
    interconnect: str | None = option(
        None,
        "The links collectives go through, comma-separated, one within a node and one between nodes: nvlink2-5, "
        "pcie3-5; ib-edr, ib-hdr, ib-ndr, ib-xdr, roce-200, roce-400, efa-3200, eth-100, eth-25, eth-10 "
        "(rules/hardware.toml [links]), e.g. pcie4,eth-100. Default: the accelerator's own link, and the network "
        "its machines usually carry (A100: ib-hdr; H100, H200, B200: ib-ndr; PCIe cards: Ethernet).",
    )
    method: str | None = option(
        None,
        "The training step: sft (TRL's SFTTrainer: its chunked log-probabilities, no full logits), trainer "
        "(Trainer on the model's own loss), dpo (TRL's DPOTrainer: chosen and rejected in one forward, the "
        "reference's forward without gradients), reward (TRL's RewardTrainer: a one-label classifier on pairs), "
        "grpo (TRL's GRPOTrainer: completions sampled, then the policy's step on them). With dpo and reward, "
        "--batch-size and --effective-batch count pairs; with grpo, completions (--seq-len: prompt + completion). "
        "Default: sft for a causal language model (trainer where trl is not installed, or with --loss fused), "
        "else trainer.",
    )
    reference: str | None = option(
        None,
        "DPO's (and GRPO's, with --beta) reference: model (a frozen copy in memory), adapter (the base with the "
        "adapter off: no extra weights; LoRA and QLoRA only), precomputed (DPO: log-probabilities computed "
        "before training). Default: model for full fine-tuning, adapter for LoRA and QLoRA.",
    )
    completion_len: int | None = option(
        None,
        "GRPO: tokens generated per completion (max_completion_length), within --seq-len. Default: TRL's 512, "
        "or half of --seq-len where that is shorter.",
    )
    generations: int | None = option(
        None,
        "GRPO: completions sampled per prompt (num_generations); the effective batch is a multiple of it. "
        "Default: TRL's 8.",
    )
    beta: float | None = option(
        None,
        "GRPO: the KL coefficient. Above 0 a reference model scores every completion (--reference). Default: "
        "TRL's 0.0 (no reference loaded).",
    )
    loss: str = option(
        "logits",
        "Trainer's loss: logits (the model's own, its [tokens, vocabulary] logits whole) or fused (Liger's fused "
        "linear cross-entropy alone, use_liger_kernel: the output layer and the loss in chunks, no logits; a "
        "CUDA GPU). TRL's methods compute theirs in chunks already.",
    )
    generation: str | None = option(
        None,
        "GRPO: who samples the completions: transformers (the policy's own generate, on the training GPUs), "
        "vllm-colocate (vLLM beside training, holding TRL's 30 % of each GPU), vllm-server (vLLM on GPUs of "
        "its own: not counted here). Default: transformers, TRL's default.",
    )


MAX_GPUS_PER_NODE = 72  # an NVL72 rack's NVLink domain, the largest one node's link figure stands for


TUPLES = ("optimizers", "strategies", "adapters", "lora_targets", "offload", "shardings")


def normalized(options: FitRequest) -> FitRequest:
    """A single name where a tuple is expected (the Python API's adapters="lora") as a one-name tuple."""
    fixed = {k: (getattr(options, k),) for k in TUPLES if isinstance(getattr(options, k), str)}
    options = replace(options, **fixed) if fixed else options
    repeated = {k: tuple(dict.fromkeys(getattr(options, k))) for k in TUPLES}  # a name given twice: once
    return replace(options, **repeated)


# FitRequest's whole numbers, each (its flag, least, most or None, what it counts): the one place their ranges
# are declared. The command line's types are made from it (advisor/cli/params.py `whole`), and the Python API's
# values are held to it (check_numbers); measure's shape options (--batch-size, --seq-len, ...) share it.
WHOLE = {
    "batch_size": ("--batch-size", 1, MOST_SAMPLES, "a whole number of samples"),
    "seq_len": ("--seq-len", 4, None, "a whole number of tokens"),
    "image_size": ("--image-size", 8, None, "a whole number of pixels"),
    "accumulation_steps": ("--accumulation-steps", 2, MOST_SAMPLES, "a whole number of micro-batches"),
    "effective_batch": ("--effective-batch", 1, MOST_SAMPLES, "a whole number of samples per step"),
    "lora_r": ("--lora-r", 1, None, "a whole, positive rank (8 to 64 are usual)"),
    "lora_alpha": ("--lora-alpha", 1, None, "a whole, positive number"),
    "gpus": ("--gpus", 1, None, "a whole number of accelerators per node"),
    "nodes": ("--nodes", 1, MAX_NODES, "a whole number of nodes"),
    "completion_len": ("--completion-len", 1, None, "a whole number of tokens"),
    "generations": ("--generations", 1, None, "a whole number of completions per prompt"),
}


# FitRequest's other numbers, each (its flag, least, most, whether the least is excluded, what it is)
NUMBERS = {
    "memory": ("--memory", 0.0, MOST_MEMORY_GIB, True, "a number of GiB"),
    "mfu": ("--mfu", 0.0, 1.0, True, "a fraction"),
    "beta": ("--beta", 0.0, None, False, "a number"),
}


def check_numbers(options: FitRequest) -> None:
    """What click checks on the command line (WHOLE, NUMBERS), for the Python API too."""
    if isinstance(options.nodes, int) and not isinstance(options.nodes, bool) and options.nodes > MAX_NODES:
        raise InputError(
            f"--nodes is at most {MAX_NODES:,} (got {options.nodes:,}): no cluster built has more.", "nodes"
        )
    if isinstance(options.gpus, int) and options.gpus > MAX_GPUS_PER_NODE:
        raise InputError(
            f"--gpus is per node, and {MAX_GPUS_PER_NODE} share one NVLink domain at most (got {options.gpus}): "
            "pass --nodes for more.",
            "gpus",
        )
    for name in (*WHOLE, *NUMBERS):
        check_number(name, getattr(options, name))


def check_number(name: str, value) -> None:
    """`value` of FitRequest's field `name` (or None) in its declared range (WHOLE, NUMBERS): InputError naming
    the flag, with the range, otherwise. advisor.measure holds its shape options to it too."""
    if value is None:
        return
    if name in WHOLE:
        flag, least, most, what = WHOLE[name]
        fits = isinstance(value, int) and not isinstance(value, bool) and least <= value <= (most or value)
        bounds = f"{least} or more" + (f" and at most {most:,}" if most else "")
    else:
        flag, least, most, open_low, what = NUMBERS[name]
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        fits = number and (value > least if open_low else value >= least) and value <= (most or value)
        low = "above" if open_low else "at least"
        bounds = f"{low} {least:g}" + (f" and at most {most:,}" if most else "")
    if not fits:
        raise InputError(f"{flag} must be {what}, {bounds} (got {value!r}).", name)


def dtypes_asked(dtype: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The dtypes a request names, once each in its order: () where none is (the accelerator's menu)."""
    if dtype is None:
        return ()
    return (dtype,) if isinstance(dtype, str) else tuple(dict.fromkeys(dtype))
