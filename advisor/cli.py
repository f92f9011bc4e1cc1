"""The `advisor` command line: thin click commands that parse, call one domain function, and render."""

from __future__ import annotations

import csv
import functools
import io
import json
import sys
from pathlib import Path

import click
from rich.console import Console

from advisor import kb as kbmod
from advisor.rules import RulesError, load_rules
from advisor.schema import KBError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def console() -> Console:
    return Console(soft_wrap=False)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def domain_errors(fn):
    """Turn a domain error into a one-sentence message and exit code 1 (user mistakes: never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from advisor.models import ModelNotResolved
        from advisor.recommend import NoEvidence

        try:
            return fn(*args, **kwargs)
        except (KBError, RulesError, NoEvidence, ModelNotResolved) as e:
            raise click.ClickException(str(e)) from e

    return wrapper


class FamilyType(click.ParamType):
    """An architecture family by name or alias (rules/families.toml); lists the choices when unknown."""

    name = "family"

    def convert(self, value, param, ctx):
        rules = load_rules()
        try:
            return rules.family(value).name
        except KeyError:
            self.fail(
                f"unknown family {value!r}. Choose from: {', '.join(rules.family_choices())}.", param, ctx
            )


class MetricType(click.ParamType):
    name = "metric"

    def convert(self, value, param, ctx):
        metrics = load_rules().metrics
        if value.lower() not in metrics:
            self.fail(f"unknown metric {value!r}. Choose from: {', '.join(metrics)}.", param, ctx)
        return value.lower()


def db_option(fn):
    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Knowledge base file (default: $ADVISOR_DB, then the shipped kb/results.sqlite).",
    )(fn)


def json_option(fn):
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")(
        fn
    )


def source_option(fn):
    return click.option(
        "--source",
        metavar="SOURCE",
        help="Evidence to rank: 'paper', 'measured', or an exact source name from `advisor kb stats`. "
        "Default: the best evidence group available.",
    )(fn)


def require_measure_side() -> None:
    """The evidence side's libraries are an extra: say how to install them instead of a traceback."""
    from importlib.util import find_spec

    missing = [m for m in ("torch", "transformers", "datasets", "psutil") if find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"the measurement side is not installed ({', '.join(missing)} missing): "
            "pip install torch==2.13.0 -e '.[measure]'"
        )


def check_source(conn, source: str | None) -> None:
    """--source must name a source kind or a source present in the KB (exit 2 otherwise)."""
    if source is None:
        return
    present = kbmod.sources(conn)
    choices = sorted(set(kbmod.SOURCE_KINDS) | set(present))
    if source not in choices:
        raise click.BadParameter(
            f"unknown source {source!r}. Choose from: {', '.join(choices)}.", param_hint="'--source'"
        )


@click.group(context_settings=CONTEXT)
@click.version_option(package_name="advisor")
def cli():
    """Which optimizer and memory strategy should I train this transformer with, under this constraint?

    Answers come from a knowledge base of training runs: the paper's published figures (arXiv 2608.08961)
    and measurements made with `advisor measure`. Start with:

        advisor recommend --arch encoder --optimize memory
    """


