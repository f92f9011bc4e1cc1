"""The commands that make evidence on this machine: measure, validate and pretrain. They import the measurement side
(torch, transformers) only once their arguments are parsed: `advisor --help` stays cheap."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import click
from rich.console import Console

from advisor import api
from advisor.api import require_measure_side
from advisor.cli.params import (
    CONTEXT,
    FiniteFloat,
    accelerator_options,
    console,
    declared_option,
    domain_errors,
    echo_json,
    json_option,
    model_option,
    names_option,
    shape_options,
    write_db_option,
)
from advisor.errors import KBError
from advisor.fields import help_of
from advisor.kb.queries.for_planning import run_groups
from advisor.kb.queries.groups import USER_ID_OFFSET, group_ref
from advisor.measuring.recipe.config import PROTOCOLS, RunConfig
from advisor.measuring.request import EXECUTORS, MeasureRequest
from advisor.measuring.training.progress import failure_causes
from advisor.places import shipped_rules_dir
from advisor.render.grid_views import closing_lines, nothing_measured_sentence, summary_table, tuned_table
from advisor.render.plan_views import plan_view
from advisor.render.progress_views import reporter_for
from advisor.render.views import validation_view
from advisor.rules import load_rules

PRESETS = load_rules(str(shipped_rules_dir())).presets  # the shipped rules' presets: read at import


def preset_option(default: str):
    return click.option(
        "--preset",
        type=click.Choice(PRESETS),
        default=default,
        show_default=True,
        help="Model sizes: tiny (seconds), small (the CPU reference grid), paper (the paper's real sizes).",
    )


@click.command(context_settings=CONTEXT)
@model_option(required=True, many=True)
@names_option("--optimizer", "optimizers", "optimizer", help_of(MeasureRequest, "optimizers"))
@names_option("--strategy", "strategies", "strategy", help_of(MeasureRequest, "strategies"))
@declared_option(RunConfig, "preset", type=click.Choice(PRESETS))
@declared_option(RunConfig, "epochs", type=click.IntRange(min=1))
@declared_option(RunConfig, "steps_per_epoch", type=click.IntRange(min=1))
@declared_option(MeasureRequest, "seeds", type=click.IntRange(min=1))
@declared_option(RunConfig, "device", type=click.Choice(["auto", "cpu", "cuda"]))
@declared_option(RunConfig, "lr", type=FiniteFloat(min=0, min_open=True))
@shape_options(RunConfig)
@accelerator_options
@declared_option(RunConfig, "protocol", type=click.Choice(PROTOCOLS))
@declared_option(RunConfig, "target_loss", type=FiniteFloat(min=0, min_open=True))
@declared_option(MeasureRequest, "tune_lr", is_flag=True)
@declared_option(MeasureRequest, "decide", is_flag=True)
@declared_option(MeasureRequest, "order_seed", type=click.IntRange(min=0))
@declared_option(MeasureRequest, "data", metavar="DATA")
@declared_option(MeasureRequest, "fallback", is_flag=True)
@declared_option(MeasureRequest, "executor", type=click.Choice(EXECUTORS))
@declared_option(MeasureRequest, "ray_address", metavar="auto|HOST:PORT")
@declared_option(MeasureRequest, "cpus_per_cell", type=click.IntRange(min=1))
@declared_option(MeasureRequest, "shard", metavar="K/N|auto")
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="Train nothing: list the cells with their predicted time and memory (past runs of the cell or its "
    "model on this hardware, in every KB in sight: --db, yours, the shipped one; else a few real steps of "
    "each model timed here now; with --gpu, or a model too large to step here: advisor fit), flag those "
    "predicted not to fit and those already done, and print the makespan on --workers (with --gpu: on "
    "that accelerator).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    multiple=True,
    help="With --plan: workers (GPUs or nodes) to give the makespan for, longest cells first (repeatable; "
    "default: 1).",
)
@write_db_option
@json_option
@domain_errors
def measure(models, plan_only, workers, gpu, as_json, **options):
    """Run the benchmark grid on this machine and write every run into the knowledge base.

    Each cell (model × optimizer × strategy × seed) is trained, monitored (time, loss, memory,
    utilization) and committed epoch by epoch. Cells already ok on this hardware are skipped; a cell that
    runs out of memory, diverges or fails is stored with that status and the grid goes on.

    Each cell runs in a fresh process, in an order shuffled by a recorded seed. Under the fair protocol
    (the default) every cell is evaluated on held-out data; see docs/measuring.md.

    \b
    Examples:
        advisor measure --model vit --preset tiny --epochs 2
        advisor measure --model all --preset small --seeds 3 --tune-lr --db my.sqlite
        advisor measure --model llama --preset tiny --data ./my_corpus.jsonl
        advisor measure --model ./bases/llama-small --optimizer adamw --strategy standard --strategy lora --tune-lr
        advisor measure --model all --preset paper --seeds 3 --shard auto --db shard-$SLURM_ARRAY_TASK_ID.sqlite
        advisor measure --model all --preset paper --seeds 3 --plan --gpu H100 --workers 8 --workers 64
    """
    for flag, value in (("--workers", workers), ("--gpu", gpu)):
        if value and not plan_only:
            raise click.BadParameter(
                f"{flag} sizes a plan: add --plan (nothing is trained).", param_hint=f"'{flag}'"
            )
    if plan_only:
        return show_plan(api.plan(*models, gpu=gpu, workers=workers, **options), as_json)
    show_measured(run_to_the_end(models, options), options.get("db"), as_json)


def run_to_the_end(models, options):
    """The grid measured (api.measure) with progress bars on stderr once its cells are known (the data
    resolved and said first); Ctrl-C says what was kept and exits 130. The worker process starts before the
    bars do: it imports torch meanwhile, and writes nothing on this terminal."""
    known = []  # the grid, once api.measure has made it: where an interrupted grid's cells are kept

    def bars(grid, stack: ExitStack):
        known.append(grid)
        return stack.enter_context(reporter_for(Console(stderr=True)))

    try:
        with ExitStack() as stack:
            return api.measure(*models, say=_said, on_grid=lambda grid: bars(grid, stack), **options)
    except KeyboardInterrupt:
        if not known:
            raise
        click.echo(
            f"Interrupted: finished cells are kept in {known[0].path} and the running ones are recorded as "
            "crashed; run the same command again to go on.",
            err=True,
        )
        sys.exit(130)


def _said(line: str) -> None:
    click.echo(line, err=True)


def show_plan(plan, as_json: bool) -> None:
    if as_json:
        echo_json(plan.as_dict())
    else:
        console().print(plan_view(plan))


def show_measured(measured, db, as_json: bool) -> None:
    """The rates tuned, each cell's outcome, and what to ask next (or all of it as JSON). A grid where no
    cell ended ok and some failed or crashed ends with a sentence and exit code 1."""
    if as_json:
        echo_json(measured.as_dict())
        for cause in failure_causes(measured.results) if measured.nothing_measured else ():
            click.echo(cause, err=True)  # the sentence below refers to it
    else:
        if measured.tuned:
            console().print(tuned_table(measured.tuned))
        console().print(summary_table(measured.results))
        ask = partial(_measured_group, measured.grid, measured.results, db)
        click.echo(closing_lines(measured, failure_causes(measured.results), ask))
    if measured.nothing_measured:
        raise click.ClickException(nothing_measured_sentence(measured))


def _measured_group(grid, results, db) -> str:
    """The flags that make recommend answer from the group just measured: `--group u2` in the user's KB (read
    beside the shipped one), `--group 2 --db FILE` in a KB of its own; --source measured where none was written."""
    try:
        groups = run_groups(Path(grid.path), [r.run_id for r in results if r.status == "ok"])
    except KBError:
        groups = []
    if not groups:
        return "--source measured" + (f" --db {db}" if db else "")
    return f"--group {groups[0]} --db {db}" if db else f"--group {group_ref(groups[0] + USER_ID_OFFSET)}"


@click.command(context_settings=CONTEXT)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where to time: the GPU when one is usable (auto), or this CPU.",
)
@click.option(
    "--rounds",
    type=click.IntRange(3, 100),
    default=8,
    show_default=True,
    help="At most this many rounds of the three timings (fewer where the fastest three of each agree).",
)
@click.option(
    "--tolerance",
    type=FiniteFloat(0, 1, min_open=True),
    default=0.2,
    show_default=True,
    help="The relative spread the fastest three rounds of each rate must agree within (0.2: 20 %).",
)
@write_db_option
@json_option
@domain_errors
def calibrate(device, rounds, tolerance, db, as_json):
    """Time this device's rates, so that `advisor fit` prices steps on it from them.

    A large matrix product (FLOP/s), an optimizer-like update over 64 MB (bytes/s) and a tiny Llama's
    forward and backward (a micro-batch's fixed cost), timed in rounds until the fastest three rounds of
    each agree within --tolerance (a few seconds on a quiet machine; at most --rounds rounds or a minute on
    a busy one, and then it says they did not agree, and by how much). The fastest figure of each is
    recorded in your KB with the device's name, the spread and the rounds. `advisor fit --gpu cpu` (or the
    GPU's name) then says "calibrated on this device" and uses them instead of the datasheet's peak and
    the speed model's constants (docs/fit.md); of several calibrations, the latest that agreed.

    \b
    Examples:
        advisor calibrate
        advisor calibrate --device cpu --json
        advisor calibrate --rounds 12 --tolerance 0.1
        advisor fit --model llama-3.2-1b --gpu cpu --batch-size 1 --seq-len 256
    """
    require_measure_side()
    from advisor.measuring.device_speed import AGREE, SHORT, calibrate_here  # torch: the measurement side

    result = calibrate_here(db, device, rounds=rounds, tolerance=tolerance)
    if as_json:
        echo_json(result.as_dict())
        return
    machine = result.machine
    out = Console()
    name = machine["device"] if machine["hardware"] == "cpu" else machine["hardware"]
    spreads = ", ".join(f"{SHORT[r.name]} {result.spreads[r.name]:.0%}" for r in result.rates)
    took = f"{result.rounds} round{'s' if result.rounds > 1 else ''} in {result.seconds:.1f} s"
    asked = f"at most {result.tolerance * 100:g}% asked"
    if result.agreed:
        out.print(
            f"Calibrated {name}: {took}; the fastest {AGREE} of each rate agree within "
            f"{result.spread:.0%} ({asked}: {spreads})."
        )
    else:
        few = result.rounds < AGREE
        out.print(
            f"Calibrated {name}, but the rounds did not agree: "
            + (f"only {took} before the time allowed ran out" if few else f"after {took}")
            + f", the fastest {min(AGREE, result.rounds)} of a rate still differ by up to {result.spread:.0%} "
            f"({spreads}; {asked}). Other load on this machine slows some rounds: the fastest figures are "
            "recorded, marked as not agreed; calibrate again when the machine is quieter"
            + ("." if few else ", or with more --rounds.")
        )
    for r in result.rates:
        out.print(f"  {r.detail}")
    gpu = "cpu" if machine["hardware"] == "cpu" else f"'{machine['hardware']}'"
    chosen = result.chosen
    if chosen.get("agreed") and not result.agreed:
        out.print(
            f"advisor fit --gpu {gpu} keeps pricing steps from the calibration of {chosen['at']}, whose "
            f"rounds agreed (within {chosen['spread']:.0%}); of {chosen['calibrations']} recorded here."
        )
    else:
        out.print(f'advisor fit --gpu {gpu} now prices steps from these ("calibrated on this device").')


@click.command(context_settings=CONTEXT)
@model_option(
    many=True, references_only=True, help="vit, modernbert, llama, nanovlm (repeatable). Default: all four."
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
    require_measure_side()
    from advisor.measuring.validate import validate_here  # torch: the measurement side

    report = validate_here(models, preset, db, load_rules())
    if as_json:
        echo_json(report.as_dict())
    else:
        console().print(validation_view([c.as_dict() for c in report.checks], report.hardware))
    if not report.passed:
        raise SystemExit(1)


@click.command(context_settings=CONTEXT)
@model_option(required=True, help="vit, modernbert, llama or nanovlm: the reference model to pretrain.")
@preset_option("small")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="The folder to write the base into (default: bases/MODEL-PRESET in your data folder: advisor kb path).",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    help="Optimizer updates, each on a fresh micro-batch (default: rules/protocol.toml [pretraining]).",
)
@click.option("--force", is_flag=True, help="Replace a base advisor pretrain wrote at --out before.")
@json_option
@domain_errors
def pretrain(model, preset, out, steps, force, as_json):
    """Pretrain a reference model here: a base to fine-tune, LoRA against full fine-tuning.

    Adapters on a randomly initialised model measure nothing a fine-tune meets, so this trains the family's
    reference model on the generated corpus of its first genres (rules/protocol.toml [pretraining]) and
    saves it as a model folder. `advisor measure --model DIR` then fine-tunes it on every genre: the task's
    format known, its other genres new. The folder's advisor-base.json records the recipe and the held-out
    loss as it trained. About 2 minutes per model at --preset small on 2 CPU cores.

    \b
    Examples:
        advisor pretrain --model llama --out bases/llama-small
        advisor measure --model bases/llama-small --optimizer adamw --strategy standard --strategy lora --tune-lr --seeds 3
        advisor recommend --model bases/llama-small --source measured --optimize loss
    """
    say = (lambda line: None) if as_json else (lambda line: click.echo(line, err=True))
    record = api.pretrain(model, preset=preset, out=out, steps=steps, force=force, say=say)
    if as_json:
        echo_json(record)
        return
    first, last = record["curve"][0], record["curve"][-1]
    click.echo(
        f"Pretrained {record['model']} ({record['preset']}, {record['parameters']:,} parameters) for "
        f"{record['recipe']['steps']} updates in {record['trained_s']:.0f} s: held-out loss "
        f"{first['heldout_loss']:.3f} -> {last['heldout_loss']:.3f} on its {record['recipe']['genres']} genres, "
        f"{first['task_loss']:.3f} -> {last['task_loss']:.3f} on every genre."
    )
    click.echo(f"Saved to {record['path']}. Fine-tune it, LoRA against full:")
    click.echo(
        f"  advisor measure --model {record['path']} --optimizer adamw --strategy standard --strategy lora "
        "--tune-lr --seeds 3"
    )
