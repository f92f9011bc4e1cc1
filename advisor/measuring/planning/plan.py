"""`advisor measure --plan`: what a grid will cost before it is run, and how long it takes on W workers.

A cell's time is its updates × the seconds an update takes, plus the rest of its wall time, its start-up:
the model build, the optimizer's construction, the data, the FLOP count, the held-out evaluations the
protocol runs before, during and after training, and the measured step. Both come, in order of trust, from
1. runs of the same cell (its key, any seed) on the target hardware, in any KB in sight (history.py);
2. runs of the same model shape (model, preset, batch, dtype, sizes, device, generated data or not) there:
   the seconds per update of the same optimizer × strategy, the start-up of the same strategy and length;
3. a shape timing here, when planning for this machine, once per model shape (shape_timing.py);
4. `advisor fit`'s FLOPs per update, at the accelerator's peak × MFU, or on a CPU at the GFLOP/s measured
   here (runs, else a shape timing), for shapes nothing above prices (--gpu, a model too large to step
   here); its start-up then counts only the evaluations (a forward pass a third of a step), and says so.
The table says which KB a figure came from. Memory on this machine's CPU is the peak RSS measured (runs of
the same optimizer × strategy, else the timing process, which ran the model's steps); a cell under half
the host's RAM obviously fits, and advisor fit's trace is skipped. Elsewhere (a GPU, --gpu, a model too
large to step here) memory is advisor fit's trace (peak tensors + overhead), once per model shape, against
the accelerator's. Cells predicted not to fit are flagged and left out of the makespan (they end in
seconds). The makespan on W workers is the longest-processing-time-first schedule: cells sorted by time,
each given to the least-loaded worker, which is within 4/3 of the optimum (Graham 1969); a lower bound,
max(total / W, longest cell), is printed beside it.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field, replace

import psutil
import torch

from advisor.errors import FitError, InputError
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.measuring.model.builder import build_model
from advisor.measuring.model.families import family_of
from advisor.measuring.planning.history import (
    History,
    PastFigure,
    cells_done,
    length_of,
    open_kbs,
    read_history,
    shape_of,
)
from advisor.measuring.planning.shape_timing import (
    ShapeTiming,
    evaluations_of,
    preloaded,
    preset_of,
    sizes_of,
    time_shape,
)
from advisor.measuring.recipe.config import ADAPTING, GridCell, RunConfig
from advisor.measuring.tracer.engine import trace
from advisor.prediction import accelerators
from advisor.prediction.answer import fit
from advisor.prediction.cache import open_cache
from advisor.prediction.fit_request import FitRequest
from advisor.prediction.question import question
from advisor.rules import Rules

TIMED_HERE = "calibration"  # where a figure timed by this plan comes from (the others: a KB's label; the
# word is the JSON's and the table's: "calibrated")
OBVIOUS_SHARE = 0.5  # a CPU cell whose measured peak RSS is under this share of the host's RAM fits
TIME_SHARE = 0.25  # a model shape is timed here when 16 bytes a parameter fit in this share of memory


@dataclass
class CellCost:
    """One cell's predicted time and memory, what the time is made of, and where each figure came from."""

    config: RunConfig  # resolved, on the device planned for
    seconds: float | None  # None: nothing to predict it from
    memory_gb: float | None
    fits: bool | None
    source: str  # how its time was priced, in a sentence
    done: bool = False  # already ended in the KB measure writes, on this hardware: measure skips it
    origin: str = "unknown"  # measured (the same cell) | runs | calibrated | fit | unknown
    step: PastFigure | None = None  # seconds per optimizer update
    startup: PastFigure | None = None  # the rest of its wall time: build, data, evaluations, measured step
    startup_parts: dict[str, float] = field(default_factory=dict)  # where the shape timing timed them
    updates: int = 0
    evaluations: int = 0  # held-out evaluations the protocol runs (at most: checks stop at the target)
    memory_from: str | None = None  # peak RSS of runs (a KB's label), the shape timing, or advisor fit
    wall: PastFigure | None = None  # the same cell's measured wall time

    @property
    def label(self) -> str:
        """Where its figures came from, as the table's `from` column says it."""
        if self.wall is not None:
            return f"measured: {_short(self.wall.kb)}"
        parts = [_from(self.step, self.origin), _from(self.startup, "none")]
        return " + ".join(dict.fromkeys(p for p in parts if p))

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
            "origin": self.origin,
            "from": self.label,
            "kb": (self.wall or self.step).kb if (self.wall or self.step) else None,
            "step_s": self.step.value if self.step else None,
            "step_from": self.step.kb if self.step else None,
            "updates": self.updates,
            "startup_s": self.startup.value if self.startup else None,
            "startup_from": self.startup.kb if self.startup else None,
            "startup_parts": self.startup_parts,
            "evaluations": self.evaluations,
            "memory_from": self.memory_from,
            "done": self.done,
        }


