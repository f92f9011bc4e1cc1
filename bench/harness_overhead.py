"""Step time through the harness against a bare PyTorch loop, and the sampler on against off.

    python bench/harness_overhead.py [--model vit] [--preset small] [--rounds 9] [--steps 12]

Same model, optimizer and micro-batches (collated once, in memory). Each round runs, in turn, `steps`
optimizer steps of: a bare loop (zero_grad, forward, mean cross-entropy, backward, step); the harness's
step (advisor.measuring.grid.runner: summed loss over the window's targets, clock reads, divergence and memory checks,
progress callback) with the monitor's sampler off; the same with the sampler on. Prints median step
times and the ratios. Targets: harness / bare <= 1.03; sampler on / off <= 1.01. On a shared 2-core
machine the paired wall-clock ratios scatter by about +-2 % from run to run, so the sampler's own CPU
time (thread CPU clock) is printed too: it is the cost the wall-clock ratio cannot resolve.
"""

import argparse
import statistics
import time

import torch

from advisor.measuring.data.corpus import batches, load
from advisor.measuring.machine.monitor import Monitor
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.recipe.strategies import to_device
from advisor.measuring.training.trainer import Trainer
from advisor.model_ref import resolve_model
from advisor.rules import load_rules


def bare_step(model, optimizer, family, batch):
    """What a user writes without the harness: the mean cross-entropy of one batch, backward, step."""
    optimizer.zero_grad(set_to_none=True)
    loss = family.summed_loss(model, batch) / batch["n_targets"]
    loss.backward()
    optimizer.step()
    return loss.item()


def timed(fn, n):
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    # no step stops the bench (divergence), and every step is timed (no warm-up steps)
    cfg = RunConfig(
        model=args.model,
        preset=args.preset,
        optimizer=args.optimizer,
        device="cpu",
        divergence_factor=1e9,
        warmup_steps=0,
    ).resolved()
    rules = load_rules()
    trainer = Trainer(GridCell(cfg, resolve_model(cfg.model, rules)), rules)
    trainer.setup()
    model, optimizer, family = trainer.model, trainer.optimizer, trainer.family
    dataset, _ = load(family, trainer.built.shape, args.steps * cfg.batch_size, 0)
    micro = list(batches(dataset, family, cfg.batch_size, 0, 0))
    tensors = [to_device(b, torch.device("cpu")) for b in micro]

    def harness(i):
        trainer.step([micro[i % len(micro)]])

    def bare(i):
        bare_step(model, optimizer, family, tensors[i % len(tensors)])

    for fn in (bare, harness):  # warm-up
        timed(fn, 2)
    runs = {"bare": bare, "harness, sampler off": harness, "harness, sampler on": harness}
    times = {k: [] for k in runs}
    sampler_cpu = 0.0  # CPU seconds the sampler thread itself used, over all sampler-on rounds
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # ABC, CBA, ...: drift cancels out
        for name in order:
            if name == "harness, sampler on":
                with Monitor() as trainer.monitor:
                    times[name].append(timed(runs[name], args.steps))
                sampler_cpu += trainer.monitor.cpu_seconds
                trainer.monitor = None
            else:
                times[name].append(timed(runs[name], args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{cfg.model}/{cfg.preset} {cfg.optimizer}, batch {cfg.batch_size}, {args.rounds} rounds x {args.steps} steps"
    )
    for k, v in med.items():
        print(f"  {k:22s} median {v * 1000:8.2f} ms/step")

    def paired(a, b):  # the median of per-round ratios: each ratio compares neighbours in time
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    r1 = paired("harness, sampler off", "bare")
    r2 = paired("harness, sampler on", "harness, sampler off")
    print(
        f"harness / bare (median of paired ratios):   {r1:.3f}  (target <= 1.03: {'met' if r1 <= 1.03 else 'MISSED'})"
    )
    print(
        f"sampler on / off (median of paired ratios): {r2:.3f}  (target <= 1.01: {'met' if r2 <= 1.01 else 'MISSED'})"
    )
    share = sampler_cpu / (sum(times["harness, sampler on"]) * args.steps)
    print(f"sampler's own CPU time / wall time:         {share:.4f}  (its cost without the machine's noise)")


if __name__ == "__main__":
    main()
