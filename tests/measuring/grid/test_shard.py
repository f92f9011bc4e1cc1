"""--shard K/N: N shards cover the grid exactly once, the same on every host; their KBs merged hold the cells
a one-machine run holds; --shard auto reads a Slurm job array; bad shards are refused with a sentence."""

import json

import pytest

from advisor.measuring.grid.runner import plan_grid
from advisor.measuring.grid.shard import Shard, ShardError, from_slurm, parse
from advisor.measuring.recipe.config import RunConfig

from ...conftest import RULES, TINY_VIT, ref
from ...processes import runs


def test_shards_cover_the_grid_exactly_once_and_evenly():
    configs = plan_grid([ref("vit"), ref("llama")], RULES, seeds=3, base=RunConfig(preset="tiny"))
    for n in (1, 2, 5, 7, len(configs) + 3):
        parts = [Shard(k, n).take(configs) for k in range(1, n + 1)]
        taken = [c for part in parts for c in part]
        assert sorted(map(repr, taken)) == sorted(map(repr, configs))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    again = plan_grid([ref("vit"), ref("llama")], RULES, seeds=3, base=RunConfig(preset="tiny"))
    assert Shard(2, 5).take(again) == Shard(2, 5).take(configs), "the split depends only on the cells"


def test_slurm_array_variables_name_the_shard():
    env = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_TASK_MIN": "0"}
    assert from_slurm(env) == Shard(4, 8)
    assert parse("auto", {**env, "SLURM_ARRAY_TASK_ID": "8", "SLURM_ARRAY_TASK_MIN": "1"}) == Shard(8, 8)
    with pytest.raises(ShardError, match="SLURM_ARRAY_TASK_ID is not set"):
        parse("auto", {})
    with pytest.raises(ShardError, match="contiguous"):
        from_slurm({**env, "SLURM_ARRAY_TASK_STEP": "2"})


@pytest.mark.parametrize("bad", ["0/4", "5/4", "1/0", "x", "2of4", "-1/3"])
def test_a_shard_that_does_not_exist_is_refused(bad):
    with pytest.raises(ShardError):
        parse(bad, {})


CELLS = ("--optimizer", "sgd", "--optimizer", "adam", "--strategy", "standard", "--strategy", "checkpointing")


def test_shards_merged_hold_the_cells_of_a_one_machine_run(measure_tiny, invoke, tmp_path):
    one = tmp_path / "one.sqlite"
    assert measure_tiny(one, *CELLS).exit_code == 0
    shards = [tmp_path / f"shard-{k}.sqlite" for k in (1, 2)]
    for k, db in enumerate(shards, 1):
        result = measure_tiny(db, *CELLS, "--shard", f"{k}/2", "--json")
        assert result.exit_code == 0, result.output
        out = json.loads(result.stdout)
        assert out["shard"] == f"{k}/2" and out["cells_planned"] == 4 and len(out["results"]) == 2
    merged = tmp_path / "all.sqlite"
    assert invoke("kb", "merge", *shards, "--db", merged).exit_code == 0

    def cells(db):
        return sorted((r["cell_key"], r["seed"], r["status"]) for r in runs(db))

    assert cells(merged) == cells(one) and len(cells(one)) == 4


def test_shard_auto_outside_slurm_and_with_tune_lr_are_usage_errors(measure_tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    result = measure_tiny(tmp_path / "x.sqlite", "--shard", "auto")
    assert result.exit_code == 2 and "SLURM_ARRAY_TASK_ID is not set" in result.output
    result = measure_tiny(tmp_path / "x.sqlite", "--shard", "3/2")
    assert result.exit_code == 2 and "does not exist" in result.output
    result = measure_tiny(tmp_path / "x.sqlite", "--shard", "1/2", "--tune-lr", "--protocol", "fair")
    assert result.exit_code == 2 and "tune once" in result.output
    assert not (tmp_path / "x.sqlite").exists()


def test_a_shard_without_db_writes_its_own_kb_beside_the_users(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("ADVISOR_DB")
    cells = ("--optimizer", "adam", "--strategy", "standard", "--shard", "1/1", "--json")
    result = invoke("measure", *TINY_VIT, *cells)
    assert result.exit_code == 0, result.output
    path = json.loads(result.stdout)["db"]
    assert path.endswith("shards/shard-1-of-1.sqlite") and str(tmp_path / "xdg-data") in path
