"""The one set of rules a run must keep to enter a KB, or to be read from the user's: known or well-formed
names, finite figures within physical bounds, seeds and counts that are not negative, JSON that parses.

Each rule is written once and said two ways: `problem` in Python, which the store runs on every run it
writes (`kb import`, `kb merge`, `kb build`, `measure`, the Trainer callback), and `broken` in SQL, which
advisor.kb.queries.audit runs over a KB that is read (the user's KB beside the shipped one) without loading
it.

Names: what comes from outside (import, merge, build) names the rules' families, optimizers, strategies
and measures; a run of the user's own Trainer (protocol `trainer`) may name an optimizer or figure of its
own. advisor's own writers (measure's claims, the Trainer callback) and a KB read back are lenient: a
name the rules do not know passes if well formed (a short identifier of a-z, 0-9 and _+.-), as the
writer's rules may have known it (a rules directory of its own, the user's rules since edited) and an
unknown name cannot stand in for a known one. Values are held to the same bounds everywhere.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from advisor.kb.migrations import PROTOCOLS, STATUSES
from advisor.rules import Rules, load_rules

FREE_PROTOCOLS = ("trainer",)  # runs that may name an optimizer or figure the rules do not know
CERTAINTIES = ("measured", "stated", "inferred")
MAX_REPORTED = 5  # bad runs a refusal names; the rest are counted
_CONTROL_OR_MARKUP = re.compile(r"[\x00-\x1f\x7f<>]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # free text keeps tabs and newlines
_GLOB_CONTROL_OR_MARKUP = "*[\x01-\x1f\x7f<>]*"
_GLOB_CONTROL = "*[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]*"


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _listed(values: Iterable[str]) -> str:
    return ", ".join(_quoted(v) for v in values) or "NULL"


def _shown(value) -> str:
    """A stored value as a refusal quotes it: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the rules -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Number:
    """A number in [lo, hi] (an integer where `integer`), finite; NULL allowed unless `required`."""

    lo: float
    hi: float
    integer: bool = False
    required: bool = False

    def problem(self, value, row=None) -> str | None:
        if value is None:
            return "is missing" if self.required else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        if self.integer and not isinstance(value, int):
            return "must be an integer"
        if not math.isfinite(value):
            return "must be finite"
        if value < self.lo:
            return "must not be negative" if self.lo == 0 else f"must be at least {self.lo:g}"
        if value > self.hi:
            return f"must be at most {self.hi:g}"
        return None

    def broken(self, col: str) -> str:
        # SQLite orders any text or blob above every number: NOT BETWEEN catches them too ('NaN' as text)
        bad = f"NOT ({col} BETWEEN {self.lo!r} AND {self.hi!r})"
        if self.integer:
            bad += f" OR typeof({col}) != 'integer'"
        return f"({col} IS NULL OR {bad})" if self.required else f"({col} IS NOT NULL AND ({bad}))"


@dataclass(frozen=True)
class Text:
    """Printable text of at most max_len characters: names and provenance hold no control characters or
    markup (<, >); free text (an error, a note) may hold tabs, newlines and markup."""

    max_len: int = 300
    required: bool = False
    free: bool = False
    empty_ok: bool = False  # required, but '' will do (a figure's unit)

    def problem(self, value, row=None) -> str | None:
        if value is None or (value == "" and not self.empty_ok):
            return "is missing" if self.required else None
        if not isinstance(value, str):
            return "must be text"
        if len(value) > self.max_len:
            return f"is longer than {self.max_len} characters"
        if (_CONTROL if self.free else _CONTROL_OR_MARKUP).search(value):
            return "holds control characters" + ("" if self.free else " or markup (<, >)")
        return None

    def broken(self, col: str) -> str:
        glob = _GLOB_CONTROL if self.free else _GLOB_CONTROL_OR_MARKUP
        bad = f"typeof({col}) != 'text' OR length({col}) > {self.max_len} OR {col} GLOB {_quoted(glob)}"
        if self.required:
            empty = "" if self.empty_ok else f" OR {col} = ''"
            return f"({col} IS NULL{empty} OR {bad})"
        return f"({col} IS NOT NULL AND {col} != '' AND ({bad}))"


