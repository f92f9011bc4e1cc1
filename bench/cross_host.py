"""Whether a run's held-out loss is the same on another host: the runs of two KBs measured on different CPUs
with the same model, preset, optimizer, strategy, seed and rate, paired, and how far apart their final
held-out losses are. It is what lets a tuning run stand for any host (kb.lease.PORTABLE: `--tune-lr` and
`make reference` reuse the rates chosen elsewhere) and what bounds that. Prints a summary; `--out FILE`
writes the JSON.

    git show <commit>:kb/results.sqlite > build/before.sqlite   # a KB measured on another host
    python bench/cross_host.py build/before.sqlite build/reference-small.sqlite --out bench/results/cross-host-cpu.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from pathlib import Path

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

PAIRED = """
SELECT a.model, a.preset, a.optimizer, a.strategy, a.seed, json_extract(a.config, '$.lr') AS lr,
       a.hardware, b.hardware, am.value, bm.value
FROM a.runs a
JOIN a.metrics am ON am.run_id = a.id AND am.name = 'eval_loss'
JOIN b.runs b ON b.source = a.source AND b.model = a.model AND b.preset = a.preset AND b.family = a.family
    AND b.optimizer = a.optimizer AND b.strategy = a.strategy AND b.seed = a.seed AND b.protocol = a.protocol
    AND b.data = a.data AND json_extract(b.config, '$.lr') = json_extract(a.config, '$.lr')
    AND b.hardware != a.hardware
JOIN b.metrics bm ON bm.run_id = b.id AND bm.name = 'eval_loss'
WHERE a.source IN ('measured', 'measured:tuning') AND a.status = 'ok' AND b.status = 'ok'
ORDER BY a.model, a.preset, a.optimizer, a.strategy, a.seed
"""
BANDS = (1e-6, 1e-4, 1e-2)  # relative differences a summary counts the pairs within


def pairs(first: Path, second: Path) -> list[dict]:
    """Every run of `first` with its twin in `second` (another host, the same cell, seed and rate)."""
    conn = sqlite3.connect(":memory:")
    for name, path in (("a", first), ("b", second)):
        conn.execute("ATTACH DATABASE ? AS " + name, [f"{path.resolve().as_uri()}?mode=ro"])
    out = []
    for model, preset, opt, strat, seed, lr, host_a, host_b, loss_a, loss_b in conn.execute(PAIRED):
        relative = abs(loss_b - loss_a) / abs(loss_a) if loss_a else None
        out.append(
            dict(
                model=model,
                preset=preset,
                optimizer=opt,
                strategy=strat,
                seed=seed,
                lr=lr,
                hosts=[host_a, host_b],
                eval_loss=[loss_a, loss_b],
                relative=relative,
            )
        )
    conn.close()
    return out


def summary(found: list[dict]) -> dict:
    rel = sorted(p["relative"] for p in found if p["relative"] is not None)
    by_optimizer: dict[str, list[float]] = {}
    for p in found:
        if p["relative"] is not None:
            by_optimizer.setdefault(p["optimizer"], []).append(p["relative"])
    return dict(
        pairs=len(rel),
        median=statistics.median(rel) if rel else None,
        max=rel[-1] if rel else None,
        within={f"{b:g}": sum(r <= b for r in rel) for b in BANDS},
        worst_by_optimizer={o: max(v) for o, v in sorted(by_optimizer.items())},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="a KB")
    parser.add_argument("second", type=Path, help="a KB measured on another host")
    parser.add_argument("--out", help="write the JSON here")
    args = parser.parse_args()
    for path in (args.first, args.second):
        if not path.is_file():
            sys.exit(f"cross_host.py: {path} is not a file; pass two KBs (see the docstring)")
    found = pairs(args.first, args.second)
    result = dict(
        note="final held-out loss of the same cell, seed and rate on two hosts; relative = |b - a| / a",
        device=device(),
        versions=versions("torch", "transformers"),
        kbs=[str(args.first), str(args.second)],
        summary=summary(found),
        pairs=found,
    )
    s = result["summary"]
    print(f"{s['pairs']} pairs; median relative difference {s['median']:.2g}, max {s['max']:.2g}")
    print("within " + ", ".join(f"{b}: {n}" for b, n in s["within"].items()))
    print("worst by optimizer: " + ", ".join(f"{o} {v:.2g}" for o, v in s["worst_by_optimizer"].items()))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
