"""The grid on a Ray cluster: every cell a Ray task on whichever node has room, the driver the only writer.

SQLite never spans hosts: the driver (this process) claims each cell in its KB with a lease that its
heartbeat renews while the cell runs anywhere in the cluster, and writes what the cell's task hands back
(its machine, epochs and figures) once it ends. A task whose node or worker dies is retried by Ray
(`TASK_RETRIES`) under the same claim, so a cell has at most one `ok` run; a driver that dies stops
renewing its leases, and the next grid (on any host) finds them expired, marks the runs crashed and runs
the cells again.

A task trains its cell in a process of its own, forked from a fork server in its Ray worker, as a cell
does on one machine (advisor/measuring/grid/isolation.py): memory is the cell's own, and a worker imports torch and
transformers once, not once per cell. A cell's process that dies (the kernel's OOM killer) is the cell's
`crashed` outcome; a worker or node that dies is Ray's to retry. Cells ask for one GPU where the cluster has GPUs, else `cpus` CPUs (by
default a whole node's, the smallest's: a cell's timing is not shared with another cell). Ray is an
optional extra (`pip install 'advisor[cluster]'`), imported only here.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import Error
from advisor.kb import lease, store
from advisor.kb.open import writing
from advisor.measuring.grid.isolation import train_in_child
from advisor.measuring.grid.local import GridRun, new_order_seed, run_order
from advisor.measuring.grid.runner import CellOutcome, CellResult, built_fields, cell_run
from advisor.measuring.machine.hardware import describe, pid_alive
from advisor.measuring.recipe.config import GridCell
from advisor.measuring.training.progress import ForwardingReporter, Reporter, replay
from advisor.rules import Rules

TASK_RETRIES = 3  # tries after a node or worker dies, under the same claim
POLL_S = 0.25  # how often the driver looks at finished tasks and progress
MACHINE_KEYS = ("hardware", "device", "host_memory_gb", "accelerator_memory_gb", "software")


class ClusterError(Error):
    """The cluster cannot be used as asked (Ray missing, no cluster at the address): one sentence."""


def import_ray():
    """Ray, or a ClusterError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ClusterError(
            "--executor ray needs Ray: pip install 'advisor[cluster]' (or pip install 'ray[default]')."
        ) from e
    return ray


def connect(address: str | None):
    """Join the cluster at `address` ('auto': the one this host belongs to), or start one on this machine."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    quiet = dict(log_to_driver=False, logging_level=logging.ERROR)
    if address and address != "auto":
        _reachable(address)
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(include_dashboard=False, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"at {address}" if address else "on this machine"
        raise ClusterError(f"cannot reach a Ray cluster {where}: {_first_line(e)}") from e
    return ray


def _reachable(address: str, timeout: float = 3.0) -> None:
    """Fail in seconds, not minutes, when nothing listens at HOST:PORT (Ray retries for a long time)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address {address!r} is not HOST:PORT (or auto): e.g. 10.0.0.5:6379.")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(
            f"nothing answers at {address} ({e.strerror or e}): start the head with `ray start --head` there, "
            "or pass its address as `ray start` printed it."
        ) from e


