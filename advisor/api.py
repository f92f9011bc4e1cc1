"""The Python API: what the command line answers, as the objects it renders. Each command parses its options,
calls one of these, and renders what comes back.

    import advisor
    answer = advisor.recommend(arch="encoder", optimize="memory")
    answer.recommendation.optimizer, answer.recommendation.value, answer.caveats
    fitted = advisor.fit("llama", gpu="A100-80GB")          # advisor fit (torch for a model not yet traced)
    measured = advisor.measure("vit", preset="tiny")         # advisor measure (torch)
    conn = advisor.open_kb()                                  # read-only: the shipped KB and yours

Errors derive from advisor.Error, with the sentence the command line prints: a bad argument is an
advisor.InputError (a ValueError too), an unusable knowledge base advisor.KBError, a question nothing
answers advisor.NoEvidence.
"""

from __future__ import annotations

import math
import os
import sqlite3
import types
import typing
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import Error, InputError
from advisor.fields import default_of, option
from advisor.kb.reader import group_id_of, open_for_reading
from advisor.model_ref import ResolvedModel, reference_models, resolve_model
from advisor.prediction.accelerators import GB_PER_GIB
from advisor.prediction.accelerators import resolve as resolve_accelerator
from advisor.prediction.question import (
    FitRequest,
    check_number,
    check_numbers,
    installed,
    mixed_dtype,
    question,
)
from advisor.rules import Accelerator, FamilyRecord, Rules, load_rules

if TYPE_CHECKING:
    from advisor.answers.recommendation import Answer
    from advisor.prediction.answer import FitAnswer, TracedFits
    from advisor.prediction.cache import Traced

PathLike = str | os.PathLike
MEASURE_SIDE = ("torch", "transformers", "datasets", "psutil")


def open_kb(db: PathLike | None = None) -> sqlite3.Connection:
    """A read-only connection to the KB answers come from: `db` alone, else $ADVISOR_DB, else the shipped KB
    read together with the user's (`advisor kb path`)."""
    return open_for_reading(_path(db, "--db"))


@dataclass(frozen=True, kw_only=True)
class RecommendRequest:
    """What `advisor recommend` is asked, as one object: the question (arch or model, the metric), its
    constraints, which evidence may answer, and `fit`, the accelerator and advisor fit's menu for the prediction
    on the user's model. Each field's default and help are declared here once; the command line reads them."""

    arch: str | None = option(
        None, "Architecture family or alias: vision/vit, encoder/modernbert, decoder/llama, vlm/nanovlm."
    )
    model: str | ResolvedModel | None = option(
        None,
        "A model instead of --arch: vit, modernbert, llama, nanovlm, a local folder with config.json or a cached "
        "Hugging Face id; its family comes from model_type.",
    )
    optimize: str = option(
        "loss",
        "Metric to optimize (rules/metrics.toml): loss, time, memory, utilization, throughput, time_to_target, "
        "accuracy.",
    )
    max_time: float | None = option(None, "Exclude configurations slower than this (s/epoch).")
    optimizers: tuple[str, ...] = option((), "Only these optimizers (repeatable).")
    exclude_optimizers: tuple[str, ...] = option((), "Never these optimizers (repeatable).")
    strategies: tuple[str, ...] = option(
        (),
        "Only these strategies (repeatable): standard, checkpointing, selective-checkpointing, accumulation, "
        "checkpointing+accumulation.",
    )
    source: str | None = option(
        None,
        "Evidence to rank: 'paper', 'measured', or an exact source name from `advisor kb stats`. Default: the "
        "best evidence group available.",
    )
    preset: str | None = option(None, "Only evidence at this scale (tiny, small, paper, custom).")
    hardware: str | None = option(
        None, "Only evidence measured on this hardware (as `advisor kb stats` names it)."
    )
    group: str | int | None = option(
        None,
        "Answer from this evidence group: its id as `advisor kb stats` or 'Other evidence' lists it ('11'; 'u3' "
        "for a group of your own KB).",
    )
    evidence: str = option(
        "matching",
        "Which of your own runs may answer: 'matching' only where they match the question (the same model, or "
        "the family at its scale: rules/flowchart.toml match_scale_ratio), 'mine' your runs alone, whatever "
        "their scale.",
    )
    fit: FitRequest = option(
        help="The accelerator (gpu, memory) and advisor fit's menu (adapters, lora_r, offload, gpus, ...) for the "
        "prediction on `model`; memory also excludes measured configurations above it.",
        factory=FitRequest,
    )
    compare_groups: bool = option(
        True,
        "Rank the other evidence groups too, naming those whose pick differs (off for the short answer).",
    )


