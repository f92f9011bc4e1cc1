"""Resource monitor: a background thread samples the machine about every 100 ms.

NVML (nvidia-ml-py) gives GPU utilization, device memory and the energy counter where present; psutil
gives the process's RSS (children included) and CPU use. What this machine cannot measure stays None and
is stored as NULL, never as zero.
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
    cpu_percent: float | None  # % of one core, since the previous sample
    gpu_util: float | None = None
    gpu_mem_gb: float | None = None  # NVML: memory used on the device, by every process
    energy_j: float | None = None  # NVML's cumulative counter (mJ → J)


@dataclass
class WindowStats:
    """Aggregates of the samples between two marks (an epoch, a cell)."""

    peak_rss_gb: float | None = None
    cpu_util: float | None = None
    gpu_util: float | None = None
    gpu_mem_gb: float | None = None
    energy_j: float | None = None
    samples: int = 0


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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = _Nvml()
        self._lock = threading.Lock()

    def __enter__(self) -> Monitor:
        self._proc.cpu_percent(None)  # prime: the first call has no interval to measure
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
        rss = self._proc.memory_info().rss
        self._count = getattr(self, "_count", 0) + 1
        if self._count % self.CHILDREN_EVERY == 1:
            self._children = self._proc.children(recursive=True)
        for child in self._children:
            try:
                rss += child.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return rss / 1e9

    def sample(self) -> Sample:
        s = Sample(
            t=time.perf_counter(),
            rss_gb=self.rss_gb(),
            cpu_percent=self._proc.cpu_percent(None),
            **self._nvml.read(),
        )
        if self.memory_cap_gb is not None and s.rss_gb > self.memory_cap_gb and self.over_cap is None:
            self.over_cap = s.rss_gb
        with self._lock:
            self.samples.append(s)
        return s

    def mark(self) -> float:
        """A point in time that starts a window; sampled so that short windows are never empty."""
        return self.sample().t

    def window(self, since: float) -> WindowStats:
        """Aggregates of the samples since a mark (a closing sample is taken now)."""
        self.sample()
        with self._lock:
            ss = [s for s in self.samples if s.t >= since]
        if not ss:
            return WindowStats()

        def mean(key):
            values = [getattr(s, key) for s in ss if getattr(s, key) is not None]
            return sum(values) / len(values) if values else None

        energies = [s.energy_j for s in ss if s.energy_j is not None]
        gpu_mem = [s.gpu_mem_gb for s in ss if s.gpu_mem_gb is not None]
        return WindowStats(
            peak_rss_gb=max(s.rss_gb for s in ss),
            cpu_util=mean("cpu_percent"),
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
