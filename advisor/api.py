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

import os
import sqlite3
from dataclasses import fields
from functools import partial
from importlib.util import find_spec
from typing import TYPE_CHECKING

from advisor.errors import Error, InputError
from advisor.kb.reader import group_id_of, open_for_reading
from advisor.model_ref import ResolvedModel, reference_models, resolve_model
from advisor.prediction.accelerators import GB_PER_GIB
from advisor.prediction.accelerators import resolve as resolve_accelerator
from advisor.prediction.question import FitOptions, installed, mixed_dtype, question
from advisor.rules import Rules, load_rules

if TYPE_CHECKING:
    from advisor.answers.recommendation import Answer
    from advisor.prediction.answer import FitAnswer

PathLike = str | os.PathLike
MEASURE_SIDE = ("torch", "transformers", "datasets", "psutil")


def open_kb(db: PathLike | None = None) -> sqlite3.Connection:
    """A read-only connection to the KB answers come from: `db` alone, else $ADVISOR_DB, else the shipped KB
    read together with the user's (`advisor kb path`)."""
    return open_for_reading(db)


def recommend(
    arch: str | None = None,
    optimize: str = "loss",
    *,
    model: str | ResolvedModel | None = None,
    gpu: str | None = None,
    memory: float | None = None,
    max_time: float | None = None,
    optimizers: tuple[str, ...] = (),
    exclude_optimizers: tuple[str, ...] = (),
    strategies: tuple[str, ...] = (),
    source: str | None = None,
    preset: str | None = None,
    hardware: str | None = None,
    group: str | None = None,
    evidence: str = "matching",
    db: PathLike | None = None,
    conn: sqlite3.Connection | None = None,
    menu: dict | None = None,
    compare_groups: bool = True,
    **menu_options,
) -> Answer:
    """`advisor recommend` as an `Answer` (`.recommendation`, `.alternatives`, `.excluded`, `.caveats`,
    `.frontier`, `.as_dict(rules)` for what --json prints). One of `arch` (a family or alias) and `model` (a
    reference name, a folder with config.json, or a cached Hugging Face id). With `model` and `gpu` (or
    `memory`), configurations predicted not to fit are excluded; `memory` (GB of accelerator memory)
    excludes measured configurations above it too. `menu`: advisor fit's menu options for that prediction
    (`adapters`, `lora_r`, `offload`, `attention`, `gpus`, `nodes`, `shardings`, ...), as a dict or as
    keywords (`gpus=8`), as `advisor recommend` takes them. `group`: one evidence group's id ('11', 'u3');
    `evidence`: 'matching' (your own runs only where they match the question) or 'mine' (your runs alone).
    `compare_groups`: rank the other evidence groups too, naming those whose pick differs (`.disagreements`;
    off for the short answer, which shows none)."""
    from advisor.answers.evidence import Selector  # the evidence side: not on fit's path
    from advisor.answers.recommendation import Constraints
    from advisor.answers.recommendation import recommend as rank

    rules = load_rules()
    unknown = sorted(set(menu_options) - {f.name for f in fields(FitOptions)})
    if unknown:
        raise InputError(f"advisor.recommend takes no {', '.join(unknown)}.")
    menu = {**(menu or {}), **menu_options}
    if (arch is None) == (model is None):
        raise InputError("pass exactly one of arch (--arch FAMILY) and model (--model NAME).")
    if gpu and model is None:
        raise InputError("--gpu predicts what fits your model: pass --model too.", "--gpu")
    _check_names(rules, optimize, (*optimizers, *exclude_optimizers), strategies)
    selector = Selector(preset, hardware, _group_row(group), mine=_mine(evidence))
    resolved = _model(model, rules) if model is not None else None
    family = resolved.family.name if resolved else _family(arch, rules)
    fitted = menu_answer = None
    given = [k for k, v in (menu or {}).items() if v != getattr(FitOptions(), k)]
    if given and (resolved is None or not (gpu or memory is not None)):
        flag = {"adapters": "--adapter"}.get(given[0], "--" + given[0].replace("_", "-"))
        raise InputError(
            f"{flag} narrows the prediction for your model: pass --model with --gpu (or --memory).", flag
        )
    if resolved is not None and (gpu or memory is not None):
        # the measured cells (full fine-tuning of the family's grid, at the accelerator's mixed precision)
        # checked against a prediction of each; the answer's menu, predicted as advisor fit predicts it, under
        # the same --optimizer, --exclude-optimizer and --strategy (one cache serves both)
        acc = resolve_accelerator(gpu, rules) if gpu else None
        # every optimizer the evidence may hold (the family's grid and the menu's, measured beside it)
        grid = tuple(
            o
            for o in dict.fromkeys((*resolved.family.grid_optimizers, *rules.optimizers))
            if installed(rules, o)
        )
        # at one micro-batch for every configuration (the user's, else 1): a ranking by predicted memory or speed
        # compares like with like, not each row at the largest batch it fits
        shape = dict(gpu=gpu, memory=memory, adapters=("full",), offload=("none",), dtype=mixed_dtype(acc))
        shape["batch_size"] = menu.get("batch_size") or 1
        fitted = fit(resolved, optimizers=grid, **shape)
        menu_answer = fit(
            resolved,
            gpu=gpu,
            memory=memory,
            **_narrowed(menu, rules, optimizers, exclude_optimizers, strategies),
        )
    constraints = Constraints(
        max_memory=None if memory is None else memory * GB_PER_GIB,  # given in GiB, compared in GB
        max_time=max_time,
        optimizers=tuple(optimizers),
        exclude_optimizers=tuple(exclude_optimizers),
        strategies=tuple(strategies),
        fit=fitted,
        menu=menu_answer,
    )
    reading = conn or open_kb(db)
    try:
        return rank(
            reading,
            family,
            optimize,
            rules,
            constraints,
            source=source,
            asked=_asked(resolved, fitted),
            selector=selector,
            compare_groups=compare_groups,
            explain=True,
        )
    finally:
        if conn is None:
            reading.close()


