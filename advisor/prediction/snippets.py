"""Runnable code for a configuration: Hugging Face `TrainingArguments` (and the optimizer Trainer cannot
name), as the installed transformers takes them."""

from __future__ import annotations

from advisor.prediction.question import Question

TRAINER_OPTIM = {  # optimizer -> (optim, optim_args, weight_decay) as Trainer names them
    "sgd": ("sgd", None, None),
    "sgd-momentum": ("sgd", "momentum=0.9", None),
    "adam": ("adamw_torch_fused", None, 0.0),
    "adamw": ("adamw_torch_fused", None, 0.01),
    "adagrad": ("adagrad", None, None),
    "adafactor": ("adafactor", None, None),
}
CUSTOM_OPTIMIZER = {  # optimizers Trainer does not name: passed as optimizers=(optimizer, scheduler)
    "adadelta": "torch.optim.Adadelta(model.parameters(), lr=1.0)",
    "cgd": "ConjugateGradient(model.parameters(), lr=0.05)  # from measure.optimizers import ConjugateGradient",
}


def training_arguments(q: Question, optimizer: str, strategy: str) -> tuple[dict, str]:
    """The configuration as Hugging Face TrainingArguments, and the Python that builds it."""
    args = {"per_device_train_batch_size": q.batch_size, "gradient_accumulation_steps": q.window(strategy)}
    if strategy.startswith("checkpointing"):
        args["gradient_checkpointing"] = True
        args["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    args.update({"bf16-mixed": {"bf16": True}, "fp16-mixed": {"fp16": True}}.get(q.dtype, {}))
    if optimizer in TRAINER_OPTIM:
        optim, optim_args, decay = TRAINER_OPTIM[optimizer]
        if q.device == "cpu" and optim == "adamw_torch_fused":
            optim = "adamw_torch"
        args["optim"] = optim
        if optim_args:
            args["optim_args"] = optim_args
        if decay is not None:
            args["weight_decay"] = decay
    if q.device == "cpu":
        args["use_cpu"] = True
    lines = ["args = TrainingArguments(", '    output_dir="out",']
    lines += [f"    {k}={v!r}," for k, v in args.items()] + [")"]
    if q.dtype == "bf16":
        lines.insert(
            0, "model = AutoModelForCausalLM.from_pretrained(..., dtype=torch.bfloat16)  # pure bf16"
        )
    if optimizer in CUSTOM_OPTIMIZER:
        lines += [
            f"optimizer = {CUSTOM_OPTIMIZER[optimizer]}",
            "trainer = Trainer(model=model, args=args, train_dataset=..., optimizers=(optimizer, None))",
        ]
    else:
        lines.append("trainer = Trainer(model=model, args=args, train_dataset=...)")
    return args, "\n".join(lines)
