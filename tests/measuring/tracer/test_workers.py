"""A cold trace's stages on forked workers (advisor/measuring/tracer/workers.py): the same payloads as one process,
errors that cross, workers that die with their parent; a sharded window warmed on a shallow copy."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from advisor.errors import FitError
from advisor.measuring.tracer import workers

from .distributed import tiny_llama

forking = pytest.mark.skipif(not workers.can_fork(), reason="forked workers run on Linux only")


def _pid(_item) -> int:
    return os.getpid()


def _refuse(item) -> int:
    if item == 2:
        raise FitError("cannot trace a training step of this model: planted")
    return item


@forking
def test_pieces_run_in_forked_workers_and_every_result_comes_back():
    pids = list(workers.unordered(_pid, list(range(6)), workers=2))
    assert len(pids) == 6 and os.getpid() not in pids


def test_one_worker_runs_in_this_process():
    assert set(workers.unordered(_pid, [1, 2, 3], workers=1)) == {os.getpid()}


@pytest.mark.parametrize("n", [1, 2])
def test_a_workers_error_is_raised_to_the_caller_as_it_is(n):
    with pytest.raises(FitError, match="planted"):
        list(workers.unordered(_refuse, [1, 2, 3], workers=n))


@forking
def test_workers_die_with_their_parent(tmp_path):
    """kill -9 of the caller (advisor fit) leaves no worker tracing on."""
    script = textwrap.dedent(
        """
        import os, time
        from advisor.measuring.tracer import workers

        def report_and_sleep(_item):
            with open(os.environ["PIDS"], "a") as f:
                f.write(f"{os.getpid()}\\n")
            time.sleep(300)

        list(workers.unordered(report_and_sleep, [0, 1], workers=2))
        """
    )
    pids = tmp_path / "pids"
    child = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PIDS": str(pids)}, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(_read(pids)) < 2:
        time.sleep(0.2)
    found = _read(pids)
    assert len(found) == 2, "the workers did not start"
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(p) for p in found):
        time.sleep(0.2)
    assert not any(_alive(p) for p in found)


def _read(path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_a_trace_on_two_workers_is_the_one_on_one(tmp_path):
    """Every stage's payload, whichever process traced it and in whichever order, is the same."""
    from advisor.measuring.tracer.engine import trace
    from advisor.model_ref import resolve_model
    from advisor.prediction.fit_request import FitRequest
    from advisor.prediction.question import question
    from advisor.rules import load_rules

    rules = load_rules()
    options = FitRequest(
        gpu="cpu",
        gpus=2,
        shardings=("ddp", "fsdp"),
        adapters=("full",),
        dtype="fp32",
        optimizers=("adamw", "sgd"),
        strategies=("standard", "checkpointing"),
        seq_len=32,
        batch_size=2,
    )
    q = question(resolve_model(str(tiny_llama(tmp_path / "llama")), rules), options, rules)
    heard: list[str] = []
    one = trace(q, q.configs, rules, workers=1)
    two = trace(q, q.configs, rules, say=heard.append, workers=2)
    assert one == two and set(one) == set(q.configs)
    assert len(heard) == 1 + 2  # the heading, and a line for each stage (a sharding each)


@pytest.mark.slow
def test_a_sharded_window_warmed_on_a_shallow_copy_is_the_one_warmed_at_another_depth(tmp_path):
    """DTensor's cache is filled by op and shapes: a one-block warm-up serves a deeper trace as well as the
    trace of a neighbouring depth does (what lets a cold sharded window warm up at a fifth of its cost)."""
    from transformers import LlamaConfig

    from advisor.measuring.model.families import family
    from advisor.measuring.tracer.payloads import Tracer
    from advisor.measuring.tracer.spec import Spec
    from advisor.rules import load_rules

    rules = load_rules()
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=128,
    )
    spec = Spec(config, family("decoder", rules), 32, None, "fp32", "cpu")
    shallow_first = Tracer(spec, rules.fit)
    deep, deeper = shallow_first.points(sharded=True)
    cold = shallow_first.window(spec, deeper, 2, None, 1, sharded=True)  # warmed on one block
    neighbour = Tracer(spec, rules.fit)
    neighbour.window(spec, deep, 2, None, 1, sharded=True)
    warm = neighbour.window(spec, deeper, 2, None, 1, sharded=True)  # warmed by the trace at `deep`
    assert cold == warm
