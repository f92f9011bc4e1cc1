"""A small Llama's SGD and Adam cells in both orders, twice: each cell's RSS growth by its place in the grid.

    python bench/results/cell-time-memo-ab/rss_order.py

Prints, per order and round, each run's peak RSS, baseline and growth (MB), as the README's table quotes.
"""

import sqlite3
import tempfile
from pathlib import Path

from advisor.measuring.grid.local import run_grid, run_order
from advisor.measuring.grid.runner import plan_grid
from advisor.measuring.recipe.config import RunConfig
from advisor.model_ref import resolve_model
from advisor.rules import load_rules

FIGURES = "('rss_delta_gb', 'rss_baseline_gb', 'peak_rss_gb')"


def main() -> None:
    rules = load_rules()
    base = RunConfig(model="llama", preset="small", epochs=1, steps_per_epoch=4)
    cells = plan_grid([resolve_model("llama", rules)], rules, ["sgd", "adam"], ["standard"], 1, base)
    seeds = {tuple(run_order(cells, s)): s for s in range(16)}  # an order seed for each of the two orders
    for _ in range(2):
        for order, seed in seeds.items():
            db = Path(tempfile.mkdtemp()) / "kb.sqlite"
            run_grid(cells, db, rules, order_seed=seed)
            rows = sqlite3.connect(db).execute(
                "SELECT r.optimizer || ' ' || m.name, round(m.value * 1000, 1) FROM runs r "
                f"JOIN metrics m ON m.run_id = r.id WHERE m.name IN {FIGURES}"
            )
            print(order, sorted(rows), flush=True)


if __name__ == "__main__":
    main()
