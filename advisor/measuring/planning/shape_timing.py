"""The shape timing of `advisor measure --plan`: a model shape timed on this machine, as its cells run it
(`advisor calibrate` is another thing: the device's rates, advisor.measuring.device_speed).

The model built from its config as a cell builds it, its data, an evaluation, the FLOP count and the
measured step timed as a cell runs them; one micro-batch's forward and backward under each kind of
checkpointing the grid's strategies use (a window of k micro-batches is k of them), each optimizer's step
alone, each line-searching optimizer's whole update with its passes counted, each update under an adapter
(LoRA: peft's adapters on the frozen model, a few parameters to step) timed whole; and the rest of a cell (its run
claimed, the KB's writes, the monitor) from one whole cell of two updates run into a temporary KB, less those
parts. An update is its window of passes plus its optimizer's step: every optimizer × strategy is priced
without timing each (advisor.measuring.planning.plan prices the cells from it, where no past run does).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import math
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from advisor.kb import store
from advisor.kb.open import writing
from advisor.measuring.data.corpus import epoch_batches, load
from advisor.measuring.grid.isolation import preload
from advisor.measuring.grid.runner import run_cell
from advisor.measuring.machine.monitor import process_rss_gb
from advisor.measuring.model.builder import build_model
from advisor.measuring.model.families.base import Sizes
from advisor.measuring.planning.history import SHAPE_FIELDS
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.recipe.optimizers import make_optimizer
from advisor.measuring.recipe.strategies import checkpointing_of, prepare, train_step
from advisor.measuring.training.flops import forward_flops_per_position, known_peak, positions
from advisor.measuring.training.heldout import HeldOut
from advisor.measuring.training.protocol import target_loss
from advisor.measuring.training.tensors import measured_step
from advisor.measuring.training.trainer import (  # a shape timing builds, times as cells do
    adapted_as_run,
    clock,
)
from advisor.rules import Rules

# A shape timing's figures: repeats until STEP_BUDGET_S is spent, at most MAX_TIMED, and their best kept:
# contention only ever slows a step (the machine's own speed is the best; runs record what it adds).
STEP_BUDGET_S = 0.15
MAX_TIMED = 3


@dataclass
class ShapeTiming:
    """What one model shape cost when timed here, in seconds: the phases a cell runs besides its training
    steps, and what an update is made of, from which each optimizer × strategy's is derived (`step`)."""

    cell: str  # the cell it was built as, in words
    build_s: float  # the model built from its config and moved to the device
    data_s: float  # the training set and the held-out set prepared
    flops_s: float  # the forward a cell counts its FLOPs on
    eval_s: float  # one held-out evaluation
    warm_s: float  # what a model's first update costs beyond a later one (allocations, kernels chosen)
    measured_step_s: float  # the step a cell measures under PyTorch's MemTracker, of the reference pair
    reference: tuple[str, str]  # the plain optimizer the passes were timed with, and the base strategy
    passes_s: dict[str, float]  # strategy -> one micro-batch's collation, forward and backward
    windows: dict[str, int]  # strategy -> micro-batches per update
    updates: dict[str, float]  # plain optimizer -> its step alone (no line search)
    searches: dict[str, tuple[float, float]]  # line-searching optimizer -> (its update at the base
    # strategy, timed whole; forward and backward passes per update, counted)
    optimizers: dict[str, float]  # each optimizer's construction, imports included (OPTIMIZER_BUILDS)
    wholes: dict[tuple[str, str], float]  # (optimizer, adapter strategy) -> its update, timed whole
    rss_gb: float  # this process's resident memory after the steps (what a cell's process holds, at most)
    gflops: float | None  # model FLOPs per second the reference pair achieved
    wall_s: float  # what the timing itself took
    rest_s: float = 0.0  # the rest of a cell: a whole one's start-up less the parts timed (`rest_of_a_cell`)

    def passes(self, strategy: str) -> float:
        """The forward and backward passes of an update's window of micro-batches under `strategy`."""
        return self.windows[strategy] * self.passes_s[strategy]

    def step(self, optimizer: str, strategy: str) -> float:
        """Seconds per update: the strategy's window of passes and the optimizer's step; a line search's is
        its own update at the base strategy plus the strategy's difference once per pass it makes; an
        adapter's, its own update timed whole (its passes and its step are not a full model's)."""
        if (optimizer, strategy) in self.wholes:
            return self.wholes[(optimizer, strategy)]
        if optimizer in self.updates:
            return self.passes(strategy) + self.updates[optimizer]
        own, passes = self.searches[optimizer]
        base = self.reference[1]
        return max(own + (self.passes(strategy) - self.passes(base)) * passes, own / 2)

    def startup(self, optimizer: str, strategy: str, evaluations: int) -> dict[str, float]:
        """A cell's start-up, by part: build, its optimizer's construction (imports included), data, FLOP
        count, its first update's extra, its evaluations, its measured step (the reference's, scaled to the
        cell's update as derived here)."""
        scale = self.step(optimizer, strategy) / self.step(*self.reference)
        return {
            "build": self.build_s,
            "optimizer": self.optimizers.get(optimizer, 0.0),
            "data": self.data_s,
            "flop count": self.flops_s,
            "warm-up": self.warm_s,
            "evaluations": evaluations * self.eval_s,
            "measured step": self.measured_step_s * scale,
            "rest": self.rest_s,
        }

    def as_dict(self, shape: tuple) -> dict:
        return {
            **dict(zip(SHAPE_FIELDS, shape, strict=False)),
            "cell": self.cell,
            "build_s": self.build_s,
            "data_s": self.data_s,
            "flops_s": self.flops_s,
            "eval_s": self.eval_s,
            "warm_s": self.warm_s,
            "measured_step_s": self.measured_step_s,
            "reference": "+".join(self.reference),
            "passes_s": self.passes_s,
            "windows": self.windows,
            "optimizer_steps": self.updates,
            "line_searches": {o: {"update_s": s, "passes": p} for o, (s, p) in self.searches.items()},
            "whole_updates": {"+".join(k): v for k, v in self.wholes.items()},
            "optimizer_builds": self.optimizers,
            "rss_gb": self.rss_gb,
            "gflops": self.gflops,
            "rest_s": self.rest_s,
            "wall_s": self.wall_s,
        }


