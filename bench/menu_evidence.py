"""The fine-tuning menu's measured evidence in the shipped CPU reference grid (preset small, 3 seeds, tuned
rates): each menu configuration against AdamW + standard in the same group, on held-out loss, epoch time
and tensor peak, with the paired test the answers use; LoRA against full fine-tuning (AdamW) on each family's
base pretrained here (advisor pretrain), on held-out loss, time to target, epoch time and tensor peak; and
accumulation at equal updates (the fair protocol's) and at equal samples against a plain step, per
optimizer, on held-out loss: what the data budget, not accumulation, buys. Prints tables; `--out FILE`
writes the JSON.

    python bench/menu_evidence.py --out bench/results/menu-evidence-cpu.json
"""

from __future__ import annotations

import argparse
import json

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

from advisor.answers.comparison import equivalence_margin, reading
from advisor.answers.evidence import Asked, GroupEvidence, select_group
from advisor.kb.open import open_for_reading
from advisor.rules import load_rules

BASE = ("adamw", "standard")
ARMS = ("accumulation", "accumulation-equal-samples")  # against standard, same optimizer
MENU = [
    ("lion_32bit", "standard"),
    ("schedule_free_adamw", "standard"),
    ("muon", "standard"),
    ("adamw_torch_8bit", "standard"),
    ("adamw", "selective-checkpointing"),
]
METRICS = ("loss", "time", "memory")
LORA = ("adamw", "lora")  # against BASE, on each family's pretrained base
LORA_METRICS = ("loss", "time_to_target", "time", "memory")


def compare(ev: GroupEvidence, rules, key: tuple[str, str], base=BASE, metrics=METRICS) -> dict:
    out = {}
    for name in metrics:
        metric = rules.metric(name)
        a, b = ev.stats(name).get(key), ev.stats(name).get(base)
        if a is None or b is None:
            continue
        cmp = ev.compare(name, key, base)
        separated = cmp is not None and cmp.test.p < rules.flowchart["ranking"]["alpha"]
        read = reading(rules, metric, cmp, a, b, separated)
        out[name] = dict(
            value=a.mean,
            adamw=b.mean,
            relative=100 * (a.mean - b.mean) / b.mean,
            p=cmp.test.p if cmp else None,
            reading=read["reading"],
            seeds_needed=read["seeds_needed"],
            margin_relative=equivalence_margin(rules, metric),
            measure=ev.measure(name),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    rules, conn = load_rules(), open_for_reading(None)
    rows, budget, lora = [], [], []
    for family in ("vision", "encoder", "decoder", "vlm"):
        group = select_group(conn, rules, family, source="measured").group
        ev = GroupEvidence(conn, group, rules)
        for key in MENU:
            rows.append(
                dict(
                    family=family,
                    optimizer=key[0],
                    strategy=key[1],
                    group=group.label,
                    **compare(ev, rules, key),
                )
            )
        for opt in rules.families[family].grid_optimizers:
            arms = {a: compare(ev, rules, (opt, a), (opt, "standard"), ("loss",)).get("loss") for a in ARMS}
            budget.append(dict(family=family, optimizer=opt, **arms))
        base = f"{rules.families[family].reference_model}-small-pretrained"  # make reference-lora's name
        tuned = select_group(conn, rules, family, source="measured", asked=Asked(model=base)).group
        if tuned.model == base:
            ev = GroupEvidence(conn, tuned, rules)
            lora.append(
                dict(
                    family=family,
                    base=base,
                    group=tuned.label,
                    **compare(ev, rules, LORA, BASE, LORA_METRICS),
                )
            )
    for r in rows:
        cells = [f"{r['family']:8} {r['optimizer']:20} {r['strategy']:24}"]
        for name in METRICS:
            m = r.get(name)
            cells.append(f"{name} {m['relative']:+6.1f}% {m['reading']:10}" if m else f"{name} —")
        print("  ".join(cells))
    print(
        "\nheld-out loss against standard, same optimizer: accumulation at equal updates | at equal samples"
    )
    for b in budget:
        cells = [f"{b['family']:8} {b['optimizer']:10}"]
        cells += [f"{m['relative']:+6.1f}% {m['reading']:10}" if (m := b.get(a)) else "—" for a in ARMS]
        print("  ".join(cells))
    print("\nLoRA against full fine-tuning (AdamW), each family's pretrained base")
    for r in lora:
        cells = [f"{r['family']:8} {r['base']:28}"]
        for name in LORA_METRICS:
            m = r.get(name)
            cells.append(f"{name} {m['relative']:+6.1f}% {m['reading']:10}" if m else f"{name} —")
        print("  ".join(cells))
    if args.out:
        payload = dict(
            note="each menu configuration against AdamW + standard, same group; relative = (menu - adamw) / adamw",
            device=device(),
            versions=versions("torch", "transformers", "peft", "torchao"),
            rows=rows,
            lora_against_full=lora,
            accumulation_budget=budget,
        )
        with open(args.out, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    main()
