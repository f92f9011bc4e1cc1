"""What a grid works out once and hands to the cells after it (issue 25). Each cell runs in a fresh
process, so what one cell computed dies with it unless the grid keeps it: the device's peak FLOP rate, a
model's forward FLOPs at an input shape, and the generated corpus's encoded training and held-out sets.
Each is a pure function of its key, so a kept value is the value the cell would have computed; the cell that
computes one first sends it back to the grid after its result (`isolation`), the cells after it reuse it.

A dataset that the run reads from files (`--data`) is never kept: it is read once per run as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from advisor.measuring.flops import Peaks

KEPT_BYTES = 32 * 2**20  # the largest encoded set kept (a paper-size image set is read again, not shipped)


@dataclass
class GridMemo:
    """Device peaks, forward FLOPs per position and encoded generated sets, each by its key."""

    peaks: Peaks = field(default_factory=dict)  # (device, dtype) -> DevicePeak
    flops: dict[tuple, float] = field(default_factory=dict)  # flop_key(...) -> forward FLOPs per position
    data: dict[tuple, tuple[Any, str]] = field(default_factory=dict)  # data key -> (dataset, its source)

    def flops_of(self, key: tuple, count: Callable[[], float]) -> float:
        """The forward FLOPs per position kept under `key`, else counted now and kept."""
        if key not in self.flops:
            self.flops[key] = count()
        return self.flops[key]

    def dataset(self, key: tuple, build: Callable[[], tuple[Any, str]]) -> tuple[Any, str]:
        """(dataset, source) kept under `key` (data_key), else built now and kept if it is small enough to
        send to every cell after (KEPT_BYTES)."""
        if key not in self.data:
            built = build()
            if built[0].data.nbytes > KEPT_BYTES:
                return built
            self.data[key] = built
        return self.data[key]

    def for_cell(self, family: str, model: str, seed: int, split: str) -> GridMemo:
        """What a cell can use: every peak and FLOP count, and of the sets only its model's training set of
        its seed and held-out set of its split. A set given arrives with the cell's process, before its
        memory baseline: only what it uses may (the trainer takes it out of the baseline, `given_gb`)."""
        data = {k: v for k, v in self.data.items() if k[:2] == (family, model) and k[-1] in (seed, split)}
        return GridMemo(dict(self.peaks), dict(self.flops), data)

    def forget_work(self) -> None:
        """Drop the data and FLOP counts (a new grid: other rules may shape them); the device peak stays."""
        self.flops.clear()
        self.data.clear()

    def added_since(self, before: GridMemo) -> GridMemo:
        """The entries this memo holds that `before` (what the cell was given) did not: what a cell sends back."""
        return GridMemo(
            {k: v for k, v in self.peaks.items() if k not in before.peaks},
            {k: v for k, v in self.flops.items() if k not in before.flops},
            {k: v for k, v in self.data.items() if k not in before.data},
        )

    def update(self, other: GridMemo) -> None:
        """Take what a cell sent back."""
        self.peaks.update(other.peaks)
        self.flops.update(other.flops)
        self.data.update(other.data)

    def copy(self) -> GridMemo:
        return GridMemo(dict(self.peaks), dict(self.flops), dict(self.data))


def data_key(family: str, model: str, shape, examples: int, which: int | str) -> tuple:
    """What an encoded set of the generated corpus depends on: the family's encoding, the model (its own
    tokenizer, where it has one), the data shape (as text: a user's tokenizer object is not part of its
    repr, and never travels with the key), the number of examples, and the training seed or the held-out
    split."""
    return (family, model, repr(shape), examples, which)


def flop_key(cfg, config_hash: str | None, shape, batch: dict) -> tuple:
    """What a model's forward FLOPs per position depend on: the model (name, config, preset, data shape), the
    strategy and its adapter, the precision and device, and the micro-batch's tensor shapes (FlopCounterMode
    counts by shapes only). Optimizer, seed and rate are not in it: they do not change the forward."""
    shapes = tuple(sorted((k, tuple(v.shape)) for k, v in batch.items() if hasattr(v, "shape")))
    model = (cfg.model, config_hash, cfg.preset, repr(shape))
    return (*model, cfg.strategy, cfg.lora_r, cfg.lora_alpha, cfg.dtype, str(cfg.device), shapes)
