"""What the commands share: the click context, parameter types, the option groups every command declares
once here (model, accelerator, shape, evidence; the pattern of sqlite-utils' `output_options`), output
helpers, and the translation of advisor's errors into one sentence and an exit code."""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from advisor.api import RecommendRequest
from advisor.errors import Error, InputError, RulesError, UnsupportedModel
from advisor.fields import default_of, help_of
from advisor.files import output_problem
from advisor.kb import open as kb_open
from advisor.kb.migrations import STATUSES
from advisor.kb.queries import groups
from advisor.kb.schema import TIMED_OUT, timed_out
from advisor.model_ref import reference_models, resolve_model
from advisor.places import shipped_kb_path, user_kb_path
from advisor.prediction.fit_request import (
    ADAPTERS,
    ATTENTIONS,
    DTYPES,
    GENERATIONS,
    LOSSES,
    METHODS,
    NUMBERS,
    OFFLOADS,
    REFERENCES,
    SHARDINGS,
    WHOLE,
    FitRequest,
)
from advisor.rules import load_rules

if TYPE_CHECKING:
    from rich.console import Console

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def console() -> Console:
    from rich.console import Console  # rich's 20 ms wait for what prints tables (--json prints none)

    return Console(soft_wrap=False, emoji=False)  # nothing advisor prints is an emoji code (and 2 ms of rich)


def echo_json(obj) -> None:
    """Indented for a reader at a terminal; one line into a pipe or a file (json's C encoder: a fit's hundreds
    of configurations print in a hundredth of the indented time)."""
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json.dumps(obj, indent=indent, default=str))


class RulesProblem(click.ClickException):
    """A rules file that cannot be used (the user's, most likely): bad input, one sentence, exit code 2."""

    exit_code = 2


def flag_of(field: str) -> str:
    """The flag of the running command that sets a request's field (an InputError names the field): the one
    place a field becomes a flag. A field no option of the command sets is said as the API's sentences say it."""
    from advisor.api.inputs import _flag  # the API's own spelling (FLAGS), imported with the API it names

    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx else ():
        if param.name == field and isinstance(param, click.Option):
            return max(param.opts, key=len)
    return _flag(field)


def domain_errors(fn):
    """advisor's errors as the command line says them: a bad option (InputError) is a usage error, exit code
    2, naming the option; anything else one sentence, exit code 1. Never a traceback for the user's mistake."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            if e.field is None:
                raise click.UsageError(str(e)) from e
            raise click.BadParameter(str(e), param_hint=f"'{flag_of(e.field)}'") from e
        except RulesError as e:
            raise RulesProblem(str(e)) from e
        except Error as e:
            raise click.ClickException(str(e)) from e
        except sqlite3.DatabaseError as e:  # met while answering: a KB damaged where the checks did not look
            raise click.ClickException(sqlite_error(e)) from e
        except OSError as e:  # writing a report, an export, a cache: the environment's, said in a sentence
            raise click.ClickException(os_error(e)) from e

    return wrapper


def sqlite_error(e: sqlite3.DatabaseError) -> str:
    """An SQLite error met mid-command, as one sentence naming the KBs read and what to do."""
    kbs = " and ".join(kb_open.READING) or "the knowledge base"
    if TIMED_OUT in str(e):
        return str(timed_out(kbs, e))
    return (
        f"reading {kbs} failed ({e}), so nothing was answered: `advisor kb check` says which file is damaged; "
        "move it aside (mv FILE FILE.bad), or restore it from a copy."
    )


def os_error(e: OSError) -> str:
    where = f" {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"cannot write{where}: {e.strerror}. Free some space, or write to another disk."
    return f"cannot use{where}: {e.strerror or e}."


def checked_rules():
    """The rules, for parsing options: a broken rules file (the user's, most likely) is a sentence, exit 2."""
    try:
        return load_rules()
    except RulesError as e:
        raise RulesProblem(str(e)) from e
    except Error as e:
        raise click.ClickException(str(e)) from e


# --- parameter types ------------------------------------------------------------------------------------


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


class ModelType(click.ParamType):
    """--model resolved once, here (advisor.model_ref): a ResolvedModel, or with `all` every reference model
    (a list). A model that cannot be resolved offline is a sentence with exit code 1."""

    name = "model"

    def __init__(self, allow_all: bool = False, references_only: bool = False):
        self.allow_all, self.references_only = allow_all, references_only

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        rules = checked_rules()
        if self.allow_all and value == "all":
            return reference_models(rules)
        if self.references_only and value not in rules.reference_models():
            self.fail(
                f"unknown model {value!r}. Choose from: {', '.join(rules.reference_models())}.", param, ctx
            )
        try:
            return resolve_model(value, rules)
        except Error as e:
            takes_arch = ctx is not None and any(p.name == "arch" for p in ctx.command.params)
            takes_arch = takes_arch and not isinstance(e, UnsupportedModel)
            raise click.ClickException(
                str(e) + (" Or pass --arch FAMILY instead." if takes_arch else "")
            ) from e


def flat_models(ctx, param, value):
    """A repeatable --model with its `all`s expanded: one ResolvedModel per model, in order."""
    return tuple(m for v in value for m in (v if isinstance(v, list) else [v]))


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
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):  # before the range, whose bound inf would be said to pass
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def whole(name: str) -> click.IntRange:
    """The click type of FitRequest's whole number `name`, from its range declared once (fit_request.WHOLE)."""
    _, least, most, _ = WHOLE[name]
    return click.IntRange(min=least, max=most)


