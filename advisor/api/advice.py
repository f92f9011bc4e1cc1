"""advisor recommend in Python: a RecommendRequest checked, then ranked from the KB that open_kb opens."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

from advisor.api.inputs import PathLike, _check_names, _family, _flag, _given, _model, _path, _shown, _typed
from advisor.errors import InputError
from advisor.fields import default_of, option
from advisor.kb.open import open_for_reading
from advisor.kb.queries.groups import group_id_of
from advisor.model_ref import ResolvedModel
from advisor.prediction.accelerators import GB_PER_GIB
from advisor.prediction.fit_request import FitRequest, check_numbers
from advisor.rules import Rules, load_rules

if TYPE_CHECKING:
    from advisor.answers.recommendation import Answer
    from advisor.prediction.answer import FitAnswer


def open_kb(db: PathLike | None = None) -> sqlite3.Connection:
    """A read-only connection to the KB answers come from: `db` alone, else $ADVISOR_DB, else the shipped KB
    read together with the user's (`advisor kb path`)."""
    return open_for_reading(_path(db, "db"))


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
    db = _path(db, "db")
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
        raise InputError("--gpu predicts what fits your model: pass --model too.", "gpu")
    _check_names(
        rules, request.optimize, (*request.optimizers, *request.exclude_optimizers), request.strategies
    )
    check_numbers(request.fit)  # --memory excludes measured configurations with a model or without one
    if request.max_time is not None and request.max_time < 0:
        raise InputError(f"--max-time must be 0 seconds or more (got {request.max_time!r}).", "max_time")
    _group_row(request.group)
    _mine(request.evidence)
    resolved = _model(request.model, rules) if request.model is not None else None
    family = resolved.family.name if resolved else _family(request.arch, rules)
    others = tuple(f.name for f in fields(FitRequest) if f.name not in (*MENU_FLAGS, "gpu", "memory"))
    narrowing = [
        name for name in (*MENU_FLAGS, *others) if getattr(menu, name) != default_of(FitRequest, name)
    ]
    if narrowing and (resolved is None or not (menu.gpu or menu.memory is not None)):
        flag = _flag(narrowing[0])
        raise InputError(
            f"{flag} narrows the prediction for your model: pass --model with --gpu (or --memory).",
            narrowing[0],
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
    # the prediction: only with a model and an accelerator, never on the path of an answer from evidence alone
    from advisor.api.fits import fits
    from advisor.prediction.accelerators import resolve as resolve_accelerator
    from advisor.prediction.menu import installed, mixed_dtype

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
    return tuple(fits(resolved, (cells, narrowed), rules))  # one fit: one cache, the model resolved once


def _constraints(request: RecommendRequest, fitted, menu_answer):
    from advisor.answers.constraints import Constraints  # the evidence side: not on fit's path

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


def _narrowed(
    menu: FitRequest, rules: Rules, optimizers: tuple, excluded: tuple, strategies: tuple
) -> FitRequest:
    """advisor fit's menu for recommend's prediction, with its --optimizer, --exclude-optimizer and --strategy
    applied (the measured strategies as the configurations of advisor fit they are)."""
    from advisor.prediction.menu import installed  # with _predicted, only where a model is predicted

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
            "group",
        )
    return row


def _mine(evidence: str) -> bool:
    if evidence not in EVIDENCE:
        raise InputError(f"--evidence {evidence!r}: choose {' or '.join(EVIDENCE)}.", "evidence")
    return evidence == "mine"