@dataclass(frozen=True)
class Pattern:
    """A short identifier: its first character of `first`, the others of `rest` (character classes written
    alike for Python's re and SQLite's GLOB), at most max_len characters."""

    first: str
    rest: str
    max_len: int
    required: bool = True

    def matches(self, value) -> bool:
        return isinstance(value, str) and bool(
            re.fullmatch(f"[{self.first}][{self.rest}]{{0,{self.max_len - 1}}}", value)
        )

    def problem(self, value, row=None) -> str | None:
        if value is None or value == "":
            return "is missing" if self.required else None
        return None if self.matches(value) else f"is not a well-formed name ({_shown(value)})"

    def well_formed(self, col: str) -> str:
        return (
            f"(typeof({col}) = 'text' AND length({col}) BETWEEN 1 AND {self.max_len} AND "
            f"{col} GLOB '[{self.first}]*' AND {col} NOT GLOB '?*[^{self.rest}]*')"
        )

    def broken(self, col: str) -> str:
        missing = f"{col} IS NULL OR {col} = ''"
        if self.required:
            return f"({missing} OR NOT {self.well_formed(col)})"
        return f"(NOT ({missing}) AND NOT {self.well_formed(col)})"


IDENTIFIER = Pattern("a-z0-9", "a-z0-9_+.-", 48)  # an optimizer, a strategy, a preset as people type them
SOURCE_NAME = Pattern("a-z0-9", "a-z0-9_+.:/@-", 100)  # 'paper:2608.08961', 'measured:tuning', 'trainer'
KEY = Pattern("A-Za-z0-9", "A-Za-z0-9_.:-", 100, required=False)  # a uid or cell key (hashes)
CONFIG_HASH = Pattern("0-9a-f", "0-9a-f", 64, required=False)  # a sha256 in hex: a group's model config


@dataclass(frozen=True)
class Name:
    """One of the rules' names; or a well-formed one (IDENTIFIER) in a run of a free protocol (the user's
    Trainer) or where `lenient`: written by advisor's own writers, whose rules (a rules directory of their
    own, the user's rules since edited) may know names these rules do not, and read back (an unknown
    name cannot stand for a known one, so it forges no answer)."""

    what: str
    known: tuple[str, ...]
    free: bool = False

    def problem(self, value, row=None, lenient: bool = False) -> str | None:
        if value is None or value == "":
            return "is missing"
        if value in self.known:
            return None
        free = lenient or (self.free and (row or {}).get("protocol") in FREE_PROTOCOLS)
        if free and IDENTIFIER.matches(value):
            return None
        return f"unknown {self.what} {_shown(value)} (known: {', '.join(self.known)})"

    def broken(self, col: str) -> str:
        """As read back: lenient (a known name, or a well-formed one)."""
        unknown = f"({col} IS NULL OR typeof({col}) != 'text' OR {col} NOT IN ({_listed(self.known)}))"
        return f"({unknown} AND NOT {IDENTIFIER.well_formed(col)})"


@dataclass(frozen=True)
class Choice:
    """One of a fixed list (a status, a protocol, a certainty)."""

    values: tuple[str, ...]
    required: bool = True

    def problem(self, value, row=None) -> str | None:
        if value is None:
            return "is missing" if self.required else None
        return None if value in self.values else f"is {_shown(value)}, not one of {', '.join(self.values)}"

    def broken(self, col: str) -> str:
        out = f"{col} NOT IN ({_listed(self.values)})"
        return f"({col} IS NULL OR {out})" if self.required else f"({col} IS NOT NULL AND {out})"


