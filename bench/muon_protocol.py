"""Muon against AdamW (standard strategy, held-out loss) in every shipped group that measured both: the
reference grid's (Intel Xeon, Muon's AdamW part at AdamW's default rate, SigLIP's position embedding on
Muon) and the re-measure under the fixed protocol (AMD EPYC: every embedding on AdamW, the AdamW part at
AdamW's tuned rate, one grid width for both). The paired test by seed, as answers make it.

    python bench/muon_protocol.py --out bench/results/muon-protocol-cpu.json
"""

from __future__ import annotations

import argparse
import json

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

from advisor.answers.evidence import GroupEvidence
from advisor.kb.open import open_for_reading
from advisor.kb.queries.groups import evidence_groups
from advisor.rules import load_rules

MUON, ADAMW = ("muon", "standard"), ("adamw", "standard")


def leads(conn, rules) -> list[dict]:
    out = []
    for g in evidence_groups(conn, source="measured"):
        ev = GroupEvidence(conn, g, rules)
        stats = ev.stats("loss")
        if MUON not in stats or ADAMW not in stats:
            continue
        cmp = ev.compare("loss", MUON, ADAMW)
        out.append(
            {
                "family": g.family,
                "hardware": g.hardware,
                "group": g.ref,
                "muon": stats[MUON].mean,
                "adamw": stats[ADAMW].mean,
                "seeds": min(stats[MUON].n, stats[ADAMW].n),
                "relative": 100 * (stats[MUON].mean / stats[ADAMW].mean - 1),
                "p": cmp.test.p if cmp else None,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = leads(open_for_reading(None), load_rules())
    for r in rows:
        print(
            f"{r['family']:8s} {r['hardware'][:28]:28s} muon {r['muon']:.4f} adamw {r['adamw']:.4f} "
            f"{r['relative']:+.1f} %  p={r['p']:.3g} ({r['seeds']} seeds)"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device(), "versions": versions("torch"), "leads": rows}, f, indent=1)


if __name__ == "__main__":
    main()
