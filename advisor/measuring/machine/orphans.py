"""A helper process dies with the process that started it (kill -9 included): forked stage workers
(advisor.measuring.tracer.workers) and the grid's fork server (advisor.measuring.grid.isolation), which imports this
module first, so that it does not import torch on for minutes after its grid is gone, holding the pipes
and files the grid's caller handed it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "ADVISOR_PARENT_PID"  # the fork server's parent, as the grid starts it


def die_with(parent: int | None) -> None:
    """Ask the kernel for SIGKILL when the parent dies (Linux; elsewhere nothing), and exit now where it
    already has (the parent of record is no longer this process's parent)."""
    if sys.platform != "linux" or not parent:
        return
    # written by hand: no library sets a parent-death signal; prctl(PR_SET_PDEATHSIG=1, SIGKILL)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)


if os.environ.get(PARENT_ENV, "").isdigit():  # imported by the fork server, first of its preload
    die_with(int(os.environ[PARENT_ENV]))
