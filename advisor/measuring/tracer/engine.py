"""The engine of `advisor fit`: a model's training step traced under PyTorch's fake tensors, from its config
alone (no weight is allocated: an 8B model costs no RAM), with the real checkpointing (full or selective)
and accumulation mechanisms, autocast for mixed precision, peft's LoRA and bitsandbytes' quantized base for
QLoRA, the real optimizers (bitsandbytes', torchao's, schedule-free's, Muon and ours included) and the loss
the model computes itself, as a Hugging Face Trainer step does.

What is traced, per adapter and precision:
- a forward/backward window of two micro-batches, with each checkpointing (none, full, selective): the
  first micro-batch's phases are standard training's (and checkpointing's); the second's, with the first's
  gradients alive, accumulation's (a longer window peaks no higher). FLOPs are counted by torch's formulas;
- each optimizer's step on fake gradients of what trains: its state, and the peak of its step. The
  forward/backward peaks depend on the optimizer only through its state, alive throughout: added, not
  re-traced. Offloading the optimizer (its state and the fp32 master weights on the host) is composed from
  the half-precision window and the optimizer's state, which then counts on the host.

Deep models are traced at one and two blocks of each stack and of each kind of block a stack mixes (Gemma's
sliding and full attention, DeepSeek's dense and mixture-of-experts layers), at micro-batch 2 and 3. Every
op's live bytes are affine in the batch, so each phase keeps the lines of its peak (the upper envelope of
its ops' lines): the peak at any batch, not a secant through two peaks, which would miss the peak moving
as activations outgrow the gradients. Depth is then a linear combination of the traced points.
`tests/measuring/tracer/test_prediction.py` and `tests/measuring/tracer/test_menu.py` check the composite against full traces,
and predictions against real steps' live tensor bytes.

Its parts: what is traced and its depth (`spec.py`), the model under fake tensors (`fake_model.py`), the
traces (`traces.py`), their payloads (`payloads.py`); here, advisor fit's tracer (`trace`), its stages on
the workers (`workers.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import logging
import os
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import replace

from advisor.errors import FitError, InputError
from advisor.measuring.model.builder import model_config
from advisor.measuring.model.families import family_of
from advisor.measuring.recipe.strategies import checkpointing_of
from advisor.measuring.tracer.payloads import Tracer
from advisor.measuring.tracer.spec import HALF, Spec
from advisor.measuring.tracer.workers import unordered
from advisor.prediction.question import Question, text_first
from advisor.prediction.step import Config
from advisor.rules import Rules

# --- advisor fit's tracer ------------------------------------------------------------------------------------

# Loggers of libraries a trace imports and runs, whose notices are about the libraries, not the user's question:
# torchao's absent CUDA kernels on a CPU, bitsandbytes' `kernels` trust check when the Hub is offline, torch's
# notices of torchao's registrations, DeepSpeed's accelerator probe
NOISY = ("torchao", "bitsandbytes", "kernels", "deepspeed", "DeepSpeed", "torch.utils._pytree")
# Loggers that repeat, as a traceback, an error the trace then says in one sentence (FitError): fake tensors' log
# of a kernel that failed on a model's shapes (an odd head width, a partial rotary part the model ignores)
REPEATING = ("torch._subclasses.fake_tensor",)


@contextmanager
def quiet_libraries():
    """The libraries' notices (NOISY) kept off the user's terminal while a trace runs (errors still show); the
    loggers' levels restored after, the user's own process left as it was."""
    loggers = [logging.getLogger(name) for name in NOISY + REPEATING]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL if logger.name in REPEATING else logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


# Imported before a trace with the Hugging Face hub off: bitsandbytes' CPU backend asks the Hub for a kernel as
# it is imported (`kernels.get_kernel`, with `kernels` installed, on a CPU with AVX512-BF16), and nothing
# bounds that wait; peft imports bitsandbytes. Offline, `kernels` takes a kernel from the cache or none.
HUB_ASKING = ("bitsandbytes", "peft")


@contextmanager
def hub_off():
    """The Hugging Face hub off for the block, then as it was: HF_HUB_OFFLINE (what huggingface_hub reads as
    it is first imported) and huggingface_hub's own flag (what it and `kernels`, which has no switch of its
    own, read at every call: a request raises at once instead of waiting)."""
    from huggingface_hub import constants

    env, flag = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"], constants.HF_HUB_OFFLINE = "1", True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = flag
        if env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = env


def import_offline(names: tuple[str, ...] = HUB_ASKING) -> None:
    """Import the libraries a trace needs that ask the Hub as they are imported, with the hub off for the
    imports only (a trace reads no file from the network): before the workers fork, so they inherit them."""
    wanted = [name for name in names if name not in sys.modules and importlib.util.find_spec(name)]
    if not wanted:
        return
    with hub_off():
        for name in wanted:
            try:
                importlib.import_module(name)
            except Exception:  # a broken install fails where it is used, with that place's sentence
                pass


def trace(
    q: Question, configs: list[Config], rules: Rules, say=lambda line: None, workers: int | None = None
) -> dict[Config, dict]:
    """advisor fit's tracer: the payload of each configuration of a question, traced on the model's config
    (a reference model at its preset, a user's from its config.json as read); `say` hears one line a stage.
    The stages (an adapter, precision, offload and sharding each) run on `workers` cores (default: all;
    advisor/measuring/tracer/workers.py), the dearest first; each result is the same on any number."""
    try:
        model_cfg = model_config(q.model, rules)
    except (ValueError, KeyError, OSError) as e:
        raise FitError(f"transformers cannot build {q.model.name} from its config: {_first_line(e)}") from e
    base = Spec(
        model_cfg,
        family_of(q.model, rules),
        q.seq_len,
        q.image_size,
        "fp32",
        q.device,
        attention=q.traced_attention,
        images=q.image_size is not None or not text_first(q.model),
    )
    tracer = Tracer(base, rules.fit)
    tasks = sorted(_tasks(configs), key=lambda task: -_cost(tracer, task))
    run = next(_RUN_IDS)
    _RUNNING[run] = [(q, rules, base, tracer, task) for task in tasks]  # what forked workers inherit
    stages = sum(len(task) for task in tasks)
    say(f"tracing {q.model.name}: {len(configs)} configurations in {stages} stages (then cached)")
    out, done = {}, 0
    try:
        with quiet_libraries():
            import_offline()
            pieces = [(run, i) for i in range(len(tasks))]
            for _, traced, timings in unordered(_task, pieces, workers):
                out |= traced
                for (adapter, dtype, offload, sharding), group, seconds in timings:
                    done += 1
                    where = "" if sharding == "none" else f", {sharding}"
                    off = "" if offload == "none" else f", offload {offload}"
                    n_opt, n_strategies = len({c.optimizer for c in group}), len({c.strategy for c in group})
                    say(
                        f"[{done}/{stages}] {adapter} {dtype}{where}{off}: {n_opt} optimizers x "
                        f"{n_strategies} strategies, {seconds:.1f} s"
                    )
    finally:
        del _RUNNING[run]
    return out


# Each trace running in this process (several threads may trace at once): its id -> (question, rules, base
# spec, tracer, task) per task (a task: stages, each a stage key and its configurations); forked workers
# inherit it.
_RUNNING: dict[int, list] = {}
_RUN_IDS = itertools.count()


def _task(piece: tuple[int, int]) -> tuple[int, dict, list]:
    """One task of a running trace (`piece`: its run and index), its stages one after another in one process
    (they share windows): (the index, {configuration: payload}, (stage key, configurations, seconds) per
    stage); an error that says the model cannot be traced is a FitError, which crosses from a worker as is."""
    run, index = piece
    q, rules, base, tracer, task = _RUNNING[run][index]
    out, timings = {}, []
    for (adapter, dtype, offload, sharding), group in task:
        start = time.perf_counter()
        spec = replace(base, dtype=dtype, adapter=q.adapter_of(adapter), method=q.method_of(adapter))
        optimizers = sorted({c.optimizer for c in group}, key=list(rules.optimizers).index)
        strategies = sorted({c.strategy for c in group}, key=list(rules.strategies).index)
        try:
            traced = tracer.payloads(spec, optimizers, strategies, offload != "none", sharding == "fsdp")
        except InputError:
            raise
        except (
            ValueError,
            NotImplementedError,
            RuntimeError,
            TypeError,
            AttributeError,
            AssertionError,
            LookupError,
            ArithmeticError,
        ) as e:
            # AssertionError: what a library asserts of its inputs (torch's optimizers of their devices);
            # LookupError, ArithmeticError: a model's code on a config value its class let through (a name
            # ACT2FN lacks, a size that overflows)
            raise FitError(f"cannot trace a training step of {q.model.name}: {_first_line(e)}") from e
        out |= {c: traced[(c.optimizer, c.strategy)] for c in group}
        timings.append(((adapter, dtype, offload, sharding), group, time.perf_counter() - start))
    return index, out, timings


def _cost(tracer: Tracer, task) -> int:
    """A task's work, roughly: the blocks its windows trace (a sharded stage's points are deeper), each
    window once however many of its stages read it."""
    windows = {(sharding, checkpointing_of(c.strategy)) for (_, _, _, sharding), group in task for c in group}
    return sum(sum(sum(point) for point in tracer.points(sharded == "fsdp")) for sharded, _ in windows)


def _tasks(configs: list[Config]) -> list[list[tuple[tuple, list[Config]]]]:
    """The stages (an adapter, precision, offload and sharding each) in tasks of those that trace the same
    windows: an offloaded stage runs its precision's half on the device, the pure-bf16 stage's windows."""
    groups: dict[tuple, list[Config]] = {}
    for c in configs:
        groups.setdefault((c.adapter, c.dtype, c.offload, c.sharding), []).append(c)
    tasks: dict[tuple, list] = {}
    for key, group in groups.items():
        adapter, dtype, offload, sharding = key
        device = HALF.get(dtype, dtype) if offload != "none" else dtype
        tasks.setdefault((adapter, device, sharding), []).append((key, group))
    return list(tasks.values())


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
