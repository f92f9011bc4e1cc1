"""A Hugging Face `Trainer` run recorded as evidence: three lines in the user's script.

    from advisor.integrations.transformers import AdvisorCallback
    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[AdvisorCallback()])
    trainer.train()

The run is written to the user's KB (or `AdvisorCallback(db=PATH)`), under source `trainer`, with what
`advisor recommend --source trainer` ranks: the model (config, parameter count, family), the optimizer
(`args.optim`, or the optimizer passed to the Trainer), the strategy (`activation_checkpointing`,
`gradient_accumulation_steps`), dtype, batch and sequence length; the training loss of every log, the eval
loss, step time and throughput; peak CUDA memory and peak RSS. It is claimed `running` when training
begins, with a lease its heartbeat renews: a run that never reaches `on_train_end` (an exception, a kill)
becomes `crashed` (`oom` for an out-of-memory error), never lost.

When the run ends (on_train_end, or crashed at exit) the main process prints one line to stderr, where the
Trainer's progress bar and transformers' own messages go (stdout stays the script's): what was recorded,
in which KB, and the advisor command that shows it.

Imports transformers (the user's script already has): the answer side never imports this module.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import resource
import shlex
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm  # the Trainer's progress bars: a line written through tqdm does not break one
from transformers import TrainerCallback

from advisor.kb import lease, store
from advisor.kb.reader import USER_ID_OFFSET, group_ref
from advisor.measuring.hardware import describe, pid_alive
from advisor.places import resolve_write_path
from advisor.rules import Rules, load_rules

SOURCE = "trainer"
# transformers' `optim` names -> the optimizer names of rules/families.toml (others are kept as given)
OPTIMIZERS = {
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_hf": "adamw",
    "adamw": "adamw",
    "adam": "adam",
    "sgd": "sgd",
    "adagrad": "adagrad",
    "adafactor": "adafactor",
}
TORCH_OPTIMIZERS = {
    "AdamW": "adamw",
    "Adam": "adam",
    "SGD": "sgd",
    "Adagrad": "adagrad",
    "Adadelta": "adadelta",
}


class AdvisorCallback(TrainerCallback):
    """Records the Trainer run it is attached to into a KB (default: the user's; `db`: another)."""

    def __init__(self, db: str | os.PathLike | None = None, model_name: str | None = None):
        self.path = Path(resolve_write_path(db))
        self.alone = bool(db or os.environ.get("ADVISOR_DB"))  # read alone, as `advisor --db` reads it
        self.main = True  # the main process (rank 0): the one that prints
        self.run: dict = {}
        self.rules = load_rules()
        self.model_name = model_name
        self.run_id: int | None = None
        self.losses: list[float] = []
        self.eval_loss: float | None = None
        self.epoch_losses: list[float] = []
        self.epoch_started = self.started = 0.0
        self.epoch = 0
        self.heartbeat = None
        self.failure: BaseException | None = None
        self.samples_per_s: float | None = None

    # --- Trainer events ------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        loader = kwargs.get("train_dataloader")
        run = describe_run(args, model, optimizer, loader, self.model_name, self.rules)
        self.run, self.main = run, state.is_world_process_zero
        with store.writing(self.path) as conn:
            lease.mark_crashed(conn, pid_alive)
            self.run_id = store.insert_run(
                conn,
                {
                    **run,
                    "status": "running",
                    "started_at": store.now(),
                    "lease_until": store.later(lease.LEASE_S),
                    "owner": f"{socket.gethostname()}:{os.getpid()}",
                },
            )
        self.heartbeat = lease.Heartbeat(self.path).__enter__()
        self.heartbeat.hold(self.run_id)
        self._watch_for_an_unfinished_end()
        self.started = self.epoch_started = time.perf_counter()
        _reset_cuda_peak()

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self.losses.append(float(logs["loss"]))
            self.epoch_losses.append(float(logs["loss"]))
        if "eval_loss" in logs:
            self.eval_loss = float(logs["eval_loss"])
        if "train_samples_per_second" in logs:  # the Trainer's last log
            self.samples_per_s = float(logs["train_samples_per_second"])

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.eval_loss = float(metrics["eval_loss"])

    def on_epoch_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        row = {
            "epoch": self.epoch,
            "steps": state.global_step,
            "loss": statistics.fmean(self.epoch_losses) if self.epoch_losses else None,
            "wall_s": now - self.epoch_started,
            "eval_loss": self.eval_loss,
            "peak_rss_gb": _peak_rss_gb(),
            "peak_gpu_allocated_gb": _cuda_peak_gb(),
        }
        if self.run_id is not None:
            with store.writing(self.path) as conn:
                store.add_epoch(conn, self.run_id, row)
        self.epoch, self.epoch_started, self.epoch_losses = self.epoch + 1, now, []

    def on_train_end(self, args, state, control, **kwargs):
        self._finish("ok", None, state)

    # --- ending ----------------------------------------------------------------------------------------

    def _finish(self, status: str, error: str | None, state=None) -> None:
        """The run's figures and status written, its lease let go, and (main process) its line printed."""
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        wall = time.perf_counter() - self.started
        metrics = figures(self.losses, self.eval_loss, wall, state)
        if self.samples_per_s is not None:
            metrics.append(
                ("samples_per_s", self.samples_per_s, "training samples per second (the Trainer's)")
            )
        with store.writing(self.path) as conn:
            store.finish_run(conn, run_id, status, error, metrics)
            group = conn.execute("SELECT grp FROM runs WHERE id = ?", [run_id]).fetchone()[0]
        if self.heartbeat is not None:
            self.heartbeat.let_go(run_id)
            self.heartbeat.__exit__(None, None, None)
            self.heartbeat = None
        if self.main:
            tqdm.write(self._recorded(run_id, group, status), file=sys.stderr)

    def _recorded(self, run_id: int, group: int | None, status: str) -> str:
        """The line a finished run prints: the run, its figures and group, the KB and the command to ask."""
        ref = group_ref(group if self.alone or group is None else group + USER_ID_OFFSET)
        what = " · ".join([self.run["model"], self.run["optimizer"], self.run["strategy"], *self._loss()])
        where = shown_path(self.path) + (f", group {ref}" if ref else "")
        see = command_for(self.run["family"], ref, status, self.path if self.alone else None)
        return f"advisor: recorded run {run_id} ({status}: {what}) in {where}; see: {see}"

    def _loss(self) -> list[str]:
        """The run's loss in words: the last evaluation's, else the last logged training loss; none unlogged."""
        if self.eval_loss is not None:
            return [f"eval loss {self.eval_loss:.4g}"]
        return [f"training loss {self.losses[-1]:.4g}"] if self.losses else []

    def _watch_for_an_unfinished_end(self) -> None:
        """An exception out of trainer.train() ends the run crashed (oom for out of memory) at the latest
        when the interpreter exits; a kill leaves it to the lease (the next writer marks it crashed)."""
        previous = sys.excepthook

        def hook(kind, value, tb):
            self.failure = value
            previous(kind, value, tb)

        sys.excepthook = hook
        atexit.register(self._end_unfinished)

    def _end_unfinished(self) -> None:
        if self.run_id is None:
            return
        e = self.failure
        oom = e is not None and ("out of memory" in str(e).lower() or isinstance(e, MemoryError))
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}" if e else None
        self._finish(
            "oom" if oom else "crashed",
            why or "the training ended before the Trainer's on_train_end (interrupted or raised)",
        )