@cli.command(context_settings=CONTEXT)
@click.option(
    "--arch",
    type=FamilyType(),
    help="Architecture family or alias: vision/vit, encoder/modernbert, decoder/llama, vlm/nanovlm.",
)
@click.option(
    "--model",
    metavar="NAME|HF_ID|PATH",
    help="A model instead of --arch: vit, modernbert, llama, nanovlm, a local folder with config.json "
    "or a cached Hugging Face id; its family comes from model_type.",
)
@click.option(
    "--optimize",
    "metric",
    type=MetricType(),
    default="loss",
    show_default=True,
    help="Metric to optimize: loss, time, memory, utilization.",
)
@click.option(
    "--max-memory",
    type=click.FloatRange(min=0),
    metavar="GB",
    help="Exclude configurations above this memory.",
)
@click.option(
    "--max-time",
    type=click.FloatRange(min=0),
    metavar="S",
    help="Exclude configurations slower than this (s/epoch).",
)
@click.option(
    "--optimizer", "optimizers", multiple=True, metavar="NAME", help="Only these optimizers (repeatable)."
)
@click.option(
    "--exclude-optimizer",
    "exclude_optimizers",
    multiple=True,
    metavar="NAME",
    help="Never these optimizers (repeatable).",
)
@click.option(
    "--strategy",
    "strategies",
    multiple=True,
    metavar="NAME",
    help="Only these strategies (repeatable): standard, checkpointing, accumulation.",
)
@source_option
@db_option
@json_option
@domain_errors
def recommend(
    arch, model, metric, max_memory, max_time, optimizers, exclude_optimizers, strategies, source, db, as_json
):
    """Recommend an optimizer and memory strategy, with its evidence, alternatives and caveats.

    \b
    Examples:
        advisor recommend --arch encoder --optimize memory
        advisor recommend --model ./my-bert --optimize time --max-memory 40
        advisor recommend --arch decoder --exclude-optimizer adam --json
    """
    from advisor.models import resolve_model
    from advisor.recommend import Constraints
    from advisor.recommend import recommend as do_recommend
    from advisor.report import answer_view

    rules = load_rules()
    if bool(arch) == bool(model):
        raise click.UsageError("pass exactly one of --arch FAMILY or --model NAME.")
    _check_names(rules, optimizers + exclude_optimizers, strategies)
    model_name = None
    if model:
        resolved = resolve_model(model, rules)
        arch, model_name = resolved.family.name, resolved.name
    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    constraints = Constraints(
        max_memory=max_memory,
        max_time=max_time,
        optimizers=optimizers,
        exclude_optimizers=exclude_optimizers,
        strategies=strategies,
    )
    answer = do_recommend(conn, arch, metric, constraints, source=source, model=model_name, rules=rules)
    if as_json:
        echo_json(answer.as_dict(rules))
    else:
        console().print(answer_view(answer, rules))


def _check_names(rules, optimizers, strategies) -> None:
    for name in optimizers:
        if name not in rules.optimizers:
            raise click.BadParameter(
                f"unknown optimizer {name!r}. Choose from: {', '.join(rules.optimizers)}.",
                param_hint="'--optimizer'",
            )
    for name in strategies:
        if name not in rules.strategies:
            raise click.BadParameter(
                f"unknown strategy {name!r}. Choose from: {', '.join(rules.strategies)}.",
                param_hint="'--strategy'",
            )


@cli.command(context_settings=CONTEXT)
@click.option("--arch", type=FamilyType(), required=True, help="Architecture family or alias.")
@click.option("--x", "x", type=MetricType(), default="time", show_default=True, help="Metric on the x axis.")
@click.option("--y", "y", type=MetricType(), default="loss", show_default=True, help="Metric on the y axis.")
@source_option
@db_option
@json_option
@domain_errors
def frontier(arch, x, y, source, db, as_json):
    """The exact Pareto frontier of two metrics over every usable configuration.

    Diverged and failed runs are left out. Points are labelled in the table and the scatter plot alike.

    \b
    Examples:
        advisor frontier --arch vision
        advisor frontier --arch decoder --x memory --y loss --json
    """
    from advisor.evidence import GroupEvidence
    from advisor.recommend import frontier_points, select_group
    from advisor.report import frontier_view

    rules = load_rules()
    if x == y:
        raise click.BadParameter("--x and --y must be different metrics.", param_hint="'--x'")
    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    group, _ = select_group(conn, rules, arch, source)
    ev = GroupEvidence(conn, group, rules)
    diverged = ev.diverged()
    usable = [c for k, c in sorted(ev.cells.items()) if c.n_ok and k not in diverged]
    points = frontier_points(ev, usable, x, y)
    if as_json:
        echo_json(
            {
                "family": arch,
                "x": {"metric": x, "unit": rules.metric(x).unit, "measure": ev.measure(x)},
                "y": {"metric": y, "unit": rules.metric(y).unit, "measure": ev.measure(y)},
                "evidence": group.as_dict(),
                "points": [p.as_dict() for p in points],
                "left_out": sorted(
                    f"{c.name}: {diverged.get(k) or 'no ok run'}"
                    for k, c in ev.cells.items()
                    if k in diverged or not c.n_ok
                ),
            }
        )
        return
    if not points:
        raise click.ClickException(
            f"no configuration of {arch} has both a {x} and a {y} figure in {group.label}."
        )
    console().print(frontier_view(points, rules, x, y, evidence=f"Evidence: {group.label}"))


