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
@click.option(
    "--data",
    default="generated",
    show_default=True,
    metavar="SOURCE",
    help="What to train on: generated (offline, deterministic), mmimdb (the paper's MM-IMDb, pinned to the "
    "commit it cites; downloaded once, its size said first), a Hugging Face dataset id (owner/name"
    "[@revision]), or a local path: a JSONL, CSV, Parquet or text file, a folder of them, a save_to_disk "
    "folder, or an image folder (class subfolders, or captions in metadata.jsonl). Runs on other data are "
    "their own evidence (the README: Measuring on your data).",
)
@click.option(
    "--fallback",
    is_flag=True,
    help="When the Hugging Face hub cannot be reached (asked once, about a second) and the data is not in "
    "the local cache: measure on generated data instead of stopping (every run records it).",
)
@click.option(
    "--seq-len",
    type=click.IntRange(min=4),
    help="Text tokens per example (VLM: per caption). Default: the preset's (paper: 512; VLM 128).",
)
@click.option(
    "--image-size",
    type=click.IntRange(min=8),
    metavar="PX",
    help="Image side in pixels (a multiple of the patch size). Default: the preset's (paper: 224).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: one cell at a time on this machine. ray: each cell a Ray task on a cluster (one GPU per "
    "cell, or a node's CPUs), this process the only writer to the KB (pip install 'advisor[cluster]').",
)
@click.option(
    "--ray-address",
    metavar="auto|HOST:PORT",
    help="The Ray cluster to join (auto: the one this host belongs to). Default: start one on this machine.",
)
@click.option(
    "--cpus-per-cell",
    type=click.IntRange(min=1),
    help="With --executor ray: CPUs a cell asks for (default: 1 beside its GPU; on CPU nodes, all the "
    "CPUs of the smallest node, so that no two cells share a node's cores).",
)
@click.option(
    "--shard",
    metavar="K/N|auto",
    help="Run only shard K of N of the grid (a deterministic split by cell key), into its own KB; `auto` "
    "reads a Slurm job array's SLURM_ARRAY_TASK_ID and _COUNT. Unite the shards with `advisor kb merge`.",
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Train nothing: list the cells with their predicted time and memory (advisor fit, or this "
    "machine's measured runs), flag those predicted not to fit and those already done, and print the "
    "makespan on --workers (fit's traces are cached in the KB, as `advisor fit` does).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    multiple=True,
    help="With --plan: workers (GPUs or nodes) to give the makespan for, longest cells first (repeatable; "
    "default: 1).",
)
@click.option(
    "--gpu",
    metavar="NAME",
    help="With --plan: the accelerator of each worker (e.g. A100-80GB, H100; `advisor fit --list-gpus`). "
    "Default: this machine.",
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
    data,
    fallback,
    seq_len,
    image_size,
    executor,
    ray_address,
    cpus_per_cell,
    shard,
    plan_only,
    workers,
    gpu,
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
        advisor measure --model llama --preset tiny --data ./my_corpus.jsonl
        advisor measure --model vit --preset tiny --data ./my_images/ --image-size 64
        advisor measure --model all --preset paper --data mmimdb --fallback
        advisor measure --model vit --preset tiny --executor ray --ray-address auto
        advisor measure --model all --preset paper --seeds 3 --shard auto --db shard-$SLURM_ARRAY_TASK_ID.sqlite
        advisor measure --model all --preset paper --seeds 3 --plan --gpu H100 --workers 8 --workers 64
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
    the_shard = _check_scaling(executor, ray_address, cpus_per_cell, shard, plan_only, workers, gpu, tune_lr)
    rules = load_rules()
    for name in models:  # a model that cannot be resolved offline is the user's to fix, before torch loads
        if name != "all":
            resolve_model(name, rules)
        if executor == "ray" and not plan_only and name != "all" and name not in rules.reference_models():
            raise click.BadParameter(
                f"--executor ray runs the reference models ({', '.join(rules.reference_models())}); {name} runs "
                "with --executor local, which first predicts whether it fits the machine it runs on.",
                param_hint="'--model'",
            )
    require_measure_side()
    from measure.config import RunConfig
    from measure.grid import run_grid
    from measure.hardware import resolve_device
    from measure.progress import reporter_for, summary_table
    from measure.runner import PlanError, plan_grid
    from measure.tuning import tuned_table

    try:  # a GPU asked for and absent is the user's to fix (a cluster's GPUs are not this host's)
        if executor == "local" and not plan_only:
            resolve_device(device)
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
    if not plan_only:  # once, here: no cell asks the hub, and a bad --data stops before any cell starts
        configs = _with_data(configs, data, fallback, seq_len, image_size, rules)
    planned = len(configs)
    if the_shard is not None:
        configs = the_shard.take(configs)
    if plan_only:  # priced at the asked sizes; the data itself does not change a step's cost
        from dataclasses import replace

        configs = [replace(c, seq_len=seq_len, image_size=image_size) for c in configs]
        return _show_plan(configs, gpu, workers, rules, db, as_json)
    path = _shard_path(the_shard) if the_shard is not None and not db else kbmod.resolve_write_path(db)
    tuned = []
    try:
        with reporter_for(Console(stderr=True)) as reporter:
            if executor == "ray":
                from measure.cluster import ClusterError, run_grid_ray

                def run(cs):
                    try:
                        return run_grid_ray(cs, path, reporter, rules, order_seed, ray_address, cpus_per_cell)
                    except ClusterError as e:
                        raise click.ClickException(str(e)) from e
            else:

                def run(cs):
                    return run_grid(cs, path, reporter, rules, order_seed)

            if tune_lr:
                from measure.tuning import tune

                configs, tuned = tune(configs, path, run, rules)
            grid = run(configs)
    except KeyboardInterrupt:
        click.echo(
            f"Interrupted: finished cells are kept in {path} and the running ones are recorded as crashed; "
            "run the same command again to go on.",
            err=True,
        )
        sys.exit(130)
    results = list(grid)
    if as_json:
        echo_json(
            {
                "db": str(path),
                "shard": str(the_shard) if the_shard else None,
                "cells_planned": planned,
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
    if the_shard is not None:
        click.echo(
            f"Shard {the_shard}: {len(configs)} of the grid's {planned} cells. When every shard is done: "
            "advisor kb merge SHARD.sqlite ... --db ALL.sqlite"
        )
    done = sum(r.status == "ok" for r in results)
    first = configs[0].model if configs else models[0]
    click.echo(
        f"{done} ok of {len(results)} cells, written to {path}. "
        f"Ask: advisor recommend --model {first} --source measured" + (f" --db {db}" if db else "")
    )


def _check_scaling(executor, ray_address, cpus_per_cell, shard, plan_only, workers, gpu, tune_lr):
    """The cluster, shard and plan flags checked together, before torch loads; returns the Shard or None."""
    import importlib.util

    from measure.shard import ShardError, parse

    for flag, value in (("--ray-address", ray_address), ("--cpus-per-cell", cpus_per_cell)):
        if value is not None and executor != "ray":
            raise click.BadParameter(f"{flag} applies to --executor ray only.", param_hint=f"'{flag}'")
    for flag, value in (("--workers", workers), ("--gpu", gpu)):
        if value and not plan_only:
            raise click.BadParameter(
                f"{flag} sizes a plan: add --plan (nothing is trained).", param_hint=f"'{flag}'"
            )
    if executor == "ray" and not plan_only and importlib.util.find_spec("ray") is None:
        raise click.ClickException("--executor ray needs Ray: pip install 'advisor[cluster]'.")
    if shard is None:
        return None
    if tune_lr:
        raise click.BadParameter(
            "every shard would tune the same rates: tune once (advisor measure ... --tune-lr --seeds 1), "
            "then pass the rates with --lr, or run the grid unsharded.",
            param_hint="'--shard'",
        )
    try:
        return parse(shard)
    except ShardError as e:
        raise click.BadParameter(str(e), param_hint="'--shard'") from e


def _shard_path(the_shard):
    """A shard's own KB when no --db is given: beside the user's KB, named by the shard."""
    path = kbmod.user_dir() / "shards" / f"shard-{the_shard.index}-of-{the_shard.count}.sqlite"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _show_plan(configs, gpu, workers, rules, db, as_json) -> None:
    """--plan: the cells' predicted cost, those predicted not to fit, and the makespans."""
    from measure.plan import PlanInputError, plan_cells, plan_view

    try:
        plan = plan_cells(configs, rules, gpu=gpu, workers=list(workers) or [1], db=db)
    except PlanInputError as e:
        raise click.BadParameter(str(e), param_hint=f"'{e.param}'") from e
    if as_json:
        echo_json(plan.as_dict())
    else:
        console().print(plan_view(plan))


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


def _with_data(configs, data, fallback, seq_len, image_size, rules):
    """The grid's cells with their data resolved once, in this process (the hub asked once, a download
    done before any cell starts), and checked against every model of the grid; a --data, --seq-len or
    --image-size that cannot work stops here with a sentence (exit 2; an unreachable hub exits 1)."""
    from dataclasses import replace

    from measure.sources import DataError, check_configs, resolve

    try:
        choice = resolve(data, fallback, say=lambda line: click.echo(line, err=True))
        fields = dict(seq_len=seq_len, image_size=image_size, **choice.config_fields())
        configs = [replace(c, **fields) for c in configs]
        check_configs(configs, rules)
    except DataError as e:
        if not e.usage:
            raise click.ClickException(str(e)) from e
        raise click.BadParameter(str(e), param_hint=f"'{e.param}'") from e
    return configs


COMMANDS = [measure, validate]
