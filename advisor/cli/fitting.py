"""`advisor fit`: which optimizer × strategy fits the user's model on the user's accelerator."""

from __future__ import annotations

import click

from advisor.cli.params import (
    CONTEXT,
    FiniteFloat,
    console,
    db_option,
    domain_errors,
    echo_json,
    json_option,
    names_option,
    require_measure_side,
)
from advisor.fit import DTYPES
from advisor.rules import load_rules


@click.command(context_settings=CONTEXT)
@click.option(
    "--model",
    metavar="NAME|PATH|HF_ID",
    help="A folder with config.json (weights not needed), a cached Hugging Face id, or vit/modernbert/llama/nanovlm at the paper's size.",
)
@click.option(
    "--gpu",
    metavar="NAME",
    help="The accelerator: A100-40GB, A100-80GB, H100, H200, L4, L40S, A10G, T4, V100, RTX3090, RTX4090, RTX5090, MI300X, cpu (--list-gpus).",
)
@click.option(
    "--memory",
    type=FiniteFloat(min=0, min_open=True),
    metavar="GB",
    help="The memory budget instead of (or to override) the accelerator's.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Micro-batch size (per_device_train_batch_size).",
)
@click.option(
    "--seq-len",
    type=click.IntRange(min=1),
    help="Tokens per sample (text models). Default: 2048, or the model's maximum if shorter.",
)
@click.option(
    "--image-size",
    type=click.IntRange(min=1),
    help="Image side in pixels (vision models). Default: the config's.",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    help="fp32, bf16-mixed, fp16-mixed or bf16 (pure). Default: bf16-mixed where the chip has bf16, else fp16-mixed; fp32 on a CPU.",
)
@click.option(
    "--accumulation-steps",
    type=click.IntRange(min=2),
    default=4,
    show_default=True,
    help="Micro-batches per step with accumulation.",
)
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
def fit(
    model,
    gpu,
    memory,
    batch_size,
    seq_len,
    image_size,
    dtype,
    accumulation_steps,
    optimizers,
    strategies,
    mfu,
    list_gpus,
    db,
    as_json,
):
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
    from advisor.report import fit_view, gpus_view

    rules = load_rules()
    if list_gpus:
        console().print(gpus_view(rules))
        return
    if not model:
        raise click.UsageError("pass --model NAME|PATH|HF_ID (or --list-gpus).")
    q = fit_question(
        model,
        rules,
        gpu,
        memory,
        batch_size,
        seq_len,
        image_size,
        dtype,
        accumulation_steps,
        optimizers,
        strategies,
        mfu,
    )
    answer = predict_fit(q, rules, db)
    if as_json:
        echo_json(answer.as_dict())
    else:
        console().print(fit_view(answer))


def fit_question(model, rules, *args):
    """advisor.fit.question for a --model, its errors as usage errors (exit 2) or sentences (exit 1)."""
    from advisor import accelerators
    from advisor.fit import FitError, FitInputError, model_info, question

    try:
        return question(model_info(model, rules), rules, *args)
    except accelerators.UnknownAccelerator as e:
        raise click.BadParameter(str(e), param_hint="'--gpu'") from e
    except FitInputError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.param}'") from e
    except FitError as e:
        raise click.ClickException(str(e)) from e


def predict_fit(q, rules, db):
    """The fit answer, tracing (torch) only what the cache lacks."""
    from advisor.fit import FitError, fit, needs_tracing, open_cache

    read, write_path = open_cache(db)
    if needs_tracing(q, read):
        require_measure_side()
    try:
        return fit(q, rules, read, write_path)
    except FitError as e:
        raise click.ClickException(str(e)) from e


COMMANDS = [fit]
