"""The grid: which cells to run (`plan_grid`), and each cell claimed in the KB, trained, classified and
recorded (`run_cell`).

A cell never stops the grid: out-of-memory, divergence and exceptions end that cell with status `oom`,
`diverged` or `failed` and the grid goes on. Cells already `ok`, `oom` or `diverged` on this hardware (a
tuning run that trained: on any, kb.lease.PORTABLE) are skipped (a re-run would repeat the outcome);
`failed` ones are run again, and runs left `running` by a
process that died are marked `crashed` and run again. `train_cell` is the part that needs no KB: a remote
worker can call it and hand back its outcome.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from advisor.errors import InputError, KBError
from advisor.kb import lease, store
from advisor.measuring.machine.hardware import describe, owner, pid_alive, resolve_device
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.tracer.preflight import will_not_fit
from advisor.measuring.training.flops import Peaks
from advisor.measuring.training.progress import LOSS_MEASURES, MEMORY_MEASURES, Reporter
from advisor.measuring.training.trainer import Diverged, Trainer, Untrained, is_oom
from advisor.model_ref import ResolvedModel
from advisor.rules import Rules

MEASURED_SOURCE = "measured"
TUNING_SOURCE = "measured:tuning"


@dataclass
class CellResult:
    config: RunConfig
    status: str  # ok | oom | diverged | untrained | failed | skipped | crashed
    run_id: int | None = None
    loss: float | None = None
    epoch_time: float | None = None
    peak_memory_gb: float | None = None
    error: str | None = None
    loss_measure: str | None = None  # which stored measure `loss` is (LOSS_MEASURES: held-out first)
    memory_measure: str | None = (
        None  # which `peak_memory_gb` is (MEMORY_MEASURES: what recommend ranks first)
    )

    @classmethod
    def of(cls, cfg: RunConfig, run_id: int, outcome: CellOutcome) -> CellResult:
        """The result of a trained cell: its status and the figures an answer ranks (held-out loss before
        training loss, the GPU's or the tensors' peak before RSS), each with the name of its measure."""
        figures = outcome.figures
        loss = next((m for m in LOSS_MEASURES if figures.get(m) is not None), None)
        memory = next((m for m in MEMORY_MEASURES if figures.get(m) is not None), None)
        return cls(
            cfg,
            outcome.status,
            run_id,
            figures.get(loss) if loss else None,
            figures.get("epoch_time"),
            figures.get(memory) if memory else None,
            outcome.error,
            loss,
            memory,
        )

    def as_dict(self) -> dict:
        return {
            "model": self.config.model,
            "preset": self.config.preset,
            "optimizer": self.config.optimizer,
            "strategy": self.config.strategy,
            "seed": self.config.seed,
            "status": self.status,
            "run_id": self.run_id,
            "loss": self.loss,
            "epoch_time_s": self.epoch_time,
            "peak_memory_gb": self.peak_memory_gb,
            "loss_measure": self.loss_measure,
            "memory_measure": self.memory_measure,
            "error": self.error,
        }


@dataclass
class CellOutcome:
    """What training one cell produced, wherever it ran: status, run-level figures, epoch rows."""

    status: str
    error: str | None
    metrics: list[tuple[str, float, str]]
    epochs: list[dict] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C: recorded as crashed, then re-raised by the caller
    stderr: str | None = None  # what its process wrote (library warnings, a traceback), where one ran it

    @property
    def figures(self) -> dict[str, float]:
        return {name: value for name, value, _ in self.metrics}


def plan_grid(
    models: Iterable[ResolvedModel],
    rules: Rules,
    optimizers: Iterable[str] = (),
    strategies: Iterable[str] = (),
    seeds: int = 1,
    base: RunConfig | None = None,
) -> list[GridCell]:
    """The cells `advisor measure` runs, in run order: each model × the optimizers and strategies asked for
    (default: its family's grid in rules/families.toml) × seeds; model, then seed, then optimizer ×
    strategy (so an early stop still leaves whole seeds).

    Raises InputError for names the rules do not know or an epoch that accumulation cannot divide."""
    base = base or RunConfig()
    optimizers, strategies = list(optimizers), list(strategies)
    _check_names(rules, optimizers, strategies)
    cells = [
        GridCell(replace(base, model=m.name, optimizer=o, strategy=s, seed=seed), m)
        for m in models
        for seed in range(seeds)
        for o in optimizers or m.family.grid_optimizers
        for s in strategies or m.family.grid_strategies
    ]
    for cell in cells:
        r = cell.resolved
        if r.drops_micro_batches:
            raise InputError(
                f"--steps-per-epoch {r.steps_per_epoch} is not a multiple of --accumulation-steps "
                f"{r.accumulation_steps}: accumulation would drop micro-batches.",
                "steps_per_epoch",
            )
    return cells


def _check_names(rules: Rules, optimizers: list[str], strategies: list[str]) -> None:
    for names, known, what, field_name in (
        (optimizers, rules.optimizers, "optimizer", "optimizers"),
        (strategies, rules.strategies, "strategy", "strategies"),
    ):
        for name in names:
            if name not in known:
                raise InputError(f"unknown {what} {name!r}. Choose from: {', '.join(known)}.", field_name)


def run_cell(
    cell: GridCell,
    conn,
    rules: Rules,
    reporter: Reporter | None = None,
    heartbeat=None,
    order: dict | None = None,
    peaks: Peaks | None = None,
    exiting: bool = False,
) -> CellResult:
    """Claim one cell in the KB, train it, record every epoch and the outcome; never raises for a failure of
    the cell itself (Ctrl-C is recorded as crashed, then re-raised). The heartbeat keeps the claim's lease.

    order: where the cell ran in its grid ({"seed", "position", "cells"}), recorded with the run (not part
    of its cell key): drift over a grid can then be told from a configuration's effect. peaks and exiting:
    as train_cell's."""
    settings = cell.config.settings()
    try:
        device = resolve_device(cell.resolved.device)
    except ValueError as e:
        return CellResult(cell.resolved, "failed", error=str(e))
    cell = cell.on(device)
    cfg = cell.config
    run = cell_run(cell, settings, describe(device))
    if order is not None:
        run["config"] = {**run["config"], "order": order}
    if not cell.model.reference:
        reason = will_not_fit(cell, rules)
        if reason:
            return CellResult(cfg, "skipped", error=reason)
    run_id, taken = lease.claim_run(conn, run, pid_alive)
    if run_id is None:
        return CellResult(cfg, "skipped", error=f"already {taken} in this KB for this hardware")
    if heartbeat is not None:
        heartbeat.hold(run_id)

    def on_built(info: dict) -> None:
        store.update_run(conn, run_id, **built_fields(run["config"], info))

    outcome = train_cell(
        cell, rules, reporter, on_built, lambda row: store.add_epoch(conn, run_id, row), peaks, exiting
    )
    store.finish_run(conn, run_id, outcome.status, outcome.error, outcome.metrics)
    if heartbeat is not None:
        heartbeat.let_go(run_id)
    if outcome.interrupted:
        raise KeyboardInterrupt
    return CellResult.of(cfg, run_id, outcome)


def built_fields(config: dict, info: dict) -> dict:
    """The runs fields a built model adds (the trainer's on_built info): its size, whether it was
    pretrained, and the data it trains on, into the run's config, with the base's record where advisor
    pretrain made the weights."""
    base = {"base": info["base"]} if info.get("base") else {}
    return dict(
        n_params=info["n_params"],
        pretrained=int(info["pretrained"]),
        config={**config, "data": info["data"], **base},
    )


def cell_run(cell: GridCell, settings: str, machine: dict) -> dict:
    """The runs row a resolved cell is claimed with: its identity, provenance and configuration. Runs of
    --tune-lr go to their own source: they choose the rates, they are not evidence to answer from."""
    cfg = cell.config
    return {
        "source": TUNING_SOURCE if cfg.role == "tuning" else MEASURED_SOURCE,
        "cell_key": cfg.cell_key(),
        "seed": cfg.seed,
        "model": cfg.model,
        "family": cell.model.family.name,
        "optimizer": cfg.optimizer,
        "strategy": cfg.strategy,
        "preset": cfg.preset if cell.model.reference else "custom",
        "data": cfg.data_id
        or "generated",  # part of its evidence group: runs on other data never rank with it
        # a user's model is named as given (a path or Hub id) and kept by its config's hash too
        "config": cfg.as_dict()
        | ({} if cell.model.reference else {"model_config_hash": cell.model.config_hash}),
        "settings": settings,
        "protocol": cfg.protocol,
        "owner": owner(),
        **machine,
    }


def train_cell(
    cell: GridCell,
    rules: Rules,
    reporter=None,
    on_built=None,
    on_epoch=None,
    peaks: Peaks | None = None,
    exiting: bool = False,
) -> CellOutcome:
    """Train a resolved cell and classify how it ended: ok, diverged, untrained, oom, failed (or crashed on
    Ctrl-C). peaks: the device peaks the grid has measured, reused and added to (flops.known_peak);
    exiting: the process ends with the cell, so nothing is released for a next one."""
    trainer = Trainer(cell, rules, reporter, on_built, on_epoch, peaks)
    interrupted = False
    try:
        trainer.train()
        status, error = "ok", None
        if trainer.tensors_error:  # trained: only the tensor figures are missing, and why is kept
            error = f"no tensor figures: PyTorch's MemTracker failed ({_first_line(trainer.tensors_error)})"
    except KeyboardInterrupt:
        status, error, interrupted = "crashed", "interrupted by the user", True
    except KBError:  # the KB cannot take the cell's epochs (a full disk): the grid stops, no cell failure
        trainer.release(exiting)
        raise
    except Diverged as e:
        status, error = "diverged", str(e)
    except Untrained as e:
        status, error = "untrained", str(e)
    except Exception as e:  # the cell failed; the grid goes on
        if is_oom(e):
            peak = trainer.peak_memory_gb()
            status = "oom"
            error = f"out of memory ({_first_line(e)})" + (f"; peak {peak:.2f} GB" if peak else "")
        else:  # the traceback goes to stderr: a cell's process keeps it with the run (config.stderr)
            status, error = "failed", f"{type(e).__name__}: {_first_line(e)}"
            traceback.print_exc()
    outcome = CellOutcome(status, error, trainer.metrics(), list(trainer.epochs), interrupted)
    trainer.release(exiting)
    return outcome


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
