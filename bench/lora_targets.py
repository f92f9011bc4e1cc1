"""Time-to-target losses for LoRA against full fine-tuning, from a pilot KB (make reference-lora-pilot): per
base, the mean held-out loss after the middle epoch over the pilot's runs (full and LoRA, seed 0, default
rates), rounded to 0.01 nats. Reachable half-way by a configuration of median speed, as rules/protocol.toml's
grid targets are. Prints one `TARGET_<family's model>=<loss>` line per base, as the Makefile reads them.

    python bench/lora_targets.py build/lora-pilot.sqlite
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SUFFIX = "-small-pretrained"  # the folder name advisor pretrain's bases get in make bases


def targets(db: Path) -> dict[str, float]:
    """Base name (vit, ...) -> the pilot's mean held-out loss after the middle epoch of its ok runs."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT r.model, e.eval_loss FROM runs r JOIN epochs e ON e.run_id = r.id WHERE r.status = 'ok' "
            "AND r.source = 'measured' AND e.eval_loss IS NOT NULL "
            "AND e.epoch = (SELECT max(epoch) / 2 FROM epochs WHERE run_id = r.id)"
        ).fetchall()
    finally:
        conn.close()
    losses = defaultdict(list)
    for model, loss in rows:
        name = Path(model).name
        if name.endswith(SUFFIX):
            losses[name.removesuffix(SUFFIX)].append(loss)
    return {m: round(statistics.fmean(v), 2) for m, v in sorted(losses.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", type=Path, help="the pilot's KB (make reference-lora-pilot writes it)")
    db = parser.parse_args(argv).db
    if not db.is_file():
        print(f"error: no pilot KB at {db}: run `make reference-lora-pilot` first.", file=sys.stderr)
        return 1
    try:
        found = targets(db)
    except sqlite3.DatabaseError as e:
        print(f"error: {db} is not a KB advisor measure wrote ({e}).", file=sys.stderr)
        return 1
    if not found:
        print(f"error: {db} holds no ok run of a base named *{SUFFIX} with a held-out loss.", file=sys.stderr)
        return 1
    for model, loss in found.items():
        print(f"TARGET_{model}={loss}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
