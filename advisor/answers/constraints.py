"""What an answer is constrained by: the user's memory, time, optimizers and strategies, and advisor fit's
prediction on their model (configurations predicted not to fit excluded, the menu's summary beside the evidence)."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.answers.evidence import (
    GroupEvidence,
)
from advisor.kb.queries.for_answers import Cell
from advisor.kb.queries.groups import Group
from advisor.rules import Rules, gib


@dataclass(frozen=True)
class Constraints:
    """What a recommendation must respect: memory, time, optimizers kept or left out, and fit's predictions."""

    max_memory: float | None = None  # GB of accelerator memory (never compared with host RAM)
    max_time: float | None = None  # s/epoch, in the time metric's unit
    optimizers: tuple[str, ...] = ()
    exclude_optimizers: tuple[str, ...] = ()
    strategies: tuple[str, ...] = ()
    fit: object | None = None  # advisor fit's FitAnswer for the measured cells, on the user's model and GPU
    menu: object | None = None  # advisor fit's FitAnswer for the fine-tuning menu there


def menu_disagreement(menu: dict | None, pick, alternatives: list, evidence: str, metric: str) -> list[str]:
    """Why the menu's pick (advisor fit's, for the user's model) names another optimizer than the answer's pick
    (an Entry, its `alternatives` beside it) from the `evidence` named."""
    chosen = (menu or {}).get("pick")
    if not chosen or f"· {pick.optimizer} ·" in f"{chosen['configuration']} ·":
        return []
    if pick.seeds == 1 and not pick.predicted:
        adam = next((e for e in alternatives if e.optimizer in ("adamw", "adam") and e.value), None)
        theirs = f" ({adam.optimizer} here: {adam.value:.4g} against {pick.value:.4g})" if adam else ""
        return [
            f"The menu's pick ({chosen['configuration']}) differs, and stands: it puts AdamW-class optimizers "
            f"first, as fine-tuners do, and one run per configuration of {evidence} gives no test of "
            f"{pick.optimizer} against them{theirs}."
        ]
    return [
        f"The menu's pick ({chosen['configuration']}) differs: it ranks what fits your model by what a "
        f"practitioner gives up and by speed, AdamW-class first, not by {metric}; this {metric} pick is read "
        f"from {evidence}."
    ]


# Metrics an answer about the user's model on their accelerator ranks by advisor fit's prediction for that
# model, not by the evidence's measurements at another scale: metric -> (measure, the row's value).
PREDICTED = {
    "memory": ("predicted_gb", lambda r: r.total),
    "time": (
        "predicted_time_per_ksample",
        lambda r: 1000.0 / r.throughput if r.throughput and r.fits else None,
    ),
}


MEASURES_PREDICTED = {measure for measure, _ in PREDICTED.values()}


def exclusion(ev: GroupEvidence, cell: Cell, c: Constraints, memory_checked: bool) -> str | None:
    """Why the user's constraints, or the prediction for their model, exclude a usable configuration."""
    if c.optimizers and cell.optimizer not in c.optimizers:
        return f"not in --optimizer {', '.join(c.optimizers)}"
    if cell.optimizer in c.exclude_optimizers:
        return "not in the optimizers left by --exclude-optimizer"
    if c.strategies and cell.strategy not in c.strategies:
        return f"not in --strategy {', '.join(c.strategies)}"
    if c.fit is not None:
        row = cell_rows(c.fit, ev.rules).get((cell.optimizer, cell.strategy))
        if row is not None and not row.fits:
            q = c.fit.question
            where = q.accelerator.name if q.accelerator else "the --memory budget"
            return f"predicted {gib(row.total):.1f} GiB > {gib(q.budget_gb):.4g} GiB on {where} (advisor fit)"
        if row is not None and c.max_memory is not None and row.total > c.max_memory:
            return (
                f"predicted {gib(row.total):.1f} GiB exceeds --memory {gib(c.max_memory):.4g} (advisor fit)"
            )
    limits = [("time", c.max_time, "--max-time")] + (
        [("memory", c.max_memory, "--memory")] if memory_checked else []
    )
    for metric_name, limit, flag in limits:
        if limit is None:
            continue
        value, unit = ev.value(cell, metric_name), ev.rules.metric(metric_name).unit
        asked = f"{flag} {gib(limit):.4g} (GiB)" if flag == "--memory" else f"{flag} {limit:g} {unit}"
        if value is None:
            return f"no {metric_name} figure to check {asked} against"
        if value > limit:
            return f"exceeds {asked}"
    return None


