"""Resource monitor: a background thread samples the machine about every 100 ms, and marks read counters.

NVML (nvidia-ml-py) gives GPU utilization, device memory and the energy counter where present; psutil
gives the process's RSS (children included). CPU use is not sampled: it is the process's CPU time over a
window's wall time (psutil cpu_times at both marks), as a share of the cores the run uses, capped at 100 %
(sampled `cpu_percent` over near-zero intervals, averaged unweighted, read 608 % on two cores). What
other processes used meanwhile (the machine's busy time less ours) says whether the timing was contended.
What this machine cannot measure stays None and is stored as NULL, never as zero.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class Sample:
    t: float
    rss_gb: float
    gpu_util: float | None = None
    gpu_mem_gb: float | None = None  # NVML: memory used on the device, by every process
    energy_j: float | None = None  # NVML's cumulative counter (mJ → J)


@dataclass(frozen=True)
class Mark:
    """The start of a window: wall clock, this process's CPU seconds, the machine's busy CPU seconds."""

    t: float
    cpu_s: float
    busy_s: float


@dataclass
class WindowStats:
    """Aggregates of the samples between two marks (an epoch, a cell)."""

    peak_rss_gb: float | None = None
    cpu_util: float | None = None  # % of the cores the run uses, from CPU time (never above 100)
    others_cpu: float | None = None  # cores' worth of CPU other processes used during the window
    gpu_util: float | None = None
    gpu_mem_gb: float | None = None
    energy_j: float | None = None
    samples: int = 0


def cores_used() -> int:
    """The cores a run's math may use: torch's intra-op threads, within the CPUs the process may run on."""
    import torch

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(allowed, torch.get_num_threads()))


def process_rss_gb() -> float:
    """This process's resident memory now, children included, GB."""
    proc = psutil.Process(os.getpid())
    return _rss_gb(proc, proc.children(recursive=True))


def _rss_gb(proc: psutil.Process, children: list[psutil.Process]) -> float:
    """Resident memory of a process and the given children (those that ended meanwhile count nothing), GB."""
    rss = proc.memory_info().rss
    for child in children:
        try:
            rss += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return rss / 1e9


def _busy_s() -> float:
    """Seconds every CPU of the machine spent not idle since boot."""
    t = psutil.cpu_times()
    # Linux counts guest time inside user and nice already: do not count it twice
    guests = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - guests


class _Nvml:
    """NVML for one GPU, or nothing: `pynvml.nvmlInit()` raises without a GPU and that is not an error."""

    def __init__(self, index: int = 0):
        self.handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:
            self.handle = None

    def read(self) -> dict:
        if self.handle is None:
            return {}
        out = {}
        for key, fn in (
            ("gpu_util", lambda h: self.nv.nvmlDeviceGetUtilizationRates(h).gpu),
            ("gpu_mem_gb", lambda h: self.nv.nvmlDeviceGetMemoryInfo(h).used / 1e9),
            ("energy_j", lambda h: self.nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1e3),
        ):
            try:
                out[key] = float(fn(self.handle))
            except Exception:  # a counter this GPU does not have (e.g. energy on older boards)
                pass
        return out


@dataclass
class Monitor:
    interval: float = 0.1  # seconds between samples
    memory_cap_gb: float | None = None  # host RSS above this sets `over_cap` (a forced OOM on CPU)
    samples: list[Sample] = field(default_factory=list)
    over_cap: float | None = None  # the RSS that crossed the cap
    cpu_seconds: float = 0.0  # CPU time the sampler thread itself used: its overhead

    def __post_init__(self):
        self._proc = psutil.Process(os.getpid())
        self.cores = cores_used()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = _Nvml()
        self._lock = threading.Lock()

    def __enter__(self) -> Monitor:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="advisor-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            start = time.thread_time()
            self.sample()
            self.cpu_seconds += time.thread_time() - start

    CHILDREN_EVERY = 20  # samples between scans for child processes: a scan walks /proc (~1 ms)

    def rss_gb(self) -> float:
        self._count = getattr(self, "_count", 0) + 1
        if self._count % self.CHILDREN_EVERY == 1:
            self._children = self._proc.children(recursive=True)
        return _rss_gb(self._proc, self._children)

    def sample(self) -> Sample:
        s = Sample(t=time.perf_counter(), rss_gb=self.rss_gb(), **self._nvml.read())
        if self.memory_cap_gb is not None and s.rss_gb > self.memory_cap_gb and self.over_cap is None:
            self.over_cap = s.rss_gb
        with self._lock:
            self.samples.append(s)
        return s

    def _cpu_s(self) -> float:
        t = self._proc.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def mark(self) -> Mark:
        """The start of a window; sampled so that short windows are never empty."""
        return Mark(self.sample().t, self._cpu_s(), _busy_s())

    def window(self, since: Mark) -> WindowStats:
        """Aggregates of the samples since a mark (a closing sample is taken now), and CPU use over it."""
        end = self.mark()
        with self._lock:
            ss = [s for s in self.samples if s.t >= since.t]
        if not ss:
            return WindowStats()
        wall = end.t - since.t
        ours = end.cpu_s - since.cpu_s
        cpu_util = others = None
        if wall > 0:
            cpu_util = min(100.0, 100.0 * ours / wall / self.cores)
            others = max(0.0, (end.busy_s - since.busy_s - ours) / wall)

        def mean(key):
            values = [getattr(s, key) for s in ss if getattr(s, key) is not None]
            return sum(values) / len(values) if values else None

        energies = [s.energy_j for s in ss if s.energy_j is not None]
        gpu_mem = [s.gpu_mem_gb for s in ss if s.gpu_mem_gb is not None]
        return WindowStats(
            peak_rss_gb=max(s.rss_gb for s in ss),
            cpu_util=cpu_util,
            others_cpu=others,
            gpu_util=mean("gpu_util"),
            gpu_mem_gb=max(gpu_mem) if gpu_mem else None,
            energy_j=energies[-1] - energies[0] if len(energies) > 1 else None,
            samples=len(ss),
        )

    def forget(self) -> None:
        """Drop old samples (between cells), so nothing from one cell is read into the next."""
        with self._lock:
            self.samples.clear()
        self.over_cap = None