@dataclass
class Slots:
    """What one cell asks of a node, and how many cells the cluster can run at once now."""

    device: str  # cpu | cuda
    num_cpus: float
    num_gpus: float

    @classmethod
    def of(cls, ray, device: str, cpus: int | None) -> Slots:
        """A GPU per cell where the cluster has GPUs (unless --device cpu), else a node's CPUs."""
        nodes = _alive_nodes(ray)
        gpus = sum(n.get("GPU", 0) for n in nodes)
        if device == "cuda" and not gpus:
            raise ClusterError("--device cuda, but the Ray cluster has no GPU: use --device cpu or auto.")
        if gpus and device != "cpu":
            return cls("cuda", float(cpus or 1), 1.0)
        smallest = min((n.get("CPU", 0) for n in nodes if n.get("CPU", 0) >= 1), default=1)
        return cls("cpu", float(cpus or smallest), 0.0)

    def capacity(self, ray) -> int:
        """Cells that fit on the cluster's alive nodes now (at least one: Ray queues the rest)."""
        fits = 0
        for node in _alive_nodes(ray):
            by_cpu = int(node.get("CPU", 0) // self.num_cpus) if self.num_cpus else 1 << 30
            by_gpu = int(node.get("GPU", 0) // self.num_gpus) if self.num_gpus else 1 << 30
            fits += min(by_cpu, by_gpu)
        return max(fits, 1)


def _alive_nodes(ray) -> list[dict]:
    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def run_cell_task(cell: GridCell, rules: Rules, progress, key: int) -> dict:
    """The body of a cell's Ray task: train it where it landed and hand back what the driver writes; its
    progress goes to the grid's queue, tagged with `key` (its run id)."""

    def send(message: tuple) -> None:
        with contextlib.suppress(Exception):  # progress is best effort: the driver may be gone
            progress.put_nowait((key, message))

    send(("placed", ray_context().get_node_id(), _host()))
    reporter = ForwardingReporter(send)
    outcome, built = train_in_child(cell, reporter, rules)
    reporter.flush()
    return {"machine": describe(cell.config.device), "built": built or {}, "outcome": outcome}


def ray_context():
    import ray

    return ray.get_runtime_context()


def _host() -> str:
    return socket.gethostname()


@dataclass
class _Flight:
    """A cell the driver has claimed and handed to Ray, and the nodes its tries started on."""

    index: int
    cell: GridCell  # its configuration resolved, on the cluster's device
    run_id: int
    run: dict
    nodes: list[str] = field(default_factory=list)


def run_grid_ray(
    cells: list[GridCell],
    db_path: Path,
    rules: Rules,
    reporter: Reporter | None = None,
    order_seed: int | None = None,
    address: str | None = None,
    cpus: int | None = None,
) -> GridRun:
    """Every cell as a Ray task, claimed and recorded by this process into the KB at db_path; the results
    come back in planned order. Ctrl-C cancels the cluster's tasks, records their runs crashed and re-raises."""
    ray, reporter = connect(address), reporter or Reporter()
    order_seed = new_order_seed() if order_seed is None else order_seed
    order = run_order(cells, order_seed)
    slots = Slots.of(ray, _wanted_device(cells), cpus)
    task = ray.remote(max_retries=TASK_RETRIES)(run_cell_task)
    probe = ray.remote(describe).options(num_cpus=0, num_gpus=slots.num_gpus)  # a node's machine
    machine = ray.get(probe.remote(slots.device))
    results: list[CellResult | None] = [None] * len(cells)
    todo = deque((position, index) for position, index in enumerate(order))
    flights: dict = {}
    progress = _progress_queue()
    with writing(db_path) as conn, lease.Heartbeat(db_path) as heartbeat:
        lease.mark_crashed(conn, pid_alive)
        reporter.grid_start(len(cells))
        try:
            while todo or flights:
                while todo and len(flights) < slots.capacity(ray):
                    position, index = todo.popleft()
                    where = {"seed": order_seed, "position": position, "cells": len(cells)}
                    flight = _claim(conn, cells[index], index, slots, machine, where)
                    if isinstance(flight, CellResult):
                        results[index] = flight
                        reporter.cell_end(flight)
                        continue
                    heartbeat.hold(flight.run_id)
                    resources = dict(num_cpus=slots.num_cpus, num_gpus=slots.num_gpus)
                    ref = task.options(**resources).remote(flight.cell, rules, progress, flight.run_id)
                    flights[ref] = flight
                _follow(ray, flights, progress, reporter, conn, heartbeat, results)
        except BaseException:
            _abandon(ray, flights, conn)
            raise
        finally:
            with contextlib.suppress(Exception):
                ray.kill(progress.actor)
    return GridRun(results, order_seed, order)


def _wanted_device(cells: list[GridCell]) -> str:
    devices = {c.config.device for c in cells}
    return "cpu" if devices == {"cpu"} else "cuda" if "cuda" in devices else "auto"


def _progress_queue():
    """The queue the cells' tasks send their progress to: an actor that takes no CPU, on the driver's own
    node, so that a worker node that dies does not take the grid's progress with it."""
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray_context().get_node_id(), soft=False)
    return Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})


