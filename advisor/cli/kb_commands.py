"""`advisor kb ...`: inspect, export, import, build and migrate knowledge bases."""

from __future__ import annotations

import os
from pathlib import Path

import click

from advisor import places
from advisor.cli.params import (
    CONTEXT,
    STATUS,
    FamilyType,
    console,
    db_option,
    domain_errors,
    echo_json,
    force_option,
    json_option,
    output_file,
    reading_kb,
    source_option,
    write_db_option,
)
from advisor.errors import KBError
from advisor.files import replace_file
from advisor.kb.build import build_kb, check_target, import_file, merge_kbs
from advisor.kb.export import runs_csv, runs_json
from advisor.kb.open import check_kb, kbs_read, open_for_writing, release, whole_before_migrating
from advisor.kb.queries import for_report
from advisor.render.views import runs_view, stats_view
from advisor.rules import load_rules


@click.group(context_settings=CONTEXT)
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
    result = for_report.stats(reading_kb(db))
    if as_json:
        echo_json(result)
    else:
        console().print(stats_view(result, str(db) if db else str(places.places()["reads"])))


@kb.command(context_settings=CONTEXT)
@click.option("--family", type=FamilyType(), help="Only this family.")
@source_option
@click.option("--status", type=STATUS)
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
    conn = reading_kb(db, source)
    rows = for_report.list_runs(conn, family=family, source=source, status=status, limit=limit)
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
    help="Write to this file instead of standard output: a new file, or with --force one to replace (never a "
    "KB or any SQLite file).",
)
@force_option()
@db_option
@domain_errors
def export(fmt, source, output, force, db):
    """Export runs: JSON (every run with provenance, metrics and epochs; what `kb import` reads) or CSV.

    CSV has one row per run-level figure, in the columns of the paper's figures.csv plus provenance.

    \b
    Examples:
        advisor kb export --source measured -o my-runs.json
        advisor kb export --source measured -o my-runs.json --force   # replace an earlier export
        advisor kb export --format csv > figures.csv
    """
    output_file(output, force, "-o")
    conn = reading_kb(db, source)
    data = for_report.export_runs(conn, source=source)
    # validations belong to hardware, not to a source: a whole-KB export carries them
    text = (
        runs_csv(data)
        if fmt == "csv"
        else runs_json(data, [] if source else for_report.export_validations(conn))
    )
    if output:
        replace_file(output, text.encode("utf-8"))  # in one step, a link at the name replaced: never followed
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
@write_db_option
@domain_errors
def import_(file, setup, db):
    """Import runs from a JSON export or a figures CSV, in one transaction (a bad row imports nothing).

    \b
    Examples:
        advisor kb import colleague-runs.json --db my.sqlite
        advisor kb import figures.csv --setup setup.toml --db my.sqlite
    """
    path = places.resolve_write_path(db)
    added, skipped = import_file(path, file, load_rules(), setup)
    click.echo(
        f"Imported {added} runs into {path}" + (f" ({skipped} already there, skipped)." if skipped else ".")
    )


@kb.command(context_settings=CONTEXT)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the KB.",
)
@click.option(
    "--shipped",
    is_flag=True,
    help="Write the package's own kb/results.sqlite (what `make kb` does in a checkout).",
)
@force_option(
    "Replace a KB an earlier `kb build -o` wrote at -o (never your own KB, the shipped one, or a file that is "
    "no advisor KB)."
)
@domain_errors
def build(output, shipped, force):
    """Build a knowledge base from the versioned inputs in kb/inputs/ (atomically).

    \b
    Examples:
        advisor kb build -o /tmp/kb.sqlite
        advisor kb build -o /tmp/kb.sqlite --force   # build it again
        advisor kb build --shipped      # refresh the package's kb/results.sqlite (a checkout's make kb)
    """
    if bool(output) == shipped:
        raise click.UsageError(
            "say where to write: -o PATH, or --shipped for the package's own kb/results.sqlite."
        )
    out = _build_target(output) if output else places.shipped_kb_path()
    if output:  # -o: what is no KB refused first (never replaced), then an earlier build without --force
        check_target(out)
        output_file(output, force, "-o", replaces_kb=True)
    counts = build_kb(out, load_rules())
    click.echo(f"Built {out}: " + ", ".join(f"{k} {v} runs" for k, v in counts.items()) + ".")


