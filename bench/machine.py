"""What a benchmark's raw result records of where it ran: the CPU and its cores, the versions that matter,
and advisor's commit (+dirty where the working tree differs). One place for every script in bench/."""

from __future__ import annotations

import os
import platform
import resource
import sqlite3
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def device() -> dict:
    """The CPU the numbers were taken on."""
    model = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        model = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": model, "cores": os.cpu_count()}


def versions(*dists: str) -> dict:
    """Python, SQLite, the installed version of each distribution named (None if absent), and advisor's
    commit."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    found: dict = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for dist in dists:
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = None
    return found | {"advisor_commit": git("rev-parse", "HEAD") + dirty}


def advisor_script() -> str:
    """The `advisor` command the benchmark times: this Python's (its venv's) first, else the one on PATH;
    exits with a sentence where none is installed."""
    import shutil
    import sys

    beside = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return shutil.which("advisor", path=beside) or sys.exit(
        "advisor is not on PATH: install the project first"
    )


def timed(cmd: list[str], env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    """(CPU seconds of the child, wall seconds, the finished process) of one run of cmd; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd[:6]))} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall, done