def recommend(
    arch: str | None = None,
    optimize: str | None = None,
    *,
    request: RecommendRequest | None = None,
    db: PathLike | None = None,
    conn: sqlite3.Connection | None = None,
    **keywords,
) -> Answer:
    """`advisor recommend` as an `Answer` (`.recommendation`, `.alternatives`, `.excluded`, `.caveats`,
    `.frontier`, `.as_dict(rules)` for what --json prints): a `RecommendRequest`, or its fields as keywords
    (`arch="encoder"`, `model="llama"`, `optimize="time"`, `exclude_optimizers=("adam",)`, `group="11"`), with
    advisor fit's options as keywords too (`gpu="H100"`, `memory=24`, `gpus=8`, `adapters=("lora",)`): they go
    to its `fit`. With `model` and `gpu` (or `memory`), configurations predicted not to fit are excluded;
    `memory` (GiB of accelerator memory) excludes measured configurations above it too."""
    from advisor.answers.recommendation import recommend as rank  # the evidence side: not on fit's path

    given = {"arch": arch, "optimize": optimize}  # positionally, as advisor.recommend("encoder", "loss")
    request = recommend_request(request, {**keywords, **{k: v for k, v in given.items() if v is not None}})
    db = _path(db, "--db")
    if conn is not None and not isinstance(conn, sqlite3.Connection):
        raise InputError(f"conn must be a connection of advisor.open_kb(), not {_shown(conn)}.")
    rules = load_rules()
    resolved, family = _checked(request, rules)
    fitted, menu_answer = _predicted(request, resolved, rules)
    reading = conn or open_kb(db)
    try:
        return rank(
            reading,
            family,
            request.optimize,
            rules,
            _constraints(request, fitted, menu_answer),
            source=request.source,
            asked=_asked(resolved, fitted),
            selector=_selector(request),
            compare_groups=request.compare_groups,
            explain=True,
        )
    finally:
        if conn is None:
            reading.close()


def recommend_request(request: RecommendRequest | None, keywords: dict) -> RecommendRequest:
    """`request` with `keywords` over it: RecommendRequest's fields by name (`fit` a whole FitRequest), and
    FitRequest's into its `fit`."""
    request = _given(request, RecommendRequest, "advisor.recommend")
    mine = {f.name for f in fields(RecommendRequest)}
    menu = {f.name for f in fields(FitRequest)}
    unknown = sorted(set(keywords) - mine - menu)
    if unknown:
        raise InputError(f"advisor.recommend takes no {', '.join(unknown)}.")
    own = {k: v for k, v in keywords.items() if k in mine}
    base = _given(own.pop("fit", request.fit), FitRequest, "advisor.recommend's fit")
    fit_keywords = {k: v for k, v in keywords.items() if k in menu and k not in mine}
    if "dtype" in fit_keywords and fit_keywords["dtype"] is None:
        fit_keywords["dtype"] = ()  # the accelerator's menu, as advisor.fit reads None too
    return _typed(replace(request, fit=replace(base, **fit_keywords), **own))


def _given(request, kind: type, who: str):
    """`request` if it is a `kind` (None: the default one); else InputError naming what was passed."""
    if request is None:
        return kind()
    if not isinstance(request, kind):
        raise InputError(f"{who} takes a {kind.__name__} as its request, not {type(request).__name__}.")
    return request


# recommend's menu options in the order its --help lists them: the first one given is the one an error names
MENU_FLAGS = ("adapters", "lora_r", "lora_alpha", "lora_targets", "base_bits", "offload", "attention", "gpus")
MENU_FLAGS += ("nodes", "shardings")