def preset_of(cfg: RunConfig) -> str:
    return cfg.preset if cfg.preset != "custom" else "small"  # as the trainer builds it


def sizes_of(cfg: RunConfig) -> Sizes:
    """What the cell asks of its model's data shape, as the trainer asks it (generated data: no classes)."""
    return Sizes(seq_len=cfg.seq_len, image_size=cfg.image_size)


def time_shape(cells: list[GridCell], rules: Rules) -> ShapeTiming:
    """Time one model shape here as its cells run it (the fork server's imports done first, as a cell finds
    them): the build, the data, the FLOP count and an evaluation as a cell does them; one micro-batch's
    passes under each kind of checkpointing the grid's strategies use (a window of k is k of them); each
    plain optimizer's step alone; each line-searching optimizer's whole update; last, the measured step.
    Each timing is up to MAX_TIMED repeats within STEP_BUDGET_S, after a warm-up update per model."""
    start, cfg = time.perf_counter(), cells[0].config
    device = torch.device(cfg.device)
    t = clock(device)
    built = build_model(cells[0].model, preset_of(cfg), rules, cfg.dropout, cfg.seed, sizes_of(cfg))
    built.model.to(device)
    build_s, t = clock(device) - t, clock(device)
    dataset, _ = load(built.family, built.shape, cfg.train_examples, cfg.seed)
    heldout = HeldOut(built.family, built.shape, cfg.eval_examples, cfg.batch_size)
    data_s = clock(device) - t
    micro = _micro_batches(dataset, built, cfg)
    first = next(micro)
    flops_s, per_position = _timed(
        lambda: forward_flops_per_position(built.model, built.family, first, device, cfg.dtype), device
    )
    eval_s, _ = _timed(lambda: heldout.evaluate(built.model, device, cfg.dtype), device)
    stepper = _Stepper(built, cells, micro, device, rules)
    stepper.time_all()
    timing = ShapeTiming(
        cell=f"{cfg.model}/{cfg.preset}, batch {cfg.batch_size}, {cfg.dtype}, {cfg.device}",
        build_s=build_s,
        data_s=data_s,
        flops_s=flops_s,
        eval_s=eval_s,
        warm_s=stepper.warm_s,
        measured_step_s=stepper.measured_step(),
        reference=stepper.reference,
        passes_s=stepper.passes_s,
        windows={s: _window(cfg, s) for s in stepper.kinds},
        updates=stepper.updates,
        searches=stepper.searches,
        optimizers={o: OPTIMIZER_BUILDS.get(o, 0.0) for o in stepper.optimizers},
        wholes=stepper.wholes,
        rss_gb=stepper.rss_gb,
        gflops=None,
        wall_s=0.0,
    )
    if per_position:
        flops = 3 * per_position * positions(first) * timing.windows[stepper.reference[1]]
        timing.gflops = flops / timing.step(*stepper.reference) / 1e9
    reference = GridCell(stepper.config(*stepper.reference), cells[0].model)
    timing.rest_s = rest_of_a_cell(reference, timing, rules)
    timing.wall_s = time.perf_counter() - start
    return timing


