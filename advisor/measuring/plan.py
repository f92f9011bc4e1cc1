"""`advisor measure --plan`: what a grid will cost before it is run, and how long it takes on W workers.

Each cell's time comes, in order of trust, from
1. measured evidence of the same cell (its key, any seed) on the target hardware: the median wall time,
   claim to finish, of its `ok` runs in the KB (only when planning for this machine);
2. `advisor fit`'s FLOPs per optimizer update, at the accelerator's peak times the MFU fit uses (measured
   on it in the KB, else its default), or on a CPU at the median GFLOP/s achieved by runs measured on this
   CPU (of the same model and preset where there are some); times the cell's updates, plus its held-out evaluations (a forward pass is a third of a step) and a
   stated start-up cost (a fresh process imports torch and builds the model);
and its memory from `advisor fit` (peak tensors + overhead) against the accelerator's. Cells predicted not
to fit are flagged and left out of the makespan (they end in seconds). The makespan on W workers is the
longest-processing-time-first schedule: cells sorted by time, each given to the least-loaded worker, which
is within 4/3 of the optimum (Graham 1969); a lower bound, max(total / W, longest cell), is printed beside it.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from advisor.errors import FitError, InputError, KBError
from advisor.kb.reader import open_for_reading
from advisor.kb.store import FINAL
from advisor.measuring.config import GridCell, RunConfig
from advisor.measuring.families import family
from advisor.measuring.hardware import describe, resolve_device
from advisor.measuring.prediction import trace
from advisor.prediction import accelerators
from advisor.prediction.answer import fit
from advisor.prediction.cache import open_cache
from advisor.prediction.question import FitOptions, question
from advisor.rules import Rules

STARTUP_S = 10.0  # a cell's fresh process: imports, model build, data (seconds; measured 1-8 s here)


@dataclass
class CellCost:
    config: RunConfig  # resolved
    seconds: float | None  # None: nothing to predict it from
    memory_gb: float | None
    fits: bool | None
    source: str
    done: bool = False  # already ended in the KB measure writes, on this hardware: measure skips it

    def as_dict(self) -> dict:
        c = self.config
        return {
            "model": c.model,
            "preset": c.preset,
            "optimizer": c.optimizer,
            "strategy": c.strategy,
            "seed": c.seed,
            "predicted_s": self.seconds,
            "memory_gb": self.memory_gb,
            "fits": self.fits,
            "source": self.source,
            "done": self.done,
        }


@dataclass
class Plan:
    cells: list[CellCost]
    target: str  # the accelerator planned for, in words
    budget_gb: float
    makespans: dict[int, float] = field(default_factory=dict)  # workers -> seconds (LPT)

    @property
    def runnable(self) -> list[float]:
        """The predicted times of the cells measure would run: not done, predicted to fit, of known cost."""
        return [c.seconds for c in self.cells if c.seconds is not None and c.fits is not False and not c.done]

    def lower_bound(self, workers: int) -> float:
        costs = self.runnable
        return max(sum(costs) / workers, max(costs, default=0.0))

    def as_dict(self) -> dict:
        return {
            "target": self.target,
            "memory_gb": round(self.budget_gb, 2),
            "cells": [c.as_dict() for c in self.cells],
            "not_fitting": sum(c.fits is False for c in self.cells),
            "done": sum(c.done for c in self.cells),
            "unknown_cost": sum(c.seconds is None for c in self.cells),
            "total_s": sum(self.runnable),
            "makespan_s": {str(w): s for w, s in self.makespans.items()},
            "lower_bound_s": {str(w): self.lower_bound(w) for w in self.makespans},
            "assumptions": ASSUMPTIONS,
        }


ASSUMPTIONS = [
    f"each cell pays {STARTUP_S:.0f} s to start (fresh process, imports, model build)",
    "held-out evaluation: a forward pass costs a third of a training step per example",
    "cells predicted not to fit, cells of unknown cost and cells already done are left out (counted apart)",
    "makespan: longest cell first to the least-loaded worker, within 4/3 of the optimum; advisor measure runs "
    "cells in a shuffled order instead (drift must not follow a configuration), within 2 - 1/W of it",
]


def lpt_makespan(costs: list[float], workers: int) -> float:
    """The longest-processing-time-first schedule's makespan of `costs` on `workers` identical workers."""
    loads = [0.0] * workers
    for cost in sorted(costs, reverse=True):
        heapq.heapreplace(loads, loads[0] + cost)
    return max(loads, default=0.0)