def _checked(request: RecommendRequest, rules: Rules) -> tuple[ResolvedModel | None, str]:
    """(the request's model resolved once, its family's name), after every flag that cannot go with the others
    is refused, in the order the command line checks them."""
    if (request.arch is None) == (request.model is None):
        raise InputError("pass exactly one of arch (--arch FAMILY) and model (--model NAME).")
    menu = request.fit
    if menu.gpu and request.model is None:
        raise InputError("--gpu predicts what fits your model: pass --model too.", "--gpu")
    _check_names(
        rules, request.optimize, (*request.optimizers, *request.exclude_optimizers), request.strategies
    )
    check_numbers(request.fit)  # --memory excludes measured configurations with a model or without one
    if request.max_time is not None and request.max_time < 0:
        raise InputError(f"--max-time must be 0 seconds or more (got {request.max_time!r}).", "--max-time")
    _group_row(request.group)
    _mine(request.evidence)
    resolved = _model(request.model, rules) if request.model is not None else None
    family = resolved.family.name if resolved else _family(request.arch, rules)
    others = tuple(f.name for f in fields(FitRequest) if f.name not in (*MENU_FLAGS, "gpu", "memory"))
    narrowing = [
        name for name in (*MENU_FLAGS, *others) if getattr(menu, name) != default_of(FitRequest, name)
    ]
    if narrowing and (resolved is None or not (menu.gpu or menu.memory is not None)):
        flag = {"adapters": "--adapter", "shardings": "--sharding"}.get(narrowing[0])
        flag = flag or "--" + narrowing[0].replace("_", "-")
        raise InputError(
            f"{flag} narrows the prediction for your model: pass --model with --gpu (or --memory).", flag
        )
    return resolved, family


# FitRequest's fields that say which step is traced (Trainer's or TRL's, and its settings)
STEP_FIELDS = ("method", "reference", "completion_len", "generations", "beta", "generation", "loss")


def _predicted(request: RecommendRequest, resolved: ResolvedModel | None, rules: Rules):
    """(the measured cells predicted on the user's model, the menu's answer there), or (None, None) without a
    model and an accelerator. One cache serves both."""
    menu = request.fit
    if resolved is None or not (menu.gpu or menu.memory is not None):
        return None, None
    acc = resolve_accelerator(menu.gpu, rules) if menu.gpu else None
    # every optimizer the evidence may hold (the family's grid and the menu's, measured beside it)
    grid = tuple(
        o for o in dict.fromkeys((*resolved.family.grid_optimizers, *rules.optimizers)) if installed(rules, o)
    )
    # full fine-tuning at the accelerator's mixed precision, at one micro-batch for every configuration (the
    # user's, else 1): a ranking by predicted memory or speed compares like with like, not each row at the
    # largest batch it fits
    cells = FitRequest(
        gpu=menu.gpu,
        memory=menu.memory,
        adapters=("full",),
        offload=("none",),
        dtype=mixed_dtype(acc),
        batch_size=menu.batch_size or 1,
        optimizers=grid,
        seq_len=menu.seq_len,
        **{name: getattr(menu, name) for name in STEP_FIELDS},  # the step the user trains with
    )
    narrowed = _narrowed(menu, rules, request.optimizers, request.exclude_optimizers, request.strategies)
    return fit(resolved, cells), fit(resolved, narrowed)


def _constraints(request: RecommendRequest, fitted, menu_answer):
    from advisor.answers.recommendation import Constraints  # the evidence side: not on fit's path

    memory = request.fit.memory
    return Constraints(
        max_memory=None if memory is None else memory * GB_PER_GIB,  # given in GiB, compared in GB
        max_time=request.max_time,
        optimizers=tuple(request.optimizers),
        exclude_optimizers=tuple(request.exclude_optimizers),
        strategies=tuple(request.strategies),
        fit=fitted,
        menu=menu_answer,
    )


def _selector(request: RecommendRequest):
    from advisor.answers.evidence import Selector  # the evidence side: not on fit's path

    return Selector(request.preset, request.hardware, _group_row(request.group), mine=_mine(request.evidence))