_PEAKS: dict = {}  # the device peaks the whole cells of this process's shape timings share (once a grid)


def rest_of_a_cell(cell: GridCell, timing: ShapeTiming, rules: Rules) -> float:
    """What a cell spends beyond the parts a shape timing times (claiming its run, the KB's writes, the
    monitor, its figures): the start-up of one whole cell of the reference pair, shortened to one epoch of
    two updates, run as `advisor measure` runs a cell (advisor.measuring.grid.runner.run_cell) into a temporary KB
    that is then deleted, less its parts as timed. The device's peak is measured first, untimed: a grid
    measures it once. Its output is captured: a plan prints nothing of it."""
    base = cell.config  # one epoch: a warm-up update, and one timed
    updates = base.warmup_steps + 1
    cfg = replace(base, epochs=1, steps_per_epoch=updates * (base.window if base.equal_samples else 1))
    short = GridCell(cfg, cell.model)
    known_peak(_PEAKS, torch.device(cfg.device), cfg.dtype, rules)
    said = io.StringIO()
    with (
        tempfile.TemporaryDirectory(prefix="advisor-plan-") as folder,
        writing(Path(folder) / "kb.sqlite") as conn,
    ):
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            start = time.perf_counter()
            run_cell(short, conn, rules, peaks=_PEAKS, exiting=True)
            wall = time.perf_counter() - start
        trained = store.trained_seconds(conn)
    evaluations = evaluations_of(short, rules)
    parts = timing.startup(cfg.optimizer, cfg.strategy, evaluations)
    parts["rest"] = 0.0
    return max(0.0, wall - trained - sum(parts.values()))


def _window(cfg: RunConfig, strategy: str) -> int:
    """Micro-batches per update of `strategy` at the configuration's accumulation."""
    return replace(cfg, strategy=strategy).window


def _timed(fn, device) -> tuple[float, object]:
    """(seconds, result) of fn()."""
    start = clock(device)
    out = fn()
    return clock(device) - start, out


def _micro_batches(dataset, built, cfg: RunConfig):
    """The training set's micro-batches, as a cell's first epoch draws them (gone through again as needed)."""
    return epoch_batches(dataset, built.family, cfg.batch_size, cfg.seed, 0, built.shape)


_PRELOADED: set[str] = set()


def preloaded(rules: Rules) -> None:
    """Import what the fork server imports before any cell (advisor.measuring.grid.isolation.preload): a cell
    finds it imported, so the shape timing must not time it."""
    for name in preload(rules):
        if name not in _PRELOADED:
            _PRELOADED.add(name)
            try:
                importlib.import_module(name)
            except Exception:  # the server skips nothing either: a cell then reports it
                pass


OPTIMIZER_BUILDS: dict[str, float] = {}  # optimizer -> seconds of its first construction in this process