def plan_cells(cells: list[GridCell], rules: Rules, gpu: str | None, workers: list[int], db=None) -> Plan:
    """Every cell's predicted time and memory on `gpu` (None: this machine), and the makespans."""
    configs = [c.config for c in cells]
    acc = accelerators.resolve(gpu or _this_accelerator(), rules)
    if gpu is None and any(c.device == "cuda" for c in configs) and _this_accelerator() == "cpu":
        raise InputError(
            "--device cuda, but this machine has no GPU: pass --gpu NAME, the accelerator the cells will run on.",
            "--gpu",
        )
    cache = open_cache(db)
    runs = _evidence(db)
    here = _this_hardware() if gpu is None else None  # measured evidence and done cells: this machine's
    evidence = _measured_times(runs, configs, here) if here else {}
    rate = _cpu_gflops(runs) if acc.key == "cpu" else {}
    fits = _fit_rows(cells, acc, rules, cache)
    costs = [_cost(c.resolved(), evidence, fits, rate) for c in configs]
    done = _done(cache.read, here) if here else set()
    for cost in costs if done else ():
        cost.done = (_key(cost.config), cost.config.seed) in done
    plan = Plan(costs, acc.name, accelerators.memory_gb(acc))
    plan.makespans = {w: lpt_makespan(plan.runnable, w) for w in workers}
    return plan


def _evidence(db):
    """The runs to price cells from: --db's KB alone, else the shipped KB with the user's (None: none)."""
    try:
        return open_for_reading(db)
    except KBError:  # a KB that does not exist yet (measure creates it) has no evidence
        return None


def _this_accelerator() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def _this_hardware() -> str:
    return describe(resolve_device("auto"))["hardware"]


def _done(read, hardware: str) -> set[tuple[str, int]]:
    """(cell key, seed) of the cells that already ended (ok, oom, diverged, untrained) on `hardware` in the
    KB measure writes: it would skip them."""
    if read is None:
        return set()
    rows = read.execute(
        f"SELECT cell_key, seed FROM runs WHERE hardware = ? AND status IN ({','.join('?' * len(FINAL))})",
        [hardware, *FINAL],
    ).fetchall()
    return {tuple(row) for row in rows}  # sqlite3.Row compares to no tuple


def _measured_times(read, configs: list[RunConfig], hardware: str) -> dict[str, tuple[float, int]]:
    """cell key -> (median wall time from claim to finish, runs) of the cells' ok runs on `hardware`."""
    if read is None:
        return {}
    keys = {_key(c.resolved()) for c in configs}
    rows = read.execute(
        "SELECT cell_key, (julianday(finished_at) - julianday(started_at)) * 86400 FROM runs "
        "WHERE status = 'ok' AND hardware = ? AND source = 'measured' AND finished_at IS NOT NULL",
        [hardware],
    ).fetchall()
    times: dict[str, list[float]] = {}
    for key, seconds in rows:
        if key in keys and seconds is not None:
            times.setdefault(key, []).append(seconds)
    return {k: (statistics.median(v), len(v)) for k, v in times.items()}


def _key(cfg: RunConfig) -> str:
    return replace(cfg, device=resolve_device(cfg.device)).cell_key()


def _cpu_gflops(read) -> dict[tuple[str, str] | None, float]:
    """The median GFLOP/s achieved by ok runs measured on this CPU, per (model, preset) and over all (None)."""
    if read is None:
        return {}
    rows = read.execute(
        "SELECT r.model, r.preset, m.value FROM metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE m.name = 'achieved_gflops' AND r.status = 'ok' AND r.hardware = ?",
        [describe("cpu")["hardware"]],
    ).fetchall()
    by: dict = {}
    for model, preset, value in rows:
        by.setdefault((model, preset), []).append(value)
        by.setdefault(None, []).append(value)
    return {k: statistics.median(v) for k, v in by.items()}


