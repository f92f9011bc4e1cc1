"""Independent pieces of a cold trace on every core: forked worker processes that inherit what the caller has
built (torch imported, the model's config read), so a piece costs no import and no pickling of its inputs.

A trace is single-threaded Python under fake tensors; its stages share nothing a result depends on, so two
cores trace a menu in about half the time. Fork is used on Linux only (macOS's system libraries are not
fork-safe) and never from a daemonic process (a measure cell); elsewhere the pieces run one after another,
in this process, with the same results.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator

from advisor.measuring.machine.orphans import die_with

MOST = 8  # workers at most: a trace's stages are rarely more, and each worker holds its own model copies


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def can_fork() -> bool:
    return sys.platform == "linux" and not multiprocessing.current_process().daemon


def unordered(function: Callable, items: list, workers: int | None = None) -> Iterator:
    """`function(item)` for every item, each result as soon as it is ready: in `workers` forked processes
    (default: one per core), or in this process where forking is not safe or one worker is asked.
    `function` must be a module-level function (it is sent by name); what it needs beyond its item it
    reads from module state set before this call, which the workers inherit. An exception in a worker is
    raised here, the other workers stopped."""
    workers = min(workers or cores(), MOST, len(items))
    if workers <= 1 or not can_fork():
        yield from map(function, items)
        return
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=_worker, initargs=(os.getpid(),)) as pool:  # exit: terminate()
        yield from pool.imap_unordered(function, items)


def _worker(parent: int) -> None:
    """A worker, first thing: dies with its parent (kill -9 included), leaves Ctrl-C to the parent (which
    stops the pool), runs torch on one thread (its siblings hold the other cores), keeps shared pages."""
    die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.freeze()
    import torch

    torch.set_num_threads(1)
