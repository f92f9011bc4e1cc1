"""What `advisor measure` (and `advisor.measure(...)`) is asked, as one object: the models, the base run
configuration, the data, the scale-out (executor, shard), the tuning and the order. `check()` refuses a
request that cannot run before anything is built; `grid()` gives the cells it would run; `run()` runs them
into a KB; `price()` is `--plan`: their predicted cost, nothing trained.

The command line reads this dataclass (and RunConfig) for its options' defaults and help as `advisor measure
--help` loads: so what runs the grid (torch) is imported inside the methods that run it, never at the top."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from advisor.errors import Error, InputError
from advisor.fields import option
from advisor.measuring.data.source import resolve
from advisor.measuring.grid.shard import Shard, parse
from advisor.measuring.machine.hardware import resolve_device
from advisor.measuring.model.builder import has_weights
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.training.data_check import check_cells
from advisor.measuring.training.progress import Reporter, nothing_measured
from advisor.model_ref import ResolvedModel
from advisor.places import resolve_write_path, user_dir
from advisor.prediction.accelerators import GB_PER_GIB
from advisor.rules import Rules

if TYPE_CHECKING:
    from advisor.measuring.grid.deciding import CloseCall
    from advisor.measuring.grid.local import GridRun
    from advisor.measuring.grid.runner import CellResult
    from advisor.measuring.grid.tuning import Tuned
    from advisor.measuring.planning.plan import Plan

EXECUTORS = ("local", "ray")
MEASURED_DTYPES = (
    "fp32",
    "bf16-mixed",
)  # what the trainer runs (advisor/measuring/recipe/strategies.py: autocast)


@dataclass(frozen=True, kw_only=True)
class MeasureRequest:
    """A grid to measure, every field as `advisor measure` names its option."""

    models: tuple[ResolvedModel, ...]  # --model, resolved once (`all`: every family's reference model)
    base: RunConfig = field(default_factory=RunConfig)  # --preset, --epochs, --lr, --dtype, --protocol, ...
    optimizers: tuple[str, ...] = option((), "Optimizers to run (repeatable). Default: the family's grid.")
    strategies: tuple[str, ...] = option(
        (),
        "standard, checkpointing, selective-checkpointing, accumulation, checkpointing+accumulation, "
        "accumulation-equal-samples, or lora (LoRA adapters on a pretrained model's frozen weights: a folder "
        "with weights, e.g. from advisor pretrain) (repeatable). Default: the family's grid.",
    )
    seeds: int = option(1, "Repeat every cell over seeds 0..N-1.")
    data: str = option(
        "generated",
        "What to train on: generated (offline, deterministic), mmimdb (the paper's MM-IMDb, pinned to the "
        "commit it cites; downloaded once, its size said first), a Hugging Face dataset id (owner/name"
        "[@revision]), or a local path: a JSONL, CSV, Parquet or text file, a folder of them, a save_to_disk "
        "folder, or an image folder (class subfolders, or captions in metadata.jsonl). Runs on other data are "
        "their own evidence (docs/measuring.md).",
    )
    fallback: bool = option(
        False,
        "When the Hugging Face hub cannot be reached (asked once, about a second) and the data is not in the "
        "local cache: measure on generated data instead of stopping (every run records it).",
    )
    tune_lr: bool = option(
        False,
        "Choose each optimizer's learning rate first: a log grid around its default on a tuning seed, the best "
        "by held-out loss, tuned per effective batch (accumulation at its own batch; fair protocol only; the "
        "runs record the rate and the grid).",
    )
    decide: bool = option(
        False,
        "After the grid: more seeds for its answers' close calls (a runner-up neither separated from the pick "
        "nor equivalent to it), on both sides, where the seeds that would decide one are at most "
        "rules/protocol.toml [deciding] max_seeds; the rest are listed with what they would need. Needs "
        "--seeds 2 or more.",
    )
    order_seed: int | None = option(
        None, "Seed of the shuffled cell order (default: a fresh one, printed and recorded with every run)."
    )
    executor: str = option(
        "local",
        "local: one cell at a time on this machine. ray: each cell a Ray task on a cluster (one GPU per cell, "
        "or a node's CPUs), this process the only writer to the KB (pip install 'advisor[cluster]').",
    )
    ray_address: str | None = option(
        None,
        "The Ray cluster to join (auto: the one this host belongs to). Default: start one on this machine.",
    )
    cpus_per_cell: int | None = option(
        None,
        "With --executor ray: CPUs a cell asks for (default: 1 beside its GPU; on CPU nodes, all the CPUs of "
        "the smallest node, so that no two cells share a node's cores).",
    )
    shard: str | None = option(
        None,
        "Run only shard K of N of the grid (a deterministic split by cell key), into its own KB; `auto` reads "
        "a Slurm job array's SLURM_ARRAY_TASK_ID and _COUNT. Unite the shards with `advisor kb merge`.",
    )
    db: Path | None = option(
        None, "Knowledge base file to write (default: $ADVISOR_DB, else your own KB: `advisor kb path`)."
    )

    def check(self, pricing: bool = False) -> Shard | None:
        """Refuse flags that cannot go together (InputError naming the flag), before torch builds anything;
        the parsed shard, if one. `pricing`: for --plan, which trains nothing."""
        if self.tune_lr and self.base.lr is not None:
            raise InputError("--tune-lr chooses each optimizer's rate: drop --lr.", "tune_lr")
        if self.tune_lr and self.base.protocol == "paper":
            raise InputError(
                "the paper's protocol shares one rate per model: --tune-lr needs --protocol fair.",
                "tune_lr",
            )
        if self.base.dtype not in MEASURED_DTYPES:
            raise InputError(
                f"advisor measure trains in {' or '.join(MEASURED_DTYPES)}; {self.base.dtype} is for advisor "
                "fit's predictions.",
                "dtype",
            )
        from advisor.measuring.recipe.optimizers import missing_package  # torch: see the module's docstring

        for name in self.optimizers:
            package = missing_package(name)
            if package:
                raise InputError(
                    f"{name} needs {package}: pip install {package} (or pip install 'advisor[measure]').",
                    "optimizers",
                )
        if self.executor not in EXECUTORS:
            raise InputError(
                f"unknown executor {self.executor!r}. Choose from: {', '.join(EXECUTORS)}.", "executor"
            )
        for name, value in (("ray_address", self.ray_address), ("cpus_per_cell", self.cpus_per_cell)):
            if value is not None and self.executor != "ray":
                raise InputError(f"--{name.replace('_', '-')} applies to --executor ray only.", name)
        if self.executor == "ray" and not pricing:
            self._check_ray()
        if self.decide and self.seeds < 2:
            raise InputError(
                "--decide adds seeds to close calls, which are judged on repeated seeds: pass --seeds 2 or more "
                "(the reference grid: 3).",
                "decide",
            )
        if self.decide and pricing:
            raise InputError("--decide adds seeds once the grid has run: drop it with --plan.", "decide")
        if self.shard is None:
            return None
        if self.decide:
            raise InputError(
                "--decide reads the whole grid's answers: run it unsharded, once the shards are merged.",
                "shard",
            )
        if self.tune_lr:
            raise InputError(
                "every shard would tune the same rates: tune once (advisor measure ... --tune-lr --seeds 1), "
                "then pass the rates with --lr, or run the grid unsharded.",
                "shard",
            )
        return parse(self.shard)

    def _check_adapters(self, rules: Rules) -> None:
        """An adapter strategy fine-tunes pretrained weights: refused for a model built at random, where
        adapters on a random base would measure nothing a fine-tune meets, and with an optimizer that does not
        train adapters (rules/optimizers.toml `adapters`)."""
        asked = [s for s in self.strategies if s in rules.adapters]
        for name in self.optimizers if asked else ():
            if asked[0] not in rules.optimizer_info[name].adapters:
                raise InputError(
                    f"--optimizer {name} trains {', '.join(rules.optimizer_info[name].adapters)} only "
                    f"(rules/optimizers.toml), not --strategy {asked[0]}'s adapters: measure them apart.",
                    "optimizers",
                )
        for model in self.models if asked else ():
            if not has_weights(model):
                what = "is built from its config" if model.reference else "has no weights in its folder"
                raise InputError(
                    f"--strategy {asked[0]} fine-tunes pretrained weights, and {model.name} {what} (random "
                    f"init). Pass a model folder with weights: your own, or a reference model pretrained here "
                    f"(advisor pretrain --model {model.family.reference_model} --preset small --out DIR).",
                    "strategies",
                )

    def _check_ray(self) -> None:
        if importlib.util.find_spec("ray") is None:
            raise Error("--executor ray needs Ray: pip install 'advisor[cluster]'.")
        for model in self.models:
            if not model.reference:
                raise InputError(
                    f"--executor ray runs the reference models; {model.name} runs with --executor local, which "
                    "first predicts whether it fits the machine it runs on.",
                    "models",
                )

    def grid(self, rules: Rules, say: Callable[[str], None] = lambda line: None) -> Grid:
        """The cells this request runs: the grid with its data resolved once, here (the hub asked once, a
        download done before any cell starts) and checked against every model, then this shard's share."""
        from advisor.measuring.grid.runner import plan_grid  # torch: see the module's docstring

        shard = self.check()
        self._check_adapters(rules)
        if self.executor == "local":
            try:  # a GPU asked for and absent is the user's to fix (a cluster's GPUs are not this host's)
                resolve_device(self.base.device)
            except ValueError as e:
                raise InputError(str(e), "device") from e
        cells = plan_grid(self.models, rules, self.optimizers, self.strategies, self.seeds, self.base)
        choice = resolve(self.data, self.fallback, say=say)
        cells = [c.with_config(**choice.config_fields()) for c in cells]
        check_cells(cells, rules)
        planned = len(cells)
        if shard is not None:
            cells = shard.take(cells)
        return Grid(cells, planned, shard, self._path(shard))

    def _path(self, shard: Shard | None) -> Path:
        """The KB to write: --db, $ADVISOR_DB or the user's; without --db, a shard's own beside it."""
        if shard is None or self.db:
            return resolve_write_path(self.db)
        path = user_dir() / "shards" / f"shard-{shard.index}-of-{shard.count}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def run(
        self, rules: Rules, reporter: Reporter | None = None, say=lambda line: None, grid: Grid | None = None
    ) -> Measured:
        """Measure the planned cells (`grid`: this request's plan, made already) into the KB, tuning the
        rates first with --tune-lr."""
        # torch: see the module's docstring
        from advisor.measuring.grid.deciding import close_calls, more_seeds
        from advisor.measuring.grid.tuning import tune

        grid = grid or self.grid(rules, say)
        run = self._runner(grid.path, rules, reporter or Reporter())
        cells, tuned = grid.cells, []
        if self.tune_lr:
            cells, tuned = tune(cells, grid.path, run, rules)
        ran = run(cells)
        if not self.decide:
            return Measured(grid, ran, tuned)
        extra: list[CellResult] = []
        for _ in range(rules.protocol["deciding"]["rounds"]):
            more = more_seeds(cells, close_calls(grid.path, cells, rules), rules)
            if not more:
                break
            extra += run(more)
            cells = [*cells, *more]
        return Measured(grid, ran, tuned, extra, close_calls(grid.path, cells, rules))

    def _runner(self, path: Path, rules: Rules, reporter: Reporter) -> Callable[[list[GridCell]], GridRun]:
        from advisor.measuring.grid.local import run_grid  # torch: see the module's docstring

        if self.executor == "ray":
            from advisor.measuring.grid.cluster import run_grid_ray  # Ray is an extra: only when asked for

            return lambda cells: run_grid_ray(
                cells, path, rules, reporter, self.order_seed, self.ray_address, self.cpus_per_cell
            )
        return lambda cells: run_grid(cells, path, rules, reporter, self.order_seed)

    def price(self, rules: Rules, gpu: str | None = None, workers: tuple[int, ...] = (1,)) -> Plan:
        """--plan: every cell's predicted time and memory on `gpu` (None: this machine), and the makespan
        on each number of workers. Nothing is trained, and the data is not resolved: it does not change
        a step's cost."""
        from advisor.measuring.grid.runner import plan_grid  # torch: see the module's docstring
        from advisor.measuring.planning.plan import plan_cells

        shard = self.check(pricing=True)
        self._check_adapters(rules)
        cells = plan_grid(self.models, rules, self.optimizers, self.strategies, self.seeds, self.base)
        if shard is not None:
            cells = shard.take(cells)
        return plan_cells(cells, rules, gpu=gpu, workers=list(workers) or [1], db=self.db)


