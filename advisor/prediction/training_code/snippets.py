"""Runnable code for a configuration of the menu, as the installed transformers and peft take it: the model
loaded at its precision (quantized for QLoRA), LoRA through peft, Hugging Face `TrainingArguments` with the
Trainer's `optim` name (or the optimizer passed as an object where Trainer has none), and DeepSpeed's
ZeRO-Offload where the optimizer is offloaded. A text model's data is defined too: a JSON-lines file or Hub
dataset, tokenized and cut to the length priced."""

from __future__ import annotations

import copy

from advisor.prediction.question import Question
from advisor.prediction.step import Adapter, Config
from advisor.prediction.training_code.recipe import Recipe
from advisor.rules import Rules

AUTO_CLASS = {  # family -> the transformers class that loads its model for training
    "decoder": "AutoModelForCausalLM",
    "encoder": "AutoModelForMaskedLM",
    "vision": "AutoModelForImageClassification",
    "vlm": "AutoModelForImageTextToText",
}
TORCH_DTYPE = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}
HALF = {"bf16-mixed": "bf16", "fp16-mixed": "fp16"}
OFFLOAD = {  # DeepSpeed ZeRO-Offload on one GPU: ZeRO stage 2 with the optimizer on the host (its CPU Adam)
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
    "bf16": {"enabled": "auto"},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}


def training_code(
    q: Question, c: Config, adapter: Adapter, rules: Rules, recipe: Recipe, launched: dict | None = None
) -> tuple[dict, str]:
    """The configuration as TrainingArguments (a dict, for --json) and the Python that trains it at its
    recipe (micro-batch, accumulation, learning rate); for several accelerators, its launch as a header."""
    args = training_arguments(q, c, rules, recipe)
    trl = TRL.get(q.method)
    if trl:
        return args, _trl_code(q, c, adapter, rules, recipe, launched, args, trl)
    auto = AUTO_CLASS.get(q.model.family.name, "AutoModel")
    text = q.model.family.name in TEXT_COLLATOR and q.seq_len is not None  # its data defined here
    lines = _header(q, recipe, launched) + (QUIET if q.device == "cpu" else []) + ["import torch"]
    if text:
        lines.append("from datasets import load_dataset")
    if adapter.kind != "full":
        lines.append("from peft import LoraConfig, get_peft_model")
    if c.strategy == "selective-checkpointing":
        lines.append(
            "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts"
        )
    imports = [auto, "Trainer", "TrainingArguments"] + (
        ["BitsAndBytesConfig"] if adapter.kind == "qlora" else []
    )
    if text:
        imports += ["AutoTokenizer", "DataCollatorForLanguageModeling"]
    lines.append(f"from transformers import {', '.join(sorted(imports))}")
    info = rules.optimizer_info[c.optimizer]
    if info.imports:
        lines.append(info.imports)
    lines.append("")
    if text:
        lines += _text_data(q)
    if c.sharding == "zero3":  # made first: from_pretrained then loads each rank's partition (zero.Init)
        lines += _arguments(args)
    lines += _load(q, c, adapter, auto)
    if c.strategy == "selective-checkpointing":
        lines += SELECTIVE
    lines += _adapted(c, adapter)
    if "parallelism_config" in args:  # HSDP: accelerate's object, from its fields
        lines.insert(1, "from accelerate.parallelism_config import ParallelismConfig")
    if c.sharding != "zero3":
        lines += _arguments(args)
    data = "train_dataset=train_dataset" + (", data_collator=collator" if text else "")
    lines += _trainer("Trainer", data, info, recipe)
    return args, "\n".join(lines)


