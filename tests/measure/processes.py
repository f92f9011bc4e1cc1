"""Helpers of the process-level fault tests: advisor in a subprocess, and reading a KB from outside it."""

import os
import sqlite3
import subprocess
import sys
import time


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