@cli.command(context_settings=CONTEXT)
@source_option
@db_option
@json_option
@domain_errors
def flowchart(source, db, as_json):
    """The recommendation tree: family → metric → optimizer → strategy, like the paper's Figure 1.

    \b
    Examples:
        advisor flowchart
        advisor flowchart --source paper --json
    """
    from advisor.flowchart import summary, walk
    from advisor.report import flowchart_view

    rules = load_rules()
    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    paths = walk(conn, source=source, rules=rules)
    if as_json:
        echo_json({"paths": [p.as_dict() for p in paths], "summary": summary(paths)})
    else:
        console().print(flowchart_view(paths, summary(paths)))


@cli.command(context_settings=CONTEXT)
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    metavar="NAME",
    help="vit, modernbert, llama, nanovlm, all, a cached Hugging Face id or a local folder (repeatable).",
)
@click.option(
    "--optimizer",
    "optimizers",
    multiple=True,
    metavar="NAME",
    help="Optimizers to run (repeatable). Default: the paper's grid for each model.",
)
@click.option(
    "--strategy",
    "strategies",
    multiple=True,
    metavar="NAME",
    help="standard, checkpointing, accumulation, checkpointing+accumulation (repeatable). "
    "Default: the paper's three.",
)
@click.option(
    "--preset",
    type=click.Choice(["tiny", "small", "paper"]),
    default="small",
    show_default=True,
    help="Model sizes: tiny (seconds), small (the CPU reference grid), paper (the paper's real sizes).",
)
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
    type=click.FloatRange(min=0, min_open=True),
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
    type=click.FloatRange(min=0, min_open=True),
    metavar="GB",
    help="Treat memory above this as out of memory (CUDA: per-process fraction; CPU: host RSS).",
)
@db_option
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
    db,
    as_json,
):
    """Run the benchmark grid on this machine and write every run into the knowledge base.

    Each cell (model × optimizer × strategy × seed) is trained, monitored (time, loss, memory,
    utilization) and committed epoch by epoch. Cells already ok on this hardware are skipped; a cell that
    runs out of memory, diverges or fails is stored with that status and the grid goes on.

    \b
    Examples:
        advisor measure --model vit --preset tiny --epochs 2
        advisor measure --model all --preset small --seeds 3 --db my.sqlite
        advisor measure --model llama --optimizer adam --strategy checkpointing --device cuda
    """
    rules = load_rules()
    _check_names(rules, optimizers, strategies)
    names = [
        m for name in models for m in (["vit", "modernbert", "llama", "nanovlm"] if name == "all" else [name])
    ]
    families = {}
    for name in names:
        from advisor.models import resolve_model

        families[name] = resolve_model(name, rules).family
    require_measure_side()
    from measure.config import RunConfig
    from measure.hardware import resolve_device
    from measure.progress import RichReporter, summary_table
    from measure.runner import grid, run_grid

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
    )
    opts = {n: list(optimizers) or list(families[n].grid_optimizers) for n in names}
    strats = {n: list(strategies) or list(families[n].grid_strategies) for n in names}
    configs = grid(names, opts, strats, range(seeds), base)
    _check_accumulation(configs)
    path = kbmod.resolve_db_path(db)
    err = Console(stderr=True)
    with RichReporter(err) as reporter:
        results = run_grid(configs, path, reporter)
    if as_json:
        echo_json({"db": str(path), "results": [r.as_dict() for r in results]})
    else:
        console().print(summary_table(results))
        done = sum(r.status == "ok" for r in results)
        click.echo(
            f"{done} ok of {len(results)} cells, written to {path}. "
            f"Ask: advisor recommend --model {names[0]} --source measured" + (f" --db {db}" if db else "")
        )