def fit(
    model: str | ResolvedModel,
    request: FitRequest | None = None,
    *,
    db: PathLike | None = None,
    say=None,
    **options,
) -> FitAnswer:
    """`advisor fit` as a `FitAnswer` (`.pick`, also `.best`: `TrainingArguments(**answer.best.training_arguments)`
    takes it into a Trainer; `.rows` ranked, `.ladder`, `.as_dict()`): the fine-tuning menu on the model and
    accelerator, asked as a `FitRequest` or by its fields as keywords (`gpu`, `memory`, `batch_size`, `seq_len`,
    `dtype` (a name or a tuple), `adapters`, `lora_r`, `offload`, `gpus`, `nodes`, `shardings`, ...; keywords
    override the request's). Tracing a question not yet in the cache needs the measurement side (torch); a
    repeated question reads the cache. `say(line)` hears a cold trace's stages."""
    unknown = sorted(set(options) - {f.name for f in fields(FitRequest)})
    if unknown:
        raise InputError(f"advisor.fit takes no {', '.join(unknown)}.")
    rules = load_rules()
    # the prediction's cache and levers: not on the path of answers from evidence alone
    from advisor.prediction import ranking
    from advisor.prediction.answer import usable_gb
    from advisor.prediction.cache import open_cache

    request = _typed(replace(_given(request, FitRequest, "advisor.fit"), **options))
    db = _path(db, "--db")
    resolved = _model(model, rules)
    q = question(resolved, request, rules)
    cache = open_cache(db)
    try:
        answer = _answered(q, rules, cache, say)
        if ranking.needed(q, answer.rows, request, rules):

            def ask(lever: FitRequest, name: str):
                asked = question(resolved, lever, rules, accelerator=q.accelerator)
                heard = say and (lambda line: say(f"nothing as asked fits; the lever {name}: {line}"))
                return asked, _answered(asked, rules, cache, heard)

            answer.levers = ranking.pulled(q, answer.rows, request, rules, usable_gb(q, rules), ask)
        return answer
    finally:
        cache.close()


def _answered(q, rules: Rules, cache, say) -> FitAnswer:
    """advisor fit's answer to one question: from the cache, tracing what it lacks (torch only then)."""
    from advisor.prediction.answer import fit as fit_answer  # the prediction: not on the evidence's path

    tracer = None
    if cache.missing(q, rules):
        require_measure_side()
        from advisor.measuring.tracer.engine import trace  # torch: only when the cache lacks a prediction

        tracer = partial(trace, say=say or (lambda line: None))
    return fit_answer(q, rules, cache, tracer)


# The report's fit section, unless --gpu says: a 24 GB desk card and the two 80 GB datacentre ones
REPORT_GPUS = ("rtx4090", "a100-80gb", "h100-80gb")


def traced_fits(conn: sqlite3.Connection, gpus: tuple[Accelerator, ...] = ()) -> list[TracedFits]:
    """advisor fit's answer for every model and shape the KB at `conn` holds traces of, on each of `gpus`
    (default REPORT_GPUS'; a CPU trace on this machine's CPU alone), from the cached traces alone: what
    `advisor report`'s fit section shows."""
    from advisor.prediction.cache import traced_models  # not on the path of answers from evidence alone

    rules = load_rules()
    gpus = gpus or tuple(rules.accelerators[k] for k in REPORT_GPUS)
    out = []
    for traced in traced_models(conn):
        where = gpus if traced.device == "cuda" else (rules.accelerators["cpu"],)
        out.append((traced, [(acc, _fit_traced(traced, acc, rules, conn)) for acc in where]))
    return out


def _fit_traced(traced: Traced, acc: Accelerator, rules: Rules, conn: sqlite3.Connection) -> FitAnswer | str:
    """What `advisor fit --model NAME --gpu ACC` answers from the cached traces (its own answer and pick: the
    menu it asks, less what was not traced), or the sentence saying why there is none."""
    # the prediction's answer and cache: not on the path of answers from evidence alone
    from advisor.prediction.answer import fit as fit_answer
    from advisor.prediction.cache import StoredPredictions, keys_of, software
    from advisor.prediction.sharding import basis

    family = _traced_family(traced, rules)
    if family is None:
        return (
            f"its family is not known without its config.json: advisor fit --model {traced.name} answers it."
        )
    model = ResolvedModel(traced.name, family)  # what the traces need of it; its config is not read again
    request = FitRequest(seq_len=traced.seq_len, image_size=traced.image_size, **traced.options())
    try:
        q = question(model, request, rules, accelerator=acc)
    except Error as e:
        return str(e)
    payloads = traced.payloads(q)
    asked = tuple(c for c in q.configs if basis(c) in payloads)
    if not asked:
        dtypes = ", ".join(q.dtypes)
        return f"not traced in {acc.name}'s precision ({dtypes}): advisor fit --model {traced.name} --gpu {acc.key}."
    q = replace(q, configs=asked)
    keys = keys_of(q, rules, software())
    cache = StoredPredictions(conn, None, {key: payloads[c] for c, key in keys.items()})
    return fit_answer(q, rules, cache)


