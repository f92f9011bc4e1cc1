"""Whether the reference grid's timing repeats (its seeds) hold the time spread below the differences its
answers report: per family of the shipped CPU small grid, the spread of epoch time over seeds (coefficient of
variation, median over configurations) against the difference between each time answer's pick and every
configuration tested against it, and how those comparisons read (different, equivalent, undecided: the
answers' paired tests, Holm-corrected, with the 5 % equivalence margin). Prints a table; `--out FILE`
writes the JSON.

    python bench/time_spread.py --out bench/results/time-spread-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

from advisor.answers.evidence import Selector
from advisor.answers.recommendation import recommend
from advisor.kb.open import open_for_reading
from advisor.kb.queries.for_answers import group_values
from advisor.rules import load_rules

FAMILIES = ("vision", "encoder", "decoder", "vlm")


def spread(values: dict) -> float | None:
    """The median over configurations of the coefficient of variation over seeds, in %."""
    cvs = [100 * statistics.stdev(v) / statistics.fmean(v) for v in values.values() if len(v) > 1]
    return statistics.median(cvs) if cvs else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    rules, conn = load_rules(), open_for_reading(None)
    rows = []
    for family in FAMILIES:
        answer = recommend(conn, family, "time", rules, source="measured", selector=Selector(preset="small"))
        measure = answer.measure
        tested = [
            a for a in answer.as_dict()["alternatives"] + answer.as_dict()["tied_with"] if a.get("test")
        ]
        seen = {(a["optimizer"], a["strategy"]): a for a in tested}.values()
        differences = [abs(a["test"]["relative"]) for a in seen if a["test"].get("relative") is not None]
        cv = spread(group_values(conn, answer.group, measure))
        rows.append(
            dict(
                family=family,
                group=answer.group.label,
                measure=measure,
                pick=f"{answer.recommendation.optimizer} + {answer.recommendation.strategy}",
                spread_cv_median=cv,
                compared=len(differences),
                difference_median=statistics.median(differences) if differences else None,
                above_spread=sum(d > 2 * cv for d in differences) if cv is not None else None,
                readings=dict(Counter(a["test"]["reading"] for a in seen)),
            )
        )
    for r in rows:
        print(
            f"{r['family']:8} spread {r['spread_cv_median']:5.1f} %  differences: median {r['difference_median']:6.1f} %, "
            f"{r['above_spread']} of {r['compared']} above twice the spread  readings {r['readings']}"
        )
    if args.out:
        payload = dict(
            note="epoch time: spread over seeds (median CV) against each time answer's differences to its pick",
            device=device(),
            versions=versions("torch", "transformers"),
            rows=rows,
        )
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
