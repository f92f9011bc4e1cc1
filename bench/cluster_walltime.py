"""Wall time of one grid on this machine's local executor vs a two-node Ray cluster on the same machine.

    python bench/cluster_walltime.py [--preset tiny] [--model vit]

Both run the same cells into fresh KBs, local first; a two-node cluster of one CPU per node is made with
ray.cluster_utils.Cluster (loopback), so on a 2-core machine both use both cores: the local executor one
cell at a time with two threads, the cluster two cells at a time with one thread each. Both fork each cell
from a fork server that imported torch once (the cluster: one per Ray worker, advisor/measuring/grid/cluster.py)."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model", default="vit")
    args = parser.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from advisor.measuring.grid.cluster import run_grid_ray
    from advisor.measuring.grid.local import run_grid
    from advisor.measuring.grid.runner import plan_grid
    from advisor.measuring.recipe.config import RunConfig
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    rules = load_rules()
    configs = plan_grid([resolve_model(args.model, rules)], rules, base=RunConfig(preset=args.preset))
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        local = run_grid(configs, Path(tmp) / "local.sqlite", rules, order_seed=1)
        local_s = time.monotonic() - started
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        try:
            ray.init(address=cluster.address, log_to_driver=False)
            started = time.monotonic()
            remote = run_grid_ray(configs, Path(tmp) / "ray.sqlite", rules, order_seed=1)
            ray_s = time.monotonic() - started
        finally:
            ray.shutdown()
            cluster.shutdown()
    ok = [sum(r.status == "ok" for r in rs) for rs in (local, remote)]
    print(f"{len(configs)} cells of {args.model}/{args.preset}")
    print(f"local executor, one process at a time: {local_s:.1f} s ({ok[0]} ok)")
    print(f"two-node Ray cluster (1 CPU each):     {ray_s:.1f} s ({ok[1]} ok)")


if __name__ == "__main__":
    main()
