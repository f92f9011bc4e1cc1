"""The paper's full grid, worked on paper: GPU-hours on A100 and H100 and the makespan on 1, 8 and 64 GPUs,
from `advisor measure --plan`'s machinery (advisor fit's FLOPs and memory at each model's real size).

    python bench/scaling.py [--dtype bf16-mixed] [--seeds 3] [--epochs 25]

The full grid: the four reference models at preset paper, each family's optimizers of the paper (our grid
less Adafactor) x the four strategies x 3 seeds x 25 epochs of MM-IMDb's 15,552 training examples at the
paper's batch sizes, under the paper's protocol (an epoch is the same micro-batches for every strategy).
Prints the markdown tables docs/scaling.md quotes."""

from __future__ import annotations

import argparse
import math

TRAIN_EXAMPLES = 15_552  # MM-IMDb's training split (the paper, section 3)
GPUS = ("A100-40GB", "A100-80GB", "H100")
WORKERS = (1, 8, 64)


def full_grid(seeds: int, epochs: int, dtype: str):
    """Every cell of the paper's grid, at the paper's epoch length per model."""
    from dataclasses import replace

    from advisor.measuring.grid.runner import plan_grid
    from advisor.measuring.recipe.config import PAPER, RunConfig
    from advisor.model_ref import reference_models
    from advisor.rules import load_rules

    rules = load_rules()
    configs = []
    for model in reference_models(rules):
        optimizers = [o for o in model.family.grid_optimizers if o != "adafactor"]
        steps = math.ceil(TRAIN_EXAMPLES / PAPER[model.name]["batch_size"])
        base = RunConfig(preset="paper", protocol="paper", epochs=epochs, dtype=dtype, device="cuda")
        base = replace(base, steps_per_epoch=steps - steps % 4)  # whole accumulation windows
        configs += plan_grid([model], rules, optimizers, list(rules.strategies), seeds, base)
    return configs, rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16-mixed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=25)
    args = parser.parse_args()

    from advisor.measuring.planning.plan import plan_cells
    from advisor.render.plan_views import hours

    configs, rules = full_grid(args.seeds, args.epochs, args.dtype)
    print(f"{len(configs)} cells ({args.dtype}, {args.epochs} epochs, {args.seeds} seeds)\n")
    print(
        "| accelerator | cells that fit | GPU-hours | makespan on "
        + " | ".join(f"{w} GPU" for w in WORKERS)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(WORKERS))
    plans = {}
    for gpu in GPUS:
        plan = plan_cells(configs, rules, gpu=gpu, workers=list(WORKERS))
        plans[gpu] = plan
        fit = sum(c.fits is not False for c in plan.cells)
        spans = " | ".join(hours(plan.makespans[w]) for w in WORKERS)
        print(f"| {plan.target} | {fit} of {len(plan.cells)} | {sum(plan.runnable) / 3600:.0f} | {spans} |")
    print("\nPer model (a cell: the mean over the cells that fit; GPU-hours of all of them):\n")
    print("| model | " + " | ".join(f"{g} per cell | {g} GPU-h" for g in GPUS) + " |")
    print("|---|" + "---|---|" * len(GPUS))
    for model in rules.reference_models():
        row = [model]
        for gpu in GPUS:
            cells = [c for c in plans[gpu].cells if c.config.model == model and c.fits is not False]
            times = [c.seconds for c in cells if c.seconds]
            row += [hours(sum(times) / len(times)), f"{sum(times) / 3600:.0f}"]
        print("| " + " | ".join(row) + " |")
    longest = ", ".join(f"{gpu} {hours(max(plans[gpu].runnable))}" for gpu in GPUS)
    print(f"\nLongest cell: {longest}.")


if __name__ == "__main__":
    main()
