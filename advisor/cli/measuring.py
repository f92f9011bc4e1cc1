"""The commands that make evidence on this machine: measure and validate. They import the measurement side
(torch, transformers) only once their arguments are checked."""

from __future__ import annotations

import sys

import click
from rich.console import Console

from advisor import kb as kbmod
from advisor.cli.params import (
    CONTEXT,
    FiniteFloat,
    console,
    domain_errors,
    echo_json,
    json_option,
    names_option,
    require_measure_side,
    write_db_option,
)
from advisor.rules import load_rules, rules_dir


def preset_option(default: str):
    return click.option(
        "--preset",
        type=click.Choice(load_rules(str(rules_dir())).presets),  # the shipped rules: read at import
        default=default,
        show_default=True,
        help="Model sizes: tiny (seconds), small (the CPU reference grid), paper (the paper's real sizes).",
    )


@click.command(context_settings=CONTEXT)
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    metavar="NAME",
    help="vit, modernbert, llama, nanovlm, all, a cached Hugging Face id or a local folder (repeatable).",
)
@names_option(
    "--optimizer", "optimizers", "optimizer", "Optimizers to run (repeatable). Default: the family's grid."
)
@names_option(
    "--strategy",
    "strategies",
    "strategy",
    "standard, checkpointing, accumulation, checkpointing+accumulation (repeatable). Default: the family's grid.",
)
@preset_option("small")
@click.option("--epochs", type=click.IntRange(min=1), help="Epochs per cell (default: the preset's).")
@click.option(
    "--steps-per-epoch",
    type=click.IntRange(min=1),
    help="Micro-batches per epoch, the same for every strategy (default: the preset's).",
)
@click.option(
    "--seeds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Repeat every cell over seeds 0..N-1.",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option(
    "--lr",
    type=FiniteFloat(min=0, min_open=True),
    help="Learning rate for every optimizer (default: the paper's per model at preset paper, else each "
    "optimizer's default).",
)
@click.option("--batch-size", type=click.IntRange(min=1), help="Micro-batch size (default: the preset's).")
@click.option(
    "--accumulation-steps",
    type=click.IntRange(min=2),
    default=4,
    show_default=True,
    help="Micro-batches per optimizer step with accumulation.",
)
@click.option(
    "--memory-cap",
    type=FiniteFloat(min=0, min_open=True),
    metavar="GB",
    help="Treat memory above this as out of memory (CUDA: per-process fraction; CPU: host RSS).",
)
@click.option(
    "--protocol",
    type=click.Choice(["fair", "paper"]),
    default="fair",
    show_default=True,
    help="fair: held-out loss, equal optimizer updates for every strategy, time to target (rules/"
    "protocol.toml). paper: the paper's, for reproduction (training loss, one rate per model at preset paper).",
)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16-mixed"]),
    default="fp32",
    show_default=True,
    help="Training precision: bf16-mixed autocasts the forward to bfloat16 (a GPU's usual choice; allowed, "
    "and slow, on a CPU).",
)
@click.option(
    "--tune-lr",
    is_flag=True,
    help="Choose each optimizer's learning rate first: a log grid around its default on a tuning seed, the "
    "best by held-out loss (fair protocol only; the runs record the rate and the grid).",
)
@click.option(
    "--order-seed",
    type=click.IntRange(min=0),
    help="Seed of the shuffled cell order (default: a fresh one, printed and recorded with every run).",
)
@write_db_option
@json_option
@domain_errors
def measure(
    models,
    optimizers,
    strategies,
    preset,
    epochs,
    steps_per_epoch,
    seeds,
    device,
    lr,
    batch_size,
    accumulation_steps,
    memory_cap,
    protocol,
    dtype,
    tune_lr,
    order_seed,
    db,
    as_json,
):
    """Run the benchmark grid on this machine and write every run into the knowledge base.

    Each cell (model × optimizer × strategy × seed) is trained, monitored (time, loss, memory,
    utilization) and committed epoch by epoch. Cells already ok on this hardware are skipped; a cell that
    runs out of memory, diverges or fails is stored with that status and the grid goes on.

    Each cell runs in a fresh process, in an order shuffled by a recorded seed. Under the fair protocol
    (the default) every cell is evaluated on held-out data; see the README's "The fair protocol".

    \b
    Examples:
        advisor measure --model vit --preset tiny --epochs 2
        advisor measure --model all --preset small --seeds 3 --tune-lr --db my.sqlite
        advisor measure --model llama --optimizer adam --strategy checkpointing --device cuda --dtype bf16-mixed
        advisor measure --model vit --protocol paper --preset paper
    """
    from advisor.model_ref import resolve_model

    if tune_lr and lr is not None:
        raise click.BadParameter(
            "--tune-lr chooses each optimizer's rate: drop --lr.", param_hint="'--tune-lr'"
        )
    if tune_lr and protocol == "paper":
        raise click.BadParameter(
            "the paper's protocol shares one rate per model: --tune-lr needs --protocol fair.",
            param_hint="'--tune-lr'",
        )
    rules = load_rules()
    for name in models:  # a model that cannot be resolved offline is the user's to fix, before torch loads
        if name != "all":
            resolve_model(name, rules)
    require_measure_side()
    from measure.config import RunConfig
    from measure.grid import run_grid
    from measure.hardware import resolve_device
    from measure.progress import reporter_for, summary_table
    from measure.runner import PlanError, plan_grid
    from measure.tuning import tuned_table

    try:
        resolve_device(device)  # a GPU asked for and absent is the user's to fix, not a failed cell per cell
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--device'") from e
    base = RunConfig(
        preset=preset,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        batch_size=batch_size,
        lr=lr,
        device=device,
        accumulation_steps=accumulation_steps,
        memory_cap_gb=memory_cap,
        protocol=protocol,
        dtype=dtype,
    )
    try:
        configs = plan_grid(models, optimizers, strategies, seeds, base, rules)
    except PlanError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.param}'") from e
    path = kbmod.resolve_write_path(db)
    tuned = []
    try:
        with reporter_for(Console(stderr=True)) as reporter:
            if tune_lr:
                from measure.tuning import tune

                configs, tuned = tune(
                    configs, path, lambda cs: run_grid(cs, path, reporter, rules, order_seed), rules
                )
            grid = run_grid(configs, path, reporter, rules, order_seed)
    except KeyboardInterrupt:
        click.echo(
            f"Interrupted: finished cells are kept in {path} and the running one is recorded as crashed; "
            "run the same command again to go on.",
            err=True,
        )
        sys.exit(130)
    results = list(grid)
    if as_json:
        echo_json(
            {
                "db": str(path),
                "order_seed": grid.order_seed,
                "tuned": [t.as_dict() for t in tuned],
                "results": [r.as_dict() for r in results],
            }
        )
        return
    if tuned:
        console().print(tuned_table(tuned))
    console().print(summary_table(results))
    click.echo(f"Cell order shuffled with --order-seed {grid.order_seed} (recorded with every run).")
    done = sum(r.status == "ok" for r in results)
    first = configs[0].model if configs else models[0]
    click.echo(
        f"{done} ok of {len(results)} cells, written to {path}. "
        f"Ask: advisor recommend --model {first} --source measured" + (f" --db {db}" if db else "")
    )


