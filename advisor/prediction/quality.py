"""What a configuration of `advisor fit` gives up in quality: an optimizer outside the AdamW class (in words,
rules/optimizers.toml) and an adapter (LoRA) against full fine-tuning, each with the KB's measured held-out
loss where a group of the model's family holds both sides."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from advisor.kb.queries.for_answers import group_aggregates
from advisor.kb.queries.groups import evidence_groups
from advisor.prediction.question import Question
from advisor.rules import MEASURE_WORDS, Rules

REFERENCES = ("adamw", "adam")  # what an optimizer's trade is measured against
ADAPTER_NOTE = {  # an adapter strategy's trade, in words (its evidence follows)
    "lora": "trains rank-r adapters on frozen weights: a fraction of the gradients and optimizer state, and a "
    "smaller update than full fine-tuning can make",
}


@dataclass(frozen=True)
class Trades:
    """What the menu's optimizers and adapters trade, by name (each with its evidence, where the KB has it)."""

    optimizers: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, str] = field(default_factory=dict)
    # of each adapter's trade, the measured part alone, where there is one
    adapter_evidence: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, kbs: list[sqlite3.Connection], q: Question, rules: Rules) -> Trades:
        notes, evidence = adapter_notes(kbs, q, rules)
        return cls(trade_notes(kbs, q, rules), notes, evidence)


def trade_notes(kbs: list[sqlite3.Connection], q: Question, rules: Rules) -> dict[str, str]:
    """optimizer -> its trade, with the loss against AdamW (or Adam) at the standard strategy where a group
    of the family measured both, in the first of the KBs (the user's, then the shipped one) that has it."""
    trades = {n: rules.optimizer_info[n].trade for n in q.optimizers if rules.optimizer_info[n].trade}
    wanted = {n: ((n, "standard"), [((r, "standard"), r) for r in REFERENCES]) for n in trades}
    return _joined(trades, _measured(wanted, kbs, q, rules))


def adapter_notes(kbs: list[sqlite3.Connection], q: Question, rules: Rules) -> tuple[dict, dict]:
    """(adapter -> its trade, adapter -> its measured part alone): AdamW's held-out loss on the adapter
    strategy against full fine-tuning (its step's strategy, rules' `adapters`) where a group of the family
    measured both: a pretrained base, fine-tuned both ways (advisor pretrain)."""
    asked = {c.adapter for c in q.configs}
    notes = {
        a: ADAPTER_NOTE.get(a, "trains adapters on frozen weights") for a in rules.adapters if a in asked
    }
    wanted = {a: (("adamw", a), [(("adamw", rules.adapters[a]), "full fine-tuning")]) for a in notes}
    measured = _measured(wanted, kbs, q, rules)
    return _joined(notes, measured), measured


def _measured(wanted: dict, kbs, q: Question, rules: Rules) -> dict[str, str]:
    """name -> its measured loss against its reference, from the first KB (the user's, then the shipped one)
    that has it; nothing for a model of no known family."""
    measured: dict[str, str] = {}
    for conn in kbs if q.model.listed and wanted else ():
        rest = {n: w for n, w in wanted.items() if n not in measured}
        measured |= _loss_against(conn, q.model.family.name, rest, rules)
    return measured


def _joined(notes: dict[str, str], measured: dict[str, str]) -> dict[str, str]:
    return {n: text + f"; {measured.get(n, 'no quality evidence in the KB')}" for n, text in notes.items()}


def _loss_against(read: sqlite3.Connection | None, family: str, wanted: dict, rules: Rules) -> dict[str, str]:
    """name -> 'held-out loss 2.31 (+3.1 %) against adamw's 2.24 in <group> (3 runs each)': `wanted` maps a
    name to its (optimizer, strategy) and the references it is read against, in order; the family's groups
    are read in the order answers prefer them, and the first holding a pair decides."""
    if read is None or not wanted:
        return {}
    loss = rules.metric("loss")
    conversions = {m: (rules.measures[m].factor, rules.measures[m].scale) for m in loss.measures}
    out: dict[str, str] = {}
    try:
        for g in _preferred(evidence_groups(read, family), rules):
            aggregates = group_aggregates(read, g, conversions)
            measure = next((m for m in loss.measures if m in aggregates), None)
            values = aggregates.get(measure, {})
            for name, (key, references) in wanted.items():
                ref = next(((k, label) for k, label in references if k in values), None)
                if name in out or key not in values or ref is None:
                    continue
                mine, theirs, n = values[key], values[ref[0]], min(values[key].n, values[ref[0]].n)
                change = 100 * (mine.mean - theirs.mean) / theirs.mean if theirs.mean else 0.0
                out[name] = (
                    f"{MEASURE_WORDS.get(measure, measure)} {mine.mean:.3g} ({change:+.1f} %) against {ref[1]}'s "
                    f"{theirs.mean:.3g} in {g.label} ({n} run{'s' if n > 1 else ''} each)"
                )
    except sqlite3.DatabaseError:
        return out
    return out


def _preferred(groups, rules: Rules):
    """The groups in the order answers prefer them (rules/flowchart.toml [evidence]), none answers never use."""
    prefs = rules.flowchart["evidence"]
    never = prefs.get("answer_never", [])
    return sorted(
        (g for g in groups if g.source not in never),
        key=lambda g: (
            prefs["preset_rank"].get(g.preset, 1),
            prefs["protocol_rank"].get(g.protocol, 0),
            prefs["source_rank"].get(g.source, prefs["source_rank"].get(g.kind, 0)),
            g.n_seeds,
            g.n_runs,
        ),
        reverse=True,
    )