def _short(kb: str) -> str:
    return {"your KB": "yours", "shipped KB": "shipped"}.get(kb, kb)


def _from(figure: PastFigure | None, fallback: str) -> str | None:
    """Where a figure came from, in a word or two: runs of a KB, the shape timing, advisor fit (an estimate
    from fit's step says nothing more)."""
    if figure is None or figure.kb == ESTIMATE:
        return None if fallback == "none" else fallback
    if figure.kb == TIMED_HERE:
        return "calibrated"
    return f"runs: {_short(figure.kb)}" if figure.runs else figure.kb


@dataclass
class Plan:
    cells: list[CellCost]
    target: str  # the accelerator planned for, in words
    budget_gb: float
    makespans: dict[int, float] = field(default_factory=dict)  # workers -> seconds (LPT)
    kbs: list[dict] = field(default_factory=list)  # the KBs read, in order of trust, and why one was not
    timings: list[dict] = field(default_factory=list)  # what each model shape cost when timed here
    untimed: list[str] = field(default_factory=list)  # shapes not timed here, and why (fit prices them)

    @property
    def assumptions(self) -> list[str]:
        """What every plan assumes, in clauses (the table's last line, the JSON's `assumptions`)."""
        return ASSUMPTIONS

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
            "kbs": self.kbs,
            "calibrations": self.timings,  # the JSON's keys, as before the shape timing was named
            "uncalibrated": self.untimed,
            "assumptions": self.assumptions,
        }


ASSUMPTIONS = [
    "a cell's start-up (build, optimizer, data, FLOP count, first update, held-out evaluations, measured "
    "step) is measured: runs of the same strategy here, else timed here now; priced by advisor fit alone, "
    "it counts only the evaluations, a forward pass a third of a training step per example",
    "every target check the protocol allows is counted (checks stop once the target is reached)",
    "a calibration keeps the best of its repeats (contention only slows a step down): it prices this "
    "machine unloaded, and runs show what load adds",
    "not counted: the grid's own start (its worker process importing torch, once) and each cell's process "
    "starting and ending around its run",
    "cells predicted not to fit, cells of unknown cost and cells already done are left out (counted apart)",
    "makespan: longest cell first to the least-loaded worker, within 4/3 of the optimum; advisor measure runs "
    "cells in a shuffled order instead (drift must not follow a configuration), within 2 - 1/W of it",
]


def lpt_makespan(costs: list[float], workers: int) -> float:
    """The longest-processing-time-first schedule's makespan of `costs` on `workers` identical workers (more
    workers than cells idle: the schedule is that of one worker per cell, whatever the count asked)."""
    loads = [0.0] * min(workers, max(len(costs), 1))
    for cost in sorted(costs, reverse=True):
        heapq.heapreplace(loads, loads[0] + cost)
    return max(loads, default=0.0)


