"""`advisor report` in Python (write_report), and its fit section: advisor fit's answers from the traces a KB
holds, on the report's GPUs (traced_fits)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import Error
from advisor.model_ref import ResolvedModel, resolve_model
from advisor.prediction.fit_request import FitRequest
from advisor.prediction.question import question
from advisor.rules import Accelerator, FamilyRecord, Rules, load_rules

if TYPE_CHECKING:
    from advisor.prediction.answer import FitAnswer, TracedFits
    from advisor.prediction.cache import Traced

# The report's fit section, unless --gpu says: a 24 GB desk card and the two 80 GB datacentre ones
REPORT_GPUS = ("rtx4090", "a100-80gb", "h100-80gb")


def write_report(
    conn: sqlite3.Connection,
    out: Path,
    source: str | None = None,
    kb: str = "the knowledge base",
    gpus: tuple[Accelerator, ...] = (),
) -> Path:
    """`advisor report` in Python: the static site of the KB at `conn` (`source`: its evidence from that
    source alone; `kb`: how the page names it) written into the folder `out`, with advisor fit's answers on
    `gpus` (default REPORT_GPUS); returns its index.html. The KB's answers are gathered first
    (advisor.answers.report_data), then drawn (advisor.render.site). Needs the plots extra."""
    from advisor.answers.report_data import gather_report  # the report's queries: for a report alone
    from advisor.render.site import write_site  # Jinja2 and the charts: the plots extra

    rules = load_rules()
    return write_site(gather_report(conn, rules, source, lambda: traced_fits(conn, gpus)), out, rules, kb)


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