def number(name: str) -> FiniteFloat:
    """The click type of FitRequest's number `name`, from its range declared once (fit_request.NUMBERS)."""
    _, least, most, open_low, _ = NUMBERS[name]
    return FiniteFloat(min=least, max=most, min_open=open_low)


class Aliased(click.Option):
    """An option whose older spellings (its names after the first) still work, unshown in --help."""

    def get_help_record(self, ctx):
        names, self.opts = self.opts, self.opts[:1]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = names


def _compose(*decorators):
    def apply(fn):
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


# --- the option groups, each declared once -------------------------------------------------------------


def model_option(required: bool = False, many: bool = False, help: str | None = None, references_only=False):
    """--model NAME|PATH|HF_ID, resolved once; `many`: repeatable, with `all` for every reference model;
    `references_only`: one of the families' reference models (vit, modernbert, llama, nanovlm)."""
    text = help or (
        "A folder with config.json (weights not needed), a cached Hugging Face id, or one of vit, modernbert, "
        "llama, nanovlm (the paper's models)" + (", or all of them (repeatable)." if many else ".")
    )
    return click.option(
        "--model",
        "models" if many else "model",
        type=ModelType(allow_all=many, references_only=references_only),
        multiple=many,
        required=required,
        callback=flat_models if many else None,
        metavar="NAME|PATH|HF_ID",
        help=text,
    )


def declared_option(request: type, name: str, *decls: str, help: str | None = None, **kwargs):
    """A click option whose default and help are field `name` of the request dataclass `request`, declared
    there once (advisor.fields): the command line is derived from the request, never a second declaration.
    `decls`: the option's names (default: --name-with-dashes); `help`: a command's own sentence instead."""
    default = default_of(request, name)
    if isinstance(default, tuple) and not kwargs.get("multiple"):
        default = None  # one value on the command line (--lora-targets a,b), made a tuple by its callback
    choice = isinstance(kwargs.get("type"), click.Choice)
    if choice and default is not None and not isinstance(default, tuple):
        default = str(default)  # a choice of numbers (--base-bits 4) is text, made a number by its callback
    shown = default is not None and default is not False and default != ()
    decls = decls or ("--" + name.replace("_", "-"),)
    return click.option(
        *decls,
        name,
        default=default,
        show_default=shown,
        help=help or help_of(request, name),
        **kwargs,
    )


def accelerator_options(fn):
    """--gpu NAME and --memory GiB: the accelerator, and the memory a configuration must fit in."""
    return _compose(
        declared_option(FitRequest, "gpu", metavar="NAME"),
        declared_option(
            FitRequest,
            "memory",
            "--memory",
            "--max-memory",  # recommend's, and measure's --memory-cap, before one name meant one idea
            "--memory-cap",
            cls=Aliased,
            type=number("memory"),
            metavar="GiB",
        ),
    )(fn)


def shape_options(request: type):
    """--batch-size, --seq-len, --image-size, --dtype, --accumulation-steps (and the menu's --effective-batch):
    the shape of a step, each with the default and help of `request` (fit's FitRequest: --dtype is
    repeatable, an axis of the fine-tuning menu; measure's RunConfig: one dtype)."""
    menu = request is FitRequest
    options = [
        declared_option(request, "batch_size", type=whole("batch_size")),
        declared_option(request, "seq_len", type=whole("seq_len")),
        declared_option(request, "image_size", type=whole("image_size"), metavar="PX"),
        declared_option(request, "dtype", type=click.Choice(DTYPES), multiple=menu),
        declared_option(request, "accumulation_steps", type=whole("accumulation_steps")),
    ]
    if menu:
        options.append(
            declared_option(request, "effective_batch", type=whole("effective_batch"), metavar="SAMPLES")
        )
    return _compose(*options)


