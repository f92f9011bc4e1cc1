"""The training loop of one cell, as the harness runs it: build the model and data, train epoch by epoch
under the resource monitor, time every step, stop on divergence or a crossed memory cap.

The trainer knows nothing of the KB: it reports through callbacks (`on_built` once the model exists,
`on_epoch` with each finished epoch's row), so the same loop serves the local grid, a forked cell and a
remote worker.
"""

from __future__ import annotations

import ctypes
import gc
import math
import time
from collections.abc import Callable

from measure.config import RunConfig
from measure.progress import Reporter
from measure.summary import epoch_row, peak_only, run_metrics


class Diverged(Exception):
    """The loss became NaN/inf or exploded."""


class OutOfMemory(Exception):
    """An allocation failed (CUDA or host) or the memory cap was crossed."""


class Trainer:
    """Train one resolved configuration; `epochs` holds the finished epochs' rows."""

    def __init__(
        self,
        cfg: RunConfig,
        reporter: Reporter | None = None,
        on_built: Callable[[dict], None] | None = None,
        on_epoch: Callable[[dict], None] | None = None,
        rules=None,
    ):
        self.cfg, self.reporter, self.rules = cfg, reporter or Reporter(), rules
        self.on_built, self.on_epoch = on_built or (lambda info: None), on_epoch or (lambda row: None)
        self.epochs: list[dict] = []
        self.model = self.optimizer = self.monitor = self.scheduler = self.family = None
        self.steps_done, self.first_loss, self.warm, self.warm_steps = 0, None, 0.0, 0

    def setup(self) -> None:
        """Build the model (on the device), the optimizer and the schedule; apply the strategy."""
        import torch

        from measure.models import build_model
        from measure.optimizers import make_optimizer
        from measure.strategies import prepare

        cfg = self.cfg
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            if cfg.memory_cap_gb:
                total = torch.cuda.get_device_properties(0).total_memory / 1e9
                torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_cap_gb / total))
        preset = cfg.preset if cfg.preset != "custom" else "small"
        built = build_model(cfg.model, preset, cfg.dropout, cfg.seed, self.rules)
        self.built, self.family = built, built.family
        self.model = built.model.to(self.device)
        prepare(self.model, cfg.strategy)
        cgd = {"line_search": cfg.cgd_line_search, "beta": cfg.cgd_beta} if cfg.optimizer == "cgd" else {}
        self.optimizer = make_optimizer(cfg.optimizer, self.model.parameters(), cfg.lr, **cgd)
        self.scheduler = warmup_schedule(self.optimizer, cfg.warmup_ratio, self.steps_per_epoch * cfg.epochs)

    @property
    def window(self) -> int:
        from measure.strategies import window_size

        return window_size(self.cfg.strategy, self.cfg.accumulation_steps)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch: every strategy sees the same micro-batches."""
        return self.cfg.steps_per_epoch // self.window

    def train(self) -> None:
        """Set up, then train every epoch; raises Diverged, OutOfMemory or whatever the cell raised."""
        from measure.data import load
        from measure.monitor import Monitor

        cfg = self.cfg
        if cfg.steps_per_epoch % self.window:
            raise ValueError(
                f"steps per epoch ({cfg.steps_per_epoch}) must be a multiple of the accumulation "
                f"steps ({self.window})"
            )
        self.setup()
        dataset, source = load(self.family, self.built.shape, cfg.steps_per_epoch * cfg.batch_size, cfg.seed)
        self.on_built(dict(n_params=self.built.n_params, pretrained=self.built.pretrained, data=source))
        self.reporter.cell_start(cfg, self.steps_per_epoch * cfg.epochs)
        cap = None if self.device.type == "cuda" else cfg.memory_cap_gb
        with Monitor(memory_cap_gb=cap) as self.monitor:
            for epoch in range(cfg.epochs):
                self.train_epoch(dataset, epoch)

    def train_epoch(self, dataset, epoch: int) -> None:
        import torch

        from measure.data import batches

        mark, self.warm, self.warm_steps, losses = self.monitor.mark(), 0.0, 0, []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        start = clock(self.device)
        micro = batches(dataset, self.family, self.cfg.batch_size, self.cfg.seed, epoch)
        for _ in range(self.steps_per_epoch):
            losses.append(self.step([next(micro) for _ in range(self.window)]))
        wall = epoch_wall(clock(self.device) - start - self.warm, len(losses), self.warm_steps)
        row = epoch_row(epoch, losses, wall, self.warm, self.monitor.window(mark), self._gpu_peaks())
        self.epochs.append(row)
        self.on_epoch(row)

    def step(self, window: list[dict]) -> float:
        """One optimizer step as the harness takes it: timed, checked for divergence and memory, reported."""
        from measure.strategies import train_step

        t0 = clock(self.device)
        loss = train_step(self.model, self.optimizer, self.family, window, self.device, self.check_memory)
        self.scheduler.step()
        t1 = clock(self.device)
        if self.steps_done < self.cfg.warmup_steps:
            self.warm += t1 - t0
            self.warm_steps += 1
        self.steps_done += 1
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.check_divergence(loss)
        self.reporter.step(loss)
        return loss

    def check_memory(self) -> None:
        if self.monitor is not None and self.monitor.over_cap is not None:
            raise OutOfMemory(
                f"host RSS {self.monitor.over_cap:.2f} GB crossed --memory-cap {self.cfg.memory_cap_gb:g} GB"
            )

    def check_divergence(self, loss: float) -> None:
        if not math.isfinite(loss):
            raise Diverged(f"loss became {loss} at step {self.steps_done}")
        first = self.first_loss
        if loss > self.cfg.divergence_factor * max(first, 1e-8):
            raise Diverged(
                f"loss {loss:.4g} at step {self.steps_done} exceeds {self.cfg.divergence_factor:g}x the first "
                f"step's {first:.4g}"
            )

    def _gpu_peaks(self) -> dict:
        if self.device.type != "cuda":
            return {}
        import torch

        return {
            "allocated": torch.cuda.max_memory_allocated() / 1e9,
            "reserved": torch.cuda.max_memory_reserved() / 1e9,
        }

    def peak_memory_gb(self) -> float | None:
        """The highest memory the cell reached so far: GPU allocated on CUDA, else host RSS."""
        if self.cfg.device == "cuda":
            import torch

            return torch.cuda.max_memory_allocated() / 1e9
        if self.monitor is not None:
            return max((s.rss_gb for s in self.monitor.samples), default=None)
        return None

    def metrics(self) -> list[tuple[str, float, str]]:
        """Run-level figures from the finished epochs, or the memory peak of a cell that finished none."""
        return run_metrics(self.epochs) or peak_only(self.peak_memory_gb(), self.cfg.device)

    def release(self) -> None:
        """Drop the model, optimizer and samples so nothing of this cell is held into the next."""
        self.model = self.optimizer = self.built = None
        if self.monitor is not None:
            self.monitor.forget()
        gc.collect()
        trim_heap()
        if self.cfg.device == "cuda":
            import torch

            torch.cuda.empty_cache()


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them in its arenas), so the next cell's peak RSS
    starts from the process's baseline, not from this cell's high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def epoch_wall(timed: float, steps: int, warm_steps: int) -> float | None:
    """Seconds for the whole epoch at the rate of its timed (post-warm-up) steps; None if none was timed.

    Subtracting the warm-up alone would make the first epoch look shorter by the steps it left out."""
    if steps <= warm_steps:
        return None
    return timed * steps / (steps - warm_steps)


def clock(device) -> float:
    """perf_counter after the GPU has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


def warmup_schedule(optimizer, ratio: float, total_steps: int):
    """Linear learning-rate warm-up over ratio × total steps (the paper: 0.03 on Llama), then constant."""
    import torch

    warm = max(1, round(ratio * total_steps)) if ratio else 0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
