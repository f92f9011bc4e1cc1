"""`advisor fit`: which optimizer × strategy fits the user's model on the user's accelerator."""

from __future__ import annotations

import sys

import click

from advisor import api
from advisor.cli.params import (
    CONTEXT,
    FiniteFloat,
    accelerator_options,
    console,
    db_option,
    declared_option,
    domain_errors,
    echo_json,
    json_option,
    menu_options,
    method_options,
    model_option,
    names_option,
    shape_options,
)
from advisor.fields import help_of
from advisor.model_ref import ResolvedModel
from advisor.prediction.fit_request import FitRequest
from advisor.rules import load_rules


@click.command("fit", context_settings=CONTEXT)
@model_option()
@accelerator_options
@shape_options(FitRequest)
@names_option("--optimizer", "optimizers", "optimizer", help_of(FitRequest, "optimizers"))
@names_option("--strategy", "strategies", "strategy", help_of(FitRequest, "strategies"))
@menu_options
@declared_option(FitRequest, "mfu", type=FiniteFloat(min=0, max=1, min_open=True))
@method_options
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Show every configuration (default: the ladder, the pick and the best of each adapter, about 12).",
)
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="The whole answer: the configurations, where their memory goes, the code, the assumptions.",
)
@click.option(
    "--code",
    "code_only",
    is_flag=True,
    help="Print the pick's code alone (Trainer, peft, launch); exit 1 with a sentence when nothing fits.",
)
@click.option(
    "--list-gpus",
    is_flag=True,
    help="List the accelerators fit knows, with their memory and peaks, and exit.",
)
@click.option(
    "--list-models",
    is_flag=True,
    help="List the published models whose configs advisor ships (--model takes their names), and exit.",
)
@db_option
@json_option
@domain_errors
def fit_command(
    model: ResolvedModel | None,
    list_gpus: bool,
    list_models: bool,
    show_all: bool,
    verbose: bool,
    code_only: bool,
    db,
    as_json: bool,
    **options,
):
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
    Memory is in GiB, the unit on the box (a "24 GB" card holds 24 GiB); --json keeps GB of 10^9 bytes.

    \b
    Examples:
        advisor fit --model llama-3.1-8b --gpu RTX4090
        advisor fit --model qwen2.5-7b --gpu A100-80GB --adapter lora --lora-r 64 --seq-len 4096 --verbose
        advisor fit --model ./my-model --gpu H100 --code
        advisor fit --model llama-3.1-70b --gpu H100 --gpus 8 --json
        advisor fit --model qwen3-8b --gpu RTX4090 --gpus 2 --method dpo
        advisor fit --model qwen3-8b --gpu RTX4090 --method grpo --completion-len 1024
        advisor fit --list-models
    """
    rules = load_rules()
    if list_gpus or list_models:
        from advisor.render.fit_views import gpus_view, models_view  # rich and the views: a list's alone

        console().print(gpus_view(rules) if list_gpus else models_view())
        return
    if model is None:
        raise click.UsageError("pass --model NAME|PATH|HF_ID (or --list-models, --list-gpus).")
    # a cold trace's stages on stderr, a line each (--json's consumers are scripts: there only to a terminal)
    say = (lambda line: click.echo(line, err=True)) if not as_json or sys.stderr.isatty() else None
    answer = api.fit(model, FitRequest(**options), db=db, say=say)
    if as_json:
        echo_json(answer.as_dict())
    else:
        _show(answer, code_only, show_all, verbose)
    if answer.not_cached:  # the answer stands; the next run of the question traces again
        click.echo(f"Not cached, so the next run traces again: {answer.not_cached}", err=True)


def _show(answer, code_only: bool, show_all: bool, verbose: bool) -> None:
    """The answer drawn, or its pick's code alone: rich and the views (25 ms) imported here, never for --json."""
    from advisor.render.fit_views import NOTHING_FITS, code_of, fit_view, runnable  # never for --json

    if code_only:
        shown = runnable(answer)
        if shown is None:
            raise click.ClickException(f"no code to print: {NOTHING_FITS}")
        click.echo(code_of(answer, shown))
    else:
        console().print(fit_view(answer, show_all, verbose), crop=False)  # code lines copy whole
