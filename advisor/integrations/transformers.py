"""A Hugging Face `Trainer` run recorded as evidence: three lines in the user's script.

    from advisor.integrations.transformers import AdvisorCallback
    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[AdvisorCallback()])
    trainer.train()

The run is written to the user's KB (or `AdvisorCallback(db=PATH)`), under source `trainer`, with what
`advisor recommend --source trainer` ranks: the model (config, parameter count, family), the optimizer
(`args.optim`, or the optimizer passed to the Trainer), the strategy (`activation_checkpointing`,
`gradient_accumulation_steps`), dtype, batch and sequence length; the training loss of every log, the eval
loss, step time and throughput; peak CUDA memory and peak RSS. It is claimed `running` when training
begins, with a lease its heartbeat renews, and each log is written as it comes (an `epochs` row: `epoch` is
the log's number, `steps` the global step, `wall_s` the time since the last log), so a kill loses none.

A run that never reaches `on_train_end` is never left `running`: when `Trainer.train` leaves the stack
without it (an exception, caught by the script or not), a watcher thread ends the run `failed` (`oom` for
an out-of-memory error, `crashed` for Ctrl-C) with the exception's sentence while anything still holds the
exception, within WATCH_S; a run still training when the interpreter exits is `crashed`; a killed process's
run is `crashed` by the next writer (its lease expires, or its pid is dead on this host).

When the run ends (on_train_end, the watcher, or at exit) the main process prints one line to stderr,
where the Trainer's progress bar and transformers' own messages go (stdout stays the script's): what was
recorded, in which KB, and the advisor command that shows it.

Imports transformers (the user's script already has): the answer side never imports this module.
"""

from __future__ import annotations

import atexit
import gc
import hashlib
import json
import os
import resource
import shlex
import socket
import sqlite3
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm  # the Trainer's progress bars: a line written through tqdm does not break one
from transformers import TrainerCallback

from advisor.errors import KBError
from advisor.kb import lease, store
from advisor.kb.open import open_for_writing, release
from advisor.kb.queries.groups import USER_ID_OFFSET, group_ref
from advisor.measuring.machine.hardware import describe, pid_alive
from advisor.places import resolve_write_path
from advisor.rules import Rules, load_rules

