"""--tune-lr: each optimizer's learning rate chosen before the grid runs (DeepOBS's protocol).

For every (model, optimizer, sizes, effective batch) of a grid: a log grid of rates around the optimizer's
default (rules/protocol.toml [tuning]), each trained once on a tuning seed no grid run uses, with the
strategy that makes the cell's update (a plain step for checkpointing, accumulation's own k-micro-batch
step for accumulation, LoRA's adapters for lora; those tuned at their own batch or adapter start from the
plain step's choice); the rate with the lowest final held-out loss wins. The tuning runs are stored
under their own source (measured:tuning), so answers never rank them; the grid's runs record the rate
chosen and the grid tried (config lr and lr_grid). Resumable like the grid: a tuning run already in the KB
is not repeated, on another host either where it trained (its loss reproduces: kb.lease.PORTABLE), and the
same runs choose the same rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from advisor.kb.lease import cell_outcome
from advisor.kb.open import connect_kb_readonly
from advisor.measuring.grid.runner import TUNING_SOURCE
from advisor.measuring.machine.hardware import describe, resolve_device
from advisor.measuring.recipe.config import DEFAULT_LR, GridCell, RunConfig
from advisor.rules import Rules


@dataclass(frozen=True)
class Tuned:
    """The rate chosen for one optimizer and model, and what each rate of the grid gave."""

    model: str
    optimizer: str
    strategy: str  # the strategy the rate was tuned with: the cells it serves make this update
    lr: float | None  # None: no rate of the grid trained; the grid keeps the optimizer's default
    tried: dict[float, str]  # rate -> 'held-out loss 2.31' or the run's status

    @property
    def at_edge(self) -> bool:
        """The chosen rate is the grid's smallest or largest: the best may lie beyond what was tried."""
        return self.lr is not None and self.lr in (min(self.tried), max(self.tried))

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "strategy": self.strategy,
            "lr": self.lr,
            "at_edge": self.at_edge,
            "tried": {f"{k:g}": v for k, v in self.tried.items()},
        }


def tuning_key(cfg: RunConfig, rules) -> RunConfig:
    """The tuning run's configuration for a grid cell, rate left open: what is shared by every cell the
    rate serves. The seed is the tuning's own; the strategy is the one that makes the cell's update
    (tuning_strategy), so accumulation's rate is tuned at its own effective batch."""
    tuning = rules.protocol["tuning"]
    return replace(
        cfg,
        strategy=tuning_strategy(cfg.strategy, rules),
        seed=tuning["seed"],
        lr=None,
        lr_grid=None,
        role="tuning",
    )


def tuning_strategy(strategy: str, rules) -> str:
    """The strategy a cell's rate is tuned with (Rules.tuning_strategy)."""
    return rules.tuning_strategy(strategy)


def rates(key: RunConfig, rules: Rules) -> tuple[float, ...]:
    return tuple(float(f"{DEFAULT_LR[key.optimizer] * f:.3g}") for f in rules.protocol["tuning"]["factors"])


def tune(
    cells: list[GridCell],
    db_path: Path,
    run: Callable[[list[GridCell]], object],
    rules: Rules,
) -> tuple[list[GridCell], list[Tuned]]:
    """Run the tuning grid (through `run`, e.g. the grid runner), choose each rate, and return the grid's
    cells at their rates with the grid recorded, and what was chosen.

    The plain step's rates first, on the whole log grid; a strategy tuned at its own batch (`[tuning.with]`)
    then starts from the plain step's choice for the same model and optimizer: the rates of that grid
    within `around` steps of it. A rate chosen at the edge of what was tried is not a choice but a bound:
    the grid is extended a step beyond it (`extend` times at most) until the best lies inside; then every
    optimizer of the same model and update is widened to as many rates as the one that tried most (one grid
    width rule for all). Muon's AdamW part takes the rate chosen for AdamW on the same key (AdamW is tuned
    first, added where the grid lacks it): its embeddings, output layer and norms train as AdamW's do."""
    keys = {tuning_key(c.config, rules): c.model for c in cells}
    keys |= {replace(k, optimizer="adamw"): m for k, m in keys.items() if k.optimizer == "muon"}
    default = rules.protocol["tuning"]["strategy"]
    plain = {replace(k, strategy=default): m for k, m in keys.items()}  # where every own strategy starts
    grids = {k: rates(k, rules) for k in plain}
    chosen = _tuned_muon_last(plain, grids, db_path, run, rules)
    own = {k: m for k, m in keys.items() if k.strategy != default}
    for k in own:
        start = replace(k, strategy=default)
        grids[k] = _around(chosen[start], grids[start], rules)
    chosen |= _tuned_muon_last(own, grids, db_path, run, rules)
    out = []
    for cell in cells:
        key = tuning_key(cell.config, rules)
        found = chosen[key]
        tuned = {} if found.lr is None else dict(lr=found.lr, lr_grid=grids[key])
        if key.optimizer == "muon" and found.lr is not None:
            tuned["adamw_lr"] = _adamw_lr(key, chosen)
        out.append(cell.with_config(**tuned))
    return out, list(chosen.values())


