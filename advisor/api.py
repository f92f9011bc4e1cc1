"""The Python API: what the CLI answers, as the objects it renders.

    import advisor
    answer = advisor.recommend(arch="encoder", optimize="memory")
    answer.recommendation.optimizer, answer.recommendation.value, answer.caveats
    fitted = advisor.fit("llama", gpu="A100-80GB")          # advisor fit (torch for a model not yet traced)
    conn = advisor.open_kb()                                  # read-only: the shipped KB and yours

Errors are exceptions with the sentence the CLI prints: ValueError for a bad argument, advisor.KBError for
an unusable knowledge base, advisor.NoEvidence when nothing answers the question.
"""

from __future__ import annotations

import os
import sqlite3

from advisor.evidence import NoEvidence
from advisor.schema import KBError

PathLike = str | os.PathLike


def open_kb(db: PathLike | None = None) -> sqlite3.Connection:
    """A read-only connection to the KB answers come from: `db` alone, else $ADVISOR_DB, else the shipped KB
    read together with the user's (`advisor kb path`)."""
    from advisor.kb import open_for_reading

    return open_for_reading(db)


def recommend(
    arch: str | None = None,
    optimize: str = "loss",
    *,
    model: str | None = None,
    max_memory: float | None = None,
    max_time: float | None = None,
    optimizers: tuple[str, ...] = (),
    exclude_optimizers: tuple[str, ...] = (),
    strategies: tuple[str, ...] = (),
    source: str | None = None,
    db: PathLike | None = None,
):
    """`advisor recommend` as an `advisor.recommend.Answer` (`.recommendation`, `.alternatives`,
    `.excluded`, `.caveats`, `.frontier`, `.as_dict()` for what --json prints). One of `arch` (a family or
    alias) and `model` (a reference name, a folder with config.json, or a cached Hugging Face id)."""
    from advisor.model_ref import resolve_model
    from advisor.recommend import Constraints
    from advisor.recommend import recommend as answer
    from advisor.rules import load_rules

    rules = load_rules()
    if (arch is None) == (model is None):
        raise ValueError("pass exactly one of arch= or model=")
    if optimize not in rules.metrics:
        raise ValueError(f"unknown metric {optimize!r}. Choose from: {', '.join(rules.metrics)}.")
    for name in (*optimizers, *exclude_optimizers):
        if name not in rules.optimizers:
            raise ValueError(f"unknown optimizer {name!r}. Choose from: {', '.join(rules.optimizers)}.")
    for name in strategies:
        if name not in rules.strategies:
            raise ValueError(f"unknown strategy {name!r}. Choose from: {', '.join(rules.strategies)}.")
    model_name = None
    if model is not None:
        resolved = resolve_model(model, rules)
        family, model_name = resolved.family.name, resolved.name
    else:
        try:
            family = rules.family(arch).name
        except KeyError:
            choices = ", ".join(rules.family_choices())
            raise ValueError(f"unknown architecture {arch!r}. Choose from: {choices}.") from None
    constraints = Constraints(
        max_memory=max_memory,
        max_time=max_time,
        optimizers=tuple(optimizers),
        exclude_optimizers=tuple(exclude_optimizers),
        strategies=tuple(strategies),
    )
    conn = open_kb(db)
    try:
        return answer(
            conn,
            family,
            optimize,
            constraints,
            source=source,
            model=model_name,
            rules=rules,
            compare_groups=True,
        )
    finally:
        conn.close()


def fit(
    model: str, gpu: str | None = None, memory: float | None = None, *, db: PathLike | None = None, **options
):
    """`advisor fit` as an `advisor.fit.FitAnswer`: every optimizer × strategy on the model and accelerator
    (`gpu` by name, or `memory` in GB), with `batch_size`, `seq_len`, `image_size`, `dtype`,
    `accumulation_steps`, `optimizers`, `strategies` and `mfu` as in the CLI. Tracing a model not yet in
    the cache needs the measurement side (torch)."""
    from advisor.fit import fit as answer
    from advisor.fit import model_info, open_cache, question
    from advisor.rules import load_rules

    rules = load_rules()
    q = question(model_info(model, rules), rules, gpu, memory, **options)
    read, write_path = open_cache(db)
    try:
        return answer(q, rules, read, write_path)
    finally:
        if read is not None:
            read.close()


__all__ = ["KBError", "NoEvidence", "fit", "open_kb", "recommend"]