def plan_cells(
    cells: list[GridCell],
    rules: Rules,
    gpu: str | None,
    workers: list[int],
    db=None,
    fresh: bool = False,
) -> Plan:
    """Every cell's predicted time and memory on `gpu` (None: this machine), and the makespans.
    `fresh`: price every cell from its shape timed here now, whatever the KBs hold (this machine only)."""
    acc, device = _target(cells, gpu, rules)
    if fresh and gpu is not None:
        raise InputError("a calibration times this machine: plan without --gpu to calibrate.", "gpu")
    planned = [c.on(device) for c in cells]
    questions = _fit_questions(planned, acc, rules)  # every option checked against the model, nothing traced
    here = describe(device)["hardware"] if gpu is None else None
    kbs = open_kbs(db)
    try:
        history = (
            History()
            if fresh
            else read_history(
                kbs, lambda hw: _same_hardware(hw, here, acc, rules), {c.config.model for c in cells}
            )
        )
        done = cells_done(kbs[0].conn, here) if here else set()
    finally:
        for kb in kbs:
            if kb.conn is not None:
                kb.conn.close()
    timings, untimed = _time_shapes(planned, history, rules, fresh) if here else ({}, [])
    host_gb = accelerators.memory_gb(acc) if device == "cpu" else None
    costs = [_price(cell, history, timings, rules, host_gb) for cell in planned]
    _fill_from_fit(costs, questions, rules, db, history, timings)
    for cost in costs if done else ():
        cost.done = (_key(cost.config), cost.config.seed) in done
    plan = Plan(costs, acc.name, accelerators.memory_gb(acc))
    plan.kbs = [kb.as_dict() for kb in kbs]
    plan.timings = [t.as_dict(shape) for shape, t in timings.items() if t is not None]
    plan.untimed = untimed
    plan.makespans = {w: lpt_makespan(plan.runnable, w) for w in workers}
    return plan


def _target(cells: list[GridCell], gpu: str | None, rules: Rules) -> tuple:
    """(the accelerator planned for, the device its cells run on: cpu or cuda)."""
    if gpu is not None:
        acc = accelerators.resolve(gpu, rules)
        return acc, "cpu" if acc.key == "cpu" else "cuda"
    asked = {c.config.device for c in cells} or {"auto"}
    if "cuda" in asked and not torch.cuda.is_available():
        raise InputError(
            "--device cuda, but this machine has no GPU: pass --gpu NAME, the accelerator the cells will run on.",
            "gpu",
        )
    device = resolve_device(next(iter(asked)))
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return accelerators.resolve(name, rules), device


def _key(cfg: RunConfig) -> str:
    """The cell key a planned (resolved, device set) configuration is stored under."""
    return cfg.cell_key()


def _same_hardware(hardware: str, here: str | None, acc, rules: Rules) -> bool:
    """Whether runs on `hardware` are the target's: this machine's, or (--gpu) the accelerator's."""
    if here is not None:
        return hardware == here
    return accelerators.find(hardware, rules) is acc


# --- which model shapes are timed here ----------------------------------------------------------------


def _time_shapes(cells: list[GridCell], history: History, rules: Rules, every: bool) -> tuple:
    """({shape: its ShapeTiming, or None}, [why a shape was not timed]): each shape some cell of which
    past runs do not price (`every`: all) is timed here, unless too large to build here or its timing
    failed (advisor fit then prices it)."""
    shapes: dict[tuple, list[GridCell]] = {}
    for cell in cells:
        shapes.setdefault(shape_of(cell.config), []).append(cell)
    out, why = {}, []
    for shape, members in shapes.items():
        if not every and all(_priced_by_runs(c.config, history) for c in members):
            continue
        out[shape], name = None, members[0].config.model
        reason = _not_timed(members[0], rules)
        if reason:
            why.append(f"{name}: {reason}")
            continue
        preloaded(rules)
        try:
            out[shape] = time_shape(members, rules)
        except Exception as e:  # a model this process cannot step is the cells' to report; fit prices them
            why.append(f"{name}: its calibration failed ({type(e).__name__}: {str(e)[:200]})")
    return out, why


