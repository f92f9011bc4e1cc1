"""Running a planned grid on this machine: every cell in a fresh process, in an order shuffled by a recorded
seed, into one KB.

(Moved here from advisor/measuring/grid/runner.py: the runner says what one cell is and does; this module runs many;
advisor/measuring/grid/isolation.py runs one in its own process.)

A fresh process per cell makes a cell's memory its own: peaks do not carry over from the cell before, so
they do not depend on the order. The order is shuffled all the same, within each (model, seed) block (an
early stop still leaves whole seeds), so that drift over a grid (a machine warming up, another job
starting) is not confounded with a configuration; each run records where it ran ({"seed", "position",
"cells"}), and the same seed runs the same order again.
"""

from __future__ import annotations

import itertools
import random
import secrets
from pathlib import Path

from advisor.kb import lease
from advisor.kb.open import writing
from advisor.measuring.grid import isolation
from advisor.measuring.grid.runner import CellResult
from advisor.measuring.recipe.config import GridCell
from advisor.measuring.training.progress import Reporter
from advisor.rules import Rules


class GridRun(list):
    """The grid's CellResults in planned order (as a list), with the seed that shuffled the order they ran
    in (`order_seed`) and that order (`order`: indices into the plan)."""

    def __init__(self, results: list[CellResult], order_seed: int, order: list[int]):
        super().__init__(results)
        self.order_seed, self.order = order_seed, order


def run_order(cells: list[GridCell], seed: int) -> list[int]:
    """Indices of `cells` in the order they run: each block of consecutive cells of one (model, seed)
    shuffled by `seed`, the blocks in planned order."""
    rng, order = random.Random(seed), []
    configs = [c.config for c in cells]
    for _, block in itertools.groupby(range(len(configs)), key=lambda i: (configs[i].model, configs[i].seed)):
        block = list(block)
        rng.shuffle(block)
        order += block
    return order


def new_order_seed() -> int:
    """A fresh seed for the order cells run in (printed and recorded, so the order can be run again)."""
    return secrets.randbelow(2**31)


def run_grid(
    cells: list[GridCell],
    db_path: Path,
    rules: Rules,
    reporter: Reporter | None = None,
    order_seed: int | None = None,
) -> GridRun:
    """Every cell, each in its own process, into the KB at db_path (created if needed). order_seed shuffles
    the order they run in (None: a seed drawn now); the results come back in planned order.

    A cell whose process dies is `crashed` and the grid goes on; Ctrl-C stops the grid once the cell has
    recorded its run crashed; a KB that cannot take a cell's rows (a full disk) stops it with a KBError."""
    reporter = reporter or Reporter()
    order_seed = new_order_seed() if order_seed is None else order_seed
    order = run_order(cells, order_seed)
    results: list[CellResult | None] = [None] * len(cells)
    with writing(db_path) as conn:
        lease.mark_crashed(conn, isolation.alive)
        if cells:
            isolation.start_server(rules)
        reporter.grid_start(len(cells))
        if cells and not isolation.server_ready():  # the first seconds: the server imports torch
            reporter.waiting(isolation.STARTING)
        for position, index in enumerate(order):
            where = {"seed": order_seed, "position": position, "cells": len(cells)}
            result = isolation.run_in_child(cells[index], db_path, conn, reporter, rules, where)
            results[index] = result
            reporter.cell_end(result)
    return GridRun(results, order_seed, order)
