"""The commands that answer from the KB: recommend, frontier, flowchart, claims. Torch-free."""

from __future__ import annotations

from pathlib import Path

import click

from advisor import api
from advisor.answers.flowchart import summary, walk
from advisor.answers.frontier import frontier as frontier_of
from advisor.api import RecommendRequest
from advisor.cli.params import (
    CONTEXT,
    FamilyType,
    FiniteFloat,
    MetricType,
    accelerator_options,
    console,
    db_option,
    declared_option,
    domain_errors,
    echo_json,
    evidence_options,
    force_option,
    json_option,
    menu_options,
    method_options,
    model_option,
    names_option,
    output_file,
    reading_kb,
    source_option,
)
from advisor.cli.reporting import check_pictures, picture_option, write_pictures
from advisor.fields import help_of
from advisor.rules import load_rules

# advisor.render.charts.FRONTIER_SIZE × PNG_SCALE, not imported from there: --help must not load the plotting library
FRONTIER_PIXELS = "1280 × 840"


def show(render) -> None:
    """Print what render(advisor.render.views) makes: the views, and rich under them (20 ms to import), are
    loaded by what prints tables, never by --json."""
    from advisor.render import views  # rich's tables: --json prints none

    console().print(render(views))


@click.command(context_settings=CONTEXT)
@declared_option(RecommendRequest, "arch", type=FamilyType())
@model_option(help=help_of(RecommendRequest, "model"))
@declared_option(RecommendRequest, "optimize", type=MetricType())
@accelerator_options
@declared_option(RecommendRequest, "max_time", type=FiniteFloat(min=0), metavar="S")
@names_option("--optimizer", "optimizers", "optimizer", help_of(RecommendRequest, "optimizers"))
@names_option(
    "--exclude-optimizer", "exclude_optimizers", "optimizer", help_of(RecommendRequest, "exclude_optimizers")
)
@names_option("--strategy", "strategies", "strategy", help_of(RecommendRequest, "strategies"))
@evidence_options
@menu_options
@method_options
@click.option(
    "--verbose",
    "-v",
    is_flag=True,
    help="The whole answer: runners-up with their tests, exclusions, holes, caveats, the frontier, other evidence.",
)
@db_option
@json_option
@domain_errors
def recommend(db, as_json, verbose, **options):
    """Recommend an optimizer and memory strategy, with its evidence, alternatives and caveats.

    With --model and --gpu (or --memory), the fine-tuning menu is predicted for your model (as advisor
    fit does): measured configurations that would not fit are excluded, memory is ranked by prediction,
    and the answer names the configuration a practitioner would pick across the menu. The menu's options
    (--adapter, --lora-r, --offload, ...) narrow that prediction.

    \b
    Examples:
        advisor recommend --model llama-3.1-8b --gpu RTX4090 --optimize time
        advisor recommend --model qwen3-8b --gpu RTX4090 --method grpo --optimize memory
        advisor recommend --arch encoder --optimize loss --verbose
        advisor recommend --model ./my-bert --optimize time --memory 40
        advisor recommend --arch decoder --exclude-optimizer adam --json
    """
    conn = reading_kb(db, options["source"])
    # the short answer names no other group's pick: ranking the others is for --verbose and --json
    answer = api.recommend(conn=conn, **options, compare_groups=verbose or as_json)
    rules = load_rules()
    if as_json:
        echo_json(answer.as_dict(rules))
    else:
        show(lambda views: views.answer_view(answer, rules, verbose))


@click.command(context_settings=CONTEXT)
@click.option("--arch", type=FamilyType(), required=True, help="Architecture family or alias.")
@click.option("--x", "x", type=MetricType(), default="time", show_default=True, help="Metric on the x axis.")
@click.option("--y", "y", type=MetricType(), default="loss", show_default=True, help="Metric on the y axis.")
@source_option
@picture_option(
    "--html",
    (".html", ".htm"),
    "Also write the plot as an interactive page (hover a point for its interval, or an excluded one for "
    "why); self-contained, it opens offline.",
)
@picture_option(
    "--png",
    (".png",),
    f"Also write the plot as a {FRONTIER_PIXELS} px PNG image, for a paper or a slide.",
)
@force_option(
    "Replace a file already at --html's or --png's name (a link there by the file, never written through)."
)
@db_option
@json_option
@domain_errors
def frontier(arch, x, y, source, html, png, force, db, as_json):
    """The exact Pareto frontier of two metrics over every usable configuration.

    Diverged and failed runs are left out (drawn greyed in --html/--png pictures, with the reason). Points
    are labelled in the table and the scatter plot alike; in the plot, a * follows the label of a point on
    the frontier. --html and --png need the plots extra: pip install 'advisor[plots]'.

    \b
    Examples:
        advisor frontier --arch vision
        advisor frontier --arch decoder --x memory --y loss --json
        advisor frontier --arch vision --source measured --png frontier.png --html frontier.html
        advisor frontier --arch vision --png frontier.png --force     # replace an earlier picture
    """
    rules = load_rules()
    if x == y:
        raise click.BadParameter("--x and --y must be different metrics.", param_hint="'--x'")
    check_pictures(force, html, png)
    result = frontier_of(reading_kb(db, source), arch, x, y, rules, source)
    if not result.points and (html or png or not as_json):
        raise click.ClickException(
            f"no configuration of {arch} has both a {x} and a {y} figure in {result.group.label}: "
            "nothing to plot. Try another --x or --y, or another --source."
        )
    if as_json:
        echo_json(result.as_dict(rules))
    else:
        evidence = f"Evidence: {result.group.label}"
        show(lambda views: views.frontier_view(result.points, rules, x, y, evidence=evidence))
    write_pictures(lambda charts: charts.frontier_chart(result, rules), html, png)


