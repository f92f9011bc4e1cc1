"""The grid on a Ray cluster of two nodes on this machine (loopback only): every cell a task, the driver the
only writer; a node killed mid-grid still leaves exactly one run per cell, none running; a killed driver's
cells are recovered by the next grid."""

import json
import signal
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from advisor.measuring.grid.cluster import run_grid_ray
from advisor.measuring.recipe.config import RunConfig
from advisor.measuring.training.progress import Reporter

from ...conftest import RULES, grid
from ...processes import advisor, query, runs

# Long enough (hundreds of ms of steps after a cell's task starts) that a node killed as a cell starts on
# it dies mid-cell; the paper protocol, so that no tiny cell ends `untrained` by chance.
CELL = RunConfig(preset="tiny", epochs=2, steps_per_epoch=40, protocol="paper")


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node of one CPU each, as separate Ray nodes on this machine."""
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    made.add_node(num_cpus=1)
    made.wait_for_nodes()
    yield made
    ray.shutdown()
    made.shutdown()


@pytest.fixture
def connected(cluster):
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()


def cells(optimizers=("adam", "adamw"), strategies=("standard", "checkpointing")):
    return grid(["vit"], {"vit": list(optimizers)}, {"vit": list(strategies)}, [0], CELL)


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_a_two_node_grid_writes_one_ok_run_per_cell_from_the_driver(connected, tmp_path):
    db = tmp_path / "ray.sqlite"
    seen = Placed()
    results = run_grid_ray(cells(), db, RULES, seen, order_seed=7)
    assert [r.status for r in results] == ["ok"] * 4
    rows = runs(db)
    assert len({(r["cell_key"], r["seed"]) for r in rows}) == len(rows) == 4
    assert {r["status"] for r in rows} == {"ok"}
    assert len({n for r in rows for n in json.loads(r["config"])["ray"]["nodes"]}) == 2, (
        "both nodes ran cells"
    )
    assert query(db, "SELECT count(*) FROM epochs") == [(8,)]  # two epochs per cell, written by the driver
    assert all(json.loads(r["config"])["order"]["seed"] == 7 for r in rows)


class Placed(Reporter):
    """Records the node each try started on; `then` runs once when a try starts on `node`."""

    def __init__(self, node=None, then=None):
        self.node, self.then, self.placed = node, then, []

    def cell_placed(self, where, key=None):
        self.placed.append((key, where))
        if self.then and self.node and f"node {self.node[:8]}" in where:
            self.then()
            self.then = None


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_a_node_killed_mid_grid_loses_no_cell_and_duplicates_none(connected, tmp_path):
    extra = connected.add_node(num_cpus=1)
    connected.wait_for_nodes()
    db = tmp_path / "kill.sqlite"
    seen = Placed(extra.node_id, lambda: connected.remove_node(extra, allow_graceful=False))
    results = run_grid_ray(cells(), db, RULES, seen, order_seed=3)
    assert seen.then is None, "no cell started on the extra node"
    assert [r.status for r in results] == ["ok"] * 4
    rows = runs(db)
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}
    retried = [json.loads(r["config"])["ray"] for r in rows if json.loads(r["config"])["ray"]["tries"] > 1]
    assert retried and retried[0]["nodes"][0] == extra.node_id, "the killed node's cell ran again elsewhere"


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_a_killed_driver_leaves_cells_that_the_next_grid_recovers(connected, tmp_path):
    db = tmp_path / "driver.sqlite"
    args = ["measure", "--model", "vit", "--preset", "tiny", "--epochs", "2", "--steps-per-epoch", "40"]
    args += ["--protocol", "paper", "--optimizer", "adam", "--optimizer", "adamw", "--strategy", "standard"]
    args += ["--executor", "ray", "--ray-address", connected.address, "--db", db]
    driver = advisor(*args)
    deadline = time.time() + 120
    while time.time() < deadline and not (db.exists() and _count(db, "status = 'running'")):
        time.sleep(0.1)
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    assert _count(db, "status = 'running'") >= 1
    again = advisor(*args, "--json")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    rows = runs(db)
    assert not [r for r in rows if r["status"] == "running"]
    ok = [(r["cell_key"], r["seed"]) for r in rows if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 2, "exactly one ok run per cell"
    crashed = [r for r in rows if r["status"] == "crashed"]
    assert crashed and all("ended before the run did" in r["error"] for r in crashed)


def _count(db, where: str) -> int:
    try:
        return query(db, f"SELECT count(*) FROM runs WHERE {where}")[0][0]
    except Exception:  # the KB is being created
        return 0


def test_a_cell_asks_for_a_gpu_the_cluster_lacks(connected, tmp_path):
    from advisor.measuring.grid.cluster import ClusterError

    with pytest.raises(ClusterError, match="no GPU"):
        run_grid_ray(
            [c.with_config(device="cuda") for c in cells(["adam"], ["standard"])],
            tmp_path / "x.sqlite",
            RULES,
        )


@pytest.mark.parametrize(
    "address, said",
    [("127.0.0.1:1", "nothing answers at 127.0.0.1:1"), ("no-port", "is not HOST:PORT")],
)
def test_a_cluster_that_cannot_be_reached_is_said_in_seconds(measure_tiny, tmp_path, address, said):
    started = time.monotonic()
    result = measure_tiny(tmp_path / "x.sqlite", "--executor", "ray", "--ray-address", address)
    assert result.exit_code == 1 and said in result.output and "Traceback" not in result.output
    assert time.monotonic() - started < 30  # Ray alone retries for minutes


def test_without_ray_the_executor_says_how_to_install_it(measure_tiny, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    result = measure_tiny(tmp_path / "x.sqlite", "--executor", "ray")
    assert result.exit_code == 1 and "pip install 'advisor[cluster]'" in result.output


def test_a_model_of_ones_own_runs_with_the_local_executor(invoke, tmp_path):
    model = "tests/fixtures/configs/Qwen2-0.5B"
    result = invoke("measure", "--model", model, "--executor", "ray", "--db", tmp_path / "x.sqlite")
    assert result.exit_code == 2 and "runs with --executor local" in result.output