def _fit_rows(cells: list[GridCell], acc, rules: Rules, cache) -> dict[tuple, object]:
    """(model, preset, batch, dtype, k, optimizer, strategy) -> (advisor fit's Row, its MFU), one fit per
    model shape."""
    groups: dict[tuple, tuple[GridCell, set[tuple[str, str]]]] = {}
    for cell in cells:
        cfg = cell.config.resolved()
        strategy = rules.arms.get(cfg.strategy, cfg.strategy)  # a measured arm steps as its strategy does
        groups.setdefault(_shape(cfg), (GridCell(cfg, cell.model), set()))[1].add((cfg.optimizer, strategy))
    rows: dict[tuple, object] = {}
    for shape, (cell, pairs) in groups.items():
        model, options = _fit_question(cell, pairs, rules)
        try:
            answer = fit(question(model, options, rules, accelerator=acc), rules, cache, trace)
        except FitError as e:
            raise InputError(f"cannot plan {cell.config.model}: {e}", "--model") from e
        rows.update({(*shape, r.optimizer, r.strategy): (r, answer.mfu) for r in answer.rows})
    for arm, base in rules.arms.items():
        rows |= {(*k[:-1], arm): v for k, v in list(rows.items()) if k[-1] == base}
    return rows


def _fit_question(cell: GridCell, pairs: set[tuple[str, str]], rules: Rules):
    """advisor fit's model and options for a resolved cell: a reference model at its preset, with that
    preset's sequence length and image size unless the cell sets its own."""
    cfg, model = cell.config, cell.model
    seq, image = cfg.seq_len, cfg.image_size
    if model.reference:
        model = replace(model, preset=cfg.preset)
        _, shape = family(model.family.name, rules).reference_config(cfg.preset)
        seq = seq if seq is not None else shape.seq_len if model.family.takes_text else None
        image = image if image is not None else shape.image_size if model.family.takes_images else None
    options = FitOptions(
        batch_size=cfg.batch_size,
        seq_len=seq,
        image_size=image,
        dtype=cfg.dtype,
        accumulation_steps=cfg.accumulation_steps,
        optimizers=tuple(sorted({o for o, _ in pairs})),
        strategies=tuple(sorted({s for _, s in pairs})),
        adapters=("full",),  # what advisor measure trains
        offload=("none",),
    )
    return model, options


def _shape(cfg: RunConfig) -> tuple:
    """What a fit question depends on besides the optimizer and strategy (a resolved cell)."""
    return (
        cfg.model,
        cfg.preset,
        cfg.batch_size,
        cfg.dtype,
        cfg.accumulation_steps,
        cfg.seq_len,
        cfg.image_size,
    )


def _cost(cfg: RunConfig, evidence: dict, fits: dict, cpu_gflops: dict) -> CellCost:
    row, mfu = fits[(*_shape(cfg), cfg.optimizer, cfg.strategy)]
    memory, ok = row.memory_gb["total"], row.fits
    measured = evidence.get(_key(cfg)) if evidence else None
    if measured:
        seconds, n = measured
        return CellCost(
            cfg,
            seconds,
            memory,
            ok,
            f"measured: the median wall time of {n} ok run{'s' * (n > 1)} of the cell here",
        )
    step_s, source = row.predicted_step_s, f"fit: advisor fit's FLOPs per update at peak × MFU {mfu:.0%}"
    rate = cpu_gflops.get((cfg.model, cfg.preset))
    where = f"{cfg.model}/{cfg.preset}"
    if rate is None:
        rate, where = cpu_gflops.get(None), "any model"
    if step_s is None and rate:
        step_s = row.step_flops / (rate * 1e9)
        source = (
            f"fit: advisor fit's FLOPs per update at the {rate:.1f} GFLOP/s measured on this CPU ({where})"
        )
    if step_s is None:
        return CellCost(
            cfg,
            None,
            memory,
            ok,
            "unknown: the accelerator states no peak FLOP/s and no run was measured on it",
        )
    return CellCost(cfg, _cell_seconds(cfg, step_s), memory, ok, source)