def _adapted(c: Config, adapter: Adapter, scores: bool = False) -> list[str]:
    """peft's LoRA on the loaded model (nothing for full fine-tuning); a reward model's score head trained
    whole beside it (peft's SEQ_CLS task)."""
    if adapter.kind == "full":
        return []
    targets = list(adapter.targets) if adapter.targets else "all-linear"
    keep = ", autocast_adapter_dtype=False" if c.dtype == "bf16" else ""  # pure bf16: bf16 adapters too
    task = ', task_type="SEQ_CLS"' if scores else ""
    return [
        f"model = get_peft_model(model, LoraConfig(r={adapter.r}, lora_alpha={adapter.alpha}, "
        f"target_modules={targets!r}{task}){keep})"
    ]


def _trainer(trainer: str, data: str, info, recipe: Recipe) -> list[str]:
    """The trainer made and run: with the optimizer as an object where Trainer has no name for it."""
    if info.trainer is None:
        code = info.code.replace("ADAMW_LR", repr(recipe.rate.adamw_lr)).replace("LR", repr(recipe.rate.lr))
        return [
            *(line for name, body in DEFINITIONS.items() if code.startswith(name) for line in body),
            f"optimizer = {code}",
            f"trainer = {trainer}(model=model, args=args, {data}, optimizers=(optimizer, None))",
            "trainer.train()",
        ]
    return [f"trainer = {trainer}(model=model, args=args, {data})", "trainer.train()"]


# TRL's trainers by method: their config and trainer classes, and the columns of the data each reads
TRL = {
    "sft": ("SFTConfig", "SFTTrainer", '"text" (or "prompt" and "completion")'),
    "dpo": ("DPOConfig", "DPOTrainer", '"prompt", "chosen" and "rejected"'),
    "reward": ("RewardConfig", "RewardTrainer", '"chosen" and "rejected"'),
    "grpo": ("GRPOConfig", "GRPOTrainer", '"prompt" (text)'),
}
# GRPO's reward: the user's task defines it; the script runs with a placeholder that says so
REWARD_PLACEHOLDER = [
    "",
    "",
    "def reward_placeholder(completions, **kwargs):  # a PLACEHOLDER: replace it with your task's reward",
    "    return [min(len(str(c)), 200) / 200 for c in completions]  # e.g. a verifier's score per completion",
    "",
    "",
]


def _trl_code(q: Question, c: Config, adapter: Adapter, rules: Rules, recipe, launched, args, trl) -> str:
    """A TRL script: the user's data as the method reads it (TRL tokenizes it, cut to the priced length),
    the model as loaded and adapted for Trainer, TRL's config with every setting TRL defaults otherwise
    (checkpointing on, bf16 on) said as priced, and its trainer."""
    config, trainer, columns = trl
    reward = q.method == "reward"
    auto = "AutoModelForSequenceClassification" if reward else AUTO_CLASS["decoder"]
    args = {
        **args,
        "activation_checkpointing": args.get("activation_checkpointing", False),
        "bf16": args.get("bf16", False),
        "max_length": "MAX_LENGTH",
    }
    if q.method == "dpo" and q.method_of(c.adapter).reference == "precomputed":
        args["precompute_ref_log_probs"] = True
    if q.method == "grpo":
        args = _grpo_arguments(q, args)
    lines = _header(q, recipe, launched) + (QUIET if q.device == "cpu" else []) + ["import torch"]
    if "parallelism_config" in args:  # HSDP: accelerate's object, from its fields
        lines.append("from accelerate.parallelism_config import ParallelismConfig")
    lines.append("from datasets import load_dataset")
    if adapter.kind != "full":
        lines.append("from peft import LoraConfig, get_peft_model")
    if c.strategy == "selective-checkpointing":
        lines.append(
            "from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts"
        )
    imports = [auto, "AutoTokenizer"] + (["BitsAndBytesConfig"] if adapter.kind == "qlora" else [])
    lines.append(f"from transformers import {', '.join(sorted(imports))}")
    lines.append(f"from trl import {config}, {trainer}")
    info = rules.optimizer_info[c.optimizer]
    if info.imports:
        lines.append(info.imports)
    grpo = q.method == "grpo"
    lines += [
        "",
        f"MAX_LENGTH = {q.seq_len}  # tokens a sequence, as priced: TRL cuts longer ones to it"
        if not grpo
        else f"MAX_LENGTH = {q.seq_len}  # tokens a sequence as priced: prompt and completion",
        *(_grpo_lengths(q) if grpo else []),
        f'DATA = "train.jsonl"  # your data: a JSON-lines file with columns {columns}, or a Hub dataset id',
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({q.model.hub_id!r})",
        "tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
        'data = load_dataset("json", data_files=DATA) if DATA.endswith((".json", ".jsonl")) else load_dataset(DATA)',
        'train_dataset = data["train"]' if not grpo else GRPO_PROMPTS,
        "",
    ]
    if c.sharding == "zero3":
        lines += _arguments(args, config)
    loaded = _load(q, c, adapter, auto)
    if reward:  # one score a sequence, read at its last token: found by the pad token
        loaded = loaded[:-1] + [
            "    num_labels=1,",
            ")",
            "model.config.pad_token_id = tokenizer.pad_token_id",
        ]
    lines += (
        loaded + (SELECTIVE if c.strategy == "selective-checkpointing" else []) + _adapted(c, adapter, reward)
    )
    if c.sharding != "zero3":
        lines += _arguments(args, config)
    data = "train_dataset=train_dataset, processing_class=tokenizer"
    if grpo:
        lines += REWARD_PLACEHOLDER
        data += ", reward_funcs=reward_placeholder"
    return "\n".join(lines + _trainer(trainer, data, info, recipe))