@cli.command(context_settings=CONTEXT)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="NAME",
    help="vit, modernbert, llama, nanovlm (repeatable). Default: all four.",
)
@click.option("--preset", type=click.Choice(["tiny", "small", "paper"]), default="tiny", show_default=True)
@db_option
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
    from advisor.report import validation_view
    from measure.hardware import describe, resolve_device
    from measure.record import add_validations, connect
    from measure.validate import run_checks

    names = list(models) or ["vit", "modernbert", "llama", "nanovlm"]
    for name in names:
        if name not in ("vit", "modernbert", "llama", "nanovlm"):
            raise click.BadParameter(
                f"unknown model {name!r}. Choose from: vit, modernbert, llama, nanovlm.",
                param_hint="'--model'",
            )
    path = kbmod.resolve_db_path(db)
    conn = connect(path)  # fail on an unusable KB before minutes of checks
    checks = run_checks(names, preset)
    machine = describe(resolve_device("cpu"))
    add_validations(conn, machine, preset, checks)
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


def _check_accumulation(configs) -> None:
    from measure.strategies import window_size

    for cfg in configs:
        r = cfg.resolved()
        if r.steps_per_epoch % window_size(r.strategy, r.accumulation_steps):
            raise click.BadParameter(
                f"--steps-per-epoch {r.steps_per_epoch} is not a multiple of --accumulation-steps "
                f"{r.accumulation_steps}: accumulation would drop micro-batches.",
                param_hint="'--steps-per-epoch'",
            )


@cli.command(context_settings=CONTEXT)
@source_option
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as Markdown to this file.",
)
@db_option
@json_option
@domain_errors
def claims(source, markdown_path, db, as_json):
    """Re-check the paper's claims against the evidence: holds, does not hold, or not enough evidence.

    The claims, with the paper's own numbers, are data in rules/claims.toml.

    \b
    Examples:
        advisor claims --source paper
        advisor claims --source measured --markdown docs/claims.md
    """
    from advisor.claims import check_all, markdown
    from advisor.report import claims_view

    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    verdicts = check_all(conn, source)
    if markdown_path:
        command = (
            "advisor claims" + (f" --source {source}" if source else "") + f" --markdown {markdown_path}"
        )
        markdown_path.write_text(markdown(verdicts, source, command))
    if as_json:
        echo_json({"source": source, "claims": [v.as_dict() for v in verdicts]})
    else:
        console().print(claims_view(verdicts))


@cli.group(context_settings=CONTEXT)
def kb():
    """Inspect, export, import and build the knowledge base.

    \b
    Examples:
        advisor kb stats
        advisor kb runs --family decoder --status oom
    """


@kb.command(context_settings=CONTEXT)
@db_option
@json_option
@domain_errors
def stats(db, as_json):
    """Counts of runs by source and status, and the evidence groups.

    \b
    Example:
        advisor kb stats --json
    """
    from advisor.report import stats_view

    conn = kbmod.open_for_reading(db)
    result = kbmod.stats(conn)
    if as_json:
        echo_json(result)
    else:
        console().print(stats_view(result, str(kbmod.resolve_db_path(db))))