def _build_target(output: Path) -> Path:
    """-o names any file but the shipped KB, which only --shipped rebuilds (as every other writer refuses it)."""
    try:
        return places.resolve_write_path(output)
    except KBError as e:
        raise KBError(
            f"{output} is the shipped KB, the package's own data: -o writes another file, and "
            "`advisor kb build --shipped` rebuilds it from kb/inputs/."
        ) from e


@kb.command(context_settings=CONTEXT)
@write_db_option
@domain_errors
def migrate(db):
    """Upgrade a KB written by an older advisor to the current schema.

    \b
    Example:
        advisor kb migrate --db old.sqlite
    """
    path = places.resolve_write_path(db) if db or places.user_kb_path().exists() else None
    if path is None:
        raise click.ClickException(
            f"no knowledge base to migrate: pass --db (your KB would be {places.user_kb_path()})."
        )
    if not path.exists():
        raise click.ClickException(f"no knowledge base at {path}.")
    whole_before_migrating(path)
    release(open_for_writing(path))
    click.echo(f"{path} is at the current schema.")


@kb.command(context_settings=CONTEXT)
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@write_db_option
@domain_errors
def merge(files, db):
    """Unite other KBs (a colleague's, another machine's) into yours, by run identity, in one transaction.

    Runs your KB lacks are added with their provenance; runs it holds are skipped; a run that differs
    (another status or other figures under the same identity) is reported as a conflict and left as it
    is. Merging the same files again changes nothing.

    \b
    Examples:
        advisor kb merge colleague.sqlite
        advisor kb merge node-1.sqlite node-2.sqlite --db cluster.sqlite
    """
    path = places.resolve_write_path(db)
    if any(f.resolve() == path.resolve() for f in files if path.exists()):
        raise click.BadParameter(f"{path} is the KB merged into: name other KBs.", param_hint="FILES")
    merged = merge_kbs(path, list(files))
    for conflict in merged.conflicts:
        click.echo(f"conflict: {conflict}", err=True)
    repeats = (
        f", {merged.repeats} repeats of a cell and seed already measured on that hardware left out"
        if merged.repeats
        else ""
    )
    crashed = (
        f", {merged.crashed} runs still running in their KB copied as crashed (a merge copies no claim)"
        if merged.crashed
        else ""
    )
    click.echo(
        f"Merged {len(files)} KB{'s' if len(files) > 1 else ''} into {path}: {merged.added} runs added, "
        f"{merged.skipped} already there, {len(merged.conflicts)} conflicts{repeats}{crashed}."
    )


@kb.command(context_settings=CONTEXT)
@db_option
@domain_errors
def check(db):
    """Check a KB is whole and keeps advisor's rules: SQLite's integrity check of every page, its schema
    exactly advisor's, every row within the rules. Default: the shipped KB and your own.

    Exit code 1 when one is damaged or breaks the rules: move it aside (or restore it from a copy).

    \b
    Examples:
        advisor kb check
        advisor kb check --db colleague.sqlite
    """
    paths = [places.resolve_db_path(db)] if db or os.environ.get("ADVISOR_DB") else kbs_read()
    bad = 0
    for kb_path in paths:
        problems = check_kb(kb_path)
        bad += bool(problems)
        click.echo(
            f"{kb_path}: "
            + ("ok (every page sound, schema and rows as advisor's)" if not problems else "NOT USABLE")
        )
        for problem in problems:
            click.echo(f"  {problem}")
    if bad:
        raise click.ClickException(
            f"{bad} KB{'s' if bad > 1 else ''} damaged or breaking advisor's rules (above): move "
            f"{'them' if bad > 1 else 'it'} aside (mv FILE FILE.bad), or restore from a copy."
        )


@kb.command(context_settings=CONTEXT)
@json_option
def path(as_json):
    """Where advisor reads and writes: the shipped KB, your KB, and $ADVISOR_DB when set.

    \b
    Examples:
        advisor kb path
        sqlite3 "$(advisor kb path --json | jq -r .user_kb)"
    """
    where = places.places()
    if as_json:
        echo_json(where)
        return
    for name, value in where.items():
        click.echo(f"{name}: {value}")