# GRPO's prompts as priced: TRL 1.16 does not cut prompts, so longer ones are left out of the data
GRPO_PROMPTS = 'train_dataset = data["train"].filter(lambda row: len(tokenizer(row["prompt"]).input_ids) <= MAX_PROMPT_LENGTH)'


def _grpo_lengths(q: Question) -> list[str]:
    r = q.rollout
    return [
        f"MAX_COMPLETION_LENGTH = {r.completion}  # tokens generated per completion",
        "MAX_PROMPT_LENGTH = MAX_LENGTH - MAX_COMPLETION_LENGTH  # longer prompts are left out below",
    ]


def _grpo_arguments(q: Question, args: dict) -> dict:
    """GRPOConfig's settings as priced: the generation's lengths and count, its KL coefficient, who samples
    (vLLM colocated at TRL's share, or a server to start apart); no max_length (GRPO has none)."""
    r = q.rollout
    out = {k: v for k, v in args.items() if k != "max_length"}
    out |= {"max_completion_length": "MAX_COMPLETION_LENGTH", "num_generations": r.generations}
    if r.beta:
        out["beta"] = r.beta
    if r.generation != "transformers":
        out |= {"use_vllm": True, "vllm_mode": r.generation.removeprefix("vllm-")}
    return out


# The families whose data the code defines: text, tokenized and cut to the priced length, and the collator
# their loss takes (a causal LM's next tokens; an encoder's masked tokens)
TEXT_COLLATOR = {
    "decoder": "DataCollatorForLanguageModeling(tokenizer, mlm=False)",
    "encoder": "DataCollatorForLanguageModeling(tokenizer)",
}


def _text_data(q: Question) -> list[str]:
    """The user's text, from a JSON-lines file or a Hub dataset with a "text" column, tokenized and cut to the
    length the answer priced (every sample at most that long: the memory priced holds), and its collator."""
    return [
        f"MAX_LENGTH = {q.seq_len}  # tokens a sample, as priced: longer texts are cut to it",
        'DATA = "train.jsonl"  # your data: a JSON-lines file with a "text" column, or a Hub dataset id',
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({q.model.hub_id!r})",
        "tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token",
        'data = load_dataset("json", data_files=DATA) if DATA.endswith((".json", ".jsonl")) else load_dataset(DATA)',
        'train_dataset = data["train"].map(',
        '    lambda batch: tokenizer(batch["text"], truncation=True, max_length=MAX_LENGTH),',
        "    batched=True,",
        '    remove_columns=data["train"].column_names,',
        ")",
        f"collator = {TEXT_COLLATOR[q.model.family.name]}",
        "",
    ]


