"""How exact is `advisor fit --method`? Each TRL step (SFT, DPO with each reference, a reward model, GRPO
generating with transformers without a reference, with a frozen copy, with the disabled adapter), predicted
and run for real by TRL's own trainer on this CPU, in three architectures, its micro-batch peak (GRPO's
rollout, forward, the reference's forward, backward, with the optimizer's state held) measured by PyTorch's
MemTracker; for GRPO also its rollout's peak alone (generation and scoring).

    python bench/fit_methods.py [--out bench/results/fit-methods-cpu.json]

The cases and the harness are the test's (tests/measuring/tracer/test_methods.py, tests/measuring/tracer/trlstep.py); this
writes their errors with the machine's versions, a table to quote.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/fit-methods-cpu.json")
    args = parser.parse_args()
    import peft
    import torch
    import transformers
    import trl

    from tests.measuring.tracer.test_methods import ARCHS, STEPS, errors, spec_of

    rows = []
    for arch in ARCHS:
        for method, reference, adapter in STEPS:
            found = errors(spec_of(arch, method, reference, adapter))
            for part, err in found.items():
                rows.append(
                    {
                        "arch": arch,
                        "method": method,
                        "reference": reference,
                        "adapter": adapter,
                        "peak": part,
                        "error": err,
                    }
                )
                print(
                    f"{arch:7} {method:6} {reference or '-':11} {adapter:4} {part:7} {err:+.4%}", flush=True
                )
    sizes = [abs(r["error"]) for r in rows]
    summary = {
        "median_abs_error": statistics.median(sizes),
        "max_abs_error": max(sizes),
        "cases": len(rows),
        "grpo_median_abs_error": statistics.median(abs(r["error"]) for r in rows if r["method"] == "grpo"),
    }
    print(
        f"median |error| {summary['median_abs_error']:.2e}, max {summary['max_abs_error']:.2e}, {len(rows)} peaks"
    )
    versions = {m.__name__: m.__version__ for m in (torch, transformers, trl, peft)}
    out = {
        "device": f"CPU ({platform.processor() or platform.machine()})",
        "versions": versions,
        "summary": summary,
    }
    args.out.write_text(json.dumps({**out, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
