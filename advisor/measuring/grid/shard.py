"""A deterministic share of the grid for any scheduler: shard K of N runs every N-th cell by cell key.

Cells are ordered by a hash of their key (the resolved configuration, seed included), then dealt out in
turn: every cell falls in exactly one shard, shards differ in size by at most one cell, and the split is
the same on every host that plans the same grid (it depends on no order, clock or host). A Slurm job array
passes `--shard auto`: shard SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN + 1 of SLURM_ARRAY_TASK_COUNT.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from advisor.errors import InputError
from advisor.measuring.recipe.config import GridCell


class ShardError(InputError):
    """A --shard that cannot be used: one sentence that says what to pass."""

    def __init__(self, message: str):
        super().__init__(message, "shard")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def take(self, cells: list[GridCell]) -> list[GridCell]:
        """This shard's cells, in planned order."""
        ranked = sorted(range(len(cells)), key=lambda i: _digest(cells[i]))
        mine = set(ranked[self.index - 1 :: self.count])
        return [c for i, c in enumerate(cells) if i in mine]


def _digest(cell: GridCell) -> str:
    key = f"{cell.resolved.cell_key()}:{cell.config.seed}"
    return hashlib.sha256(key.encode()).hexdigest()


def parse(text: str, environ: dict | None = None) -> Shard:
    """'K/N' (1 ≤ K ≤ N) or 'auto' (from a Slurm job array's variables)."""
    if text == "auto":
        return from_slurm(os.environ if environ is None else environ)
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ShardError(
            f"{text!r} is not K/N: pass e.g. --shard 2/8 (the second of 8 shards) or --shard auto."
        )
    return _existing(int(match[1]), int(match[2]))


def _existing(index: int, count: int) -> Shard:
    if count < 1 or not 1 <= index <= count:
        raise ShardError(f"shard {index} of {count} does not exist: K runs from 1 to N, and N is at least 1.")
    return Shard(index, count)


def from_slurm(environ) -> Shard:
    """The shard of this Slurm array task (task ids may start anywhere: --array=0-7 or 1-8)."""
    try:
        task, count = int(environ["SLURM_ARRAY_TASK_ID"]), int(environ["SLURM_ARRAY_TASK_COUNT"])
    except KeyError as e:
        raise ShardError(
            f"--shard auto reads a Slurm job array's variables, and {e.args[0]} is not set: run it inside "
            "`sbatch --array`, or pass --shard K/N."
        ) from e
    except ValueError as e:
        raise ShardError(f"--shard auto: a Slurm array variable is not a number ({e}).") from e
    first = int(environ.get("SLURM_ARRAY_TASK_MIN", 0))
    if environ.get("SLURM_ARRAY_TASK_STEP", "1") != "1":
        raise ShardError("--shard auto needs a contiguous array (--array=0-7, no :step): pass --shard K/N.")
    return _existing(task - first + 1, count)
