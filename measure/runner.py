"""The grid: which cells to run (`plan_grid`), and each cell claimed in the KB, trained, classified and
recorded (`run_cell`).

A cell never stops the grid: out-of-memory, divergence and exceptions end that cell with status `oom`,
`diverged` or `failed` and the grid goes on. Cells already `ok`, `oom` or `diverged` on this hardware are
skipped (a re-run would repeat the outcome); `failed` ones are run again, and runs left `running` by a
process that died are marked `crashed` and run again. `train_cell` is the part that needs no KB: a remote
worker can call it and hand back its outcome.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from advisor import store
from advisor.schema import KBError
from measure.config import RunConfig
from measure.hardware import describe, owner, pid_alive, resolve_device
from measure.progress import Reporter
from measure.trainer import Diverged, OutOfMemory, Trainer, Untrained

SOURCE = "measured"
TUNING_SOURCE = "measured:tuning"


@dataclass
class CellResult:
    config: RunConfig
    status: str  # ok | oom | diverged | failed | skipped | crashed
    run_id: int | None = None
    loss: float | None = None
    epoch_time: float | None = None
    peak_memory_gb: float | None = None
    error: str | None = None

    @classmethod
    def of(cls, cfg: RunConfig, run_id: int, outcome: CellOutcome) -> CellResult:
        """The result of a trained cell: its outcome's status, loss, epoch time and peak memory."""
        figures = outcome.figures
        peak = figures.get("gpu_mem_peak_gb") or figures.get("peak_rss_gb")
        return cls(
            cfg, outcome.status, run_id, figures.get("loss"), figures.get("epoch_time"), peak, outcome.error
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

    @property
    def figures(self) -> dict[str, float]:
        return {name: value for name, value, _ in self.metrics}


class PlanError(ValueError):
    """A grid that cannot run as asked; `param` names the flag to fix."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, OutOfMemory | MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "failed to allocate" in text
    )


def grid(
    models: Iterable[str],
    optimizers: dict[str, list[str]],
    strategies: dict[str, list[str]],
    seeds: Iterable[int],
    base: RunConfig,
) -> list[RunConfig]:
    """Configurations in run order: model, then seed, then optimizer × strategy (so an early stop still
    leaves whole seeds)."""
    return [
        replace(base, model=m, optimizer=o, strategy=s, seed=seed)
        for m in models
        for seed in seeds
        for o in optimizers[m]
        for s in strategies[m]
    ]


def plan_grid(
    models: Iterable[str],
    optimizers: Iterable[str] = (),
    strategies: Iterable[str] = (),
    seeds: int = 1,
    base: RunConfig | None = None,
    rules=None,
) -> list[RunConfig]:
    """The cells `advisor measure` runs: each model ('all' = every family's reference model) × the
    optimizers and strategies asked for (default: its family's grid in rules/families.toml) × seeds.

    Raises PlanError for names the rules do not know or an epoch that accumulation cannot divide, and
    ModelNotResolved for a model whose family cannot be found offline."""
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    rules, base = rules or load_rules(), base or RunConfig()
    optimizers, strategies = list(optimizers), list(strategies)
    _check_names(rules, optimizers, strategies)
    names = [m for name in models for m in (rules.reference_models() if name == "all" else [name])]
    families = {name: resolve_model(name, rules).family for name in names}
    configs = grid(
        names,
        {n: optimizers or list(families[n].grid_optimizers) for n in names},
        {n: strategies or list(families[n].grid_strategies) for n in names},
        range(seeds),
        base,
    )
    for cfg in configs:
        r = cfg.resolved()
        if r.protocol == "paper" and r.steps_per_epoch % r.window:
            raise PlanError(
                f"--steps-per-epoch {r.steps_per_epoch} is not a multiple of --accumulation-steps "
                f"{r.accumulation_steps}: accumulation would drop micro-batches.",
                "--steps-per-epoch",
            )
    return configs


def _check_names(rules, optimizers: list[str], strategies: list[str]) -> None:
    for names, known, flag in (
        (optimizers, rules.optimizers, "optimizer"),
        (strategies, rules.strategies, "strategy"),
    ):
        for name in names:
            if name not in known:
                raise PlanError(f"unknown {flag} {name!r}. Choose from: {', '.join(known)}.", f"--{flag}")


def run_cell(
    cfg: RunConfig,
    conn,
    reporter: Reporter | None = None,
    rules=None,
    heartbeat=None,
    order: dict | None = None,
) -> CellResult:
    """Claim one cell in the KB, train it, record every epoch and the outcome; never raises for a failure of
    the cell itself (Ctrl-C is recorded as crashed, then re-raised). The heartbeat keeps the claim's lease.

    order: where the cell ran in its grid ({"seed", "position", "cells"}), recorded with the run (not part
    of its cell key): drift over a grid can then be told from a configuration's effect."""
    settings = cfg.settings()
    cfg = cfg.resolved()
    try:
        device = resolve_device(cfg.device)
    except ValueError as e:
        return CellResult(cfg, "failed", error=str(e))
    cfg = replace(cfg, device=device)
    run = cell_run(cfg, settings, describe(device), rules)
    if order is not None:
        run["config"] = {**run["config"], "order": order}
    if run["preset"] == "custom":
        from measure.preflight import will_not_fit

        reason = will_not_fit(cfg, rules)
        if reason:
            return CellResult(cfg, "skipped", error=reason)
    run_id, taken = store.claim_run(conn, run, pid_alive)
    if run_id is None:
        return CellResult(cfg, "skipped", error=f"already {taken} in this KB for this hardware")
    if heartbeat is not None:
        heartbeat.hold(run_id)

    def on_built(info: dict) -> None:
        store.update_run(conn, run_id, **built_fields(run["config"], info))

    outcome = train_cell(cfg, reporter, on_built, lambda row: store.add_epoch(conn, run_id, row), rules)
    store.finish_run(conn, run_id, outcome.status, outcome.error, outcome.metrics)
    if heartbeat is not None:
        heartbeat.let_go(run_id)
    if outcome.interrupted:
        raise KeyboardInterrupt
    return CellResult.of(cfg, run_id, outcome)


def built_fields(config: dict, info: dict) -> dict:
    """The runs fields a built model adds (the trainer's on_built info): its size, whether it was
    pretrained, and the data it trains on, into the run's config."""
    return dict(
        n_params=info["n_params"], pretrained=int(info["pretrained"]), config={**config, "data": info["data"]}
    )


def cell_run(cfg: RunConfig, settings: str, machine: dict, rules=None) -> dict:
    """The runs row a resolved cell is claimed with: its identity, provenance and configuration. Runs of
    --tune-lr go to their own source: they choose the rates, they are not evidence to answer from."""
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    rules = rules or load_rules()
    reference = cfg.model in rules.reference_models()
    return {
        "source": TUNING_SOURCE if cfg.role == "tuning" else SOURCE,
        "cell_key": cfg.cell_key(),
        "seed": cfg.seed,
        "model": cfg.model,
        "family": resolve_model(cfg.model, rules).family.name,
        "optimizer": cfg.optimizer,
        "strategy": cfg.strategy,
        "preset": cfg.preset if reference else "custom",
        "data": cfg.data_id
        or "generated",  # part of its evidence group: runs on other data never rank with it
        "config": cfg.as_dict(),
        "settings": settings,
        "protocol": cfg.protocol,
        "owner": owner(),
        **machine,
    }


def train_cell(cfg: RunConfig, reporter=None, on_built=None, on_epoch=None, rules=None) -> CellOutcome:
    """Train a resolved cell and classify how it ended: ok, diverged, untrained, oom, failed (or crashed on
    Ctrl-C)."""
    trainer = Trainer(cfg, reporter, on_built, on_epoch, rules)
    interrupted = False
    try:
        trainer.train()
        status, error = "ok", None
        if trainer.tensors_error:  # trained: only the tensor figures are missing, and why is kept
            error = f"no tensor figures: PyTorch's MemTracker failed ({_first_line(trainer.tensors_error)})"
    except KeyboardInterrupt:
        status, error, interrupted = "crashed", "interrupted by the user", True
    except KBError:  # the KB cannot take the cell's epochs (a full disk): the grid stops, no cell failure
        trainer.release()
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
        else:
            status, error = "failed", f"{type(e).__name__}: {_first_line(e)}"
    outcome = CellOutcome(status, error, trainer.metrics(), list(trainer.epochs), interrupted)
    trainer.release()
    return outcome


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
