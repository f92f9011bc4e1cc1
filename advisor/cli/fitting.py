"""`advisor fit`: which optimizer × strategy fits the user's model on the user's accelerator."""

from __future__ import annotations

import click

from advisor import api
from advisor.cli.params import (
    CONTEXT,
    FiniteFloat,
    accelerator_options,
    console,
    db_option,
    domain_errors,
    echo_json,
    json_option,
    menu_options,
    model_option,
    names_option,
    shape_options,
)
from advisor.model_ref import ResolvedModel
from advisor.render.fit_views import fit_view, gpus_view
from advisor.rules import load_rules


@click.command("fit", context_settings=CONTEXT)
@model_option()
@accelerator_options
@shape_options(batch_size=1, menu=True)
@names_option(
    "--optimizer",
    "optimizers",
    "optimizer",
    "Only these optimizers (repeatable), as Trainer's optim names them (adamw_bnb_8bit, adamw_torch_4bit, "
    "lion_8bit, ...). Default: the menu of rules/optimizers.toml.",
)
@names_option(
    "--strategy",
    "strategies",
    "strategy",
    "Only these strategies (repeatable): standard, checkpointing, selective-checkpointing, accumulation, "
    "checkpointing+accumulation. Default: all.",
)
@menu_options
@click.option(
    "--mfu",
    type=FiniteFloat(min=0, max=1, min_open=True),
    help="Fraction of peak FLOP/s a step reaches, for step times (default: measured on this accelerator, else 0.35).",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Show every configuration (default: the ladder, the pick and the best of each adapter, about 12).",
)
@click.option(
    "--list-gpus",
    is_flag=True,
    help="List the accelerators fit knows, with their memory and peaks, and exit.",
)
@db_option
@json_option
@domain_errors
def fit_command(model: ResolvedModel | None, list_gpus: bool, show_all: bool, db, as_json: bool, **options):
    """Which fine-tuning configuration fits this model on this accelerator, and how fast each runs.

    The menu: what trains (full, LoRA, QLoRA), precision (fp32, bf16-mixed, pure bf16), optimizer
    (AdamW fused, 8-bit and 4-bit AdamW, Lion, Muon, schedule-free, Adafactor, SGD), strategy
    (checkpointing full or selective, accumulation) and offload. For each: predicted peak accelerator
    memory with its breakdown, host memory apart, whether it fits, the largest micro-batch that fits,
    step time and tokens/s, and the code to run it. The first row is what a practitioner would pick;
    when nothing as asked fits, a ladder shows each lever in turn. Predictions trace a real training
    step under fake tensors (no weights allocated) and are cached in your KB: a repeated question
    needs no torch.

    \b
    Examples:
        advisor fit --model tests/fixtures/configs/Llama-3.1-8B --gpu RTX4090
        advisor fit --model ./my-model --gpu H100 --adapter lora --lora-r 64 --seq-len 4096 --json
        advisor fit --model Qwen/Qwen2-0.5B --memory 16 --dtype fp32 --optimizer adamw --all
    """
    rules = load_rules()
    if list_gpus:
        console().print(gpus_view(rules))
        return
    if model is None:
        raise click.UsageError("pass --model NAME|PATH|HF_ID (or --list-gpus).")
    answer = api.fit(model, db=db, **options)
    if as_json:
        echo_json(answer.as_dict())
    else:
        console().print(fit_view(answer, show_all))