# On a CPU, libraries announce their absent CUDA kernels as they import (torchao's "Failed to load _C_mxfp8",
# bitsandbytes' "Failed to load CPU gemm_4bit_forward", torch's notices of torchao's registrations): notices,
# not errors, that a CPU run's script silences before importing them. (DeepSpeed, which resets its own
# logger, is configured for GPUs alone.)
QUIET = [
    "import logging",
    "",
    'for name in ("torchao", "bitsandbytes", "torch.utils._pytree"):  # a CPU: their CUDA kernels are absent',
    "    logging.getLogger(name).setLevel(logging.ERROR)",
    "",
]

# Selective checkpointing as torch ships it: matrix products and attention saved, the cheap rest recomputed
SELECTIVE = [
    "aten = torch.ops.aten",
    "SAVED = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,",
    "         aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,",
    "         aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default}",
    "",
    "",
    "def selective(ctx, op, *args, **kwargs):  # save matrix products and attention, recompute the rest",
    "    return CheckpointPolicy.MUST_SAVE if op in SAVED else CheckpointPolicy.PREFER_RECOMPUTE",
    "",
    "",
    "model.activation_checkpointing_enable(activation_checkpointing_kwargs={",
    '    "use_reentrant": False, "context_fn": lambda: create_selective_checkpoint_contexts(selective)})',
    "model.config.use_cache = False",
]


# Classes the printed code defines where no library has them (rules/optimizers.toml `code` names them), so
# that it imports nothing of advisor's: Muon steps 2-D hidden matrices only, and Trainer takes one optimizer.
DEFINITIONS = {
    "MuonWithAdamW": [
        "",
        "class MuonWithAdamW(torch.optim.Optimizer):",
        '    """torch\'s Muon for the hidden 2-D matrices, AdamW for embeddings, output layer, norms and biases."""',
        "",
        "    def __init__(self, model, lr, adamw_lr, weight_decay=0.1):",
        "        ends = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]  # positions too (wpe)",
        "        ends += [m for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None]",
        "        ends = {id(p) for m in ends for p in m.parameters()}",
        "        params = [p for p in model.parameters() if p.requires_grad]",
        "        hidden = [p for p in params if p.ndim == 2 and id(p) not in ends]",
        "        rest = [p for p in params if p.ndim != 2 or id(p) in ends]",
        "        self.inner = [torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay),",
        "                      torch.optim.AdamW(rest, lr=adamw_lr, weight_decay=0.01)]",
        "        super().__init__(params, {})",
        "        self.param_groups = [g for o in self.inner for g in o.param_groups]  # a schedule reaches both",
        "",
        "    def step(self, closure=None):",
        "        loss = closure() if closure is not None else None",
        "        for o in self.inner:",
        "            o.step()",
        "        return loss",
        "",
        "    def state_dict(self):",
        '        return {"inner": [o.state_dict() for o in self.inner]}',
        "",
        "    def load_state_dict(self, state_dict):",
        '        for o, inner in zip(self.inner, state_dict["inner"]):',
        "            o.load_state_dict(inner)",
        "",
    ],
}


