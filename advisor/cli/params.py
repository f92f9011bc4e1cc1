"""What the commands share: the click context, parameter types, option decorators, output helpers, and
the translation of domain errors into one sentence and an exit code."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import click
from rich.console import Console

from advisor import kb as kbmod
from advisor.rules import RulesError, load_rules
from advisor.schema import STATUSES, KBError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def console() -> Console:
    return Console(soft_wrap=False)


def echo_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def domain_errors(fn):
    """Turn a domain error into a one-sentence message and exit code 1 (user mistakes: never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from advisor.evidence import NoEvidence
        from advisor.model_ref import ModelNotResolved

        try:
            return fn(*args, **kwargs)
        except (KBError, RulesError, NoEvidence, ModelNotResolved) as e:
            raise click.ClickException(str(e)) from e
        except OSError as e:  # writing a report, an export, a cache: the environment's, said in a sentence
            raise click.ClickException(os_error(e)) from e

    return wrapper


def os_error(e: OSError) -> str:
    import errno

    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"cannot write{where}: {e.strerror}. Free some space, or write to another disk."
    return f"cannot use{where}: {e.strerror or e}."


def checked_rules():
    """The rules, for parsing options: a broken rules file (the user's, most likely) is a sentence, exit 1."""
    try:
        return load_rules()
    except RulesError as e:
        raise click.ClickException(str(e)) from e


class FamilyType(click.ParamType):
    """An architecture family by name or alias (rules/families.toml); lists the choices when unknown."""

    name = "family"

    def convert(self, value, param, ctx):
        rules = checked_rules()
        try:
            return rules.family(value).name
        except KeyError:
            self.fail(
                f"unknown family {value!r}. Choose from: {', '.join(rules.family_choices())}.", param, ctx
            )


class MetricType(click.ParamType):
    name = "metric"

    def convert(self, value, param, ctx):
        metrics = checked_rules().metrics
        if value.lower() not in metrics:
            self.fail(f"unknown metric {value!r}. Choose from: {', '.join(metrics)}.", param, ctx)
        return value.lower()


class NameType(click.ParamType):
    """An optimizer or strategy the rules know (rules/families.toml); lists the choices when unknown."""

    def __init__(self, kind: str):
        self.name = kind

    def convert(self, value, param, ctx):
        rules = checked_rules()
        known = rules.optimizers if self.name == "optimizer" else rules.strategies
        if value not in known:
            self.fail(f"unknown {self.name} {value!r}. Choose from: {', '.join(known)}.", param, ctx)
        return value


STATUS = click.Choice(STATUSES)


class FiniteFloat(click.FloatRange):
    """A float range that also refuses nan and infinity (click's FloatRange lets nan through)."""

    def convert(self, value, param, ctx):
        import math

        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


def names_option(flag: str, dest: str, kind: str, help: str):
    """A repeatable --optimizer/--strategy-like option whose values the rules must know."""
    return click.option(flag, dest, type=NameType(kind), multiple=True, metavar="NAME", help=help)


def db_option(fn):
    """--db of a command that reads: one KB instead of the shipped KB read together with the user's."""
    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Knowledge base file to read alone (default: $ADVISOR_DB, else the shipped KB together with "
        "your own: `advisor kb path`).",
    )(fn)


def write_db_option(fn):
    """--db of a command that writes: never the shipped KB by default."""
    return click.option(
        "--db",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Knowledge base file to write (default: $ADVISOR_DB, else your own KB: `advisor kb path`).",
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


def open_for_reading(db, source: str | None = None):
    """The KB to answer from, read-only, with --source checked against it."""
    conn = kbmod.open_for_reading(db)
    check_source(conn, source)
    return conn