def command_for(family: str, group: str | None, status: str, db: Path | None) -> str:
    """The advisor command that shows a recorded run: its group ranked (`recommend --group`) when it is ok
    and of a family the rules know, else the KB's runs of its status; `--db` where the KB is read alone."""
    named = f" --db {shell_path(db)}" if db is not None else ""
    if status == "ok" and group and family != "unknown":
        return f"advisor recommend --arch {family} --group {group}{named}"
    return f"advisor kb runs --source {SOURCE} --status {status}{named}"


def shown_path(path: Path) -> str:
    """A path as a person reads it: ~ for the home directory."""
    path = Path(path).absolute()
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:  # not under the home directory
        return str(path)


def shell_path(path: Path) -> str:
    """A path as a shell takes it: ~ for the home directory (left unquoted, so the shell expands it)."""
    shown = shown_path(path)
    return f"~/{shlex.quote(shown[2:])}" if shown.startswith("~/") else shlex.quote(shown)


def describe_run(args, model, optimizer, dataloader, model_name: str | None, rules: Rules) -> dict:
    """The run's provenance and configuration, from the Trainer's arguments and objects."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    fam = rules.family_of_model_type(model_type) if model_type else None
    device = "cuda" if _cuda_in_use(model) else "cpu"
    strategy = strategy_of(args)
    seq_len = _sequence_length(dataloader)
    settings = {
        "optimizer": optimizer_of(args, optimizer),
        "strategy": strategy,
        "lr": args.learning_rate,
        "batch_size": args.per_device_train_batch_size,
        "accumulation_steps": args.gradient_accumulation_steps,
        "dtype": "bf16-mixed" if args.bf16 else "fp16-mixed" if args.fp16 else "fp32",
        "seq_len": seq_len,
        "epochs": args.num_train_epochs,
        "max_steps": args.max_steps,
        "seed": args.seed,
        "model_config": config.to_dict() if config is not None else None,
    }
    n_params = sum(p.numel() for p in model.parameters()) if model is not None else None
    return {
        **describe(device),
        "source": SOURCE,
        "model": model_identity(model_name, config),
        "data": data_identity(getattr(dataloader, "dataset", None)),
        "family": fam.name if fam else "unknown",
        "optimizer": settings["optimizer"],
        "strategy": strategy,
        "preset": "custom",
        "protocol": "trainer",  # the user's own protocol: their data, rate and schedule
        "seed": args.seed,
        "n_params": n_params,
        "pretrained": int(bool(getattr(config, "_name_or_path", ""))),
        "config": settings,
        "owner": None,
    }


def model_identity(model_name: str | None, config) -> str:
    """The model as the KB names it: the name given, else its Hub id or folder, else its type and a hash of
    its config ('llama config 3f2a9c1b'): never a reference model's bare name, which means the family's own."""
    path = getattr(config, "_name_or_path", None)
    if model_name or path:
        return model_name or path
    if config is None:
        return "custom model"
    text = json.dumps(config.to_dict(), sort_keys=True, default=str)
    return f"{config.model_type} config {hashlib.sha256(text.encode()).hexdigest()[:8]}"


def data_identity(dataset) -> str:
    """What the run trained on: a Hugging Face dataset by name and fingerprint (the hash `datasets` keeps of
    its content and transforms), else its class and size; '' when the Trainer had none."""
    if dataset is None:
        return ""
    fingerprint = getattr(dataset, "_fingerprint", None)
    if fingerprint:
        name = getattr(getattr(dataset, "info", None), "dataset_name", None) or "dataset"
        return f"{name} fingerprint:{fingerprint[:16]}"
    try:
        size = f" of {len(dataset)} samples"
    except TypeError:  # an iterable dataset has no length
        size = ""
    return f"{type(dataset).__name__}{size} (not fingerprinted)"


def optimizer_of(args, optimizer) -> str:
    """The optimizer's name in the rules' terms: the optimizer the Trainer built or was given (accelerate
    wraps it), else `args.optim`."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one
    if inner is not None:
        return TORCH_OPTIMIZERS.get(type(inner).__name__, type(inner).__name__.lower())
    optim = str(getattr(args.optim, "value", args.optim))
    return OPTIMIZERS.get(optim, optim)