@kb.command(context_settings=CONTEXT)
@click.option("--family", type=FamilyType(), help="Only this family.")
@source_option
@click.option("--status", type=click.Choice(["ok", "oom", "diverged", "failed", "running", "crashed"]))
@click.option("--limit", type=click.IntRange(min=1), help="At most this many runs.")
@db_option
@json_option
@domain_errors
def runs(family, source, status, limit, db, as_json):
    """List runs with their provenance and status.

    \b
    Example:
        advisor kb runs --family vision --source paper
    """
    from advisor.report import runs_view

    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    rows = kbmod.list_runs(conn, family=family, source=source, status=status, limit=limit)
    if as_json:
        echo_json(rows)
    else:
        console().print(runs_view(rows))


@kb.command(context_settings=CONTEXT)
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@source_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Write to this file instead of standard output.",
)
@db_option
@domain_errors
def export(fmt, source, output, db):
    """Export runs: JSON (every run with provenance, metrics and epochs; what `kb import` reads) or CSV.

    CSV has one row per run-level figure, in the columns of the paper's figures.csv plus provenance.

    \b
    Examples:
        advisor kb export --source measured -o my-runs.json
        advisor kb export --format csv > figures.csv
    """
    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    data = kbmod.export_runs(conn, source=source)
    if fmt == "json":
        text = json.dumps({"runs": data}, indent=1, sort_keys=True, default=str) + "\n"
    else:
        buf = io.StringIO()
        cols = [
            "source",
            "model",
            "family",
            "optimizer",
            "strategy",
            "preset",
            "seed",
            "hardware",
            "status",
            "metric",
            "value",
            "unit",
            "certainty",
            "note",
        ]
        writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        writer.writeheader()
        for run in data:
            for m in run["metrics"]:
                writer.writerow(
                    {
                        **{c: run.get(c) for c in cols[:9]},
                        "metric": m["name"],
                        "value": m["value"],
                        "unit": m["unit"],
                        "certainty": m["certainty"],
                        "note": m["note"],
                    }
                )
        text = buf.getvalue()
    if output:
        output.write_text(text)
        click.echo(f"Wrote {len(data)} runs to {output}.", err=True)
    else:
        click.echo(text, nl=False)


@kb.command(name="import", context_settings=CONTEXT)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--setup",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="For a figures CSV: its setup.toml (hardware, hyperparameters). Default: setup.toml beside it.",
)
@db_option
@domain_errors
def import_(file, setup, db):
    """Import runs from a JSON export or a figures CSV, in one transaction (a bad row imports nothing).

    \b
    Examples:
        advisor kb import colleague-runs.json --db my.sqlite
        advisor kb import figures.csv --setup setup.toml --db my.sqlite
    """
    from advisor.ingest import import_file

    path = kbmod.resolve_db_path(db)
    added, skipped = import_file(path, file, setup)
    click.echo(
        f"Imported {added} runs into {path}" + (f" ({skipped} already there, skipped)." if skipped else ".")
    )


@kb.command(context_settings=CONTEXT)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the KB. Default: the shipped kb/results.sqlite.",
)
@domain_errors
def build(output):
    """Rebuild the knowledge base from the versioned sources in kb/sources/ (atomically).

    \b
    Example:
        advisor kb build                 # refresh the shipped kb/results.sqlite
    """
    from advisor.ingest import build_kb

    out = output or kbmod.shipped_kb_path()
    counts = build_kb(out)
    click.echo(f"Built {out}: " + ", ".join(f"{k} {v} runs" for k, v in counts.items()) + ".")


@kb.command(context_settings=CONTEXT)
@db_option
@domain_errors
def migrate(db):
    """Upgrade a KB written by an older advisor to the current schema.

    \b
    Example:
        advisor kb migrate --db old.sqlite
    """
    from advisor.schema import open_kb

    path = kbmod.resolve_db_path(db)
    if not path.exists():
        raise click.ClickException(f"no knowledge base at {path}.")
    open_kb(path).close()
    click.echo(f"{path} is at the current schema.")


def main():
    try:
        cli(prog_name="advisor")
    except BrokenPipeError:  # `advisor kb export | head` is not an error
        sys.stderr.close()


if __name__ == "__main__":
    main()