def _header(q: Question, recipe: Recipe, launched: dict | None) -> list[str]:
    """Comments above the code: the recipe's batch and rate with their sources, and for several
    accelerators how to launch it, with the accelerate config it needs."""
    rate = recipe.rate
    step = f"micro-batch {recipe.batch_size} x {recipe.accumulation_steps} accumulated" + (
        f" x {q.world} GPUs" if q.world > 1 else ""
    )
    shares = f" ({_one_line(q.model.architecture_of)}'s architecture)" if q.model.architecture_of else ""
    length = f" of {q.seq_len:,} tokens" if q.seq_len else ""
    samples = "pairs (chosen and rejected)" if q.rows_per_sample == 2 else "samples"
    if q.rollout is not None:
        per_step = recipe.batch_size * recipe.accumulation_steps * q.world
        samples = (
            f"completions ({per_step // q.rollout.generations} prompts x {q.rollout.generations} generations)"
        )
        length = f" of up to {q.seq_len:,} tokens"
    out = [
        f"# train.py: {_one_line(q.model.name)}{shares}, {recipe.batch_size * recipe.accumulation_steps * q.world} "
        f"{samples}{length} per optimizer step ({step}).",
        f"# Learning rate {rate.lr:g}, {rate.schedule} after {rate.warmup_ratio:.0%} warmup: {_one_line(rate.short)}"
        + ("." if rate.tuned else ", not tuned for this model."),
    ]
    if launched:
        out += [
            f"# Launch: {launched['command']}",
            f"# or: {launched['accelerate_command']}, with accelerate.yaml:",
        ]
        out += [f"#   {line}" for line in launched["accelerate_config"].splitlines()]
    return out + [""]


def _one_line(text: str) -> str:
    """A name or phrase from a file or the command line, as a comment may hold it: no line break that would end
    the comment and start code."""
    return " ".join(str(text).split())


def _load(q: Question, c: Config, adapter: Adapter, auto: str) -> list[str]:
    """The model loaded at the configuration's precision: fp32 weights under mixed precision (a frozen
    adapter base in half), bf16 for pure bf16, quantized for QLoRA."""
    source = q.model.hub_id
    half = HALF.get(c.dtype)
    weights = "bf16" if c.dtype == "bf16" else (half if half and adapter.kind != "full" else "fp32")
    mine = (
        "the published model of its size; or your weights' folder"
        if q.model.twinned
        else "or your weights' folder"
    )
    out = [
        f"model = {auto}.from_pretrained(",
        f"    {source!r},  # {mine}",
        f"    dtype={TORCH_DTYPE[weights]},",
        f"    attn_implementation={q.attention!r},",
    ]
    bf16_experts = weights == "bf16" or (c.sharding in ("fsdp", "hsdp") and c.dtype == "bf16-mixed")
    if (
        q.model.experts and not bf16_experts
    ):  # as traced: grouped GEMM takes bf16 alone (rules/fit.toml [moe])
        out.append("    experts_implementation='eager',")
    if adapter.kind == "qlora":
        compute = TORCH_DTYPE[half or "bf16"]
        quant = (
            "BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, "
            f"bnb_4bit_compute_dtype={compute})"
            if adapter.base_bits == 4
            else "BitsAndBytesConfig(load_in_8bit=True)"
        )
        out.append(f"    quantization_config={quant},")
    return out + [")"]


CONSTANTS = ("MAX_LENGTH", "MAX_COMPLETION_LENGTH")  # the script's own names, passed as they are


def _arguments(args: dict, config: str = "TrainingArguments") -> list[str]:
    """The snippet's `args = TrainingArguments(...)` (or TRL's config), one keyword a line, from the dict
    keyword_arguments reads (MAX_LENGTH: the script's constant)."""
    body = [f"    {k}={v if v in CONSTANTS else _literal(k, v)}," for k, v in args.items()]
    return [f"args = {config}("] + body + [")"]


def _literal(key: str, value) -> str:
    """An argument as Python source: its repr, or the object a dict of its fields stands for."""
    return f"ParallelismConfig(**{value!r})" if key == "parallelism_config" else repr(value)


def keyword_arguments(args: dict) -> dict:
    """TrainingArguments' keyword arguments as the snippet passes them, from the same dict (so they cannot
    drift): a deep copy, HSDP's parallelism_config built as _literal writes it (accelerate imported only then:
    in the user's training script, never on `advisor fit`'s path)."""
    out = copy.deepcopy(args)
    if "parallelism_config" in out:
        from accelerate.parallelism_config import ParallelismConfig

        out["parallelism_config"] = ParallelismConfig(**out["parallelism_config"])
    return out


