"""What `advisor fit` is asked: the options as the user gives them (`FitRequest`), checked against the
model and the accelerator into one `Question`, with the menu of configurations it asks about, that every
later step receives."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from importlib.util import find_spec

from advisor.errors import InputError
from advisor.fields import option
from advisor.model_ref import ResolvedModel
from advisor.prediction import accelerators
from advisor.prediction.step import (
    ADAPTERS,
    ATTENTIONS,
    DTYPES,
    GENERATIONS,
    LOSSES,
    METHODS,
    OFFLOADS,
    REFERENCES,
    SHARDINGS,
    Adapter,
    Config,
    Method,
)
from advisor.rules import Accelerator, Rules

# FSDP's default strategies (Menu.strategies): Trainer's own checkpointing (fsdp_config's, on or off), with and
# without accumulation (each micro-batch's gradients reduce-scattered: accelerate's sync_each_batch)
SHARDED_STRATEGIES = ("standard", "checkpointing", "accumulation", "checkpointing+accumulation")
MAX_NODES = 16_384  # past the largest clusters built (about 100,000 GPUs, 8 a node): a larger count is a typo
MOST_SAMPLES = 1 << 20  # a micro-batch, an effective batch, micro-batches per step: past any recipe, a typo
MOST_MEMORY_GIB = 1 << 20  # 1 PiB, past any accelerator or host built (1e308 overflows the arithmetic)
OFFLOAD_DTYPES = ("bf16-mixed",)  # what an offloaded optimizer is predicted for: a bf16 device copy


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
    method: str = "trainer"  # trainer | sft | dpo | reward | grpo (step.py METHODS)
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
    options = _normalized(options)
    check_numbers(options)
    options, defaulted = _with_method(options, model)
    acc = accelerator or (accelerators.resolve(options.gpu, rules) if options.gpu else None)
    if acc is None and options.memory is None:
        raise InputError("pass --gpu NAME (e.g. A100-80GB, H100, RTX4090, cpu) or --memory GiB.", "--gpu")
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
        raise InputError(f"unknown loss {options.loss!r}. Choose from: {', '.join(LOSSES)}.", "--loss")
    if options.method != "trainer":
        raise InputError(
            f"--method {options.method} computes TRL's loss in chunks already: drop --loss.", "--loss"
        )
    if acc is not None and acc.key == "cpu":
        raise InputError("Liger's kernels are Triton's, for CUDA GPUs: pass a --gpu, not cpu.", "--loss")
    supported = rules.fit["loss"]["fused"]["model_types"]
    if model.model_type not in supported:
        raise InputError(
            f"Liger has no fused loss for {model.name} ({model.model_type or 'no model_type'}); it patches "
            f"{', '.join(supported)}.",
            "--loss",
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
            raise InputError(f"{flag} is GRPO's: add --method grpo, or drop {flag}.", flag)
        return None
    beta = options.beta  # its range: check_numbers
    if options.generation is not None and options.generation not in GENERATIONS:
        raise InputError(
            f"unknown generation {options.generation!r}. Choose from: {', '.join(GENERATIONS)}.",
            "--generation",
        )
    if options.reference is not None and not beta:
        raise InputError(
            "GRPO loads a reference only with a KL coefficient: add --beta (e.g. 0.04), or drop --reference.",
            "--reference",
        )
    completion = options.completion_len or min(COMPLETION, seq_len // 2)
    if completion >= seq_len:
        raise InputError(
            f"--seq-len is prompt + completion: {seq_len} leaves no prompt for --completion-len {completion}; "
            "raise --seq-len or lower --completion-len.",
            "--completion-len",
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
        raise InputError(f"unknown method {options.method!r}. Choose from: {', '.join(METHODS)}.", "--method")
    if options.reference is not None:
        if options.method not in ("dpo", "grpo"):
            raise InputError(
                "--reference is DPO's and GRPO's: add --method dpo, or drop --reference.", "--reference"
            )
        if options.reference == "precomputed" and options.method == "grpo":
            raise InputError(
                "GRPO scores completions it samples during training: nothing to precompute. Use --reference "
                "model or adapter.",
                "--reference",
            )
        if options.reference not in REFERENCES:
            raise InputError(
                f"unknown reference {options.reference!r}. Choose from: {', '.join(REFERENCES)}.",
                "--reference",
            )
        if options.reference == "adapter" and set(options.adapters or ()) == {"full"}:
            raise InputError(
                "--reference adapter disables a LoRA adapter: with --adapter full, use --reference model or "
                "precomputed.",
                "--reference",
            )
    if options.method == "trainer":
        return
    if options.method not in model.family.methods:
        raise InputError(
            f"--method {options.method} trains a causal language model with TRL; {model.name} is a "
            f"{model.family.name} model: drop --method (Trainer's step).",
            "--method",
        )
    if find_spec("trl") is None:
        raise InputError(
            f"--method {options.method} traces TRL's own trainer: pip install 'advisor[trainer]' (trl).",
            "--method",
        )


class Menu:
    """The configurations a question asks about: each axis as given, else its default, with the combinations
    that do not apply left out (and refused when the user named both sides of one)."""

    def __init__(self, options: FitRequest, rules: Rules, acc: Accelerator | None):
        self.o, self.rules, self.acc = options, rules, acc
        self.cpu = acc is not None and acc.key == "cpu"
        self.left_out: list[str] = []

    def configs(self) -> tuple[tuple[Config, ...], tuple[str, ...]]:
        out, why = [], []
        for sharding in self.shardings():
            for adapter in self.adapters():
                for dtype in self.dtypes(adapter):
                    for optimizer in self.optimizers(adapter):
                        reason = refused(sharding, adapter, dtype, optimizer, self.rules) or self._copy(
                            sharding, adapter
                        )
                        if reason:
                            why.append(reason)
                            continue
                        offloads = self.offloads(adapter, dtype, optimizer, sharding)
                        if not offloads:
                            self.left_out.append(
                                f"{sharding}: --offload {'/'.join(self.o.offload)} does not apply to it"
                            )
                        for offload in offloads:
                            out += [
                                Config(adapter, dtype, optimizer, s, offload, sharding)
                                for s in self.strategies(sharding)
                            ]
        if not out and self.cpu and "none" not in (self.o.offload or ("none",)):
            raise InputError(
                "offload moves state from an accelerator to the host: a CPU run has nothing to offload.",
                "--offload",
            )
        if not out and "none" not in (self.o.offload or ("none",)):
            raise InputError(
                "offload applies to full fine-tuning in bf16-mixed on one GPU (an optimizer the host can step: "
                "adam, adamw, adagrad, lion_32bit), to ZeRO-2 and ZeRO-3 (optimizer; ZeRO-3 also "
                "optimizer+params) and to FSDP and HSDP (optimizer+params).",
                "--offload",
            )
        if not out:
            hint = f" ({why[0]})" if why else ""
            raise InputError(
                f"no configuration is left to predict{hint}: widen --adapter, --dtype, --optimizer or --sharding.",
                "--sharding" if why else "--adapter",
            )
        return tuple(out), tuple(dict.fromkeys(self.left_out))

    def shardings(self) -> tuple[str, ...]:
        """How the ranks share the work: none on one accelerator; else every way that applies to the nodes."""
        world = self.o.gpus * self.o.nodes
        asked = tuple(self.o.shardings)
        if world == 1:
            if asked and asked != ("none",):
                raise InputError(
                    f"--sharding {asked[0]} takes several accelerators: pass --gpus 2 or more.", "--sharding"
                )
            return ("none",)
        if "none" in asked:
            raise InputError(
                "--sharding none is one accelerator: drop --gpus and --nodes, or pick a sharding.",
                "--sharding",
            )
        if "hsdp" in asked and self.o.nodes == 1:
            raise InputError(
                "hsdp shards within a node and replicates across nodes: pass --nodes 2 or more, or use fsdp.",
                "--sharding",
            )
        if asked:
            return asked
        return tuple(s for s in SHARDINGS if s != "none" and (s != "hsdp" or self.o.nodes > 1))

    def adapters(self) -> tuple[str, ...]:
        if self.o.adapters:
            if "qlora" in self.o.adapters and self.cpu:
                raise InputError(
                    "QLoRA's 4-bit and 8-bit kernels are CUDA's: pass a --gpu, not cpu.", "--adapter"
                )
            return tuple(a for a in ADAPTERS if a in self.o.adapters)
        menu = ("full", "lora") if self.cpu else ADAPTERS
        if self.o.reference == "adapter":  # an adapter to disable: full fine-tuning has none
            self.left_out.append(
                "full: --reference adapter disables a LoRA adapter, which full fine-tuning has not"
            )
            return tuple(a for a in menu if a != "full")
        return menu

    def dtypes(self, adapter: str) -> tuple[str, ...]:
        asked = _dtypes(self.o.dtype)
        for dtype in asked:
            self._check_dtype(dtype)
        if adapter == "qlora" and "fp32" in asked:
            if self.o.adapters and asked == ("fp32",):
                raise InputError(
                    f"QLoRA computes in half precision: pass --dtype {mixed_dtype(self.acc)}.", "--dtype"
                )
            asked = tuple(d for d in asked if d != "fp32")
            if not asked:
                self.left_out.append("qlora: QLoRA computes in half precision, and --dtype asked fp32 only")
                return ()
        if asked:
            return asked
        best = mixed_dtype(self.acc)
        # pure bf16 is a full fine-tuning choice; an adapter's frozen base is bf16 under bf16-mixed already
        return (best, "bf16") if adapter == "full" and best == "bf16-mixed" else (best,)

    def _check_dtype(self, dtype: str) -> None:
        if dtype not in DTYPES:
            raise InputError(f"unknown dtype {dtype!r}. Choose from: {', '.join(DTYPES)}.", "--dtype")
        acc = self.acc
        if acc is not None and not self.cpu and accelerators.peak_tflops(acc, dtype) is None:
            raise InputError(
                f"{acc.name} has no {accelerators.PRECISION[dtype]} support; use --dtype fp16-mixed or fp32.",
                "--dtype",
            )

    def optimizers(self, adapter: str) -> tuple[str, ...]:
        info = self.rules.optimizer_info
        if self.o.optimizers:
            for name in self.o.optimizers:
                self._check_installed(name)
                if adapter not in info[name].adapters and self.o.adapters:
                    raise InputError(
                        f"{name} trains {', '.join(info[name].adapters)} only: with --adapter {adapter}, "
                        "pick an AdamW-class optimizer (e.g. adamw).",
                        "--optimizer",
                    )
            return tuple(n for n in self.o.optimizers if adapter in info[n].adapters)
        out = []
        for name, record in info.items():
            if self.cpu and name.startswith("paged_"):
                continue  # paging moves state from an accelerator to the host: a CPU run has no such thing
            if record.menu and adapter in record.adapters:
                if not installed(self.rules, name):
                    self.left_out.append(f"{name}: needs {record.package} (pip install {record.package})")
                else:
                    out.append(name)
        return tuple(out)

    def _check_installed(self, name: str) -> None:
        if not installed(self.rules, name):
            package = self.rules.optimizer_info[name].package
            raise InputError(
                f"{name} needs {package}: pip install {package} (or pip install 'advisor[measure]').",
                "--optimizer",
            )

    def _reference_copy(self, adapter: str) -> bool:
        """DPO (GRPO with a KL coefficient) with its reference as a frozen copy of the model, for this adapter."""
        method = Method.asked(self.o.method, self.o.reference, adapter, self.o.beta or 0.0)
        return method.reference == "model"

    def _copy(self, sharding: str, adapter: str) -> str | None:
        """Why the method is not predicted under a sharding (None: it is): DPO's frozen reference copy under
        ZeRO; GRPO's generation under ZeRO or FSDP, which gathers the whole model on every rank for
        `generate` (TRL's ds3_gather_for_generation, FSDP's summon_full_params): not traced."""
        if self.o.method == "grpo" and sharding not in ("none", "ddp"):
            reason = "GRPO is predicted on one GPU and under DDP, not ZeRO or FSDP (their generation gathers the whole model on every rank)"
            self.left_out.append(reason)
            return reason
        if sharding.startswith("zero") and self._reference_copy(adapter):
            return (
                "DPO's reference copy is predicted on one GPU, under DDP and FSDP, not ZeRO (or --reference "
                "adapter / precomputed)"
            )
        return None

    def offloads(self, adapter: str, dtype: str, optimizer: str, sharding: str = "none") -> tuple[str, ...]:
        hostable = self.rules.optimizer_info[optimizer].offload and not self.cpu
        if self._reference_copy(adapter) or self.o.method == "grpo":  # not composed with a copy, a rollout
            hostable = False
        applies = {
            "none": ("optimizer",) if adapter == "full" and dtype in OFFLOAD_DTYPES and hostable else (),
            "zero2": ("optimizer",) if hostable else (),
            "zero3": ("optimizer", "optimizer+params") if hostable else (),
            "fsdp": ("optimizer+params",) if not self.cpu else (),
            "hsdp": ("optimizer+params",) if not self.cpu else (),
        }.get(sharding, ())
        return tuple(o for o in self.o.offload or OFFLOADS if o == "none" or o in applies)

    def strategies(self, sharding: str = "none") -> tuple[str, ...]:
        """As asked, else every one; FSDP's default is Trainer's own (fsdp_config's activation checkpointing, full
        or none, with or without accumulation): its traces are the menu's dearest."""
        if self.o.strategies:
            return tuple(self.o.strategies)
        if sharding in ("fsdp", "hsdp"):
            self.left_out.append(f"{sharding}: selective checkpointing on request (--strategy)")
            return tuple(s for s in self.rules.strategies if s in SHARDED_STRATEGIES)
        return self.rules.fit_strategies


