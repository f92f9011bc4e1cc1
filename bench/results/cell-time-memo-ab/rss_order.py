import sys, tempfile, sqlite3
from dataclasses import replace
from pathlib import Path
sys.path.insert(0, "tests/measure"); sys.path.insert(0, "tests")
from advisor.measuring.grid import run_grid, run_order
from advisor.measuring.config import GridCell, RunConfig
from advisor.measuring.runner import plan_grid
from advisor.model_ref import resolve_model
from advisor.rules import load_rules
RULES = load_rules()
def main():
    base = RunConfig(model="llama", preset="small", epochs=1, steps_per_epoch=4)
    cells = plan_grid([resolve_model("llama", RULES)], RULES, ["sgd", "adam"], ["standard"], 1, base)
    seeds = {tuple(run_order(cells, s)): s for s in range(16)}
    for rep in range(2):
        for order, seed in seeds.items():
            db = Path(tempfile.mkdtemp()) / "kb.sqlite"
            run_grid(cells, db, RULES, order_seed=seed)
            rows = sqlite3.connect(db).execute("SELECT r.optimizer || ' ' || m.name, round(m.value*1000,1) FROM runs r JOIN metrics m ON m.run_id = r.id WHERE m.name IN ('rss_delta_gb','rss_baseline_gb','peak_rss_gb')").fetchall()
            print(order, sorted(rows), flush=True)
if __name__ == "__main__":
    main()