TRAINER_SOURCE = "trainer"
WATCH_S = 0.5  # how often the watcher looks whether Trainer.train is still on its thread's stack
UNKNOWN_END = "training ended without on_train_end (an exception the script caught?)"
RESTARTED = "the Trainer started over at a smaller batch (auto_find_batch_size) after running out of memory"
# transformers' `optim` names -> the optimizer names of rules/families.toml (others are kept as given)
TRAINER_OPTIMIZERS = {
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
        try:
            self.path = Path(resolve_write_path(db))
            self.refused: str | None = None  # why no run can be recorded: said once, training goes on
        except (KBError, OSError) as e:  # the shipped KB named, or a data folder that cannot be made
            self.path, self.refused = Path(db or "."), str(e)
        self.alone = bool(db or os.environ.get("ADVISOR_DB"))  # read alone, as `advisor --db` reads it
        self.main = True  # the main process (rank 0): the one that prints
        self.run: dict = {}
        self.rules = load_rules()
        self.model_name = model_name
        self.run_id: int | None = None
        self.conn: sqlite3.Connection | None = None  # the KB, open for writing while a run is
        self.lock = threading.Lock()  # the watcher thread and the training thread both end runs
        self.losses: list[float] = []
        self.eval_loss: float | None = None
        self.logs = 0
        self.started = self.logged_at = 0.0
        self.heartbeat = None
        self.state = None  # the Trainer's state (steps and epochs so far), updated in place as it trains
        self.watch: TrainWatch | None = None
        self.pid = os.getpid()
        self.unwritten = False  # a log the KB refused (a full disk): said once, training goes on
        self.samples_per_s: float | None = None
        self.exit_hooked = False

    # --- Trainer events ------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        frame = training_frame()
        if not self.exit_hooked:
            atexit.register(self._at_exit)
            self.exit_hooked = True
        if self.run_id is not None:  # train() began again before its last run ended
            self._end_open_run(frame)
        loader = kwargs.get("train_dataloader")
        run = describe_run(args, model, optimizer, loader, self.model_name, self.rules)
        self.run, self.main, self.pid, self.state = run, state.is_world_process_zero, os.getpid(), state
        self.losses, self.eval_loss, self.logs, self.samples_per_s = [], None, 0, None
        if not self._begin_run(run):
            return  # nothing is recorded; every later event finds no open run
        # watched when called from Trainer.train (as the Trainer calls it), not when called by hand
        self.watch = TrainWatch(frame, self._train_left) if frame is not None else None
        self.started = self.logged_at = time.perf_counter()
        _reset_cuda_peak()

    def _begin_run(self, run: dict) -> bool:
        """The run claimed `running` in the KB with its lease held; False (said once, in words that fit a
        script) where the KB cannot take it: read-only, full, not a KB. The callback never stops training."""
        try:
            if self.refused:
                raise KBError(self.refused)
            self.conn = open_for_writing(self.path)
            lease.mark_crashed(self.conn, pid_alive)
            with store.transaction(self.conn):
                self.run_id = store.insert_run(
                    self.conn,
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
            return True
        except (KBError, sqlite3.Error, OSError) as e:
            reason = _script_words(str(e))
            self._say_once(
                f"advisor: this run is not recorded: {reason}. Training goes on; to record runs, give "
                "AdvisorCallback(db=PATH) a file you can write."
            )
            if self.conn is not None:
                release(self.conn)
            self.conn, self.run_id, self.heartbeat = None, None, None
            return False

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" in logs:
            self.losses.append(float(logs["loss"]))
        if "eval_loss" in logs:
            self.eval_loss = float(logs["eval_loss"])
        if "train_samples_per_second" in logs:  # the Trainer's last log
            self.samples_per_s = float(logs["train_samples_per_second"])
        if "loss" in logs or "eval_loss" in logs:
            self._write_log(state, logs)

    def _write_log(self, state, logs: dict) -> None:
        """One log's losses written to the KB as it comes (an epochs row): a killed run keeps them."""
        now = time.perf_counter()
        row = {
            "epoch": self.logs,  # the log's number: a Trainer logs every logging_steps, not per epoch
            "steps": state.global_step,
            "loss": float(logs["loss"]) if "loss" in logs else None,
            "eval_loss": float(logs["eval_loss"]) if "eval_loss" in logs else None,
            "wall_s": now - self.logged_at,
            "peak_rss_gb": _peak_rss_gb(),
            "peak_gpu_allocated_gb": _cuda_peak_gb(),
        }
        with self.lock:
            if self.run_id is None:  # a log after the run ended (trainer.evaluate() after train())
                return
            try:
                store.add_epoch(self.conn, self.run_id, row)
            except (KBError, sqlite3.Error) as e:  # the run's figures still come at its end
                self._say_once(
                    f"advisor: could not write a log to {shown_path(self.path)} ({e}); training goes on."
                )
        self.logs, self.logged_at = self.logs + 1, now

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and "eval_loss" in metrics:
            self.eval_loss = float(metrics["eval_loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self._finish("ok", None)

    # --- ending ----------------------------------------------------------------------------------------

    def _finish(self, status: str, error: str | None, watched=None) -> None:
        """The run's figures and status written, its lease let go, and (main process) its line printed.
        `watched`: only if the open run is the one whose train() frame that is (a watcher's late call)."""
        with self.lock:
            if self.run_id is None or (
                watched is not None and getattr(self.watch, "frame", None) is not watched
            ):
                return
            run_id, self.run_id = self.run_id, None
            if self.watch is not None:
                self.watch.stop()  # its thread ends, and lets go of the frame (and so of the Trainer)
                self.watch = None
            wall = time.perf_counter() - self.started
            metrics = figures(self.losses, self.eval_loss, wall, self.state)
            if self.samples_per_s is not None:
                metrics.append(
                    ("samples_per_s", self.samples_per_s, "training samples per second (the Trainer's)")
                )
            if self.heartbeat is not None:  # its connection closed before ours lets go of the KB
                self.heartbeat.let_go(run_id)
                self.heartbeat.__exit__(None, None, None)
                self.heartbeat = None
            try:
                store.finish_run(self.conn, run_id, status, error, metrics)
                group = store.run_group(self.conn, run_id)
            finally:
                release(self.conn)
                self.conn = None
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

    def _say_once(self, line: str) -> None:
        if not self.unwritten and self.main:
            tqdm.write(line, file=sys.stderr)
        self.unwritten = True

    # --- a run that did not reach on_train_end ---------------------------------------------------------

    def _train_left(self, frame) -> None:
        """Trainer.train left the stack without on_train_end: ended by the exception that left it."""
        if self.run_id is not None:
            self._finish(*verdict(escaped(frame)), watched=frame)

    def _end_open_run(self, frame) -> None:
        """train() began again while a run was open: within the same train() call, accelerate's
        find_executable_batch_size retrying after an out-of-memory error; else an earlier train() that
        ended without on_train_end, which the watcher had not yet seen."""
        watched = self.watch.frame if self.watch is not None else None
        if watched is not None and watched is frame:
            self._finish("oom", RESTARTED)
        else:
            self._train_left(watched)

    def _at_exit(self) -> None:
        """At interpreter exit: a run whose train() ended without on_train_end is failed (the exception the
        interpreter reported, if uncaught); one still training (in another thread) is crashed."""
        if self.run_id is None or os.getpid() != self.pid:  # a forked child: its parent owns the run
            return
        if self.watch is None:  # on_train_begin came from outside Trainer.train: how it ended is unknown
            self._finish("crashed", "the training ended before the Trainer's on_train_end")
        elif not self.watch.running():
            self._train_left(self.watch.frame)
        else:
            self._finish("crashed", "the interpreter exited while the Trainer was still training")


class TrainWatch:
    """A daemon thread that looks, every WATCH_S, whether a Trainer.train frame is still on its thread's
    stack, and calls `left(frame)` once it is not: the one sign of an exception a script caught, since the
    Trainer calls no callback when train() raises. Nothing global is patched."""

    def __init__(self, frame, left):
        self.frame, self.left = frame, left
        self.thread_id = threading.get_ident()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="advisor-train-watch", daemon=True).start()

    def running(self) -> bool:
        """Whether the frame is on its thread's stack (the thread alive)."""
        frame = sys._current_frames().get(self.thread_id)
        while frame is not None:
            if frame is self.frame:
                return True
            frame = frame.f_back
        return False

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_S):
            if not self.running():
                self.left(self.frame)
                return


def training_frame():
    """The outermost Trainer.train frame on this thread's stack (a subclass's override included), or None
    when the callback was called otherwise."""
    from transformers import Trainer

    found, frame = None, sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "train" and "self" in code.co_varnames:
            if isinstance(frame.f_locals.get("self"), Trainer):
                found = frame
        frame = frame.f_back
    return found


def escaped(frame) -> BaseException | None:
    """The exception that left Trainer.train through `frame`, while anything still holds it: the script's
    except clause or a variable, or the interpreter's report of an uncaught one; None once it is gone."""
    if frame is None:
        return None
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # uncaught, reported
    alive = [last] if last is not None else []
    alive += [o for o in gc.get_objects() if issubclass(type(o), BaseException)]  # never o.__class__
    through = [e for e in alive if _passed(e, frame)]
    causes = {id(c) for e in through for c in (e.__cause__, e.__context__) if c is not None}
    return next((e for e in through if id(e) not in causes), through[0] if through else None)


def _passed(exception: BaseException, frame) -> bool:
    """Whether the exception's traceback goes through the frame."""
    tb = exception.__traceback__
    while tb is not None:
        if tb.tb_frame is frame:
            return True
        tb = tb.tb_next
    return False


def verdict(exception: BaseException | None) -> tuple[str, str]:
    """(status, error) of a run that train() left by this exception (None: not known)."""
    if exception is None:
        return "failed", UNKNOWN_END
    text = str(exception).strip()
    why = f"{type(exception).__name__}: {text.splitlines()[0]}" if text else type(exception).__name__
    if isinstance(exception, KeyboardInterrupt | SystemExit):
        return "crashed", f"interrupted ({why})"
    if isinstance(exception, MemoryError) or "out of memory" in text.lower():
        return "oom", why
    return "failed", why


def command_for(family: str, group: str | None, status: str, db: Path | None) -> str:
    """The advisor command that shows a recorded run: its group ranked (`recommend --group`) when it is ok
    and of a family the rules know, else the KB's runs of its status; `--db` where the KB is read alone."""
    named = f" --db {shell_path(db)}" if db is not None else ""
    if status == "ok" and group and family != "unknown":
        return f"advisor recommend --arch {family} --group {group}{named}"
    return f"advisor kb runs --source {TRAINER_SOURCE} --status {status}{named}"


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
        "source": TRAINER_SOURCE,
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
    return TRAINER_OPTIMIZERS.get(optim, optim)


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


def _script_words(message: str) -> str:
    """A KB error's sentence as a script's log reads it: up to the command-line advice (--db, `advisor ...`)
    it goes on with, which a Trainer script cannot follow."""
    for cut in (": write your own KB", ". Pass --db", ". Pass ", "; pass --db", " --db"):
        if cut in message:
            message = message.split(cut)[0]
    return message.rstrip(". ")


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