def checks_memory(ev: GroupEvidence, c: Constraints, notes: list[str]) -> bool:
    """Whether --memory is checked against the evidence's own figures: only figures of accelerator
    memory (never host RAM); where it is not, a note says so. With a prediction, the prediction is what is checked."""
    if c.max_memory is None or c.fit is not None:
        return False
    measure = ev.measure("memory")
    if measure is not None and ev.rules.measures[measure].accelerator:
        return True
    stated = ev.rules.measures[measure].label if measure else "no memory figure"
    notes.append(
        f"--memory {gib(c.max_memory):.4g} (GiB) means accelerator memory, and this evidence states only {stated}: "
        "not applied. Pass --model with --gpu (or --memory) to check what fits by prediction."
    )
    return False


def cell_rows(fit, rules: Rules) -> dict[tuple[str, str], object]:
    """(optimizer, strategy) of a KB cell -> the best-ranked prediction, without offload, of the configuration
    the cell trained: full fine-tuning for a plain strategy and for a measured arm (predicted as the strategy
    it stands for: the same step, another data budget), the adapter on its step for an adapter strategy
    (rules' `as_fit`). The KB's cells trained every weight they trained on the accelerator."""
    best: dict[tuple[str, str, str], object] = {}
    for r in fit.rows:  # ranked
        if r.offload == "none":
            best.setdefault((r.adapter.kind, r.optimizer, r.strategy), r)
    out: dict[tuple[str, str], object] = {}
    for strategy in rules.strategies:
        adapter, step = rules.as_fit(strategy)
        out |= {(o, strategy): r for (a, o, s), r in best.items() if (a, s) == (adapter, step)}
    return out


QUALITY_GAP = (
    "Quality (loss) evidence in the KB: the paper's optimizers, Lion, Muon, schedule-free AdamW and torchao's "
    "8-bit AdamW against AdamW (the CPU reference grid), and LoRA against full fine-tuning on small bases "
    "pretrained here (advisor fit quotes both); QLoRA and 4-bit states have none yet: those rows are ranked "
    "by memory and speed, as predicted for your model."
)


def menu_summary(fit, metric: str) -> dict:
    """The fine-tuning menu for the user's model (advisor fit): the configuration a practitioner would pick,
    the best by this metric where a prediction decides it (memory, speed), and the ladder when nothing as
    asked fits. Quality is evidence's alone: the KB's (QUALITY_GAP), which the rows quote as their trades."""
    fitting = fit.fitting
    best = None
    if metric == "memory":
        best = min(fit.rows, key=lambda r: r.total)
    elif metric in ("time", "throughput", "utilization") and fitting:
        best = max(fitting, key=lambda r: r.tokens_per_s or r.throughput or 0.0)
    return {
        "pick": _menu_row(fit.pick),
        "best_for_metric": _menu_row(best),
        "fitting": len(fitting),
        "configurations": len(fit.rows),
        "ladder": [r.as_dict() for r in fit.ladder],
        "quality": QUALITY_GAP,
    }


def _menu_row(row) -> dict | None:
    if row is None:
        return None
    return {
        "configuration": row.label,
        "fits": row.fits,
        "memory_gb": row.total,
        "per_rank": row.world > 1,
        "host_gb": round(row.host_gb, 4),
        "tokens_per_s": row.tokens_per_s,
        "trade": row.trade,
        "adapter_trade": row.adapter_trade,
        "adapter_evidence": row.adapter_evidence,
    }


def model_summary(fit, group: Group) -> dict:
    """The user's model as the answer names it (its scale against the evidence's: `scale_statement`)."""
    q = fit.question
    out = {
        "name": q.model.name,
        "parameters": fit.n_params,
        "accelerator": q.accelerator.name if q.accelerator else None,
        "memory_gb": round(q.budget_gb, 3),
        "dtype": ", ".join(q.dtypes),
        "batch_size": q.batch_size,
        "seq_len": q.seq_len,
        "method": q.method,  # the step predicted: Trainer's, or TRL's (advisor fit --method)
        "evidence_parameters": group.n_params,
    }
    return out