def _priced_by_runs(cfg: RunConfig, history: History) -> bool:
    shape = shape_of(cfg)
    if _key(cfg) in history.walls:
        return True
    return (shape, cfg.optimizer, cfg.strategy) in history.steps and (
        shape,
        length_of(cfg),
        cfg.strategy,
    ) in history.startups


def _not_timed(cell: GridCell, rules: Rules) -> str | None:
    """Why the cell's model may not be built and stepped here, or None: its fp32 weights, gradients and two
    moments (16 bytes a parameter, counted on PyTorch's meta device: nothing allocated) must fit in
    TIME_SHARE of the memory free on its device."""
    cfg = cell.config
    try:
        with torch.device("meta"):
            n_params = build_model(
                cell.model, preset_of(cfg), rules, cfg.dropout, cfg.seed, sizes_of(cfg)
            ).n_params
    except Exception as e:  # a folder with weights (a base) refuses the meta device: its config says its size
        n_params = cell.model.approx_params
        if not n_params:  # the cells will report it; fit prices them meanwhile
            return f"its model could not be built ({type(e).__name__}: {str(e)[:200]})"
    need, free = 16 * n_params / 1e9, _available_bytes(cfg.device) / 1e9
    if need > TIME_SHARE * free:
        return f"too large to step here ({need:.1f} GB of weights, gradients and moments; {free:.1f} GB free)"
    return None


def _available_bytes(device: str) -> float:
    if device == "cuda":
        return float(torch.cuda.mem_get_info()[0])
    return float(psutil.virtual_memory().available)


# --- each cell's price ----------------------------------------------------------------------------------

SOURCES = {
    "measured": "measured: the mean wall time of the same cell's ok runs on this hardware",
    "runs": "runs: past runs of the same model shape on this hardware: the median seconds per update of the "
    "same optimizer × strategy, and the mean start-up (wall time less training) of the same strategy and "
    "protocol",
    "calibrated": "calibrated: timed here now on the model built from its config, as a cell runs it: its "
    "build, data, FLOP count, an evaluation and the measured step; a micro-batch's forward and backward per "
    "kind of checkpointing and each optimizer's step, at the cell's batch size (runs first, where they "
    "price a part)",
}
ESTIMATE = "evaluations only"  # a start-up nothing measured: its evaluations at a third of a step each


def _price(cell: GridCell, history: History, timings: dict, rules: Rules, host_gb) -> CellCost:
    """A cell's time from runs of the same cell, else runs of its shape, else its shape's timing here
    (seconds None: advisor fit prices it), and its memory where a measured peak RSS obviously fits."""
    cfg = cell.config
    pair = (shape_of(cfg), cfg.optimizer, cfg.strategy)
    timed = timings.get(pair[0])
    updates = cfg.epochs * cfg.updates_per_epoch
    cost = CellCost(cfg, None, None, None, "", updates=updates, evaluations=evaluations_of(cell, rules))
    _host_memory(cost, history.rss.get(pair), timed, host_gb)
    wall = history.walls.get(_key(cfg))
    if wall is not None:
        cost.wall, cost.origin, cost.seconds, cost.source = wall, "measured", wall.value, SOURCES["measured"]
        return cost
    cost.step = history.steps.get(pair)
    cost.startup = history.startups.get((pair[0], length_of(cfg), cfg.strategy))
    if timed is not None and cost.step is None:
        cost.step = PastFigure(timed.step(cfg.optimizer, cfg.strategy), 0, TIMED_HERE)
    if timed is not None and cost.startup is None:
        cost.startup_parts = timed.startup(cfg.optimizer, cfg.strategy, cost.evaluations)
        cost.startup = PastFigure(sum(cost.startup_parts.values()), 0, TIMED_HERE)
    if cost.step is not None:
        here = TIMED_HERE in (cost.step.kb, cost.startup and cost.startup.kb)
        _settle(cost, "calibrated" if here else "runs", SOURCES["calibrated" if here else "runs"])
    return cost