@click.command(context_settings=CONTEXT)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="vit, modernbert, llama, nanovlm (repeatable). Default: all four.",
)
@preset_option("tiny")
@write_db_option
@json_option
@domain_errors
def validate(models, preset, db, as_json):
    """Check on this machine that the strategies are numerically what they claim.

    Checkpointing must give the same loss and gradients as standard training (bit-identical with dropout
    off, and with dropout on given the seed); accumulating k micro-batches of padded sequences must give
    the gradient and logged loss of one batch of k·b; conjugate gradient must solve a quadratic in n exact
    steps; the monitor's sampler must take under 1 % of the time. Exits with code 1 when a check fails.
    Results are recorded in the KB, and answers from this hardware say whether it was validated.

    \b
    Examples:
        advisor validate
        advisor validate --model llama --preset small --json
    """
    from advisor import store
    from advisor.report import validation_view

    reference = list(load_rules().reference_models())
    for name in models:
        if name not in reference:
            raise click.BadParameter(
                f"unknown model {name!r}. Choose from: {', '.join(reference)}.", param_hint="'--model'"
            )
    require_measure_side()
    from measure.hardware import describe, resolve_device
    from measure.validate import run_checks

    path = kbmod.resolve_write_path(db)
    store.release(store.open_kb(path))  # fail on an unusable KB before minutes of checks
    checks = run_checks(list(models) or reference, preset)
    machine = describe(resolve_device("cpu"))
    with store.writing(path) as conn:
        store.add_validations(conn, machine, preset, checks)
    failed = [c for c in checks if not c.passed]
    if as_json:
        echo_json(
            {
                "passed": not failed,
                "hardware": machine["hardware"],
                "preset": preset,
                "checks": [c.as_dict() for c in checks],
            }
        )
    else:
        console().print(validation_view([c.as_dict() for c in checks], machine["hardware"]))
    if failed:
        raise SystemExit(1)


COMMANDS = [measure, validate]
