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

The package, a job to a module: advice (recommend, RecommendRequest, open_kb), fits (fit), measurement
(measure, plan, pretrain), report (the report's fit section, traced_fits), inputs (the checks they share).
"""

# Each name is imported from its module on first use (PEP 562), so that `advisor recommend` does not pay for
# fit's, measure's and the report's imports: name -> the module of advisor/api/ that defines it.
_HOMES = {
    "RecommendRequest": "advice",
    "open_kb": "advice",
    "recommend": "advice",
    "recommend_request": "advice",
    "MEASURE_SIDE": "fits",
    "fit": "fits",
    "require_measure_side": "fits",
    "measure": "measurement",
    "plan": "measurement",
    "pretrain": "measurement",
    "REPORT_GPUS": "report",
    "traced_fits": "report",
    "write_report": "report",
}


def __getattr__(name: str):
    if name == "FitRequest":
        from advisor.prediction.fit_request import FitRequest  # the request fit and recommend's menu take

        return FitRequest
    if name not in _HOMES:
        raise AttributeError(f"module 'advisor.api' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"advisor.api.{_HOMES[name]}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, "FitRequest"})


__all__ = ["FitRequest", "RecommendRequest", "fit", "measure", "open_kb", "plan", "recommend", "traced_fits"]