@dataclass(frozen=True)
class Stamp:
    """A date or time as ISO 8601 text ('2026-11-30', '2026-11-30T12:00:00+00:00')."""

    def problem(self, value, row=None) -> str | None:
        if value is None:
            return None
        if isinstance(value, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[0-9T:+.Z -]{0,29}", value):
            return None
        return f"is not an ISO date or time ({_shown(value)})"

    def broken(self, col: str) -> str:
        return (
            f"({col} IS NOT NULL AND (typeof({col}) != 'text' OR length({col}) > 39 OR "
            f"{col} NOT GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' OR "
            f"substr({col}, 11) GLOB '*[^0-9T:+.Z -]*'))"
        )


MAX_JSON = 1_000_000  # characters of a config or software column


def _not_finite(token: str):
    raise ValueError(f"{token} is not a JSON number")


@dataclass(frozen=True)
class Json:
    """A JSON object (strict JSON: no NaN or Infinity), as a dict or as its text."""

    def problem(self, value, row=None) -> str | None:
        if value is None:
            return None
        try:
            if isinstance(value, dict):
                value = json.dumps(value, sort_keys=True, allow_nan=False)
            if not isinstance(value, str):
                return "must be a JSON object"
            if len(value) > MAX_JSON:
                return f"is longer than {MAX_JSON} characters"
            parsed = json.loads(value, parse_constant=_not_finite)
        except (ValueError, TypeError):
            return "is not JSON (or holds a number that is not finite)"
        except RecursionError:
            return "is JSON nested too deeply"
        return None if isinstance(parsed, dict) else "must be a JSON object"

    def broken(self, col: str) -> str:
        return (
            f"(CASE WHEN {col} IS NULL THEN 0 WHEN typeof({col}) != 'text' OR length({col}) > {MAX_JSON} "
            f"THEN 1 WHEN NOT json_valid({col}) THEN 1 WHEN json_type({col}) != 'object' THEN 1 ELSE 0 END)"
        )


# --- figures: each measure's physical bounds ----------------------------------------------------------

TIME = Number(0, 1e9, required=True)  # seconds (or minutes): a run of 30 years is not one
MEMORY = Number(0, 1e6, required=True)  # GB
PERCENT = Number(0, 100.5, required=True)  # a utilization or share, rounding allowed
LOSS = Number(-1e15, 1e15, required=True)  # a Trainer's own loss may be negative; never infinite
FLAG = Number(0, 1, required=True)
# counts, rates, FLOPs, joules: any other figure (an epoch's FLOPs pass 1e19)
AMOUNT = Number(0, 1e30, required=True)

_PERCENTS = ("gpu_util", "host_ram", "mfu", "eval_accuracy")
_LOSSES = ("loss", "loss_final", "eval_loss", "eval_loss_initial", "target_loss")
_FLAGS = ("contended", "target_reached")
_TIMES = ("epoch_time", "total_time", "time_to_target", "predicted_time_per_ksample", "step_time")


def bounds(name: str) -> Number:
    """The physical bounds of a figure (a metric, or an epoch column) by its name."""
    if name in _PERCENTS:
        return PERCENT
    if name in _LOSSES:
        return LOSS
    if name in _FLAGS:
        return FLAG
    if name in _TIMES or (name.endswith("_s") and not name.endswith("_per_s")):
        return TIME
    if name.endswith("_gb"):
        return MEMORY
    return AMOUNT  # cpu_util before 0008 was % of one core: up to 100 x the cores, so no percent bound


# --- the rules of each table ------------------------------------------------------------------------------


_TABLES: dict[int, tuple[Rules, dict, dict]] = {}  # id(rules) -> (rules, run rules, metric rules)


def _tables(rules: Rules | None) -> tuple[dict, dict]:
    """The run and metric rules for a set of rules (the rules are loaded once per process, and so are
    these: a merge checks thousands of runs)."""
    rules = rules or load_rules()
    if id(rules) not in _TABLES:
        _TABLES[id(rules)] = (rules, _run_rules(rules), _metric_rules(rules))
    return _TABLES[id(rules)][1:]


def _run_rules(rules: Rules) -> dict:
    families, optimizers, strategies = tuple(rules.families), tuple(rules.optimizers), tuple(rules.strategies)
    return {
        "id": Number(1, 2**40, integer=True),  # a user KB's ids are shifted by 2**40 when read beside ours
        "cell_key": KEY,
        "source": SOURCE_NAME,
        "model": Text(1000, required=True),
        "family": Name("family", (*families, "unknown")),  # unknown: a Trainer model no family lists
        "optimizer": Name("optimizer", optimizers, free=True),
        "strategy": Name("strategy", strategies),
        "preset": IDENTIFIER,
        "seed": Number(0, 2**53, integer=True),
        "hardware": Text(300, required=True),
        "device": Text(100),
        "host_memory_gb": Number(0, 1e6),
        "accelerator_memory_gb": Number(0, 1e6),
        "software": Json(),
        "config": Json(),
        "pretrained": Number(0, 1, integer=True),
        "n_params": Number(0, 1e15, integer=True),
        "status": Choice(STATUSES),
        "error": Text(100_000, free=True),
        "started_at": Text(40),  # ISO times as advisor writes them; older files and tests name others
        "finished_at": Text(40),
        "owner": Text(300),
        "settings": Text(2000),
        "uid": KEY,
        "lease_until": Stamp(),
        "protocol": Choice(PROTOCOLS),
        "grp": Number(1, 2**40, integer=True),
        "data": Text(2000),
    }


def run_rules(rules: Rules | None = None) -> dict:
    """Each runs column's rule, the names known from the rules (the user's rules included)."""
    return _tables(rules)[0]


def metric_rules(rules: Rules | None = None) -> dict:
    """Each metrics column's rule (a figure's value: `bounds` of its name)."""
    return _tables(rules)[1]


def _metric_rules(rules: Rules) -> dict:
    return {
        "run_id": Number(1, 2**40, integer=True),
        "name": Name("metric", tuple(rules.measures), free=True),
        "unit": Text(300, required=True, empty_ok=True),
        "certainty": Choice(CERTAINTIES),
        "note": Text(2000, free=True),
    }  # value: bounds(name)


EPOCH_INTEGERS = ("epoch", "steps", "micro_batches", "samples", "tokens")


@cache
def epoch_rule(column: str) -> Number:
    """An epoch column's rule: its epoch and step counts are integers; the rest figures, NULL where the
    machine cannot measure them."""
    if column in EPOCH_INTEGERS:
        return Number(0, 1e15, integer=True, required=column in ("epoch", "steps"))
    return Number(bounds(column).lo, bounds(column).hi)


VALIDATION_RULES = {
    "id": Number(1, 2**62, integer=True),
    "hardware": Text(300, required=True),
    "device": Text(100),
    "model": Text(1000),
    "preset": Pattern(IDENTIFIER.first, IDENTIFIER.rest, 48, required=False),
    "name": Pattern("a-z0-9", "a-z0-9_+.:-", 100),
    "passed": Number(0, 1, integer=True, required=True),
    "value": Number(-1e18, 1e18),  # a relative error may be negative; a calibrated GPU's FLOP/s exceed 1e15
    "tolerance": Number(0, 1e15),
    "detail": Text(100_000, required=True, free=True),
    "software": Json(),
    "created_at": Text(40, required=True),
}


# --- checking a run in Python (the store's write path) ----------------------------------------------------


def run_problem(run: dict, rules: Rules | None = None, lenient: bool = False) -> str | None:
    """What is wrong with a run (its row, metrics and epochs), in a phrase, or None: the first problem.
    `lenient`: names may be well-formed ones the rules do not know (advisor's own writers: see Name)."""
    rules = rules or load_rules()
    # the store numbers runs and gives them their group
    problem = _columns_problem(run_rules(rules), run, run, lenient, skip=("id", "grp"))
    if problem:
        return problem
    for i, m in enumerate(run.get("metrics") or ()):
        problem = figure_problem(m, run, rules, lenient) if isinstance(m, dict) else "is not an object"
        if problem:
            return f"figure {m.get('name', i)!r:.40} {problem}"
    for i, e in enumerate(run.get("epochs") or ()):
        problem = epoch_problem(e) if isinstance(e, dict) else "is not an object"
        if problem:
            return f"epoch {i} {problem}"
    return None


def figure_problem(m: dict, run: dict, rules: Rules | None = None, lenient: bool = False) -> str | None:
    """What is wrong with one run-level figure ({name, value, unit, certainty, note})."""
    figure = {**m, "certainty": m.get("certainty") or "measured"}
    problem = _columns_problem(metric_rules(rules), figure, run, lenient, skip=("run_id",))
    if problem:
        return problem
    problem = bounds(m["name"]).problem(m.get("value"))
    return f"value {problem}, not {_shown(m.get('value'))}" if problem else None


def _columns_problem(rules: dict, row: dict, run: dict, lenient: bool, skip: tuple[str, ...]) -> str | None:
    """The first column of `row` that breaks its rule, in a phrase (a name's own phrase; else the column,
    what is wrong and the value), or None."""
    for col, rule in rules.items():
        if col in skip:
            continue
        value = row.get(col)
        if isinstance(rule, Name):
            problem = rule.problem(value, run, lenient)
            if problem:
                return problem
        elif problem := rule.problem(value, run):
            return _said(col, problem, value)
    return None


def epoch_problem(e: dict) -> str | None:
    """What is wrong with one epoch's row."""
    for col, value in e.items():
        if col == "run_id":
            continue
        problem = epoch_rule(col).problem(value)
        if problem:
            return _said(col, problem, value)
    return None


def validation_problem(v: dict) -> str | None:
    """What is wrong with one validation row."""
    for col, rule in VALIDATION_RULES.items():
        if col == "id":
            continue
        problem = rule.problem(v.get(col), v)
        if problem:
            return _said(col, problem, v.get(col))
    rate = speed_rate_problem(v.get("name"), v.get("value"))
    return _said("value", rate, v.get("value")) if rate else None


def _said(col: str, problem: str, value) -> str:
    """'seed must not be negative, not -5': the column, what is wrong, and the value (unless missing)."""
    shown = "" if value is None or value == "" or _shown(value) in problem else f", not {_shown(value)}"
    return f"{col} {problem}{shown}"


def identity(run: dict) -> str:
    """A run as a refusal names it: its uid (or position) and what it ran."""
    uid = run.get("uid")
    what = " · ".join(_shown(run.get(k)) for k in ("model", "optimizer", "strategy"))
    return f"run {uid or '(no uid)'} ({what})"


def clean(text: str | None, free: bool = True) -> str | None:
    """Text with its control characters (and, for a name, markup) replaced: what a live run's error
    becomes rather than being refused mid-run."""
    if text is None:
        return None
    return (_CONTROL if free else _CONTROL_OR_MARKUP).sub("\ufffd", str(text))


# --- `advisor calibrate`'s rates ------------------------------------------------------------------------


SPEED_BOUNDS = {  # what `advisor calibrate` can plausibly record on any device: (lowest, highest, unit)
    "speed_matmul_flops": (1e6, 1e18, "FLOP/s"),
    "speed_stream_bytes": (1e6, 1e16, "bytes/s"),
    "speed_micro_batch_s": (1e-6, 1e4, "s"),
    "speed_spread": (0.0, 1e6, ""),  # the slowest of the fastest rounds over the fastest, less one
    "speed_rounds": (1.0, 1e4, ""),
}


def speed_rate_problem(name: str, value) -> str | None:
    """What is wrong with a figure `advisor calibrate` records ('must be finite', 'must lie between ...'),
    or None: non-finite, non-positive and absurd rates (-1, 0, 1e-300 FLOP/s, Inf, NaN, which SQLite keeps
    as NULL) price no step. A name not of SPEED_BOUNDS is not judged."""
    if name not in SPEED_BOUNDS:
        return None
    lo, hi, unit = SPEED_BOUNDS[name]
    if value is None:
        return "is missing"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number"
    if not math.isfinite(value):
        return "must be finite"
    if not lo <= value <= hi:
        return f"must lie between {lo:g} and {hi:g}{' ' + unit if unit else ''}"
    return None
