"""The grid runner: every cell (model × optimizer × strategy × seed) trained, monitored and written to the KB.

A cell never stops the grid: out-of-memory, divergence and exceptions end that cell with status `oom`,
`diverged` or `failed` and the grid goes on. Cells already `ok`, `oom` or `diverged` on this hardware are
skipped (a re-run would repeat the outcome); `failed` ones are run again, and runs left `running` by a
process that died are marked `crashed` and run again.
"""

from __future__ import annotations

import ctypes
import gc
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from advisor.schema import cell_key
from measure import record
from measure.config import RunConfig
from measure.hardware import describe, resolve_device


class Diverged(Exception):
    """The loss became NaN/inf or exploded."""


class OutOfMemory(Exception):
    """An allocation failed (CUDA or host) or the memory cap was crossed."""


@dataclass
class CellResult:
    config: RunConfig
    status: str  # ok | oom | diverged | failed | skipped | crashed
    run_id: int | None = None
    loss: float | None = None
    epoch_time: float | None = None
    peak_memory_gb: float | None = None
    error: str | None = None

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


class Reporter:
    """Progress callbacks; the silent default. The CLI passes a rich one."""

    def grid_start(self, total: int) -> None: ...
    def cell_start(self, config: RunConfig, total_steps: int) -> None: ...
    def step(self, loss: float) -> None: ...
    def cell_end(self, result: CellResult) -> None: ...


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


def run_grid(configs: list[RunConfig], db_path: Path, reporter: Reporter | None = None) -> list[CellResult]:
    reporter = reporter or Reporter()
    conn = record.connect(db_path)
    record.mark_crashed(conn)
    reporter.grid_start(len(configs))
    results = []
    for cfg in configs:
        result = run_cell(cfg, conn, reporter)
        results.append(result)
        reporter.cell_end(result)
    conn.close()
    return results


def run_cell(cfg: RunConfig, conn, reporter: Reporter | None = None) -> CellResult:
    """Train one cell and record it; never raises for a failure of the cell itself."""
    import torch

    reporter = reporter or Reporter()
    protocol = cfg.protocol()
    cfg = cfg.resolved()
    try:
        device = resolve_device(cfg.device)
    except ValueError as e:
        return CellResult(cfg, "failed", error=str(e))
    cfg = replace(cfg, device=device)
    machine = describe(device)
    key = cell_key(cfg.as_dict())
    from measure.models import REFERENCE_MODELS

    family = REFERENCE_MODELS.get(cfg.model) or _family_of(cfg.model)
    run = {
        "model": cfg.model,
        "family": family,
        "optimizer": cfg.optimizer,
        "strategy": cfg.strategy,
        "preset": cfg.preset if cfg.model in REFERENCE_MODELS else "custom",
        "config": cfg.as_dict(),
        "protocol": protocol,
        **machine,
    }
    run_id, taken = record.claim(conn, key, cfg.seed, run)
    if run_id is None:
        return CellResult(cfg, "skipped", error=f"already {taken} in this KB for this hardware")
    trainer = _Trainer(cfg, conn, run_id, reporter, run["config"])
    try:
        trainer.train()
        status, error = "ok", None
    except KeyboardInterrupt:
        record.finish(conn, run_id, "crashed", "interrupted by the user", trainer.summary())
        raise
    except Diverged as e:
        status, error = "diverged", str(e)
    except Exception as e:  # the cell failed; the grid goes on
        if is_oom(e):
            peak = trainer.peak_memory_gb()
            status, error = (
                "oom",
                f"out of memory ({_first_line(e)})" + (f"; peak {peak:.2f} GB" if peak else ""),
            )
        else:
            status, error = "failed", f"{type(e).__name__}: {_first_line(e)}"
    summary = trainer.summary()
    record.finish(conn, run_id, status, error, summary)
    figures = {name: value for name, value, _ in summary}
    trainer.release()
    if device == "cuda":
        torch.cuda.empty_cache()
    return CellResult(
        cfg,
        status,
        run_id,
        figures.get("loss"),
        figures.get("epoch_time"),
        figures.get("gpu_mem_peak_gb") or figures.get("peak_rss_gb"),
        error,
    )