# Liger's kernels as Trainer applies them (its apply function takes the names it knows): the fused loss on,
# the rest off
LIGER_FUSED_LOSS_ONLY = {
    "fused_linear_cross_entropy": True,
    "cross_entropy": False,
    "rope": False,
    "rms_norm": False,
    "layer_norm": False,
    "swiglu": False,
    "geglu": False,
}


def training_arguments(q: Question, c: Config, rules: Rules, recipe: Recipe) -> dict:
    """TrainingArguments for the configuration at its recipe: no deprecated argument of the installed
    transformers."""
    args: dict = {
        "output_dir": "out",
        "per_device_train_batch_size": recipe.batch_size,
        "gradient_accumulation_steps": recipe.accumulation_steps,
        **recipe.rate.arguments(),
    }
    if c.strategy in ("checkpointing", "checkpointing+accumulation"):
        args["activation_checkpointing"] = True
    if q.loss == "fused":  # Liger's fused linear cross-entropy alone: what was traced
        args |= {"use_liger_kernel": True, "liger_kernel_config": LIGER_FUSED_LOSS_ONLY}
    args.update({"bf16-mixed": {"bf16": True}, "fp16-mixed": {"fp16": True}}.get(c.dtype, {}))
    info = rules.optimizer_info[c.optimizer]
    if info.trainer is not None:
        optim = info.trainer
        if q.device == "cpu" and optim == "adamw_torch_fused":
            optim = "adamw_torch"
        args["optim"] = optim
        if info.optim_args:
            args["optim_args"] = info.optim_args
        if info.weight_decay is not None:
            args["weight_decay"] = info.weight_decay
    if c.offload != "none" and c.sharding == "none":  # DeepSpeed's CPU optimizer replaces Trainer's
        args["deepspeed"] = OFFLOAD
        args.pop("optim", None)
    if c.sharding != "none":
        args |= sharded_arguments(q, c)
        if "fsdp" in args:
            args.pop("activation_checkpointing", None)  # FSDP's own, in fsdp_config
        elif (
            c.offload != "none"
        ):  # ZeRO-Offload: DeepSpeed's CPU optimizer, from its JSON, replaces Trainer's
            args.pop("optim", None)
    if q.device == "cpu":
        args["use_cpu"] = True
    return args


# the optimizers a host can step (rules/optimizers.toml `offload`) -> DeepSpeed's, which run on the CPU when offloaded
DEEPSPEED_OPTIMIZER = {"adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad", "lion_32bit": "Lion"}