def refused(sharding: str, adapter: str, dtype: str, optimizer: str, rules: Rules) -> str | None:
    """Why a sharding does not take this adapter, precision or optimizer (None: it does)."""
    if sharding.startswith("zero"):
        if adapter == "qlora":
            return "DeepSpeed ZeRO is predicted for full fine-tuning and LoRA, not QLoRA"
        if dtype not in ("bf16-mixed", "fp16-mixed"):
            return f"DeepSpeed ZeRO keeps fp32 master weights (--dtype bf16-mixed or fp16-mixed), not --dtype {dtype}"
        if optimizer in ("cgd", "muon") or optimizer.startswith("paged_"):
            return f"{optimizer} is not predicted under DeepSpeed ZeRO"
    if sharding in ("fsdp", "hsdp"):
        if adapter == "qlora":
            return "FSDP with a quantized base (QLoRA) is not predicted yet"
        if dtype == "fp16-mixed":
            return "FSDP is predicted in fp32, bf16-mixed and bf16"
        if not rules.optimizer_info[optimizer].sharded:
            return f"{optimizer} does not step FSDP's sharded parameters"
    return None


def mixed_dtype(acc: Accelerator | None) -> str:
    """The accelerator's mixed precision: bf16 where the chip has it, fp16 where it has only fp16; fp32 on a
    CPU (and bf16-mixed for a bare --memory budget)."""
    if acc is not None and acc.key == "cpu":
        return "fp32"
    return "bf16-mixed" if acc is None or "bf16" in acc.tflops else "fp16-mixed"


