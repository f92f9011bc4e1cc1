"""`advisor measure --plan`: each cell's predicted cost (measured evidence of the same cell first, else
advisor fit's FLOPs), cells predicted not to fit flagged and left out, the LPT makespan; nothing trained."""

import json

import pytest

from advisor.measuring.plan import lpt_makespan

from .processes import runs

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
    assert by["checkpointing"]["source"].startswith("fit") and by["checkpointing"]["predicted_s"] > 0
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