def _traced_family(traced: Traced, rules: Rules) -> FamilyRecord | None:
    """The family the traces were made as: as stored, or (a model no family lists) from its config, if at hand."""
    if traced.family in rules.families:
        return rules.families[traced.family]
    try:
        return resolve_model(traced.name, rules).family
    except Error:
        return None


def measure(*models: str | ResolvedModel, request=None, say=lambda line: None, reporter=None, **options):
    """`advisor measure` in Python: the grid of `models` ('all' for the paper's four) trained on this machine
    into a KB, asked as a `MeasureRequest` (`request`, advisor.measuring.request) or with the options of
    `advisor measure` by their names (the run configuration's: `preset`, `epochs`, `lr`, `dtype`, `protocol`,
    ...; and `optimizers`, `strategies`, `seeds`, `data`, `tune_lr`, `executor`, `shard`, `db`, ...). Returns
    what was measured (`.results`, `.as_dict()`). Needs torch."""
    require_measure_side()
    asked = _measure_request(models, request, options)
    return asked.run(load_rules(), reporter, say)


def plan(*models: str | ResolvedModel, request=None, gpu: str | None = None, workers=(1,), **options):
    """`advisor measure --plan` in Python: what the grid would cost, nothing trained (a `Plan`: each cell's
    predicted time and memory on `gpu`, None: this machine, and the makespan on each number of `workers`;
    `.as_dict()`), asked as `measure` is. Needs torch for a shape not timed before."""
    if gpu is not None and not isinstance(gpu, str):
        raise InputError(f"--gpu must be an accelerator's name (a str), not {_shown(gpu)}.", "--gpu")
    workers = _workers(workers)
    require_measure_side()
    asked = _measure_request(models, request, options)
    return asked.price(load_rules(), gpu, workers)


def _workers(workers) -> tuple[int, ...]:
    """plan's numbers of workers, as --workers takes them: whole numbers of at least 1 (one, or several)."""
    counts = (workers,) if isinstance(workers, int) else workers
    if not isinstance(counts, tuple | list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts
    ):
        raise InputError(
            f"--workers must be whole numbers of at least 1 (a tuple of them), not {_shown(workers)}.",
            "--workers",
        )
    return tuple(counts)


def _measure_request(models: tuple, request, options: dict):
    """The MeasureRequest of `measure` and `plan`: the one given, or one built from models and options."""
    from advisor.measuring.request import MeasureRequest  # numpy and psutil: not on the answers' path
    from advisor.measuring.request import request as build

    if request is not None:
        if models or options:
            raise InputError("pass a MeasureRequest or models and options, not both.")
        return _typed(_given(request, MeasureRequest, "advisor.measure"))
    for name in MEASURE_SHARED:  # the shape and memory options measure shares with fit, held to fit's ranges
        check_number(name, options.get(name))
    rules = load_rules()
    return _typed(build(tuple(m for name in models for m in _models(name, rules)), **options))


# the options of `advisor measure` whose ranges are FitRequest's (advisor/cli/params.py shape_options and
# accelerator_options declare both commands' at once)
MEASURE_SHARED = ("memory", "batch_size", "seq_len", "image_size", "accumulation_steps")


