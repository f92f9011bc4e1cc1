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

# `name as name`: what the code imports from here beyond __all__ (which stays what `import *` took before)
from advisor.api.advice import RecommendRequest, open_kb, recommend
from advisor.api.advice import recommend_request as recommend_request
from advisor.api.fits import MEASURE_SIDE as MEASURE_SIDE
from advisor.api.fits import fit
from advisor.api.fits import require_measure_side as require_measure_side
from advisor.api.measurement import measure, plan
from advisor.api.measurement import pretrain as pretrain
from advisor.api.report import REPORT_GPUS as REPORT_GPUS
from advisor.api.report import traced_fits
from advisor.prediction.question import FitRequest

__all__ = ["FitRequest", "RecommendRequest", "fit", "measure", "open_kb", "plan", "recommend", "traced_fits"]