def menu_options(fn):
    """The fine-tuning menu's axes beside precision and optimizer: what trains (--adapter and LoRA's settings),
    where the optimizer lives (--offload), the ranks, and the attention kernel (FitRequest's fields)."""
    return _compose(
        declared_option(FitRequest, "adapters", "--adapter", type=click.Choice(ADAPTERS), multiple=True),
        declared_option(FitRequest, "lora_r", type=whole("lora_r")),
        declared_option(FitRequest, "lora_alpha", type=whole("lora_alpha")),
        declared_option(
            FitRequest,
            "lora_targets",
            metavar="NAMES",
            callback=lambda ctx, param, value: tuple(t for t in (value or "").split(",") if t.strip()),
        ),
        declared_option(
            FitRequest,
            "base_bits",
            type=click.Choice(["4", "8"]),
            callback=lambda ctx, param, value: int(value),
        ),
        declared_option(FitRequest, "offload", type=click.Choice(OFFLOADS), multiple=True),
        declared_option(FitRequest, "gpus", type=whole("gpus")),
        declared_option(FitRequest, "nodes", type=whole("nodes")),
        declared_option(FitRequest, "shardings", "--sharding", type=click.Choice(SHARDINGS), multiple=True),
        declared_option(FitRequest, "interconnect", metavar="LINKS"),
        declared_option(FitRequest, "attention", type=click.Choice(ATTENTIONS)),
    )(fn)


def method_options(fn):
    """The training step traced (FitRequest's fields): Trainer's or TRL's (--method), DPO's and GRPO's
    reference, GRPO's generation, Trainer's loss."""
    return _compose(
        declared_option(FitRequest, "method", type=click.Choice(METHODS)),
        declared_option(FitRequest, "reference", type=click.Choice(REFERENCES)),
        declared_option(FitRequest, "completion_len", type=whole("completion_len"), metavar="TOKENS"),
        declared_option(FitRequest, "generations", type=whole("generations"), metavar="N"),
        declared_option(FitRequest, "beta", type=number("beta"), metavar="KL"),
        declared_option(FitRequest, "generation", type=click.Choice(GENERATIONS)),
        declared_option(FitRequest, "loss", type=click.Choice(LOSSES)),
    )(fn)


def names_option(flag: str, dest: str, kind: str, help: str):
    """A repeatable --optimizer/--strategy-like option whose values the rules must know."""
    return click.option(flag, dest, type=NameType(kind), multiple=True, metavar="NAME", help=help)


def source_option(fn):
    return declared_option(RecommendRequest, "source", metavar="SOURCE")(fn)


def evidence_options(fn):
    """--source, --preset, --hardware, --group, --evidence: which evidence an answer may rank (RecommendRequest's
    fields)."""
    return _compose(
        source_option,
        declared_option(RecommendRequest, "preset", metavar="PRESET"),
        declared_option(RecommendRequest, "hardware", metavar="NAME"),
        declared_option(RecommendRequest, "group", metavar="ID"),
        declared_option(RecommendRequest, "evidence", type=click.Choice(["matching", "mine"])),
    )(fn)


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


FORCE_HELP = "Replace a file already at the output's name (a link there by the file, never written through)."


def force_option(help: str = FORCE_HELP):
    """--force of a command that writes a FILE the user names: without it, one already there is refused."""
    return click.option("--force", is_flag=True, help=help)


def output_file(path: Path | None, force: bool, option: str, replaces_kb: bool = False) -> None:
    """Refuse, before any work, an output FILE whose writing would lose something (advisor.files.output_problem:
    a KB advisor reads, any SQLite file, or a file already there without --force): a usage error, exit 2."""
    if path is None:
        return
    kept = {shipped_kb_path(): "the shipped KB, advisor's own data", user_kb_path(): "your own KB"}
    if os.environ.get("ADVISOR_DB"):
        kept[Path(os.environ["ADVISOR_DB"])] = "the KB $ADVISOR_DB names"
    problem = output_problem(Path(path), force, kept, replaces_kb)
    if problem:
        raise click.BadParameter(problem, param_hint=f"'{option}'")


# --- the measurement side, and reading ------------------------------------------------------------------


def check_source(conn, source: str | None) -> None:
    """--source must name a source kind or a source present in the KB (exit 2 otherwise)."""
    if source is None:
        return
    present = groups.sources(conn)
    choices = sorted(set(groups.SOURCE_KINDS) | set(present))
    if source not in choices:
        raise click.BadParameter(
            f"unknown source {source!r}. Choose from: {', '.join(choices)}.", param_hint="'--source'"
        )


def reading_kb(db, source: str | None = None):
    """The KB to answer from, read-only, with --source checked against it."""
    conn = kb_open.open_for_reading(db)
    check_source(conn, source)
    return conn
