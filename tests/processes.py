"""Helpers of the process-level fault tests: advisor in a subprocess, reading a KB from outside it, and the
processes a grid leaves behind (a cell runs in a process of its own, forked from a fork server)."""

import os
import sqlite3
import subprocess
import sys
import time

import psutil


def advisor(*args, env=None, **kwargs):
    """`python -m advisor ARGS` in a subprocess, offline, with its output captured."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "advisor", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def runs(db) -> list[dict]:
    """Every run of a KB, as dicts, in insertion order."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY id")]
    finally:
        conn.close()


def query(db, sql, *params):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def wait_for(db, sql, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if db.exists() and query(db, sql)[0][0]:
                return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {sql}")


def running(procs) -> list[int]:
    """The pids of psutil processes that still run (a zombie has ended: it only awaits its parent's wait)."""
    out = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def in_group(pgid: int) -> list[psutil.Process]:
    """Every process of a process group (a terminal's foreground job, a subprocess's new session)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                out.append(proc)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def wait_until_ended(procs, timeout=30) -> list[int]:
    """Wait for processes to end (the fork server finalizes torch for a second or so); the pids still
    running at the timeout."""
    deadline = time.time() + timeout
    while running(procs) and time.time() < deadline:
        time.sleep(0.05)
    return running(procs)