def fit(model: str | ResolvedModel, *, db: PathLike | None = None, say=None, **options) -> FitAnswer:
    """`advisor fit` as a `FitAnswer` (`.pick`, also `.best`: `TrainingArguments(**answer.best.training_arguments)`
    takes it into a Trainer; `.rows` ranked, `.ladder`, `.as_dict()`): the fine-tuning menu
    on the model and accelerator, with the options of `advisor fit` by their names (`gpu`, `memory`,
    `batch_size`, `seq_len`, `image_size`, `dtype` (a name or a tuple), `accumulation_steps`, `optimizers`,
    `strategies`, `adapters`, `lora_r`, `lora_alpha`, `lora_targets`, `base_bits`, `offload`, `attention`,
    `mfu`, `effective_batch`, and across accelerators `gpus` (per node), `nodes`, `shardings`:
    advisor.prediction.question.FitOptions). Tracing a question not yet in the cache needs the
    measurement side (torch); a repeated question reads the cache. `say(line)` hears a cold trace's stages."""
    unknown = sorted(set(options) - {f.name for f in fields(FitOptions)})
    if unknown:
        raise InputError(f"advisor.fit takes no {', '.join(unknown)}.")
    rules = load_rules()
    from advisor.prediction.answer import fit as fit_answer  # not on the path of answers from evidence alone
    from advisor.prediction.cache import open_cache

    q = question(_model(model, rules), FitOptions(**options), rules)
    cache = open_cache(db)
    try:
        tracer = None
        if cache.missing(q, rules):
            require_measure_side()
            from advisor.measuring.tracer.engine import trace  # torch: only when the cache lacks a prediction

            tracer = partial(trace, say=say or (lambda line: None))
        return fit_answer(q, rules, cache, tracer)
    finally:
        cache.close()


def measure(*models: str | ResolvedModel, say=lambda line: None, reporter=None, **options):
    """`advisor measure` in Python: the grid of `models` ('all' for the paper's four) trained on this machine
    into a KB, with the options of `advisor measure` by their names (the run configuration's: `preset`,
    `epochs`, `lr`, `dtype`, `protocol`, ...; and `optimizers`, `strategies`, `seeds`, `data`, `tune_lr`,
    `executor`, `shard`, `db`, ...). Returns what was measured (`.results`, `.as_dict()`). Needs torch."""
    require_measure_side()
    from advisor.measuring.request import request  # torch: the measurement side

    rules = load_rules()
    resolved = tuple(m for name in models for m in _models(name, rules))
    return request(resolved, **options).run(rules, reporter, say)


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
    from pathlib import Path

    rules = load_rules()
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
    from advisor.measuring.pretraining import Recipe, check_out, default_out
    from advisor.measuring.pretraining import pretrain as train_base  # torch: the measurement side

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


def _narrowed(menu: dict | None, rules: Rules, optimizers: tuple, excluded: tuple, strategies: tuple) -> dict:
    """advisor fit's menu options for recommend's prediction, with its --optimizer, --exclude-optimizer and
    --strategy applied (the measured strategies as the configurations of advisor fit they are)."""
    options = dict(menu or {})
    if excluded and not optimizers:
        menu_names = [n for n, o in rules.optimizer_info.items() if o.menu and installed(rules, n)]
        optimizers = tuple(n for n in menu_names if n not in excluded)
    if optimizers:
        options["optimizers"] = tuple(o for o in optimizers if o not in excluded)
    if (
        strategies
    ):  # as advisor fit asks for them: a measured arm as its step, an adapter strategy as its adapter
        fitted = [rules.as_fit(s) for s in strategies]
        options["strategies"] = tuple(dict.fromkeys(step for _, step in fitted))
        adapters = tuple(dict.fromkeys(adapter for adapter, _ in fitted))
        if adapters != ("full",) and not options.get("adapters"):
            options["adapters"] = adapters
    return options


def _asked(resolved: ResolvedModel | None, fitted: FitAnswer | None):
    """What the answer is about, for choosing its evidence: the user's model by its name and size; a reference
    model ('llama') by its size alone (its family's groups at every preset carry its name)."""
    from advisor.answers.evidence import Asked

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


def _model(name: str | ResolvedModel, rules: Rules) -> ResolvedModel:
    return name if isinstance(name, ResolvedModel) else resolve_model(name, rules)


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


__all__ = ["fit", "measure", "open_kb", "recommend"]