@dataclass(frozen=True)
class Grid:
    """The cells a request runs, how many the whole grid has, the shard and the KB they go to."""

    cells: list[GridCell]
    planned: int
    shard: Shard | None
    path: Path


@dataclass(frozen=True)
class Measured:
    """What a request measured: its grid, each cell's result in planned order, and the rates tuned."""

    grid: Grid
    ran: GridRun
    tuned: list[Tuned]
    extra: list[CellResult] = field(default_factory=list)  # --decide's seeds, after the grid's
    calls: list[CloseCall] = field(default_factory=list)  # --decide: the close calls left after it

    @property
    def results(self) -> list[CellResult]:
        return [*self.ran, *self.extra]

    @property
    def nothing_measured(self) -> bool:
        """Whether no cell ended ok (or with another outcome: oom, diverged, untrained, skipped) and some
        failed or crashed: `advisor measure` then exits with code 1."""
        return nothing_measured(self.results)

    def as_dict(self) -> dict:
        return {
            "db": str(self.grid.path),
            "shard": str(self.grid.shard) if self.grid.shard else None,
            "cells_planned": self.grid.planned,
            "order_seed": self.ran.order_seed,
            "tuned": [t.as_dict() for t in self.tuned],
            "close_calls": [c.as_dict() for c in self.calls],
            "results": [r.as_dict() for r in self.results],
        }


