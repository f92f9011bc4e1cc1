"""Each cell of a grid in a fresh process, forked from a server that has already imported torch,
transformers and datasets: memory is the cell's own, and no cell pays the imports again.

The server is multiprocessing's fork server, started once per process with the measure side preloaded; a
cell's process opens the KB, beats its own heartbeat and calls `run_cell`, forwarding progress, its claim
and its result to the grid through a pipe. A cell's process that dies without a result (the kernel's
out-of-memory killer, a segfault) leaves its run `crashed`, with a sentence that names the signal, and the
grid goes on; Ctrl-C is recorded by the cell, then re-raised by the grid; a KBError stops the grid.
A cell's process dies with the grid's: kill -9 of `advisor measure` leaves no cell running on (its run is
crashed by the next grid).

The server's sys.path is the grid's, whatever the current folder (`python -c` would put the folder first,
where a copy of advisor would shadow the installed one), and what the server and its cells write on stdout
and stderr (library warnings, log lines, a traceback) goes to a file, never through the progress bars:
each cell's share is kept with its run (`config.stderr`).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import multiprocessing
import os
import signal
import socket
import sqlite3
import sys
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import wait
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import lease, store
from advisor.kb.open import writing
from advisor.measuring.grid.runner import CellOutcome, CellResult, run_cell, train_cell
from advisor.measuring.machine.hardware import pid_alive
from advisor.measuring.machine.orphans import PARENT_ENV
from advisor.measuring.model.families import family
from advisor.measuring.recipe.config import GridCell
from advisor.measuring.training.flops import Peaks
from advisor.measuring.training.progress import ForwardingReporter, Reporter, replay
from advisor.rules import Rules

# What the fork server imports once; a cell's process finds them imported. transformers.modeling_utils is
# the costly part of building a model (2 s here); transformers.optimization (Adafactor) pulls in peft and
# torchao (0.6-1.8 s an Adafactor cell otherwise); every cell counts FLOPs and tracks its measured step;
# advisor.cli is what the `advisor` script re-runs in a child as its __main__.
PRELOAD = (
    "advisor.measuring.machine.orphans",  # first: the server dies with its grid, even while it imports the rest
    "torch",
    "torch.utils.flop_counter",
    "torch.distributed._tools.mem_tracker",
    "transformers",
    "transformers.modeling_utils",
    "transformers.optimization",
    "datasets",
    "advisor.cli",
    "advisor.kb.store",
    "advisor.measuring.data.corpus",
    "advisor.measuring.model.builder",
    "advisor.measuring.machine.monitor",
    "advisor.measuring.recipe.optimizers",
    "advisor.measuring.grid.runner",
    "advisor.measuring.recipe.strategies",
    "advisor.measuring.training.trainer",
    "advisor.measuring.grid.isolation",
)
STOP_WAIT_S = 60  # after Ctrl-C, how long a cell may take to record itself crashed before it is killed
SIGNALS = {
    signal.SIGKILL: "SIGKILL: the kernel's out-of-memory killer or kill -9",
    signal.SIGSEGV: "SIGSEGV: a segmentation fault in native code",
    signal.SIGBUS: "SIGBUS: a bus error, often a full /dev/shm or a mapped file that shrank",
    signal.SIGABRT: "SIGABRT: native code aborted",
    signal.SIGTERM: "SIGTERM: asked to terminate",
}


STARTING = "starting the worker process (importing torch, transformers)…"  # said until the first cell starts
STDERR_KEPT = 16_000  # characters of a cell's output kept with its run: the first quarter and the end

_preloading = False  # whether this process has chosen its fork server's preload
_ready = False  # whether a cell was forked from the running server: its imports are done
_output: int | None = None  # the file the server and its cells write stdout and stderr to
_peaks: Peaks = {}  # the device peaks a cell measured: the cells after it reuse them (once per grid)


def preload(rules: Rules) -> list[str]:
    """The modules the fork server imports: the measure side, and each family of the rules with the
    transformers modules that build its models (llama's pulls in generation: 0.26 s a cell otherwise)."""
    modules = list(PRELOAD)
    for name, spec in rules.families.items():
        if spec.module:
            modules += [spec.module, *_modeling_modules(name, rules)]
    return list(dict.fromkeys(modules))


def _modeling_modules(name: str, rules: Rules) -> list[str]:
    """transformers' modeling modules of a family's reference model and of its sub-models."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    try:
        config, _ = family(name, rules).reference_config("tiny")
    except Exception:  # a family that cannot load is the cell's to report, not the server's
        return []
    configs = [config, *(getattr(config, key, None) for key in getattr(config, "sub_configs", {}))]
    names = [model_type_to_module_name(c.model_type) for c in configs if getattr(c, "model_type", None)]
    return [f"transformers.models.{m}.modeling_{m}" for m in names]


def start_server(rules: Rules) -> None:
    """Start the fork server now, if it is not running: it imports in the background while the grid gets
    ready. Its preload is chosen once per process (a server that died restarts with it). It starts with
    this process's sys.path and writes into the cells' output file, not on this process's terminal."""
    global _preloading, _ready
    if not _preloading:
        multiprocessing.get_context("forkserver").set_forkserver_preload(preload(rules))
        _preloading = True
    if _server_pid() is not None:
        return
    with _server_environment(), _output_to(_output_file()):
        forkserver.ensure_running()
    _ready = False


def server_ready() -> bool:
    """Whether the fork server has done its imports (it forked a cell): until then the grid says STARTING."""
    return _ready and _server_pid() is not None


def _server_pid() -> int | None:
    """The pid of this process's fork server while it runs (multiprocessing keeps it, privately)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid if pid is not None and alive(f"{socket.gethostname()}:{pid}") else None


@contextlib.contextmanager
def _server_environment():
    """The environment a process started in the block reads: this process's sys.path as PYTHONPATH, and no
    current folder put in front of it (PYTHONSAFEPATH), so that it imports what this process imports; and the
    Hugging Face hub off. No cell touches the network: the data was resolved before the grid (dataset.resolve),
    the models are read from files. A library that asks the hub as it is imported would otherwise wait on it
    in the server's preload: bitsandbytes' CPU backend fetches a kernel with `kernels`, when installed."""
    wanted = {
        PARENT_ENV: str(os.getpid()),  # the server started in the block dies with this process
        "PYTHONSAFEPATH": "1",
        "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if os.pathsep not in p),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    before = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _output_to(fd: int):
    """This process's stdout and stderr sent to `fd` during the block: what a process started meanwhile
    inherits (the fork server, and through it every cell)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    saved = {}
    for target in (1, 2):
        with contextlib.suppress(OSError):  # a closed stdout stays closed afterwards
            saved[target] = os.dup(target)
    try:
        for target in (1, 2):
            os.dup2(fd, target)
        yield
    finally:
        for target in (1, 2):
            if target in saved:
                os.dup2(saved.pop(target), target)
            else:
                os.close(target)
        for kept in saved.values():
            os.close(kept)


def _output_file() -> int:
    """The file the fork server and its cells write stdout and stderr to, opened once per process: unlinked
    (it goes with this process), appended to (it is emptied once a cell's share is read)."""
    global _output
    if _output is None:
        fd, path = tempfile.mkstemp(prefix="advisor-cells-", suffix=".log")
        os.unlink(path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        _output = fd
    return _output


def _new_output() -> str:
    """What the server and its cells wrote since the last call: the share of the cell that just ended (one
    cell at a time per process; the first also has the server's own, while it imported)."""
    if _output is None:
        return ""
    data = os.pread(_output, os.fstat(_output).st_size, 0)
    os.ftruncate(_output, 0)  # writers append: they go on at the new end
    return data.decode("utf-8", "replace")


alive = pid_alive  # zombies count dead (advisor/measuring/machine/hardware.py)


def death_sentence(exitcode: int | None, said: str = "") -> str:
    """What ended a cell's process that handed back no result, as a sentence for the run's error; the
    exception a traceback in what it said ends with, if one (the sentence stays one line)."""
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "an unknown signal"
        return f"the cell's process was killed by signal {number} ({SIGNALS.get(number, name)})"
    raised = last_exception(said)
    return f"the cell's process exited with code {exitcode} before handing back its result" + (
        f" ({raised})" if raised else ""
    )


def last_exception(said: str) -> str | None:
    """The exception line ('ImportError: ...') that the last traceback in a process's output ends with."""
    if "Traceback (most recent call last):" not in said:
        return None
    tail = said.rsplit("Traceback (most recent call last):", 1)[1].splitlines()
    lines = [line for line in tail if line.strip() and not line[0].isspace()]
    return lines[-1][:300] if lines else None


def clipped(said: str) -> str:
    """A cell's output as kept with its run: all of it up to STDERR_KEPT characters, else its start and its
    end (where a traceback is), with how much was left out between."""
    if len(said) <= STDERR_KEPT:
        return said
    head, tail = STDERR_KEPT // 4, STDERR_KEPT - STDERR_KEPT // 4
    return f"{said[:head]}\n[... {len(said) - head - tail} characters left out ...]\n{said[-tail:]}"


# --- the grid's side ----------------------------------------------------------------------------------


@dataclass
class _Heard:
    """What a cell's process said: its claim (or, training only, its model), and how it ended."""

    run_id: int | None = None
    result: CellResult | None = None
    built: dict | None = None
    outcome: CellOutcome | None = None
    interrupted: bool = False
    kb_error: str | None = None
    raised: str | None = None
    said: str = ""  # what its process wrote on stdout and stderr
    peaks: Peaks = field(default_factory=dict)  # the device peaks it knew or measured

    def take(self, message: tuple, reporter: Reporter) -> None:
        kind = message[0]
        if kind == "claimed":
            self.run_id = message[1]
        elif kind == "result":
            self.result = message[1]
        elif kind == "built":
            self.built = message[1]
        elif kind == "outcome":
            self.outcome = message[1]
        elif kind == "interrupted":
            self.interrupted = True
        elif kind == "kb_error":
            self.kb_error = message[1]
        elif kind == "raised":
            self.raised = message[1]
        elif kind == "peaks":
            self.peaks = message[1]
        else:
            replay(message, reporter)


def run_in_child(
    cell: GridCell, db_path: Path, conn: sqlite3.Connection, reporter: Reporter, rules: Rules, order=None
) -> CellResult:
    """run_cell in a fresh process; its progress drives `reporter` here. conn (the grid's) marks the run
    of a process that died crashed. Raises KeyboardInterrupt after Ctrl-C (the cell recorded), and
    KBError with the cell's sentence when the KB could not take its rows."""
    args = (cell, str(Path(db_path).absolute()), rules, order, dict(_peaks))
    heard, interrupted, proc = _in_child(_cell_process, args, reporter, rules)
    _peaks.update(heard.peaks)
    if interrupted or heard.interrupted:
        _mark_crashed(conn)
        _keep_said(conn, heard.run_id, heard.said)
        raise KeyboardInterrupt
    if heard.kb_error:
        _mark_crashed(conn)
        raise KBError(heard.kb_error)
    result = heard.result
    if result is None:
        sentence = heard.raised or death_sentence(proc.exitcode, heard.said)
        result = _crashed(conn, cell, heard.run_id, sentence)
    _keep_said(conn, result.run_id, heard.said)
    return result


def train_in_child(cell: GridCell, reporter: Reporter, rules: Rules) -> tuple[CellOutcome, dict | None]:
    """train_cell (a resolved cell, no KB) in a fresh process: (its outcome, its model's info). A process
    that dies without an outcome is a `crashed` outcome with the sentence. A cluster's worker runs cells so:
    the imports once per worker, memory each cell's own. Raises KeyboardInterrupt after Ctrl-C."""
    heard, interrupted, proc = _in_child(_train_process, (cell, rules, dict(_peaks)), reporter, rules)
    _peaks.update(heard.peaks)
    if interrupted or heard.interrupted:
        raise KeyboardInterrupt
    outcome = heard.outcome
    if outcome is None:
        outcome = CellOutcome("crashed", heard.raised or death_sentence(proc.exitcode, heard.said), [])
    outcome.stderr = clipped(heard.said) if heard.said.strip() else None
    return outcome, heard.built


def _in_child(target, args: tuple, reporter: Reporter, rules) -> tuple[_Heard, bool, object]:
    """target(*args, pipe, watch, environ) in a process forked from the server, followed until it ends:
    (what it said, on its pipe and on its stdout and stderr; whether Ctrl-C came; the process)."""
    global _ready
    start_server(rules)
    ctx = multiprocessing.get_context("forkserver")
    reader, writer = ctx.Pipe(duplex=False)  # the cell's messages
    watch, alive_w = ctx.Pipe(duplex=False)  # ends when this process does: the cell then dies too
    proc = ctx.Process(target=target, args=(*args, writer, watch, dict(os.environ)), name="advisor-cell")
    heard, interrupted, followed = _Heard(), False, False
    try:
        with _sigint_deferred() as held:  # a started process is always waited for
            proc.start()
        _ready = True
        writer.close()  # the child's copies are its own: its pipe ends when it does
        watch.close()
        if held:
            raise KeyboardInterrupt
        _follow(proc, reader, reporter, heard)
        followed = True
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()
        watch.close()
        try:  # Ctrl-C, or the reporter raised: the cell is stopped, then waited for
            interrupted |= _end(proc, stop=not followed)
        finally:
            reader.close()
            alive_w.close()
            heard.said = _new_output()
    return heard, interrupted, proc


def _follow(proc, reader, reporter: Reporter, heard: _Heard) -> None:
    """Replay the cell's messages until its process has ended and its pipe is empty."""
    while True:
        wait([reader, proc.sentinel])
        ended = not proc.is_alive()  # asked before draining: what it wrote before it ended is read
        try:
            while reader.poll():
                heard.take(reader.recv(), reporter)
        except EOFError:
            return
        if ended:
            return


def _end(proc, stop: bool) -> bool:
    """Wait for the cell's process; with stop, ask it first to record its run crashed (SIGINT, as Ctrl-C in
    a terminal does), and kill it if it takes longer than STOP_WAIT_S. Returns whether Ctrl-C came meanwhile
    (held: it must not leave the cell running)."""
    if proc.pid is None:
        return False
    with _sigint_deferred() as held:
        if stop and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            proc.join(STOP_WAIT_S)
            if proc.is_alive():
                proc.kill()
        proc.join()
    return bool(held)


def _crashed(conn: sqlite3.Connection, cell: GridCell, run_id: int | None, sentence: str) -> CellResult:
    """The result of a cell whose process ended without one: its run marked crashed, with the sentence."""
    lease.mark_crashed(conn, alive)
    row = None
    if run_id is not None:
        row = store.run_ending(conn, run_id)
    if row is not None and row[0] not in ("running", "crashed"):  # it finished, then died before saying so
        return CellResult(cell.resolved, row[0], run_id, error=row[1])
    if row is not None and row[0] == "crashed":
        store.update_run(conn, run_id, error=sentence)
    return CellResult(cell.resolved, "crashed", run_id, error=sentence)


def _keep_said(conn: sqlite3.Connection, run_id: int | None, said: str) -> None:
    """What a cell's process wrote (library warnings, log lines, a traceback) kept with its run, as
    `config.stderr` (the runs table has no column of its own for it); best effort: it is no evidence."""
    if run_id is None or not said.strip():
        return
    with contextlib.suppress(KBError, sqlite3.Error, ValueError):
        config = store.run_config(conn, run_id)
        if config is not None:
            store.update_run(conn, run_id, config={**config, "stderr": clipped(said)})


def _mark_crashed(conn: sqlite3.Connection) -> None:
    """Best effort on the way out (the disk may be full): a run left behind is crashed by the next grid."""
    with contextlib.suppress(KBError, sqlite3.Error):
        lease.mark_crashed(conn, alive)


@contextlib.contextmanager
def _sigint_deferred():
    """Hold Ctrl-C during the block; yields a list that says afterwards whether it came (main thread only:
    elsewhere, Ctrl-C is not held)."""
    held: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(True))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


# --- the cell's side ----------------------------------------------------------------------------------


class _ClaimTelling(lease.Heartbeat):
    """The cell's heartbeat, which also tells the grid the run it claimed (to mark it if the cell dies)."""

    def __init__(self, path, send):
        super().__init__(path)
        self._send = send

    def hold(self, run_id: int) -> None:
        super().hold(run_id)
        self._send(("claimed", run_id))


def _cell_process(cell, db_path, rules, order, peaks, pipe, watch, environ) -> None:
    """The body of a cell's process (the target the fork server runs)."""
    send = _child_setup(pipe, watch, environ)
    code = 0
    try:
        reporter = ForwardingReporter(send)
        with writing(db_path) as conn, _ClaimTelling(db_path, send) as heartbeat:
            result = run_cell(cell, conn, rules, reporter, heartbeat, order=order, peaks=peaks, exiting=True)
        reporter.flush()
        send(("peaks", peaks))
        send(("result", result))
    except KeyboardInterrupt:
        send(("interrupted",))
        code = 130
    except KBError as e:
        send(("kb_error", str(e)))
        code = 1
    except BaseException as e:  # a bug outside the cell's training: the grid records it and goes on
        code = _said(send, e)
    finally:
        pipe.close()
    sys.exit(code)


def _train_process(cell, rules, peaks, pipe, watch, environ) -> None:
    """The body of a training-only cell's process: its model's info and its outcome go to the pipe."""
    send = _child_setup(pipe, watch, environ)
    code = 0
    try:
        reporter = ForwardingReporter(send)
        outcome = train_cell(
            cell, rules, reporter, lambda info: send(("built", info)), peaks=peaks, exiting=True
        )
        reporter.flush()
        send(("peaks", peaks))
        send(("outcome", outcome))
        code = 130 if outcome.interrupted else 0
    except BaseException as e:  # a bug outside the cell's training: said, and the cell is crashed
        code = _said(send, e)
    finally:
        pipe.close()
    sys.exit(code)


def _child_setup(pipe, watch, environ):
    """A cell's process, first thing: shared pages kept, dies with the grid, Ctrl-C once, the grid's
    environment; returns how it sends its messages."""
    gc.freeze()  # what the server imported is never collected: the collector leaves its pages shared
    _die_with_grid(watch)
    _interrupt_once()
    os.environ.clear()
    os.environ.update(environ)  # the grid's environment now, not the server's when it started
    return _sender(pipe)


def _said(send, e: BaseException) -> int:
    """An exception outside the cell's training, printed (into the cells' output, which the grid keeps with
    the run) and sent to the grid; the exit code."""
    traceback.print_exc()
    first = (str(e).strip().splitlines() or [""])[0][:300]
    send(("raised", f"the cell's process raised {type(e).__name__}: {first}"))
    return 1


def _sender(pipe):
    def send(message) -> None:
        try:
            pipe.send(message)
        except OSError:  # the grid is gone: end as it did; the next grid marks the run crashed
            os.kill(os.getpid(), signal.SIGKILL)

    return send


def _die_with_grid(watch) -> None:
    """Be killed as soon as the grid's process is gone (kill -9 included): it holds the only write end of
    `watch`, which then reads end-of-file. (The fork server, this process's parent, outlives the grid by
    seconds: it finalizes torch before it exits.)"""

    def watch_grid() -> None:
        with contextlib.suppress(OSError, EOFError):
            watch.poll(None)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch_grid, name="advisor-grid-watch", daemon=True).start()


def _interrupt_once() -> None:
    """Ctrl-C raises KeyboardInterrupt once; a second one (the grid forwards the terminal's) is ignored,
    so that it cannot cut short the recording of the first."""

    def interrupt(*_) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