@click.command(context_settings=CONTEXT)
@source_option
@picture_option(
    "--html",
    (".html", ".htm"),
    "Also write the flowchart as an interactive page: a grid of family × metric, each cell the pick "
    "(hover it for the test and the evidence); self-contained, it opens offline.",
)
@force_option("Replace a file already at --html's name (a link there by the file, never written through).")
@db_option
@json_option
@domain_errors
def flowchart(source, html, force, db, as_json):
    """The recommendation tree: family → metric → optimizer → strategy, like the paper's Figure 1.

    --html needs the plots extra: pip install 'advisor[plots]'.

    \b
    Examples:
        advisor flowchart
        advisor flowchart --source paper --json
        advisor flowchart --source measured --html flowchart.html
    """
    check_pictures(force, html)
    rules = load_rules()
    paths = walk(reading_kb(db, source), rules, source=source)
    if html and not any(p.answer for p in paths):
        where = f" from source {source!r}" if source else ""
        raise click.ClickException(
            f"the knowledge base has no runs{where}: nothing to draw. Measure some with `advisor measure`."
        )
    if as_json:
        echo_json({"paths": [p.as_dict() for p in paths], "summary": summary(paths)})
    else:
        show(lambda views: views.flowchart_view(paths, summary(paths)))
    write_pictures(lambda charts: charts.flowchart_chart(paths, summary(paths), rules), html)


@click.command(context_settings=CONTEXT)
@source_option
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the report as Markdown to this file: a new file, or with --force one to replace (never a "
    "KB or any SQLite file).",
)
@force_option(
    "Replace a file already at --markdown's name (a link there by the file, never written through)."
)
@db_option
@json_option
@domain_errors
def claims(source, markdown_path, force, db, as_json):
    """Re-check the paper's claims against the evidence: holds, does not hold, not enough evidence, or not
    comparable (the evidence was measured under another protocol than the claim was made under).

    The claims, with the paper's own numbers and their protocol, are data in rules/claims.toml.

    \b
    Examples:
        advisor claims --source paper
        advisor claims --source measured --markdown docs/claims.md --force
    """
    output_file(markdown_path, force, "--markdown")
    from advisor.answers.claims import check_all, markdown  # not on the path of the other answers
    from advisor.files import (
        replace_file,  # only --markdown writes a file: the short answer loads only what it uses
    )

    verdicts = check_all(reading_kb(db, source), source, load_rules())
    if markdown_path:
        command = (
            "advisor claims" + (f" --source {source}" if source else "") + f" --markdown {markdown_path}"
        )
        replace_file(
            markdown_path, markdown(verdicts, source, command).encode("utf-8")
        )  # never through a link
    if as_json:
        echo_json({"source": source, "claims": [v.as_dict() for v in verdicts]})
    else:
        show(lambda views: views.claims_view(verdicts))


@click.command(context_settings=CONTEXT)
@click.option("--arch", type=FamilyType(), help="Only this family (or an alias: vit, llama, ...).")
@db_option
@json_option
@domain_errors
def transfer(arch, db, as_json):
    """How rankings carry across scale: the same grid measured at two model sizes, compared.

    Per family and metric, Kendall's tau-b between the configurations' rankings at the smaller and the
    larger size (1: the same order, 0: unrelated, -1: reversed), its 95 % bootstrap interval over seeds, and
    whether the pick stayed the pick. It says how far a ranking measured on small models can be trusted
    for a larger one: evidence groups that differ only in scale (`make reference` measures the CPU grid at
    presets tiny and small; a paper's table at several sizes). Under it, per source and metric, the pick at
    the largest size and its lead over the runner-up at every size: the trend `advisor recommend` states
    beside an answer from any of them.

    \b
    Examples:
        advisor transfer
        advisor transfer --arch decoder --json
    """
    from advisor.answers.transfer import METRICS, transfers  # only this command reads it
    from advisor.answers.trend import trends

    conn, rules = reading_kb(db, None), load_rules()
    found, leads = transfers(conn, rules, arch), trends(conn, rules, arch, METRICS)
    if as_json:
        echo_json(
            {
                "family": arch,
                "transfers": [t.as_dict() for t in found],
                "trends": [t.as_dict() for t in leads],
            }
        )
    else:
        show(lambda views: views.transfer_view(found, arch, leads))