def _deepspeed(c: Config) -> dict:
    """DeepSpeed's JSON for a ZeRO stage, every size left to transformers' "auto" (h x h buckets, rules/fit.toml)."""
    zero: dict = {
        "stage": int(c.sharding[-1]),
        "overlap_comm": c.sharding == "zero3",
        "contiguous_gradients": True,
    }
    zero |= {"reduce_bucket_size": "auto"}
    if c.sharding == "zero3":
        zero |= {"stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
    if c.offload != "none":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if c.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "zero_optimization": zero,
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    if c.offload != "none":  # DeepSpeed's CPU optimizer of the same kind steps the offloaded state
        config["optimizer"] = {**OFFLOAD["optimizer"], "type": DEEPSPEED_OPTIMIZER[c.optimizer]}
        if c.optimizer == "adagrad":
            config["optimizer"]["params"] = {"lr": "auto", "eps": "auto", "weight_decay": "auto"}
        if c.optimizer == "lion_32bit":
            config["optimizer"]["params"] = {"lr": "auto", "betas": "auto", "weight_decay": "auto"}
    return config


def sharded_arguments(q: Question, c: Config) -> dict:
    """TrainingArguments' keys for a sharding: FSDP2's fsdp_config (its own activation checkpointing, which
    transformers prefers under FSDP; HSDP a ParallelismConfig's fields), or DeepSpeed's JSON."""
    if c.sharding in ("fsdp", "hsdp"):
        fsdp = {"version": 2, "reshard_after_forward": True, "state_dict_type": "SHARDED_STATE_DICT"}
        if c.strategy in ("checkpointing", "checkpointing+accumulation"):
            fsdp["activation_checkpointing"] = True
        if c.offload == "optimizer+params":
            fsdp["cpu_offload"] = True
        out = {"fsdp": True, "fsdp_config": fsdp}
        if c.strategy.endswith("accumulation"):
            # each micro-batch's gradients reduce-scattered into the shard, as traced: without it accelerate
            # defers the reduction to the last micro-batch and every rank holds the whole model's gradients
            out["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
        if c.sharding == "hsdp":  # shard within a node, replicate across nodes
            out["parallelism_config"] = {"dp_replicate_size": q.nodes, "dp_shard_size": q.gpus}
        return out
    if c.sharding.startswith("zero"):
        return {"deepspeed": _deepspeed(c)}
    return {}


def launch(q: Question, c: Config, adapter: Adapter, rules: Rules) -> dict:
    """How to start the job: torchrun's line (Trainer reads fsdp= or deepspeed= from its arguments), and the
    accelerate config that does the same with `accelerate launch`."""
    where = (
        f"--nnodes {q.nodes} --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port 29500 "
        if q.nodes > 1
        else ""
    )
    command = f"torchrun --nproc_per_node {q.gpus} {where}train.py"
    precision = "bf16" if c.dtype in ("bf16-mixed", "bf16") else "fp16" if c.dtype == "fp16-mixed" else "no"
    lines = [
        "compute_environment: LOCAL_MACHINE",
        f"distributed_type: {_ACCELERATE[c.sharding]}",
        f"num_machines: {q.nodes}",
        f"num_processes: {q.world}",
    ]
    if not c.sharding.startswith(
        "zero"
    ):  # with a deepspeed_config_file, accelerate refuses its own precision
        lines.insert(2, f"mixed_precision: {precision}")
    on_node = (
        " --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port 29500"
        if q.nodes > 1
        else ""
    )
    if c.sharding in ("fsdp", "hsdp"):
        fsdp = sharded_arguments(q, c)["fsdp_config"]
        lines += ["fsdp_config:", "  fsdp_version: 2", "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP"]
        lines += [
            f"  {ACCELERATE_FSDP.get(k, 'fsdp_' + k)}: {str(v).lower() if isinstance(v, bool) else v}"
            for k, v in fsdp.items()
            if k != "version"
        ]
        if c.sharding == "hsdp":  # shard within a node, replicate across nodes
            lines += [
                "parallelism_config:",
                f"  parallelism_config_dp_replicate_size: {q.nodes}",
                f"  parallelism_config_dp_shard_size: {q.gpus}",
            ]
    if c.sharding.startswith("zero"):
        lines += ["deepspeed_config:", "  deepspeed_config_file: ds_config.json"]
    return {
        "command": command,
        "accelerate_command": f"accelerate launch --config_file accelerate.yaml{on_node} train.py",
        "accelerate_config": "\n".join(lines) + "\n",
        "deepspeed": _deepspeed(c) if c.sharding.startswith("zero") else None,
    }


# Trainer's fsdp_config keys that accelerate's config file names otherwise (its launcher's --fsdp_* arguments)
ACCELERATE_FSDP = {"cpu_offload": "fsdp_offload_params"}
_ACCELERATE = {
    "ddp": "MULTI_GPU",
    "fsdp": "FSDP",
    "hsdp": "FSDP",
    "zero1": "DEEPSPEED",
    "zero2": "DEEPSPEED",
    "zero3": "DEEPSPEED",
}
