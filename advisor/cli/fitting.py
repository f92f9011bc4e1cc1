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
    model_option,
    names_option,
    shape_options,
)
from advisor.model_ref import ResolvedModel
from advisor.render.views import fit_view, gpus_view
from advisor.rules import load_rules


@click.command("fit", context_settings=CONTEXT)
@model_option()
@accelerator_options
@shape_options(batch_size=1)
@names_option(
    "--optimizer", "optimizers", "optimizer", "Only these optimizers (repeatable). Default: all eight."
)
@names_option(
    "--strategy", "strategies", "strategy", "Only these strategies (repeatable). Default: all four."
)
@click.option(
    "--mfu",
    type=FiniteFloat(min=0, max=1, min_open=True),
    help="Fraction of peak FLOP/s a step reaches, for step times (default: measured on this accelerator, else 0.35).",
)
@click.option(
    "--list-gpus",
    is_flag=True,
    help="List the accelerators fit knows, with their memory and peaks, and exit.",
)
@db_option
@json_option
@domain_errors
def fit_command(model: ResolvedModel | None, list_gpus: bool, db, as_json: bool, **options):
    """Which optimizer and memory strategy fit this model on this accelerator, and how fast each runs.

    For every optimizer × strategy: predicted peak accelerator memory with its breakdown (parameters,
    gradients, optimizer state, activations, temporaries, framework overhead), whether it fits, the
    largest micro-batch that fits, step FLOPs, step time and throughput, and the Trainer arguments.
    Predictions trace a real training step under fake tensors (no weights allocated), and are cached
    in your KB: a repeated question needs no torch.

    \b
    Examples:
        advisor fit --model tests/fixtures/configs/Llama-3.1-8B --gpu A100-80GB
        advisor fit --model ./my-model --gpu RTX4090 --batch-size 4 --seq-len 1024 --json
        advisor fit --model Qwen/Qwen2-0.5B --memory 16 --dtype fp32 --optimizer adamw
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
        console().print(fit_view(answer))