# Run configuration fields that are not options: the grid's to set, and the data's, resolved by `plan()`
NOT_OPTIONS = (
    "model",
    "optimizer",
    "strategy",
    "seed",
    "role",
    "lr_grid",
    "data",
    "data_path",
    "data_id",
    "data_note",
)


def request(models: tuple[ResolvedModel, ...], **options) -> MeasureRequest:
    """A MeasureRequest from options by their names, as `advisor measure` and `advisor.measure` take them:
    the run configuration's fields go to its base (`memory` is its memory cap); InputError for the rest."""
    if "memory" in options:
        memory = options.pop("memory")  # GiB, the unit on the box
        options["memory_cap_gb"] = None if memory is None else memory * GB_PER_GIB
    run = {f.name for f in fields(RunConfig)} - set(NOT_OPTIONS)
    mine = {f.name for f in fields(MeasureRequest)} - {"models", "base"}
    unknown = sorted(set(options) - run - mine)
    if unknown:
        raise InputError(f"advisor measure takes no {', '.join(unknown)}.")
    base = RunConfig(**{k: v for k, v in options.items() if k in run and v is not None})
    _check_values(base)
    return MeasureRequest(models=tuple(models), base=base, **{k: v for k, v in options.items() if k in mine})


def _check_values(base: RunConfig) -> None:
    """What the command line's types check, checked for the Python API too (advisor.measure(lora_r=0))."""
    for name in ("lora_r", "lora_alpha"):
        value = getattr(base, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a whole number of at least 1, not {value!r}.", name)
    target = base.target_loss
    if target is not None and not (isinstance(target, int | float) and 0 < target < math.inf):
        raise InputError(f"target_loss must be a held-out loss above 0, not {target!r}.", "target_loss")
