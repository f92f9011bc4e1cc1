"""The training loop of one cell, as the harness runs it: build the model and data, train epoch by epoch
under the resource monitor, time every step, stop on divergence or a crossed memory cap; under the fair
protocol, evaluate on held-out data before training and after every epoch; last, one measured step for
the peak of live tensor bytes.

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

import torch

from advisor.measuring.data.corpus import epoch_batches, load
from advisor.measuring.data.shape import DEFAULT_SHAPE
from advisor.measuring.data.table import open_view
from advisor.measuring.machine.monitor import Monitor, process_rss_gb
from advisor.measuring.model.adapters import adapted, classifier_heads
from advisor.measuring.model.builder import build_model
from advisor.measuring.model.families import family_of
from advisor.measuring.model.families.base import Sizes
from advisor.measuring.recipe.config import GridCell, RunConfig
from advisor.measuring.recipe.optimizers import make_optimizer
from advisor.measuring.recipe.strategies import prepare, train_step
from advisor.measuring.training.figures import EpochWork, epoch_row, peak_only, run_metrics
from advisor.measuring.training.flops import Peaks, forward_flops_per_position, known_peak, positions
from advisor.measuring.training.heldout import HeldOut
from advisor.measuring.training.progress import Reporter
from advisor.measuring.training.protocol import TargetClock, Untrained, check_trained, contended, target_loss
from advisor.measuring.training.tensors import measured_step
from advisor.prediction.step import Adapter
from advisor.rules import Rules


class Diverged(Exception):
    """The loss became NaN/inf or exploded."""


class OutOfMemory(Exception):
    """An allocation failed (CUDA or host) or the memory cap was crossed."""


def is_oom(exc: BaseException) -> bool:
    """Whether an exception means the cell ran out of memory: ours, Python's, CUDA's, or the allocator's."""
    if isinstance(exc, OutOfMemory | MemoryError | torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text or "failed to allocate" in text
    )


__all__ = ["Diverged", "OutOfMemory", "Trainer", "Untrained", "is_oom"]