class _Stepper:
    """Times the parts of an update on one built model: a fresh optimizer each time, the weights reset to
    their initial values, each kind of model (checkpointing, an adapter) on its own copy (warmed by one
    untimed update)."""

    def __init__(self, built, cells: list[GridCell], micro, device, rules: Rules):
        self.built, self.micro, self.device, self.rules = built, micro, device, rules
        self.configs: dict[tuple[str, str], RunConfig] = {}
        for cell in cells:  # grid order; a pair's first seed
            self.configs.setdefault((cell.config.optimizer, cell.config.strategy), cell.config)
        self.optimizers = list(dict.fromkeys(o for o, _ in self.configs))
        self.strategies = list(dict.fromkeys(s for _, s in self.configs))
        self.adapted = [s for s in self.strategies if rules.as_fit(s)[0] != "full"]
        # the strategies timed by their passes: the full fine-tuning ones (standard alone: an instrument)
        self.full = [s for s in self.strategies if s not in self.adapted] or ["standard"]
        self.kinds = {  # (adapter, checkpointing) of each strategy: ('full', None), ('lora', None), ...
            s: (rules.as_fit(s)[0], checkpointing_of(s)) for s in dict.fromkeys([*self.full, *self.adapted])
        }
        self.initial = copy.deepcopy(built.model.state_dict())
        self.models: dict[object, tuple] = {}  # kind of model -> (it, its initial weights)
        self.warmed: set[int] = set()  # the models that took their first update
        self.passes_s: dict[str, float] = {}
        self.updates: dict[str, float] = {}
        self.searches: dict[str, tuple[float, float]] = {}
        self.wholes: dict[tuple[str, str], float] = {}
        plain = [o for o in self.optimizers if not self._searches(o)]
        self.reference = (plain[0] if plain else "sgd", self.full[0])  # sgd: a timing instrument
        self.warm_s = 0.0  # the base model's first update, beyond a later one
        self.rss_gb = 0.0

    def time_all(self) -> None:
        """One micro-batch's passes under each kind of checkpointing (with the reference optimizer, its
        step taken out), every plain optimizer's step alone (on the base model's gradients), every
        line-searching optimizer's whole update at the base strategy, and every update under an adapter
        whole (the base model's gradients are kept for the steps: its kind goes first, adapters last)."""
        plain, base = self.reference
        kinds: dict[object, float] = {}
        for strategy in [base, *self.full]:
            if self.kinds[strategy] not in kinds:
                kinds[self.kinds[strategy]] = self._time(plain, strategy, 1)[0]
        for optimizer in dict.fromkeys([plain, *self.optimizers]):
            if self._searches(optimizer):
                window = self.config(optimizer, base).window
                self.searches[optimizer] = self._time(optimizer, base, window)
            else:
                self.updates[optimizer] = self._time_update(optimizer)
        self.passes_s = {s: max(kinds[self.kinds[s]] - self.updates[plain], 0.0) for s in self.full}
        for optimizer, strategy in self.configs:
            if strategy in self.adapted:
                window = self.config(optimizer, strategy).window
                self.wholes[(optimizer, strategy)] = self._time(optimizer, strategy, window)[0]

    def config(self, optimizer: str, strategy: str) -> RunConfig:
        """The pair's configuration (its first seed's), or another cell's with the pair set (an instrument)."""
        found = self.configs.get((optimizer, strategy))
        return found or replace(next(iter(self.configs.values())), optimizer=optimizer, strategy=strategy)

    def _optimizer(self, name: str, model, strategy: str):
        cfg = self.config(name, strategy)
        trainable = [p for p in model.parameters() if p.requires_grad]  # all, but under an adapter
        return make_optimizer(name, trainable, cfg.lr, model=model, **_cgd(cfg))

    def _searches(self, name: str) -> bool:
        """Whether the optimizer line-searches (train_step then hands it a closure that reruns the window).
        Its first construction in this process is timed: a cell, forked from a server that did not import
        what it needs, pays those imports too (OPTIMIZER_BUILDS)."""
        seconds, opt = _timed(
            lambda: self._optimizer(name, self.built.model, self.strategies[0]), self.device
        )
        OPTIMIZER_BUILDS.setdefault(name, seconds)
        return any(g.get("line_search", "fixed") != "fixed" for g in opt.param_groups)

    def _time(self, optimizer: str, strategy: str, window: int) -> tuple[float, float]:
        """(the best of up to MAX_TIMED updates of `window` micro-batches, collation included; forward
        and backward passes per update: more than one where a line search calls its closure again)."""
        model = self._model(strategy)
        model.load_state_dict(self._initial(model))
        opt, cfg = self._optimizer(optimizer, model, strategy), self.config(optimizer, strategy)

        def update():
            batches = [next(self.micro) for _ in range(window)]
            return train_step(model, opt, self.built.family, batches, self.device, None, cfg.dtype)

        warm = None
        if id(model) not in self.warmed:  # each model's first update: allocations, kernels chosen
            self.warmed.add(id(model))
            warm, _ = _timed(update, self.device)
        calls = _count_closure_calls(opt)
        times: list[float] = []
        while len(times) < MAX_TIMED and sum(times) < STEP_BUDGET_S:
            times.append(_timed(update, self.device)[0])
        if warm is not None and len(self.warmed) == 1:  # the cell's first update, beyond a later one
            self.warm_s = max(warm - min(times), 0.0)
        self.rss_gb = max(self.rss_gb, process_rss_gb())
        return min(times), 1.0 + max(0, calls[1] - calls[0]) / max(calls[0], 1)

    def _time_update(self, optimizer: str) -> float:
        """The best of the optimizer's step alone, after one that allocates its state: what it adds to an
        update whatever the strategy (the gradients are the base model's last ones)."""
        opt = self._optimizer(optimizer, self._model(self.reference[1]), self.reference[1])
        opt.step()
        times: list[float] = []
        while len(times) < MAX_TIMED and sum(times) < STEP_BUDGET_S:
            times.append(_timed(opt.step, self.device)[0])
        return min(times)

    def _model(self, strategy: str):
        """The model of the strategy's kind: the built one, else a copy with its adapter and checkpointing on,
        as a cell's trainer sets them up (advisor.measuring.training.trainer.adapted_as_run, then prepare)."""
        kind = self.kinds[strategy]
        if kind == ("full", None):
            return self.built.model
        if kind not in self.models:
            model = copy.deepcopy(self.built.model)
            model = adapted_as_run(model, self.config(self._first(strategy), strategy), self.rules)
            prepare(model, strategy)
            self.models[kind] = (model, copy.deepcopy(model.state_dict()))
        return self.models[kind][0]

    def _initial(self, model) -> dict:
        """The model's weights as first built (an adapted copy's keys are peft's)."""
        found = [initial for m, initial in self.models.values() if m is model]
        return found[0] if found else self.initial

    def _first(self, strategy: str) -> str:
        """The grid's first optimizer with the strategy (the reference's where none is: an instrument)."""
        return next((o for o, s in self.configs if s == strategy), self.reference[0])

    def measured_step(self) -> float:
        """Seconds of the step a cell measures under PyTorch's MemTracker after its last epoch (advisor.
        measuring.tensors), with the reference pair; where the tracker fails, as a cell's may, its time."""
        optimizer, strategy = self.reference
        model, cfg = self._model(strategy), self.config(optimizer, strategy)
        opt = self._optimizer(optimizer, model, strategy)
        opt.step()  # its state there, as after a cell's epochs
        batches = [next(self.micro) for _ in range(cfg.window)]

        def step(before):
            return train_step(model, opt, self.built.family, batches, self.device, before, cfg.dtype)

        def tracked():
            try:
                measured_step(model, opt, step)
            except Exception:  # the cell keeps its run and goes without the tensor figures
                pass

        return _timed(tracked, self.device)[0]


