"""What an optimizer outside the AdamW class trades, in words (rules/optimizers.toml) and, where the KB has
it, in measured loss against Adam on the model's family: the quality side of a row of `advisor fit`."""

from __future__ import annotations

import sqlite3

from advisor.kb.reader import evidence_groups, group_aggregates
from advisor.prediction.question import Question
from advisor.rules import Rules

REFERENCES = ("adamw", "adam")  # what a trade is measured against


def trade_notes(kbs: list[sqlite3.Connection], q: Question, rules: Rules) -> dict[str, str]:
    """optimizer -> its trade, with the loss against AdamW (or Adam) at the standard strategy where a group
    of the family measured both, in the first of the KBs (the user's, then the shipped one) that has it."""
    trades = {n: rules.optimizer_info[n].trade for n in q.optimizers if rules.optimizer_info[n].trade}
    if not trades:
        return {}
    measured: dict[str, str] = {}
    for conn in kbs if q.model.listed else ():
        found = _loss_against_adam(conn, q.model.family.name, set(trades) - set(measured), rules)
        measured |= found
    return {
        n: text + (f"; {measured[n]}" if n in measured else "; no quality evidence in the KB")
        for n, text in trades.items()
    }


def _loss_against_adam(
    read: sqlite3.Connection | None, family: str, names: set[str], rules: Rules
) -> dict[str, str]:
    """optimizer -> 'loss 2.31 against adamw's 1.87 in <group> (n runs each)' from the family's groups in the
    order answers prefer them; the first group holding both decides."""
    if read is None:
        return {}
    loss = rules.metric("loss")
    conversions = {m: (rules.measures[m].factor, rules.measures[m].scale) for m in loss.measures}
    out: dict[str, str] = {}
    try:
        prefs = rules.flowchart["evidence"]  # the preference answers use (rules/flowchart.toml [evidence])
        never = prefs.get("answer_never", [])
        groups = sorted(
            (g for g in evidence_groups(read, family) if g.source not in never),
            key=lambda g: (
                prefs["preset_rank"].get(g.preset, 1),
                prefs["protocol_rank"].get(g.protocol, 0),
                prefs["source_rank"].get(g.source, prefs["source_rank"].get(g.kind, 0)),
                g.n_seeds,
                g.n_runs,
            ),
            reverse=True,
        )
        for g in groups:
            aggregates = group_aggregates(read, g, conversions)
            measure = next((m for m in loss.measures if m in aggregates), None)
            values = aggregates.get(measure, {})
            ref = next((o for o in REFERENCES if (o, "standard") in values), None)
            if ref is None:
                continue
            for name in names - set(out):
                if (name, "standard") in values:
                    mine, theirs = values[(name, "standard")], values[(ref, "standard")]
                    out[name] = (
                        f"{measure.replace('_', ' ')} {mine.mean:.3g} against {ref}'s {theirs.mean:.3g} in {g.label} "
                        f"({min(mine.n, theirs.n)} run{'s' if min(mine.n, theirs.n) > 1 else ''} each)"
                    )
    except sqlite3.DatabaseError:
        return out
    return out