class Trainer:
    """Train one cell (its configuration resolved); `epochs` holds the finished epochs' rows."""

    def __init__(
        self,
        cell: GridCell,
        rules: Rules,
        reporter: Reporter | None = None,
        on_built: Callable[[dict], None] | None = None,
        on_epoch: Callable[[dict], None] | None = None,
        peaks: Peaks | None = None,
    ):
        self.cfg, self.resolved = cell.config, cell.model
        self.peaks = {} if peaks is None else peaks  # the device peaks the grid measured: reused, added to
        self.reporter, self.rules = reporter or Reporter(), rules
        self.on_built, self.on_epoch = on_built or (lambda info: None), on_epoch or (lambda row: None)
        self.epochs: list[dict] = []
        self.model = self.optimizer = self.monitor = self.scheduler = self.family = self.heldout = None
        self.view = (
            None  # the dataset a --data other than the generated corpus names (advisor.measuring.data.table)
        )
        self.steps_done, self.first_loss, self.warm, self.warm_steps = 0, None, 0.0, 0
        self.baseline_rss_gb = self.initial_eval = self.flops_per_position = self.peak = None
        self.trained_s, self.tensors, self.tensors_error = 0.0, {}, None
        self.clock = TargetClock(None)
        self.checking_s = 0.0  # this epoch's time spent checking the target (not training)

    def setup(self) -> None:
        """Build the model (on the device), the optimizer and the schedule; apply the strategy."""
        cfg = self.cfg
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            if cfg.memory_cap_gb:
                total = torch.cuda.get_device_properties(0).total_memory / 1e9
                torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_cap_gb / total))
        preset = cfg.preset if cfg.preset != "custom" else "small"
        built = build_model(self.resolved, preset, self.rules, cfg.dropout, cfg.seed, self.sizes())
        self.built, self.family = built, built.family
        self.model = adapted_as_run(built.model.to(self.device), cfg, self.rules)
        prepare(self.model, cfg.strategy)
        cgd = {}
        if cfg.optimizer == "cgd":
            cgd = dict(
                line_search=cfg.cgd_line_search,
                beta=cfg.cgd_beta,
                restart_every=cfg.cgd_restart_every,
                beta_max=cfg.cgd_beta_max,
            )
        trainable = [p for p in self.model.parameters() if p.requires_grad]  # all, but under an adapter
        self.optimizer = make_optimizer(
            cfg.optimizer, trainable, cfg.lr, model=self.model, adamw_lr=cfg.adamw_lr, **cgd
        )
        self.scheduler = warmup_schedule(self.optimizer, cfg.warmup_ratio, cfg.updates_per_epoch * cfg.epochs)

    def sizes(self):
        """What the run asks of the model's data shape: the flags, and the classes of the data's labels."""
        classes = self.view.classes if self.view is not None else None
        return Sizes(seq_len=self.cfg.seq_len, image_size=self.cfg.image_size, num_labels=classes)

    def open_data(self) -> None:
        """The dataset the run trains on, when it is not the generated corpus: read from local files (the
        parent process resolved --data once), before the model, which is built to its classes."""
        if self.cfg.data_path is None:
            return
        fam = family_of(self.resolved, self.rules)
        self.view = open_view(self.cfg.data_path, fam, self.cfg.eval_examples)

    def datasets(self):
        """(training set, held-out set or None, provenance): what the run trains and evaluates on."""
        cfg, shape = self.cfg, self.built.shape
        split = "validation" if cfg.role == "tuning" else "test"  # rates are never chosen on the test set
        if self.view is None:
            dataset, source = load(self.family, shape, cfg.train_examples, cfg.seed)
        else:
            dataset = self.view.training(self.family, shape, cfg.train_examples, cfg.seed)
            source = f"{cfg.data_id} ({self.view.split} split)"
        heldout = None
        if cfg.protocol == "fair":
            heldout = HeldOut(
                self.family, shape, cfg.eval_examples, cfg.batch_size, split, self.view, cfg.data_id
            )
        return dataset, heldout, self.provenance(source, heldout)

    def provenance(self, source: str, heldout) -> dict:
        """The data a run records: its identity, where it was read, how many examples of which split."""
        cfg = self.cfg
        out = {
            "train": source,
            "source": cfg.data_id or "generated",
            "tokenizer": self.built.shape.tokenizer.name,
        }
        if heldout is not None:
            out["heldout"] = heldout.source
        if self.view is not None:
            out |= {
                "path": cfg.data_path,
                "split": self.view.split,
                "examples": self.view.counts(cfg.train_examples),
            }
        if cfg.data_note:
            out["note"] = cfg.data_note
        return out

    @property
    def window(self) -> int:
        return self.cfg.window

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer updates per epoch (equal for every strategy under the fair protocol)."""
        return self.cfg.updates_per_epoch

    def train(self) -> None:
        """Set up, then train every epoch; raises Diverged, Untrained, OutOfMemory or what the cell raised."""
        cfg = self.cfg
        if cfg.drops_micro_batches:
            raise ValueError(
                f"steps per epoch ({cfg.steps_per_epoch}) must be a multiple of the accumulation "
                f"steps ({self.window})"
            )
        self.baseline_rss_gb = process_rss_gb()  # before the model: the interpreter and its libraries
        self.open_data()
        self.setup()
        dataset, self.heldout, data = self.datasets()
        if self.heldout is not None:
            self.clock = TargetClock(target_loss(cfg, self.family.name, self.rules))
        built = self.built
        self.on_built(dict(n_params=built.n_params, pretrained=built.pretrained, data=data, base=built.base))
        first = next(iter_batches(dataset, self.family, cfg, 0, self.built.shape))
        self.flops_per_position = forward_flops_per_position(
            self.model, self.family, first, self.device, cfg.dtype
        )
        self.peak = known_peak(self.peaks, self.device, cfg.dtype, self.rules)
        self.reporter.cell_start(cfg, self.steps_per_epoch * cfg.epochs)
        cap = None if self.device.type == "cuda" else cfg.memory_cap_gb
        with Monitor(memory_cap_gb=cap) as self.monitor:
            if self.heldout is not None:
                self.initial_eval = self.heldout.evaluate(self.model, self.device, cfg.dtype)
            for epoch in range(cfg.epochs):
                self.train_epoch(dataset, epoch)
            self.tensors = self.tensors_or_none(dataset)
        if self.initial_eval is not None:
            check_trained(self.initial_eval.loss, self.epochs[-1]["eval_loss"])

    def train_epoch(self, dataset, epoch: int) -> None:
        mark, self.warm, self.warm_steps, losses = self.monitor.mark(), 0.0, 0, []
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        work = EpochWork()
        start, self.checking_s = clock(self.device), 0.0
        micro = iter_batches(dataset, self.family, self.cfg, epoch, self.built.shape)
        for i in range(self.steps_per_epoch):
            window = [next(micro) for _ in range(self.window)]
            for b in window:
                work.add(b, positions(b))
            losses.append(self.step(window, work))
            if i < self.steps_per_epoch - 1:
                self.check_target(start)
        spent = clock(self.device) - start - self.checking_s
        wall = epoch_wall(spent - self.warm, len(losses), self.warm_steps)
        stats = self.monitor.window(mark)  # read before the evaluation: it is not training
        self.trained_s += spent
        evaluation = None
        if self.heldout is not None:
            evaluation = self.heldout.evaluate(self.model, self.device, self.cfg.dtype)
            self.clock.check(evaluation.loss, self.steps_done, self.trained_s)
        row = epoch_row(
            epoch,
            losses,
            wall,
            self.warm,
            stats,
            self._gpu_peaks(),
            work,
            self.flops_per_position,
            evaluation,
        )
        self.epochs.append(row)
        self.on_epoch(row)
        self.reporter.epoch(row)

    def check_target(self, epoch_start: float) -> None:
        """Between epochs' evaluations, every `target_checks.every` updates until the target is reached: the
        held-out loss against the target, its time excluded from training time."""
        every = self.rules.protocol.get("target_checks", {}).get("every", 0)
        if self.heldout is None or self.clock.target is None or self.clock.steps is not None:
            return
        if not every or self.steps_done % every:
            return
        t0 = clock(self.device)
        loss = self.heldout.evaluate(self.model, self.device, self.cfg.dtype).loss
        trained = self.trained_s + (t0 - epoch_start - self.checking_s)
        self.clock.check(loss, self.steps_done, trained)
        self.checking_s += clock(self.device) - t0

    def step(self, window: list[dict], work: EpochWork | None = None) -> float:
        """One optimizer step as the harness takes it: timed, checked for divergence and memory, reported."""
        t0 = clock(self.device)
        loss = train_step(
            self.model, self.optimizer, self.family, window, self.device, self.check_memory, self.cfg.dtype
        )
        self.scheduler.step()
        t1 = clock(self.device)
        if self.steps_done < self.cfg.warmup_steps:
            self.warm += t1 - t0
            self.warm_steps += 1
        elif work is not None:
            work.step_s.append(t1 - t0)
        self.steps_done += 1
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.check_divergence(loss)
        self.reporter.step(loss)
        return loss

    def tensors_or_none(self, dataset) -> dict[str, float]:
        """The measured step's tensor figures; none (and the reason kept) when PyTorch's tracker, a private
        tool, fails on this model: a fully trained run is not lost to it. Running out of memory still is."""
        try:
            return self.measured_step(dataset)
        except Exception as e:
            if is_oom(e) or isinstance(e, (Diverged, OutOfMemory)):
                raise
            self.tensors_error = f"{type(e).__name__}: {e}"
            return {}

    def measured_step(self, dataset) -> dict[str, float]:
        """One more step, under PyTorch's tensor tracker: the peak of live tensor bytes, by category."""
        micro = iter_batches(dataset, self.family, self.cfg, self.cfg.epochs, self.built.shape)
        window = [next(micro) for _ in range(self.window)]
        return measured_step(
            self.model,
            self.optimizer,
            lambda before: train_step(
                self.model, self.optimizer, self.family, window, self.device, before, self.cfg.dtype
            ),
        )

    def check_memory(self) -> None:
        if self.monitor is not None and self.monitor.over_cap is not None:
            raise OutOfMemory(
                f"host RSS {self.monitor.over_cap:.2f} GB crossed --memory {self.cfg.memory_cap_gb:g} GB"
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
        return {
            "allocated": torch.cuda.max_memory_allocated() / 1e9,
            "reserved": torch.cuda.max_memory_reserved() / 1e9,
        }

    def peak_memory_gb(self) -> float | None:
        """The highest memory the cell reached so far: GPU allocated on CUDA, else host RSS."""
        if self.cfg.device == "cuda":
            return torch.cuda.max_memory_allocated() / 1e9
        if self.monitor is not None:
            return max((s.rss_gb for s in self.monitor.samples), default=None)
        return None

    def metrics(self) -> list[tuple[str, float, str]]:
        """Run-level figures from the finished epochs and the measured step, or the memory peak of a cell
        that finished none."""
        out = run_metrics(self.epochs)
        if not out:
            return peak_only(self.peak_memory_gb(), self.cfg.device)
        figures = {name: value for name, value, _ in out}
        if self.baseline_rss_gb is not None and "peak_rss_gb" in figures:
            out.append(("rss_baseline_gb", self.baseline_rss_gb, "GB, the process before the model"))
            out.append(
                ("rss_delta_gb", figures["peak_rss_gb"] - self.baseline_rss_gb, "GB, peak RSS less baseline")
            )
        out += [(name, value, "GB, live tensors at the step's peak") for name, value in self.tensors.items()]
        if self.initial_eval is not None:
            out.append(
                ("eval_loss_initial", self.initial_eval.loss, "nats/target, held-out, before training")
            )
        out += self.clock.metrics()
        if self.peak is not None and "achieved_gflops" in figures:
            out.append(("peak_gflops", self.peak.flops_per_s / 1e9, f"GFLOP/s: {self.peak.source}"))
            out.append(("mfu", 100 * figures["achieved_gflops"] * 1e9 / self.peak.flops_per_s, "% of peak"))
        searches = self.cfg.optimizer == "cgd" and self.cfg.cgd_line_search != "fixed"
        out.append(("contended", float(contended(self.epochs, self.rules, searches)), "1: timing disturbed"))
        return out

    def release(self, exiting: bool = False) -> None:
        """Drop the model, optimizer and samples so nothing of this cell is held into the next. A process
        that ends with the cell (a forked cell) skips it: collecting a heap about to go costs ~0.3 s a cell."""
        if exiting:
            return
        self.model = self.optimizer = self.built = self.heldout = self.view = None
        if self.monitor is not None:
            self.monitor.forget()
        gc.collect()
        trim_heap()
        if self.cfg.device == "cuda":
            torch.cuda.empty_cache()


def adapted_as_run(model, cfg: RunConfig, rules: Rules):
    """The model as the run's strategy trains it: with LoRA adapters (peft) on its frozen weights for an
    adapter strategy (rules/families.toml `adapters`), a classifier's label head trained in full beside them
    (its new labels need it), else as built. The cell's trainer and the plan's calibration both use it."""
    adapter, _ = rules.as_fit(cfg.strategy)
    if adapter == "full":
        return model
    lora = Adapter("lora", r=cfg.lora_r, alpha=cfg.lora_alpha)
    return adapted(model, lora, cfg.dtype, heads=classifier_heads(model))


def iter_batches(dataset, family, cfg: RunConfig, epoch: int, shape=None):
    """The micro-batches of an epoch: a fresh permutation of the training set per (seed, epoch), gone
    through again where the set is smaller than the epoch needs."""
    return epoch_batches(dataset, family, cfg.batch_size, cfg.seed, epoch, shape or DEFAULT_SHAPE)


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
        torch.cuda.synchronize()
    return time.perf_counter()


def warmup_schedule(optimizer, ratio: float, total_steps: int):
    """Linear learning-rate warm-up over ratio × total steps (the paper: 0.03 on Llama), then constant."""
    warm = max(1, round(ratio * total_steps)) if ratio else 0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