def pretrain(
    model: str | ResolvedModel,
    *,
    preset: str = "small",
    out: PathLike | None = None,
    steps: int | None = None,
    force: bool = False,
    say=lambda line: None,
) -> dict:
    """`advisor pretrain` in Python: a reference model trained here into a base for fine-tuning (LoRA against
    full), saved at `out` (default: the data folder's bases/<model>-<preset>); returns its advisor-base.json
    record, with `path`."""
    rules = load_rules()
    out = _path(out, "--out")
    resolved = _model(model, rules)
    if not resolved.reference:
        raise InputError(
            f"advisor pretrain trains a family's reference model ({', '.join(rules.reference_models())}); "
            f"{resolved.name} is your own: pass its folder to advisor measure --model.",
            "--model",
        )
    if preset not in rules.presets:
        raise InputError(f"unknown preset {preset!r}. Choose from: {', '.join(rules.presets)}.", "--preset")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise InputError(f"steps must be a whole number of at least 1, not {steps!r}.", "--steps")
    require_measure_side()
    # the measurement side (its trainer loads torch when a base is trained)
    from advisor.measuring.pretraining import Recipe, check_out, default_out
    from advisor.measuring.pretraining import pretrain as train_base

    where = Path(out) if out is not None else default_out(resolved, preset)
    check_out(where, force)
    record = train_base(resolved, preset, where, rules, Recipe.of(rules, steps), say)
    return {**record, "path": str(where)}


def require_measure_side() -> None:
    """The evidence side's libraries are an extra: say how to install them instead of a traceback."""
    missing = [m for m in MEASURE_SIDE if find_spec(m) is None]
    if missing:
        raise Error(
            f"the measurement side is not installed ({', '.join(missing)} missing): "
            "pip install 'advisor[measure]' (on a machine without a GPU, pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu first: an unpinned torch is a multi-GB CUDA build)."
        )


def _narrowed(
    menu: FitRequest, rules: Rules, optimizers: tuple, excluded: tuple, strategies: tuple
) -> FitRequest:
    """advisor fit's menu for recommend's prediction, with its --optimizer, --exclude-optimizer and --strategy
    applied (the measured strategies as the configurations of advisor fit they are)."""
    if excluded and not optimizers:
        menu_names = [n for n, o in rules.optimizer_info.items() if o.menu and installed(rules, n)]
        optimizers = tuple(n for n in menu_names if n not in excluded)
    if optimizers:
        menu = replace(menu, optimizers=tuple(o for o in optimizers if o not in excluded))
    if (
        strategies
    ):  # as advisor fit asks for them: a measured arm as its step, an adapter strategy as its adapter
        fitted = [rules.as_fit(s) for s in strategies]
        menu = replace(menu, strategies=tuple(dict.fromkeys(step for _, step in fitted)))
        adapters = tuple(dict.fromkeys(adapter for adapter, _ in fitted))
        if adapters != ("full",) and not menu.adapters:
            menu = replace(menu, adapters=adapters)
    return menu


def _asked(resolved: ResolvedModel | None, fitted: FitAnswer | None):
    """What the answer is about, for choosing its evidence: the user's model by its name and size; a reference
    model ('llama') by its size alone (its family's groups at every preset carry its name)."""
    from advisor.answers.evidence import Asked  # the evidence side: not on fit's path

    if resolved is None:
        return None
    size = fitted.n_params if fitted else resolved.approx_params
    if resolved.reference:
        return Asked(None, size)
    return Asked(resolved.name, size, resolved.config_hash)


EVIDENCE = ("matching", "mine")  # --evidence: which of the user's own runs an answer may rank


def _group_row(group: str | int | None) -> int | None:
    if group is None:
        return None
    row = group_id_of(str(group))
    if row is None:
        raise InputError(
            f"--group {group!r} is not a group id: pass one as `advisor kb stats` or 'Other evidence' lists it "
            "(a number, or u and a number for a group of your own KB).",
            "--group",
        )
    return row


def _mine(evidence: str) -> bool:
    if evidence not in EVIDENCE:
        raise InputError(f"--evidence {evidence!r}: choose {' or '.join(EVIDENCE)}.", "--evidence")
    return evidence == "mine"


def _model(name: str | os.PathLike | ResolvedModel, rules: Rules) -> ResolvedModel:
    """A model as the API takes it: resolved already, or a name, folder or Hugging Face id (a str or a path)."""
    if isinstance(name, ResolvedModel):
        return name
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(name, str):
        raise InputError(
            f"--model must be a model's name, folder or Hugging Face id (a str or a path), not {_shown(name)}.",
            "--model",
        )
    return resolve_model(name, rules)