def _settle(cost: CellCost, origin: str, source: str) -> None:
    """The cell's time from its step and start-up (estimated from its evaluations where none is known)."""
    if cost.startup is None:
        cost.startup_parts = {"evaluations": _evaluations_s(cost.config, cost.step.value, cost.evaluations)}
        cost.startup = PastFigure(cost.startup_parts["evaluations"], 0, ESTIMATE)
    cost.origin, cost.source = origin, source
    cost.seconds = cost.startup.value + cost.updates * cost.step.value


def _evaluations_s(cfg: RunConfig, step_s: float, evaluations: int) -> float:
    """Held-out evaluations when none was timed: a forward pass costs a third of a training step."""
    per_example = step_s / (cfg.batch_size * cfg.window) / 3
    return evaluations * cfg.eval_examples * per_example


def _host_memory(
    cost: CellCost, runs: PastFigure | None, timed: ShapeTiming | None, host_gb: float | None
) -> None:
    """On this machine's CPU: the peak RSS measured (the pair's runs, else the shape timing's process) as
    the cell's memory, where it is under OBVIOUS_SHARE of the host's RAM: it fits, and no trace is made."""
    if host_gb is None:
        return
    figure = runs or (PastFigure(timed.rss_gb, 0, TIMED_HERE) if timed is not None else None)
    if figure is not None and figure.value <= OBVIOUS_SHARE * host_gb:
        cost.memory_gb, cost.fits, cost.memory_from = figure.value, True, figure.kb


# --- advisor fit, where nothing measured prices a cell ---------------------------------------------------


def _fill_from_fit(costs: list[CellCost], questions: dict, rules: Rules, db, history, timings) -> None:
    """Memory from advisor fit's trace for the cells no measured figure sizes, and time from its FLOPs
    for the cells nothing measured prices; one fit per model shape, none when no cell needs it."""
    need = [cost for cost in costs if cost.fits is None or cost.seconds is None]
    if not need:
        return
    shapes = {_fit_shape(cost.config) for cost in need}
    rows = _fit_rows({shape: questions[shape] for shape in shapes}, rules, open_cache(db))
    acc = next(iter(questions.values()))[1].accelerator
    rates = _cpu_rates(history, timings) if acc.key == "cpu" else {}
    for cost in need:
        cfg = cost.config
        row, mfu = rows[(*_fit_shape(cfg), cfg.optimizer, cfg.strategy)]
        if cost.fits is None:
            cost.memory_gb, cost.fits, cost.memory_from = row.memory_gb["total"], row.fits, "fit"
        if cost.seconds is None:
            _price_by_fit(cost, row, mfu, rates)


def _price_by_fit(cost: CellCost, row, mfu: float, rates: dict) -> None:
    cfg = cost.config
    step_s, how = (
        row.predicted_step_s,
        f"advisor fit's step time (its FLOPs at {mfu:.0%} of peak, docs/fit.md)",
    )
    rate = rates.get((cfg.model, cfg.preset)) or rates.get(None)
    if rate:  # measured on this CPU, by runs of the shape or this plan: before fit's step time
        step_s = row.step_flops / (rate.value * 1e9)
        measured = "this plan's calibration" if rate.kb == TIMED_HERE else f"runs in {rate.kb}"
        how = f"advisor fit's FLOPs per update at the {rate.value:.1f} GFLOP/s measured on this CPU ({measured})"
    if step_s is None:
        cost.source = "unknown: the accelerator states no peak FLOP/s and nothing was measured on it"
        return
    cost.step = PastFigure(step_s, 0, "fit")
    _settle(cost, "fit", f"fit: {how}; the start-up from runs of the shape, else its evaluations alone")