def _claim(conn, cell: GridCell, index: int, slots: Slots, machine: dict, where: dict):
    """Claim a cell for the cluster: a _Flight, or the CellResult of a cell that is done or taken."""
    settings = cell.config.settings()
    resolved = cell.on(slots.device)
    run = cell_run(resolved, settings, machine)
    run["config"] = {**run["config"], "order": where}
    if not cell.model.reference:
        return CellResult(
            resolved.config, "skipped", error="a user's model runs with --executor local (its preflight)"
        )
    run_id, taken = lease.claim_run(conn, run, pid_alive)
    if run_id is None:
        return CellResult(resolved.config, "skipped", error=f"already {taken} in this KB for this hardware")
    return _Flight(index, resolved, run_id, run)


def _follow(ray, flights: dict, progress, reporter: Reporter, conn, heartbeat, results: list) -> None:
    """Wait a moment for tasks to end; replay the running cells' progress; record the ones that ended."""
    done, _ = ray.wait(list(flights), num_returns=len(flights), timeout=POLL_S)
    _drain(progress, reporter, {f.run_id: f for f in flights.values()})
    for ref in done:
        flight = flights.pop(ref)
        result = _record(ray, ref, flight, conn)
        heartbeat.let_go(flight.run_id)
        results[flight.index] = result
        reporter.cell_end(result, flight.run_id)


def _drain(progress, reporter: Reporter, by_run: dict) -> None:
    """Replay the progress the cells' tasks sent; note the node each try started on."""
    try:
        messages = progress.get_nowait_batch(progress.qsize())
    except Exception:  # a queue whose actor died takes no more progress
        return
    for key, message in messages:
        if message[0] == "placed" and key in by_run:
            by_run[key].nodes.append(message[1])
            reporter.cell_placed(f"{message[2]} (node {message[1][:8]})", key)
        else:
            replay(message, reporter, key)


def _record(ray, ref, flight: _Flight, conn) -> CellResult:
    """Write what a finished task handed back (or why it has nothing) into the claimed run."""
    try:
        out = ray.get(ref)
    except ray.exceptions.OutOfMemoryError as e:
        return _ended(
            conn, flight, "oom", f"out of memory: Ray's memory monitor killed the cell ({_first_line(e)})"
        )
    except ray.exceptions.RayTaskError as e:  # the task's own code raised (not retried): a bug, said
        return _ended(conn, flight, "failed", f"the cell's Ray task raised: {_first_line(e)}")
    except ray.exceptions.RayError as e:  # its worker or node died on every try
        tries = 1 + TASK_RETRIES
        why = f"the cell's Ray worker died on each of {tries} tries ({type(e).__name__}: {_first_line(e)})"
        return _ended(conn, flight, "crashed", why)
    outcome: CellOutcome = out["outcome"]
    fields = {k: out["machine"][k] for k in MACHINE_KEYS if out["machine"].get(k) != flight.run.get(k)}
    config = {**flight.run["config"], "ray": {"nodes": flight.nodes, "tries": max(len(flight.nodes), 1)}}
    if outcome.stderr:  # what the cell's process wrote, kept with its run as on one machine
        config["stderr"] = outcome.stderr
    fields |= built_fields(config, out["built"]) if out["built"] else {"config": config}
    store.update_run(conn, flight.run_id, **fields)
    for row in outcome.epochs:
        store.add_epoch(conn, flight.run_id, row)
    store.finish_run(conn, flight.run_id, outcome.status, outcome.error, outcome.metrics)
    return CellResult.of(flight.cell.config, flight.run_id, outcome)


def _ended(conn, flight: _Flight, status: str, why: str) -> CellResult:
    store.finish_run(conn, flight.run_id, status, why, [])
    return CellResult(flight.cell.config, status, flight.run_id, error=why)


def _abandon(ray, flights: dict, conn) -> None:
    """Ctrl-C or an error in the driver: cancel the cluster's tasks and record their runs crashed."""
    for ref, flight in flights.items():
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)
        with contextlib.suppress(Exception):
            store.finish_run(conn, flight.run_id, "crashed", "interrupted: the driver stopped the grid", [])


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]