def _cgd(cfg: RunConfig) -> dict:
    """Conjugate gradient's options, as the trainer passes them."""
    if cfg.optimizer != "cgd":
        return {}
    return dict(
        line_search=cfg.cgd_line_search,
        beta=cfg.cgd_beta,
        restart_every=cfg.cgd_restart_every,
        beta_max=cfg.cgd_beta_max,
    )


def _count_closure_calls(optimizer) -> list[int]:
    """[updates, closure calls] from now on: the optimizer's step is wrapped on this instance. The first
    call of an update's closure costs no pass (train_step hands over the loss it has)."""
    calls = [0, 0]
    step = optimizer.step

    def counted(closure=None):
        calls[0] += 1
        if closure is None:
            return step()

        def counting():
            calls[1] += 1
            return closure()

        return step(counting)

    optimizer.step = counted
    return calls


def evaluations_of(cell: GridCell, rules: Rules) -> int:
    """The held-out evaluations a cell runs: before training, after every epoch, and every
    `target_checks.every` updates within an epoch until the target is reached (all of them counted)."""
    cfg = cell.config
    if cfg.protocol != "fair":
        return 0
    every = rules.protocol.get("target_checks", {}).get("every", 0)
    checks = 0
    if every and target_loss(cfg, cell.model.family.name, rules) is not None:
        updates, per_epoch = cfg.epochs * cfg.updates_per_epoch, cfg.updates_per_epoch
        at_ends = cfg.epochs // (every // math.gcd(per_epoch, every))  # an epoch's end evaluates anyway
        checks = updates // every - at_ends
    return 1 + cfg.epochs + checks