def _cell_seconds(cfg: RunConfig, step_s: float) -> float:
    """Start-up, every optimizer update, and the held-out evaluations of the fair protocol."""
    updates = cfg.epochs * cfg.updates_per_epoch
    train = updates * step_s
    if cfg.protocol != "fair":
        return STARTUP_S + train
    checks = cfg.epochs * (math.ceil(cfg.updates_per_epoch / 4) + 1)
    per_example = step_s / (cfg.batch_size * cfg.window) / 3
    return STARTUP_S + train + checks * cfg.eval_examples * per_example


def hours(seconds: float) -> str:
    """A duration as people read it: s, min or h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def plan_view(plan: Plan):
    """The cells (seeds folded into one row), where their costs come from, and what they add up to."""
    sources = [Text(f"{s.split(':')[0]}: {s.split(':', 1)[-1].strip()}", style="dim") for s in _sources(plan)]
    return Group(_cells_table(plan), *sources, *_totals(plan))


def _sources(plan: Plan) -> list[str]:
    return sorted({c.source for c in plan.cells})


def _cells_table(plan: Plan) -> Table:
    """One row per model × optimizer × strategy (its seeds folded), narrow enough for 80 columns."""
    title = f"Plan on {plan.target} ({plan.budget_gb:.0f} GB; ✗: predicted not to fit)"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    any_done = any(c.done for c in plan.cells)
    for name in ("model", "optimizer", "strategy", "seeds", *["done"] * any_done, "time", "GB", "from"):
        right = name in ("seeds", "done", "time", "GB")
        wraps = name == "strategy"  # "checkpointing +" / "accumulation" on two lines
        table.add_column(name, justify="right" if right else "left", no_wrap=not wraps, min_width=15 * wraps)
    rows: dict[tuple, list[CellCost]] = {}
    for cell in plan.cells:
        c = cell.config
        rows.setdefault((c.model, c.preset, c.optimizer, c.strategy), []).append(cell)
    for (model, preset, optimizer, strategy), cells in rows.items():
        first = cells[0]
        memory = "?" if first.memory_gb is None else f"{first.memory_gb:.2f}"
        table.add_row(
            f"{model}/{preset}" if "/" not in model else Path(model).name,
            optimizer,
            strategy.replace("+", " + "),
            str(len(cells)),
            *[str(sum(c.done for c in cells))] * any_done,
            "?" if first.seconds is None else hours(first.seconds),
            f"[red]{memory} ✗[/]" if first.fits is False else memory,  # a mark that survives piping
            first.source.split(":")[0],
        )
    return table


def _totals(plan: Plan) -> list[Text]:
    """The cells left out and why, the work left, and the makespan per worker count."""
    lines = []
    bad = sum(c.fits is False for c in plan.cells)
    if bad:
        lines.append(Text(f"{bad} cells predicted not to fit: they would end out of memory.", style="red"))
    done = sum(c.done for c in plan.cells)
    if done:
        lines.append(Text(f"{done} cells already ended in the KB measure writes: it skips them."))
    unknown = sum(c.seconds is None for c in plan.cells)
    known = " (of the cells of known cost)" if unknown else ""
    if unknown:
        lines.append(Text(f"{unknown} cells of unknown cost: the makespan leaves them out.", style="yellow"))
    lines.append(
        Text(f"{len(plan.runnable)} cells to run{known}, {hours(sum(plan.runnable))} of work in all.")
    )
    for workers, span in plan.makespans.items():
        bound = hours(plan.lower_bound(workers))
        plural = "s" * (workers > 1)
        lines.append(Text(f"Makespan on {workers} worker{plural}{known}: {hours(span)} (at least {bound})"))
    lines.append(Text("Assumptions: " + "; ".join(ASSUMPTIONS) + ".", style="dim"))
    return lines