def _family_of(model: str) -> str:
    from advisor.models import resolve_model
    from advisor.rules import load_rules

    return resolve_model(model, load_rules()).family.name


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


class _Trainer:
    """The training loop of one cell, with its monitor, timing and per-epoch records."""

    def __init__(self, cfg: RunConfig, conn, run_id: int, reporter: Reporter, config_json: dict):
        self.cfg, self.conn, self.run_id, self.reporter, self.config_json = (
            cfg,
            conn,
            run_id,
            reporter,
            config_json,
        )
        self.epochs: list[dict] = []
        self.model = self.optimizer = self.monitor = self.scheduler = None
        self.steps_done, self.first_loss, self.warm, self.warm_steps = 0, None, 0.0, 0

    def train(self) -> None:
        import torch

        from measure.data import batches, load
        from measure.models import build_model
        from measure.monitor import Monitor
        from measure.optimizers import make_optimizer
        from measure.strategies import prepare, window_size

        cfg = self.cfg
        device = torch.device(cfg.device)
        window = window_size(cfg.strategy, cfg.accumulation_steps)
        if cfg.steps_per_epoch % window:
            raise ValueError(
                f"steps per epoch ({cfg.steps_per_epoch}) must be a multiple of the accumulation "
                f"steps ({window})"
            )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            if cfg.memory_cap_gb:
                total = torch.cuda.get_device_properties(0).total_memory / 1e9
                torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_cap_gb / total))
        built = build_model(
            cfg.model, cfg.preset if cfg.preset != "custom" else "small", cfg.dropout, cfg.seed
        )
        self.model = built.model.to(device)
        dataset, data_source = load(built.family, built.shape, cfg.steps_per_epoch * cfg.batch_size, cfg.seed)
        record.update_run(
            self.conn,
            self.run_id,
            n_params=built.n_params,
            pretrained=int(built.pretrained),
            config=_json({**self.config_json, "data": data_source}),
        )
        prepare(self.model, cfg.strategy)
        self.optimizer = make_optimizer(
            cfg.optimizer,
            self.model.parameters(),
            cfg.lr,
            **({"line_search": cfg.cgd_line_search, "beta": cfg.cgd_beta} if cfg.optimizer == "cgd" else {}),
        )
        steps_per_epoch = cfg.steps_per_epoch // window
        self.scheduler = _warmup(self.optimizer, cfg.warmup_ratio, steps_per_epoch * cfg.epochs)
        self.family, self.device = built.family, device
        self.reporter.cell_start(cfg, steps_per_epoch * cfg.epochs)
        cap = None if device.type == "cuda" else cfg.memory_cap_gb
        with Monitor(memory_cap_gb=cap) as self.monitor:
            for epoch in range(cfg.epochs):
                mark, self.warm, self.warm_steps, losses = self.monitor.mark(), 0.0, 0, []
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                start = _clock(device)
                micro = batches(dataset, built.family, cfg.batch_size, cfg.seed, epoch)
                for _ in range(steps_per_epoch):
                    losses.append(self.step([next(micro) for _ in range(window)]))
                wall = _epoch_wall(_clock(device) - start - self.warm, len(losses), self.warm_steps)
                self._end_epoch(epoch, len(losses), losses, wall, self.warm, mark, device)

    def step(self, window: list[dict]) -> float:
        """One optimizer step as the harness takes it: timed, checked for divergence and memory, reported."""
        from measure.strategies import train_step

        t0 = _clock(self.device)
        loss = train_step(self.model, self.optimizer, self.family, window, self.device, self._check_memory)
        self.scheduler.step()
        t1 = _clock(self.device)
        if self.steps_done < self.cfg.warmup_steps:
            self.warm += t1 - t0
            self.warm_steps += 1
        self.steps_done += 1
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self._check_divergence(loss, self.first_loss, self.steps_done)
        self.reporter.step(loss)
        return loss

    def _check_memory(self) -> None:
        if self.monitor is not None and self.monitor.over_cap is not None:
            raise OutOfMemory(
                f"host RSS {self.monitor.over_cap:.2f} GB crossed --memory-cap {self.cfg.memory_cap_gb:g} GB"
            )

    def _check_divergence(self, loss: float, first: float, step: int) -> None:
        if not math.isfinite(loss):
            raise Diverged(f"loss became {loss} at step {step}")
        if loss > self.cfg.divergence_factor * max(first, 1e-8):
            raise Diverged(
                f"loss {loss:.4g} at step {step} exceeds {self.cfg.divergence_factor:g}x the first "
                f"step's {first:.4g}"
            )

    def _end_epoch(self, epoch, steps, losses, wall, warm, mark, device) -> None:
        import torch

        stats = self.monitor.window(mark)
        row = {
            "epoch": epoch,
            "steps": steps,
            "loss": sum(losses) / len(losses),
            "wall_s": wall,
            "warmup_s": warm if epoch == 0 else None,
            "peak_rss_gb": stats.peak_rss_gb,
            "peak_gpu_allocated_gb": torch.cuda.max_memory_allocated() / 1e9
            if device.type == "cuda"
            else None,
            "peak_gpu_reserved_gb": torch.cuda.max_memory_reserved() / 1e9 if device.type == "cuda" else None,
            "gpu_util": stats.gpu_util,
            "cpu_util": stats.cpu_util,
            "energy_j": stats.energy_j,
        }
        self.epochs.append(row)
        record.add_epoch(self.conn, self.run_id, row)

    def peak_memory_gb(self) -> float | None:
        import torch

        if self.cfg.device == "cuda":
            return torch.cuda.max_memory_allocated() / 1e9
        if self.monitor is not None:
            return max((s.rss_gb for s in self.monitor.samples), default=None)
        return None

    def summary(self) -> list[tuple[str, float, str]]:
        """Run-level figures from the finished epochs (NULL-free: what was not measured is absent)."""
        e = self.epochs
        if not e:
            peak = self.peak_memory_gb()
            key = "gpu_mem_peak_gb" if self.cfg.device == "cuda" else "peak_rss_gb"
            return [(key, peak, "GB")] if peak else []

        def col(k):
            return [r[k] for r in e if r[k] is not None]

        out = [
            ("loss", sum(col("loss")) / len(e), "nats/target, mean over epochs"),
            ("loss_final", e[-1]["loss"], "nats/target, last epoch"),
            # the median epoch: one epoch slowed by another process on a shared machine does not move it
        ]
        if col("wall_s"):  # absent when every step was a warm-up step
            out.append(
                (
                    "epoch_time",
                    statistics.median(col("wall_s")),
                    "s/epoch, median over epochs, warm-up excluded",
                )
            )
        for name, key, agg, unit in (
            ("peak_rss_gb", "peak_rss_gb", max, "GB"),
            ("gpu_mem_peak_gb", "peak_gpu_allocated_gb", max, "GB"),
            ("gpu_mem_reserved_gb", "peak_gpu_reserved_gb", max, "GB"),
            ("gpu_util", "gpu_util", _mean, "%"),
            ("cpu_util", "cpu_util", _mean, "% of one core"),
            ("energy_j", "energy_j", sum, "J"),
        ):
            if col(key):
                out.append((name, agg(col(key)), unit))
        return out

    def release(self) -> None:
        """Drop the model, optimizer and samples so nothing of this cell is held into the next."""
        self.model = self.optimizer = None
        if self.monitor is not None:
            self.monitor.forget()
        gc.collect()
        _trim_heap()


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them in its arenas), so the next cell's peak RSS
    starts from the process's baseline, not from this cell's high-water mark."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _mean(values):
    return sum(values) / len(values)


def _json(obj) -> str:
    import json

    return json.dumps(obj, sort_keys=True)


def _epoch_wall(timed: float, steps: int, warm_steps: int) -> float | None:
    """Seconds for the whole epoch at the rate of its timed (post-warm-up) steps; None if none was timed.

    Subtracting the warm-up alone would make the first epoch look shorter by the steps it left out."""
    if steps <= warm_steps:
        return None
    return timed * steps / (steps - warm_steps)


def _clock(device) -> float:
    """perf_counter after the GPU has finished its queued work (CUDA runs asynchronously)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()
    return time.perf_counter()


def _warmup(optimizer, ratio: float, total_steps: int):
    """Linear learning-rate warm-up over ratio × total steps (the paper: 0.03 on Llama), then constant."""
    import torch

    warm = max(1, round(ratio * total_steps)) if ratio else 0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
