"""Runnable code for a configuration of the menu, as the installed transformers and peft take it: the model
loaded at its precision (quantized for QLoRA), LoRA through peft, Hugging Face `TrainingArguments` with the
Trainer's `optim` name (or the optimizer passed as an object where Trainer has none), and DeepSpeed's
ZeRO-Offload where the optimizer is offloaded. `train_dataset` is the user's."""

from __future__ import annotations

from advisor.prediction.question import Question
from advisor.prediction.step import Adapter, Config
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


def training_code(q: Question, c: Config, adapter: Adapter, rules: Rules) -> tuple[dict, str]:
    """The configuration as TrainingArguments (a dict, for --json) and the Python that trains it."""
    args = training_arguments(q, c, rules)
    auto = AUTO_CLASS.get(q.model.family.name, "AutoModel")
    lines = ["import torch"]
    if adapter.kind != "full":
        lines.append("from peft import LoraConfig, get_peft_model")
    imports = [auto, "Trainer", "TrainingArguments"] + (
        ["BitsAndBytesConfig"] if adapter.kind == "qlora" else []
    )
    lines.append(f"from transformers import {', '.join(sorted(imports))}")
    info = rules.optimizer_info[c.optimizer]
    if info.imports:
        lines.append(info.imports)
    if c.strategy == "selective-checkpointing":
        lines.append(
            "from measure.strategies import enable_checkpointing  # torch's selective checkpointing policy"
        )
    lines.append("")
    lines += _load(q, c, adapter, auto)
    if c.strategy == "selective-checkpointing":
        lines.append("enable_checkpointing(model, selective=True)")
    if adapter.kind != "full":
        targets = list(adapter.targets) if adapter.targets else "all-linear"
        keep = ", autocast_adapter_dtype=False" if c.dtype == "bf16" else ""  # pure bf16: bf16 adapters too
        lines.append(
            f"model = get_peft_model(model, LoraConfig(r={adapter.r}, lora_alpha={adapter.alpha}, "
            f"target_modules={targets!r}){keep})"
        )
    lines += ["args = TrainingArguments("] + [f"    {k}={v!r}," for k, v in args.items()] + [")"]
    if info.trainer is None:
        lines += [
            f"optimizer = {info.code}",
            "trainer = Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(optimizer, None))",
        ]
    else:
        lines.append("trainer = Trainer(model=model, args=args, train_dataset=train_dataset)")
    lines.append("trainer.train()")
    return args, "\n".join(lines)


def _load(q: Question, c: Config, adapter: Adapter, auto: str) -> list[str]:
    """The model loaded at the configuration's precision: fp32 weights under mixed precision (a frozen
    adapter base in half), bf16 for pure bf16, quantized for QLoRA."""
    source = q.model.name
    half = HALF.get(c.dtype)
    weights = "bf16" if c.dtype == "bf16" else (half if half and adapter.kind != "full" else "fp32")
    out = [
        f"model = {auto}.from_pretrained(",
        f"    {source!r},  # your weights",
        f"    dtype={TORCH_DTYPE[weights]},",
        f"    attn_implementation={q.attention!r},",
    ]
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


def training_arguments(q: Question, c: Config, rules: Rules) -> dict:
    """TrainingArguments for the configuration: no deprecated argument of the installed transformers."""
    args: dict = {
        "output_dir": "out",
        "per_device_train_batch_size": q.batch_size,
        "gradient_accumulation_steps": q.window(c.strategy),
    }
    if c.strategy in ("checkpointing", "checkpointing+accumulation"):
        args["activation_checkpointing"] = True
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
    if c.offload != "none":  # DeepSpeed's CPU optimizer replaces Trainer's (pip install deepspeed)
        args["deepspeed"] = OFFLOAD
        args.pop("optim", None)
    if q.device == "cpu":
        args["use_cpu"] = True
    return args