def _cpu_rates(history: History, timings: dict) -> dict:
    """GFLOP/s measured on this CPU: by (model, preset) and over all (None), from runs, else shape timings."""
    rates = dict(history.gflops)
    timed = [t.gflops for t in timings.values() if t is not None and t.gflops]
    if None not in rates and timed:
        rates[None] = PastFigure(statistics.median(timed), 0, TIMED_HERE)
    return rates


def _fit_questions(cells: list[GridCell], acc, rules: Rules) -> dict[tuple, tuple]:
    """fit shape -> (its cell, advisor fit's question of its optimizers and strategies): built for every
    shape, so that an option the model does not take is refused (InputError) whatever prices the cells."""
    groups: dict[tuple, tuple[GridCell, set[tuple[str, str]]]] = {}
    for cell in cells:
        cfg = cell.config
        strategy = rules.as_fit(cfg.strategy)[1]  # the step advisor fit predicts (the adapter is the shape's)
        groups.setdefault(_fit_shape(cfg), (cell, set()))[1].add((cfg.optimizer, strategy))
    out = {}
    for shape, (cell, pairs) in groups.items():
        model, options = _fit_question(cell, pairs, rules)
        try:
            out[shape] = (cell, question(model, options, rules, accelerator=acc))
        except FitError as e:
            raise InputError(f"cannot plan {cell.config.model}: {e}", "models") from e
    return out


def _fit_rows(questions: dict[tuple, tuple], rules: Rules, cache) -> dict[tuple, object]:
    """(model, preset, batch, dtype, k, seq, image, optimizer, strategy) -> (advisor fit's Row, its MFU),
    one traced fit per model shape asked."""
    rows: dict[tuple, object] = {}
    for shape, (cell, asked) in questions.items():
        try:
            answer = fit(asked, rules, cache, trace)
        except FitError as e:
            raise InputError(f"cannot plan {cell.config.model}: {e}", "models") from e
        for r in answer.rows:  # a cell's strategy, from the configuration of fit it trains (rules' as_fit)
            for strategy in rules.strategies:
                if rules.as_fit(strategy) == (r.adapter.kind, r.strategy):
                    rows[(*shape, r.optimizer, strategy)] = (r, answer.mfu)
    return rows


def _fit_question(cell: GridCell, pairs: set[tuple[str, str]], rules: Rules):
    """advisor fit's model and options for a resolved cell: a reference model at its preset, with that
    preset's sequence length and image size unless the cell sets its own."""
    cfg, model = cell.config, cell.model
    seq, image = cfg.seq_len, cfg.image_size
    if model.reference:
        model = replace(model, preset=cfg.preset)
        _, shape = family_of(model, rules).reference_config(cfg.preset)
        seq = seq if seq is not None else shape.seq_len if model.family.takes_text else None
        image = image if image is not None else shape.image_size if model.family.takes_images else None
    options = FitRequest(
        batch_size=cfg.batch_size,
        seq_len=seq,
        image_size=image,
        dtype=cfg.dtype,
        accumulation_steps=cfg.accumulation_steps,
        optimizers=tuple(sorted({o for o, _ in pairs})),
        strategies=tuple(sorted({s for _, s in pairs})),
        adapters=(
            rules.as_fit(cfg.strategy)[0],
        ),  # what advisor measure trains: full, or the shape's adapter
        offload=("none",),
        method="trainer",  # advisor measure trains with Trainer
    )
    return model, options


def _fit_shape(cfg: RunConfig) -> tuple:
    """What a fit question depends on besides the optimizer and strategy (a resolved cell): one adapter each
    (full, or an adapter strategy's), so that no question asks an optimizer for an adapter it does not train."""
    return (
        cfg.strategy if cfg.strategy in ADAPTING else "full",
        cfg.model,
        cfg.preset,
        cfg.batch_size,
        cfg.dtype,
        cfg.accumulation_steps,
        cfg.seq_len,
        cfg.image_size,
    )