def _models(name: str | ResolvedModel, rules: Rules) -> list[ResolvedModel]:
    return reference_models(rules) if name == "all" else [_model(name, rules)]


def _family(arch: str, rules: Rules) -> str:
    try:
        return rules.family(arch).name
    except KeyError:
        raise InputError(
            f"unknown architecture {arch!r}. Choose from: {', '.join(rules.family_choices())}.", "--arch"
        ) from None


def _check_names(rules: Rules, metric: str, optimizers: tuple, strategies: tuple) -> None:
    if metric not in rules.metrics:
        raise InputError(f"unknown metric {metric!r}. Choose from: {', '.join(rules.metrics)}.", "--optimize")
    for name in optimizers:
        if name not in rules.optimizers:
            raise InputError(
                f"unknown optimizer {name!r}. Choose from: {', '.join(rules.optimizers)}.", "--optimizer"
            )
    for name in strategies:
        if name not in rules.strategies:
            raise InputError(
                f"unknown strategy {name!r}. Choose from: {', '.join(rules.strategies)}.", "--strategy"
            )


# --- each field of a request as its annotation says, as the command line's types make it --------------------

FLAGS = {
    "adapters": "--adapter",
    "shardings": "--sharding",
    "optimizers": "--optimizer",
    "exclude_optimizers": "--exclude-optimizer",
    "strategies": "--strategy",
}  # the option of a field whose flag is not its name with dashes


def _typed(request):
    """`request` (a request dataclass: RecommendRequest, FitRequest, MeasureRequest, RunConfig) with every field
    holding what its annotation says, as the command line's types make them: a str where a name belongs (a
    path taken as its str), a whole number (not a bool) where a count does, a finite number where a number does,
    a tuple of names (one name, or a list, taken as one); a request inside it checked so too. InputError naming
    the option otherwise."""
    hints = typing.get_type_hints(type(request))
    fixed = {}
    for f in fields(request):
        value, hint = getattr(request, f.name), hints[f.name]
        if isinstance(value, os.PathLike) and not _fits(value, hint) and _fits(os.fspath(value), hint):
            value = fixed[f.name] = os.fspath(value)  # a folder (--model, --data) given as a Path
        if isinstance(value, str | list) and _is_tuple(hint) and not _fits(value, hint):
            value = fixed[f.name] = (value,) if isinstance(value, str) else tuple(value)
        if not _fits(value, hint):
            flag = FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
            raise InputError(f"{flag} must be {_described(hint)}, not {_shown(value)}.", flag)
        if is_dataclass(value) and not isinstance(value, type) and not isinstance(value, ResolvedModel):
            fixed[f.name] = _typed(value)
    return replace(request, **fixed) if fixed else request


def _fits(value, hint) -> bool:
    """Whether `value` is of the annotation `hint` (a bool is no number; a float finite; a str a path)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if _is_tuple(hint):
        return isinstance(value, tuple) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is Path:
        return isinstance(value, str | os.PathLike)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _is_tuple(hint) -> bool:
    """tuple[X, ...], or a union holding one."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_tuple(arm) for arm in typing.get_args(hint))
    return typing.get_origin(hint) is tuple


WORDS = {str: "a str", int: "a whole number", float: "a finite number", bool: "True or False", Path: "a path"}


def _described(hint) -> str:
    """An annotation in words: 'a finite number or None', 'a str or a tuple of str'."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_described(arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if _is_tuple(hint):
        return f"a tuple of {_described(typing.get_args(hint)[0]).removeprefix('a ')}"
    return WORDS.get(hint) or f"a {getattr(hint, '__name__', hint)}"


def _shown(value) -> str:
    """A wrong value as a sentence quotes it: short, its type named."""
    text, kind = repr(value), type(value).__name__
    return f"{text[:60]}{'…' if len(text) > 60 else ''} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"


def _path(value, flag: str):
    """A path the caller names (a str or an os.PathLike), or None; InputError naming the option otherwise."""
    if value is None or isinstance(value, str | os.PathLike):
        return value
    raise InputError(f"{flag} must be a path (a str or an os.PathLike), not {_shown(value)}.", flag)


__all__ = ["FitRequest", "RecommendRequest", "fit", "measure", "open_kb", "plan", "recommend", "traced_fits"]
