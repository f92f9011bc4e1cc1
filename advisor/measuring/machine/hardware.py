"""What machine and software a run was measured on: part of every measured run's provenance."""

from __future__ import annotations

import os
import platform
import socket
from functools import cache

import psutil


def resolve_device(device: str) -> str:
    """'auto' → 'cuda' when a GPU is usable, else 'cpu'; an explicit 'cuda' without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda, but torch sees no CUDA GPU on this machine; use --device cpu or auto"
        )
    if device not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; choose from auto, cpu, cuda")
    return device


@cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(device: str) -> dict:
    """hardware, device, host and accelerator memory (GB), and software versions, for the runs table."""
    import torch

    host_gb = round(psutil.virtual_memory().total / 1e9, 1)
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        hardware = torch.cuda.get_device_name(0)
        accel_gb = round(props.total_memory / 1e9, 1)
    else:
        hardware = f"CPU: {cpu_name()} ({os.cpu_count()} cores)"
        accel_gb = None
    return {
        "hardware": hardware,
        "device": device,
        "host_memory_gb": host_gb,
        "accelerator_memory_gb": accel_gb,
        "software": software_versions(),
    }


@cache
def software_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for pkg in ("torch", "transformers", "datasets", "advisor"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    import torch

    out["cuda"] = torch.version.cuda
    return out


def owner() -> str:
    """'host:pid' of this process: how a later process tells a crashed run from one still running."""
    return f"{socket.gethostname()}:{os.getpid()}"


def pid_alive(owner_tag: str) -> bool:
    """Whether the process of a 'host:pid' owner on this host still runs (leases decide for other hosts)."""
    pid = owner_tag.rsplit(":", 1)[-1]
    if not pid.isdigit() or int(pid) == 0:
        return False
    try:  # a zombie is dead: where nothing reaps orphans (PID 1 of some containers) it lingers as one
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
