"""`advisor report`, and the picture files that `frontier --html/--png` and `flowchart --html` write.

The plotting libraries (the `plots` extra: Altair, vl-convert, Jinja2) are imported here only when a
picture is asked for: an answer in the terminal never loads them.
"""

from __future__ import annotations

import os
import struct
from importlib.util import find_spec
from pathlib import Path

import click

from advisor.cli.params import CONTEXT, db_option, domain_errors, output_file, reading_kb, source_option
from advisor.errors import InputError
from advisor.places import places
from advisor.prediction.accelerators import resolve
from advisor.rules import load_rules

PLOTS = ("altair", "vl_convert", "jinja2")  # what the plots extra installs, as imported


def charts_module():
    """advisor.render.charts, or one sentence saying how to install what drawing needs (exit 1)."""
    missing = [m for m in PLOTS if find_spec(m) is None]
    if missing:
        raise click.ClickException(
            f"drawing needs the plots extra ({', '.join(missing)} missing): pip install 'advisor[plots]'."
        )
    from advisor.render import charts  # Altair and vl-convert: only when a picture is asked for

    return charts


def picture_option(flag: str, suffixes: tuple[str, ...], help: str):
    """--html/--png FILE: a file (not a folder) whose name says what it holds."""

    def check(ctx, param, value: Path | None):
        """A name with another suffix is a usage error (exit 2): `--png plot.jpg` would mislead."""
        if value is not None and value.suffix.lower() not in suffixes:
            raise click.BadParameter(
                f"{value} does not end in {' or '.join(suffixes)}: {flag} writes that kind of file "
                f"(e.g. frontier{suffixes[0]}).",
                ctx,
                param,
            )
        return value

    path = click.Path(dir_okay=False, path_type=Path)
    help += (
        " A FILE already there is replaced only with --force (a link by the file, never written through); a KB "
        "or any SQLite file never."
    )
    return click.option(flag, type=path, metavar="FILE", callback=check, help=help)


def check_pictures(force: bool, html: Path | None = None, png: Path | None = None) -> None:
    """Refuse, before any work, a picture FILE whose writing would lose something (params.output_file)."""
    output_file(html, force, "--html")
    output_file(png, force, "--png")


def write_pictures(draw, html: Path | None = None, png: Path | None = None) -> None:
    """Draw the chart once (draw(charts) -> chart) and write it as interactive HTML and/or PNG. The files are
    the ones the user named (check_pictures refused what they may not replace): one there is replaced, in one
    step, and a symbolic link there replaced by the file rather than written through (charts.replace_file),
    so a link planted at the name reaches nothing."""
    if not (html or png):
        return
    charts = charts_module()
    chart = draw(charts)
    if html:
        charts.replace_file(html, charts.html_page(chart).encode("utf-8"))
        click.echo(f"Wrote {html}: interactive HTML, opens offline in any browser.", err=True)
    if png:
        data = charts.png_bytes(chart)
        charts.replace_file(png, data)
        width, height = png_size(data)
        click.echo(f"Wrote {png}: {width} × {height} px PNG.", err=True)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, which always comes first."""
    return struct.unpack(">II", data[16:24])


def check_folder(out: Path) -> None:
    """Refuse, before any work, a folder that cannot be made: one under a file, or in a read-only place."""
    parent = next(p for p in [out, *out.parents] if p.exists())
    if not parent.is_dir():
        raise click.ClickException(
            f"cannot use {out}: {parent} is a file, not a folder. Choose another --out."
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise click.ClickException(f"cannot write into {parent}: permission denied. Choose another --out.")


def check_own_folder(out: Path, force: bool) -> None:
    """Refuse, before any work, a folder that holds files a report did not write (unless --force: its
    index.html and vega.js would be replaced without a word), or a folder where either of them goes."""
    # Jinja2 and the charts: the plots extra
    from advisor.render.site import INDEX, SCRIPT, foreign_files, in_the_way

    blocked = in_the_way(out)
    if blocked:
        raise click.ClickException(
            f"cannot write {blocked[0]}, a folder: move it aside or choose another --out."
        )
    if not force and foreign_files(out):
        raise click.ClickException(
            f"{out} holds files that advisor report did not write: choose a new or empty folder, or add "
            "--force to write index.html and vega.js among them."
        )
    for name in (INDEX, SCRIPT):  # replaced with the folder's consent, but never a KB or any SQLite file
        output_file(out / name, True, "--out")


def kb_label(db, shown=str) -> str:
    """Which KB the report is of, as a reader should see it named (`shown`: how a path is named)."""
    if db or os.environ.get("ADVISOR_DB"):
        return shown(db or os.environ["ADVISOR_DB"])
    where = places()
    return "the shipped KB" + (f" and yours ({shown(where['user_kb'])})" if where["user_kb_exists"] else "")


def fit_accelerators(ctx, param, values: tuple[str, ...]):
    """--gpu, each named as `advisor fit --gpu` takes it, resolved before any work (a bad name: exit 2)."""
    rules = load_rules()
    try:
        found = {a.key: a for a in (resolve(v, rules) for v in values)}  # a card named twice: once
    except InputError as e:
        raise click.BadParameter(str(e), ctx, param) from e
    return tuple(found.values())


@click.command(context_settings=CONTEXT)
@click.option(
    "--out",
    "out_dir",
    required=True,
    metavar="DIR",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to write the site into (created if missing). Only DIR/index.html and DIR/vega.js are "
    "written; open index.html in a browser, no server or network needed. A folder that holds other files "
    "is refused unless it holds an earlier report, or --force.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Write into a folder that holds files a report did not write: DIR/index.html and DIR/vega.js are "
    "replaced (a symbolic link there by the file, never written through); nothing else is touched.",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME",
    callback=fit_accelerators,
    help="An accelerator the fit section answers for (repeat for several; as `advisor fit --gpu` takes it). "
    "Default: RTX4090, A100-80GB and H100.",
)
@source_option
@db_option
@domain_errors
def report(out_dir, force, gpus, source, db):
    """Write a static site of the knowledge base's answers, to read in a browser or put in a slide.

    One page: the recommendation flowchart (family × metric → optimizer + strategy), every answer with its
    interval, test, runners-up, exclusions and caveats, the Pareto frontiers of loss against time, memory
    and utilization (hover a point for its interval, or an excluded one for why), the paper's claims with
    their verdicts, what fits which accelerator for every model advisor fit has traced (its pick, the
    largest micro-batch, the code), and the provenance of each evidence group. The page names no absolute
    path: a file by its name, or from ~ or the current folder. Needs the plots extra: pip install
    'advisor[plots]'.

    \b
    Examples:
        advisor report --out site/
        advisor report --out site-measured/ --source measured
        advisor report --out my-runs/ --db runs.sqlite
        advisor report --out site/ --gpu L4 --gpu H200
        advisor report --out docs/ --force
    """
    charts_module()  # say what is missing before any work
    from advisor.api.report import write_report  # the report's gathering: this command's alone
    from advisor.render.site import shown_path  # Jinja2 and the charts: the plots extra

    check_folder(out_dir)
    check_own_folder(out_dir, force)
    label = kb_label(db, shown_path)
    conn = reading_kb(db, source)
    index = write_report(conn, out_dir, source, label, gpus)
    click.echo(f"Wrote {index}: open it in a browser (no server needed).")
