"""advisor fit in Python: the menu's answer from the cache, traced (torch only then) where it lacks one."""

from __future__ import annotations

from dataclasses import fields, replace
from functools import partial
from importlib.util import find_spec
from typing import TYPE_CHECKING

from advisor.api.inputs import PathLike, _given, _model, _path, _typed
from advisor.errors import Error, InputError
from advisor.model_ref import ResolvedModel
from advisor.prediction.fit_request import FitRequest
from advisor.prediction.question import question
from advisor.rules import Rules, load_rules

if TYPE_CHECKING:
    from advisor.prediction.answer import FitAnswer

MEASURE_SIDE = ("torch", "transformers", "datasets", "psutil")


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
    request = _typed(replace(_given(request, FitRequest, "advisor.fit"), **options))
    db = _path(db, "db")
    return fits(_model(model, rules), (request,), rules, db, say)[0]


def fits(
    resolved: ResolvedModel, requests: tuple[FitRequest, ...], rules: Rules, db=None, say=None
) -> list[FitAnswer]:
    """advisor fit's answers to several requests on one resolved model, over one open cache: `recommend --model`
    asks two (the evidence's cells and the menu) in one fit."""
    # the prediction's cache and levers: not on the path of answers from evidence alone
    from advisor.prediction import ranking
    from advisor.prediction.answer import usable_gb
    from advisor.prediction.cache import open_cache

    cache = open_cache(db)
    try:
        answers = []
        for request in requests:
            q = question(resolved, request, rules)
            answer = _answered(q, rules, cache, say)
            if ranking.needed(q, answer.rows, request, rules):

                def ask(lever: FitRequest, name: str, q=q):
                    asked = question(resolved, lever, rules, accelerator=q.accelerator)
                    heard = say and (lambda line: say(f"nothing as asked fits; the lever {name}: {line}"))
                    return asked, _answered(asked, rules, cache, heard)

                answer.levers = ranking.pulled(q, answer.rows, request, rules, usable_gb(q, rules), ask)
            answers.append(answer)
        return answers
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


def require_measure_side() -> None:
    """The evidence side's libraries are an extra: say how to install them instead of a traceback."""
    missing = [m for m in MEASURE_SIDE if find_spec(m) is None]
    if missing:
        raise Error(
            f"the measurement side is not installed ({', '.join(missing)} missing): "
            "pip install 'advisor[measure]' (on a machine without a GPU, pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu first: an unpinned torch is a multi-GB CUDA build)."
        )