def strategy_of(args) -> str:
    """The strategy in the rules' terms, from the arguments (activation_checkpointing, the deprecated
    gradient_checkpointing's successor that transformers 5 mirrors into it)."""
    checkpointing = getattr(args, "activation_checkpointing", None)
    if checkpointing is None:  # a transformers without the new name
        checkpointing = args.gradient_checkpointing
    parts = ["checkpointing"] if checkpointing else []
    parts += ["accumulation"] if args.gradient_accumulation_steps > 1 else []
    return "+".join(parts) or "standard"


def figures(losses: list[float], eval_loss: float | None, wall: float, state) -> list[tuple[str, float, str]]:
    """Run-level figures under the measures of rules/metrics.toml."""
    out = []
    if losses:
        out += [
            ("loss", statistics.fmean(losses), "nats/target, training, mean of the logged losses"),
            ("loss_final", losses[-1], "nats/target, training, last log"),
        ]
    if eval_loss is not None:
        out.append(("eval_loss", eval_loss, "nats/target, the Trainer's eval set, last evaluation"))
    out.append(("total_time", wall, "s, on_train_begin to on_train_end"))
    steps = getattr(state, "global_step", 0) if state is not None else 0
    if steps:
        out.append(("step_time", wall / steps, "s per optimizer step"))
    epochs = getattr(state, "epoch", None) if state is not None else None
    if epochs:
        out.append(("epoch_time", wall / epochs, "s per epoch (total over epochs run)"))
    if (peak := _cuda_peak_gb()) is not None:
        out.append(("gpu_mem_peak_gb", peak, "GB, torch.cuda.max_memory_allocated"))
    out.append(("peak_rss_gb", _peak_rss_gb(), "GB, the process's peak resident set"))
    return out


def _sequence_length(dataloader) -> int | None:
    """The first batch's sequence length (input_ids' second dimension), where the batches have one."""
    if dataloader is None:
        return None
    try:
        batch = next(iter(dataloader))
    except Exception:  # a dataloader that cannot be peeked at: the length stays unknown
        return None
    ids = batch.get("input_ids") if hasattr(batch, "get") else None
    return int(ids.shape[1]) if ids is not None and ids.ndim == 2 else None


def _cuda_in_use(model) -> bool:
    try:
        return next(model.parameters()).device.type == "cuda"
    except (AttributeError, StopIteration):
        return False


def _reset_cuda_peak() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def _cuda_peak_gb() -> float | None:
    return torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux reports KiB