def _tuned(keys: dict, grids: dict, db_path: Path, run, rules: Rules) -> dict[RunConfig, Tuned]:
    """Each key's rate: its grid trained on the tuning seed, then extended past an edge choice (`grids` grows
    with what was tried)."""
    if not keys:
        return {}
    run([GridCell(replace(k, lr=lr), model) for k, model in keys.items() for lr in grids[k]])
    chosen = {k: _choose(k, grids[k], db_path) for k in keys}
    for _ in range(rules.protocol["tuning"].get("extend", 0)):
        beyond = {k: lr for k in keys if (lr := _beyond(chosen[k], grids[k], rules)) is not None}
        if not beyond:
            break
        run([GridCell(replace(k, lr=lr), keys[k]) for k, lr in beyond.items()])
        for k, lr in beyond.items():
            grids[k] = tuple(sorted((*grids[k], lr)))
            chosen[k] = _choose(k, grids[k], db_path)
    return chosen


def _tuned_muon_last(keys: dict, grids: dict, db_path: Path, run, rules: Rules) -> dict[RunConfig, Tuned]:
    """The keys' rates, Muon's after AdamW's: its tuning runs train their AdamW part at AdamW's choice."""
    chosen = _tuned({k: m for k, m in keys.items() if k.optimizer != "muon"}, grids, db_path, run, rules)
    muon = {k: m for k, m in keys.items() if k.optimizer == "muon"}
    at = {k: replace(k, adamw_lr=_adamw_lr(k, chosen)) for k in muon}  # the runs' own configuration
    grids |= {at[k]: grids[k] for k in muon}
    found = _tuned({at[k]: m for k, m in muon.items()}, grids, db_path, run, rules)
    for k in muon:
        grids[k], chosen[k] = grids[at[k]], found[at[k]]
    return _widened(keys, grids, chosen, at, db_path, run, rules)


def _adamw_lr(key: RunConfig, chosen: dict[RunConfig, Tuned]) -> float | None:
    """The rate chosen for AdamW on a Muon key's model and update (None: AdamW's default, none trained)."""
    return chosen[replace(key, optimizer="adamw", adamw_lr=None)].lr


def _widened(keys, grids, chosen, at, db_path, run, rules: Rules) -> dict[RunConfig, Tuned]:
    """Every optimizer of one model and update widened to as many rates as the one that tried most, a step
    beyond alternate ends (the top first): no optimizer gets more tries at a lucky rate than another."""
    width: dict[RunConfig, int] = {}
    for k in keys:
        peers = replace(k, optimizer="", adamw_lr=None)
        width[peers] = max(width.get(peers, 0), len(grids[k]))
    factors = rules.protocol["tuning"]["factors"]
    step = factors[1] / factors[0]
    while more := {
        k: grid
        for k in keys
        if len(grid := grids[k]) < width[replace(k, optimizer="", adamw_lr=None)] and chosen[k].lr is not None
    }:
        added = {}
        for k, grid in more.items():
            up = len(grid) % 2 == len(rates(k, rules)) % 2  # alternate: above the top, then below the bottom
            added[k] = float(f"{max(grid) * step:.3g}") if up else float(f"{min(grid) / step:.3g}")
        run([GridCell(replace(at.get(k, k), lr=lr), keys[k]) for k, lr in added.items()])
        for k, lr in added.items():
            grids[k] = tuple(sorted((*grids[k], lr)))
            chosen[k] = _choose(at.get(k, k), grids[k], db_path)
    return chosen


def _around(start: Tuned, grid: tuple[float, ...], rules: Rules) -> tuple[float, ...]:
    """The rates of the plain step's grid within `around` steps of its choice (the whole grid when it chose
    none, or when `around` is not set): where a strategy tuned at its own batch starts."""
    steps = rules.protocol["tuning"].get("around")
    if start.lr is None or steps is None:
        return grid
    i = grid.index(start.lr)
    return grid[max(0, i - steps) : i + steps + 1]


def _beyond(found: Tuned, grid: tuple[float, ...], rules: Rules) -> float | None:
    """The next rate past the edge the choice sits on (one step of the grid's own spacing), or None when the
    choice lies inside the grid, or nothing trained."""
    if found.lr is None or not found.at_edge:
        return None
    factors = rules.protocol["tuning"]["factors"]
    step = factors[1] / factors[0]
    return float(f"{found.lr * step:.3g}") if found.lr == max(grid) else float(f"{found.lr / step:.3g}")


def _choose(key: RunConfig, grid: tuple[float, ...], db_path: Path) -> Tuned:
    """The rate whose tuning run ended ok with the lowest final held-out loss, read back from the KB."""
    device = resolve_device(key.device)
    hardware = describe(device)["hardware"]
    conn = connect_kb_readonly(db_path)
    tried: dict[float, str] = {}
    losses: dict[float, float] = {}
    try:
        for lr in grid:
            cfg = replace(replace(key, lr=lr).resolved(), device=device)
            # this host's run first, else one that trained elsewhere (lease.PORTABLE)
            row = cell_outcome(conn, TUNING_SOURCE, cfg.cell_key(), cfg.seed, hardware)
            if row is None:
                tried[lr] = "not run"
            elif row[0] == "ok" and row[1] is not None:
                losses[lr] = row[1]
                tried[lr] = f"held-out loss {row[1]:.4g}"
            else:
                tried[lr] = row[0]
    finally:
        conn.close()
    best = min(losses, key=lambda lr: (losses[lr], lr)) if losses else None
    return Tuned(key.model, key.optimizer, key.strategy, best, tried)