def installed(rules: Rules, optimizer: str) -> bool:
    """Whether the package an optimizer needs (rules/optimizers.toml) is installed; found without importing."""
    package = rules.optimizer_info[optimizer].package
    return package is None or find_spec(package) is not None


MAX_GPUS_PER_NODE = 72  # an NVL72 rack's NVLink domain, the largest one node's link figure stands for
TUPLES = ("optimizers", "strategies", "adapters", "lora_targets", "offload", "shardings")


def _normalized(options: FitRequest) -> FitRequest:
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
            f"--nodes is at most {MAX_NODES:,} (got {options.nodes:,}): no cluster built has more.", "--nodes"
        )
    if isinstance(options.gpus, int) and options.gpus > MAX_GPUS_PER_NODE:
        raise InputError(
            f"--gpus is per node, and {MAX_GPUS_PER_NODE} share one NVLink domain at most (got {options.gpus}): "
            "pass --nodes for more.",
            "--gpus",
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
        raise InputError(f"{flag} must be {what}, {bounds} (got {value!r}).", flag)


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
        "--effective-batch" if options.effective_batch is not None else "--generations",
    )


def _samples(options: FitRequest, model: ResolvedModel, rules: Rules) -> tuple[int, str]:
    world = options.gpus * options.nodes
    given = (options.batch_size, options.accumulation_steps)
    if options.effective_batch is not None:
        if None not in given:
            raise InputError(
                "--effective-batch is --batch-size x --accumulation-steps x GPUs: pass two of the three.",
                "--effective-batch",
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
            "--attention",
        )
    if "fp32" in _dtypes(options.dtype):
        raise InputError(
            "FlashAttention-2 computes in fp16 or bf16: drop --dtype fp32, or use --attention sdpa.",
            "--attention",
        )


