"""`advisor measure --plan`: each cell's predicted cost (runs of the same cell first, then runs of its model
shape, in every KB in sight, else the model shape timed here, else advisor fit's FLOPs), cells predicted not
to fit flagged and left out, the LPT makespan; nothing trained."""

import json

import pytest

from advisor.errors import InputError
from advisor.measuring.planning.plan import lpt_makespan, plan_cells
from advisor.measuring.recipe.config import RunConfig
from advisor.places import user_kb_path

from ...conftest import cells as grid_cells
from ...processes import query, runs

LLAMA_8B = "tests/fixtures/configs/Llama-3.1-8B"


def test_lpt_gives_the_longest_cell_first_to_the_least_loaded_worker():
    assert lpt_makespan([7, 6, 5, 4, 3, 2], 2) == 14  # optimum 13.5: within 4/3
    assert lpt_makespan([3, 3, 2, 2, 2], 2) == 7  # Graham's bad case: the optimum is 6
    assert lpt_makespan([5, 1, 1], 1) == 7
    assert lpt_makespan([5, 1, 1], 8) == 5
    assert lpt_makespan([], 4) == 0


def test_a_plan_trains_nothing_and_prices_measured_cells_from_their_runs(measure_tiny, tmp_path):
    db = tmp_path / "plan.sqlite"
    cells = ("--optimizer", "adam", "--strategy", "standard", "--strategy", "checkpointing")
    assert measure_tiny(db, "--optimizer", "adam", "--strategy", "standard").exit_code == 0
    measured = runs(db)[0]
    result = measure_tiny(db, *cells, "--plan", "--workers", "1", "--workers", "2", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert len(runs(db)) == 1, "--plan trains nothing"
    by = {c["strategy"]: c for c in plan["cells"]}
    assert by["standard"]["source"].startswith("measured") and measured["status"] == "ok"
    assert by["standard"]["done"] and plan["done"] == 1, "measure would skip it: no work left there"
    assert by["checkpointing"]["origin"] in ("runs", "calibrated") and by["checkpointing"]["predicted_s"] > 0
    assert not by["checkpointing"]["done"]
    assert (
        plan["makespan_s"]["1"]
        == plan["makespan_s"]["2"]
        == pytest.approx(by["checkpointing"]["predicted_s"])
    )
    assert plan["total_s"] == pytest.approx(by["checkpointing"]["predicted_s"])


def test_cells_predicted_not_to_fit_are_flagged_and_left_out(invoke, tmp_path):
    result = invoke(
        "measure",
        "--model",
        LLAMA_8B,
        "--plan",
        "--gpu",
        "T4",
        "--optimizer",
        "sgd",
        "--strategy",
        "standard",
        "--db",
        tmp_path / "p.sqlite",
    )
    assert result.exit_code == 0, result.output
    assert "✗" in result.output and "1 cells predicted not to fit" in result.output
    assert "0 cells to run" in result.output


@pytest.mark.parametrize(
    "args, hint",
    [
        (("--plan", "--gpu", "no-such-gpu"), "unknown accelerator"),
        (("--workers", "4"), "add --plan"),
        (("--gpu", "H100"), "add --plan"),
        (("--plan", "--workers", "0"), "--workers"),
        (("--ray-address", "auto"), "--executor ray only"),
        (("--cpus-per-cell", "2"), "--executor ray only"),
        (("--executor", "slurm"), "--executor"),
        (("--plan", "--seq-len", "64"), "takes images, not text"),
        (("--plan", "--device", "cuda"), "pass --gpu NAME"),
    ],
)
def test_bad_scaling_flags_are_usage_errors(measure_tiny, tmp_path, args, hint):
    result = measure_tiny(tmp_path / "x.sqlite", *args)
    assert result.exit_code == 2 and hint in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.sqlite").exists()


# A shape no KB holds (batch 3), under the fair protocol: one epoch of 8 updates evaluates 3 times (before
# training, at update 4 against the target, after the epoch).
FRESH = (
    "--model",
    "vit",
    "--preset",
    "tiny",
    "--protocol",
    "fair",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "8",
    "--batch-size",
    "3",
    *("--optimizer", "sgd", "--optimizer", "adam", "--optimizer", "cgd"),
    *("--strategy", "standard", "--strategy", "accumulation"),
)


def test_a_fresh_machine_prices_every_cell_from_its_shape_timed_here(invoke, tmp_path):
    db = tmp_path / "new.sqlite"
    result = invoke("measure", *FRESH, "--plan", "--json", "--db", db)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["unknown_cost"] == 0 and len(plan["cells"]) == 6
    assert not db.exists(), "a plan writes nothing: no advisor fit trace cached for a CPU cell that fits"
    (cal,) = plan["calibrations"]
    assert cal["batch_size"] == 3 and cal["device"] == "cpu" and cal["windows"]["accumulation"] == 4
    for cell in plan["cells"]:
        parts = cell["startup_parts"]
        assert cell["origin"] == "calibrated" and cell["from"] == "calibrated"
        assert cell["evaluations"] == 3 and cell["updates"] == 8
        assert parts["build"] == cal["build_s"] and parts["data"] == cal["data_s"]
        assert parts["evaluations"] == pytest.approx(3 * cal["eval_s"])
        assert cell["startup_s"] == pytest.approx(sum(parts.values())) and cell["startup_s"] > 0
        assert cell["predicted_s"] == pytest.approx(cell["startup_s"] + 8 * cell["step_s"])
        assert cell["fits"] and cell["memory_from"] == "calibration" and cell["memory_gb"] == cal["rss_gb"]
        passes = cal["windows"][cell["strategy"]] * cal["passes_s"][cell["strategy"]]
        if cell["optimizer"] in cal["optimizer_steps"]:  # the window's passes and the optimizer's step
            assert cell["step_s"] == pytest.approx(passes + cal["optimizer_steps"][cell["optimizer"]])
    searched = cal["line_searches"]["cgd"]
    assert searched["passes"] > 1, "the line search reruns the window: counted, not assumed"
    assert set(cal["optimizer_steps"]) == {"sgd", "adam"}
    assert plan["total_s"] == pytest.approx(sum(c["predicted_s"] for c in plan["cells"]))


def test_runs_in_the_users_kb_price_cells_when_db_points_elsewhere(measure_tiny, tmp_path):
    mine = user_kb_path()
    mine.parent.mkdir(parents=True, exist_ok=True)
    assert measure_tiny(mine, "--optimizer", "sgd", "--strategy", "standard").exit_code == 0
    other = tmp_path / "other.sqlite"
    same = measure_tiny(other, "--optimizer", "sgd", "--strategy", "standard", "--plan", "--json")
    (cell,) = json.loads(same.stdout)["cells"]
    assert cell["origin"] == "measured" and cell["kb"] == "your KB" and cell["from"] == "measured: yours"
    assert not cell["done"], "done counts the KB measure writes (--db), not yours"
    ((wall,),) = query(mine, "SELECT (julianday(finished_at) - julianday(started_at)) * 86400 FROM runs")
    assert cell["predicted_s"] == pytest.approx(wall)
    # another learning rate is another cell, of the same shape: its step and start-up from that run
    shape = measure_tiny(
        other, "--optimizer", "sgd", "--strategy", "standard", "--lr", "0.5", "--plan", "--json"
    )
    plan = json.loads(shape.stdout)
    (cell,) = plan["cells"]
    assert cell["origin"] == "runs" and cell["from"] == "runs: yours"
    ((trained, updates),) = query(mine, "SELECT sum(wall_s), sum(steps) FROM epochs")
    assert cell["step_s"] == pytest.approx(trained / updates) and cell["startup_from"] == "your KB"
    assert cell["startup_s"] == pytest.approx(max(0.0, wall - trained))
    assert cell["memory_from"] == "your KB" and plan["calibrations"] == []
    assert [kb["kb"] for kb in plan["kbs"]] == ["--db", "your KB", "shipped KB"]


def test_a_kb_that_cannot_be_read_is_said_and_the_others_price(measure_tiny, tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("not a knowledge base")
    result = measure_tiny(bad, "--optimizer", "sgd", "--strategy", "standard", "--plan")
    assert result.exit_code == 0, result.output
    assert "Not read, --db" in result.output
    plan = json.loads(
        measure_tiny(bad, "--optimizer", "sgd", "--strategy", "standard", "--plan", "--json").stdout
    )
    assert "not an SQLite file" in plan["kbs"][0]["problem"]
    assert plan["unknown_cost"] == 0 and plan["cells"][0]["predicted_s"] > 0


def test_a_shape_timing_times_this_machine_only(rules):
    cells = grid_cells(RunConfig(model="vit", preset="tiny"), rules=rules)
    with pytest.raises(InputError, match="calibration times this machine"):
        plan_cells(cells, rules, gpu="H100", workers=[1], fresh=True)


def test_a_makespan_on_more_workers_than_cells_is_that_of_one_worker_each():
    """--workers 99999999999 is an answer, not a MemoryError: the idle workers are never allocated."""
    from advisor.measuring.planning.plan import lpt_makespan

    costs = [5.0, 3.0, 2.0]
    assert lpt_makespan(costs, 99_999_999_999) == lpt_makespan(costs, 3) == 5.0
    assert lpt_makespan([], 10**12) == 0.0