def _dtypes(dtype: str | tuple[str, ...] | None) -> tuple[str, ...]:
    if dtype is None:
        return ()
    return (dtype,) if isinstance(dtype, str) else tuple(dict.fromkeys(dtype))


def _lora(options: FitRequest) -> Adapter:
    """The LoRA settings, checked: a positive rank and alpha, 4- or 8-bit base."""
    alpha = 2 * options.lora_r if options.lora_alpha is None else options.lora_alpha
    if alpha <= 0:
        raise InputError(
            f"--lora-alpha must be positive (got {alpha}); the default is 2 x r.", "--lora-alpha"
        )
    if options.base_bits not in (4, 8):
        raise InputError(f"--base-bits is 4 (NF4) or 8 (LLM.int8), not {options.base_bits}.", "--base-bits")
    if options.base_bits != 4 and options.adapters and "qlora" not in options.adapters:
        raise InputError("--base-bits sets QLoRA's base: add --adapter qlora.", "--base-bits")
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
            raise InputError(f"{given[0]} applies to --adapter lora or qlora, not full.", given[0])
    targets = tuple(sorted({t.strip() for t in options.lora_targets if t.strip()}))
    return Adapter("lora", options.lora_r, alpha, targets, options.base_bits)


def _shape(model: ResolvedModel, options: FitRequest) -> tuple[int | None, int | None]:
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
    for names, known, flag in (
        (options.optimizers, rules.optimizers, "--optimizer"),
        (options.strategies, rules.strategies, "--strategy"),
        (options.adapters, ADAPTERS, "--adapter"),
        (options.offload, OFFLOADS, "--offload"),
        (options.shardings, SHARDINGS, "--sharding"),
        ((options.attention,), ATTENTIONS, "--attention"),
    ):
        for name in names if flag == "--strategy" else ():
            if name in rules.arms:
                raise InputError(
                    f"--strategy {name} is a measured arm of {rules.arms[name]} (the same step, another data "
                    f"budget): for memory and speed ask for --strategy {rules.arms[name]}.",
                    "--strategy",
                )
            if name in rules.adapters:
                raise InputError(
                    f"--strategy {name} is a measured strategy: advisor fit asks for it as --adapter {name} "
                    f"--strategy {rules.adapters[name]}.",
                    "--strategy",
                )
        for name in names:
            if name not in known:
                raise InputError(f"unknown {flag[2:]} {name!r}. Choose from: {', '.join(known)}.", flag)
