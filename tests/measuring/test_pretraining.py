"""LoRA against full fine-tuning, measured: `advisor pretrain` makes a base of a reference model, `advisor
measure --strategy lora` trains adapters on it (only they change), and what cannot work is refused first."""

import json

import pytest

from tests.conftest import RULES


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny llama pretrained for a few updates (the recipe's other settings as shipped)."""
    from advisor import api

    out = tmp_path_factory.mktemp("bases") / "llama-tiny"
    record = api.pretrain("llama", preset="tiny", out=out, steps=12)
    return out, record


def test_a_base_is_a_model_folder_with_its_recipe_and_a_falling_loss(base):
    out, record = base
    assert {"config.json", "model.safetensors", "advisor-base.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "advisor-base.json").read_text())
    assert saved["recipe"] == {**RULES.protocol["pretraining"], "steps": 12}
    first, last = saved["curve"][0], saved["curve"][-1]
    assert (first["step"], last["step"]) == (0, 12)
    assert last["heldout_loss"] < first["heldout_loss"] and last["task_loss"] < first["task_loss"]
    assert saved["family"] == "decoder" and record["path"] == str(out)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no partial folder left


def test_the_pretraining_corpus_holds_only_its_genres():
    from advisor.measuring.data.corpus import GENRES, _generated

    held = set(_generated(500, 20011, genres=12)["label"])
    assert held <= set(range(12)) and len(held) == 12
    assert set(_generated(500, 20011)["label"]) == set(range(len(GENRES)))  # the grid's corpus: all of them
    assert _generated(50, 7) == _generated(50, 7, genres=None)  # the grid's data is as it was
    with pytest.raises(ValueError, match="genres must be 1 to 23"):
        _generated(5, 7, genres=24)


def test_lora_trains_its_adapters_on_a_frozen_base_and_full_fine_tuning_every_weight(base):
    """Both strategies from the same base, one tiny epoch each: LoRA's base weights end as they started, its
    adapters moved; its gradients and optimizer state are the adapters' alone, a fraction of full's."""
    from dataclasses import replace

    import torch
    from safetensors.torch import load_file

    from advisor.measuring.recipe.config import RunConfig
    from advisor.measuring.training.trainer import Trainer
    from tests.conftest import one_cell

    out, _ = base
    saved = load_file(out / "model.safetensors")
    cfg = RunConfig(model=str(out), preset="tiny", optimizer="adamw", epochs=1, device="cpu").resolved()
    runs = {}
    for strategy in ("standard", "lora"):
        trainer = Trainer(one_cell(replace(cfg, strategy=strategy)), RULES)
        trainer.train()
        runs[strategy] = trainer
    lora = runs["lora"].model
    base_now = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in lora.state_dict().items()
    }
    assert len(set(base_now) & set(saved)) == len(saved)  # every base weight found
    assert all(torch.equal(base_now[k], v) for k, v in saved.items() if k in base_now)  # frozen
    assert any(not torch.equal(v, 0 * v) for k, v in lora.state_dict().items() if "lora_B" in k)  # trained
    full = runs["standard"].model.state_dict()
    assert any(not torch.equal(full[k], v) for k, v in saved.items() if k in full)
    t_full, t_lora = runs["standard"].tensors, runs["lora"].tensors
    assert runs["lora"].tensors_error is None  # torch's tracker measures a model with frozen weights
    assert t_lora["tensor_optimizer_gb"] < t_full["tensor_optimizer_gb"]  # AdamW's two buffers, adapters only
    trains = {s: sum(p.numel() for p in t.model.parameters() if p.requires_grad) for s, t in runs.items()}
    assert trains["lora"] < trains["standard"] == sum(p.numel() for p in runs["standard"].model.parameters())
    assert t_lora["tensor_parameters_gb"] > t_full["tensor_parameters_gb"]  # the base, and its adapters


def test_only_a_lora_cell_records_the_adapters_settings_so_other_cells_keep_their_keys():
    from advisor.measuring.recipe.config import RunConfig

    plain = RunConfig(model="llama", preset="tiny", optimizer="adamw")
    assert "lora_r" not in plain.as_dict() and "lora_alpha" not in plain.as_dict()
    lora = RunConfig(model="llama", preset="tiny", optimizer="adamw", strategy="lora")
    assert (lora.as_dict()["lora_r"], lora.as_dict()["lora_alpha"]) == (16, 32)


def test_measure_fine_tunes_a_base_lora_against_full_into_one_evidence_group(base, invoke, tmp_path):
    out, _ = base
    db = tmp_path / "ft.sqlite"
    args = ("--model", out, "--preset", "tiny", "--optimizer", "adamw", "--strategy", "standard")
    result = invoke(
        "measure", *args, "--strategy", "lora", "--epochs", "1", "--target-loss", "9.5", "--db", db, "--json"
    )
    assert result.exit_code == 0, result.output
    import sqlite3

    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT strategy, status, pretrained, grp, error, config FROM runs").fetchall()
    assert sorted(r[0] for r in rows) == ["lora", "standard"] and {r[1] for r in rows} == {"ok"}
    assert {r[2] for r in rows} == {1} and len({r[3] for r in rows}) == 1  # pretrained; one group
    assert all(r[4] is None or "MemTracker" not in r[4] for r in rows)
    configs = {r[0]: json.loads(r[5]) for r in rows}
    assert (
        configs["lora"]["base"]["recipe"]["steps"] == 12 and configs["standard"]["base"]["model"] == "llama"
    )
    targets = conn.execute("SELECT value FROM metrics WHERE name = 'target_loss'").fetchall()
    assert [t[0] for t in targets] == [9.5, 9.5]  # --target-loss: time to target's loss, as asked


def test_a_plan_prices_a_lora_cell_from_an_update_of_the_adapted_model(base, invoke, tmp_path):
    """--plan on a fresh machine times a LoRA update whole, on the base with peft's adapters (their step is a
    few parameters'), not as a full fine-tuning step; a grid of LoRA alone still calibrates."""
    out, _ = base
    args = ("--model", out, "--preset", "tiny", "--optimizer", "adamw", "--db", tmp_path / "new.sqlite")
    for strategies in (("--strategy", "standard", "--strategy", "lora"), ("--strategy", "lora")):
        result = invoke("measure", *args, *strategies, "--plan", "--json")
        assert result.exit_code == 0, result.output
        plan = json.loads(result.stdout)
        (cal,) = plan["calibrations"]
        assert set(cal["whole_updates"]) == {"adamw+lora"} and cal["whole_updates"]["adamw+lora"] > 0
        cells = {c["strategy"]: c for c in plan["cells"]}
        assert cells["lora"]["step_s"] == pytest.approx(cal["whole_updates"]["adamw+lora"])
        assert plan["unknown_cost"] == 0


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_target_loss_that_is_no_loss_is_refused(value, invoke, tmp_path):
    result = invoke(
        "measure", "--model", "vit", "--preset", "tiny", "--target-loss", value, "--db", tmp_path / "x"
    )
    assert result.exit_code == 2 and "--target-loss" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda a: a.measure("vit", preset="tiny", lora_r=0), "lora_r must be a whole number of at least 1"),
        (lambda a: a.measure("vit", preset="tiny", target_loss=-2.0), "target_loss must be a held-out loss"),
        (lambda a: a.pretrain("llama", preset="tiny", steps=0), "steps must be a whole number of at least 1"),
        (lambda a: a.pretrain("llama", preset="huge"), "unknown preset 'huge'"),
    ],
)
def test_the_python_api_refuses_the_values_the_command_line_does(call, says):
    import advisor

    with pytest.raises(advisor.InputError, match=says):
        call(advisor)


def test_a_base_record_that_is_not_plain_data_is_left_out(base, tmp_path):
    """advisor-base.json comes from a folder: only short plain values reach a run's config."""
    import shutil

    from advisor.measuring.model.builder import base_record
    from tests.conftest import ref

    out, _ = base
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert base_record(ref(copy))["recipe"]["genres"] == 12
    record = json.loads((copy / "advisor-base.json").read_text())
    (copy / "advisor-base.json").write_text(json.dumps({**record, "model": "<script>x</script>"}))
    assert base_record(ref(copy)) is None
    (copy / "advisor-base.json").write_text("{not json")
    assert base_record(ref(copy)) is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--model", "llama"), "fine-tunes pretrained weights, and llama is built from its config"),
        (("--model", "CONFIG_ONLY"), "has no weights in its folder"),
    ],
)
def test_lora_on_a_model_without_weights_is_refused_before_anything_runs(args, says, invoke, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    args = tuple(str(folder) if a == "CONFIG_ONLY" else a for a in args)
    result = invoke("measure", *args, "--preset", "tiny", "--strategy", "lora", "--db", tmp_path / "x.sqlite")
    assert result.exit_code == 2 and says in result.output and "advisor pretrain" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.sqlite").exists()


def test_pretrain_refuses_what_it_cannot_or_must_not_do(invoke, tmp_path, base):
    out, _ = base
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [  # a bad value is a usage error (2); a model that cannot be found is exit 1, as for measure
        (("--model", out), 2, "is your own: pass its folder to advisor measure --model"),
        (("--model", "llama", "--out", mine), 2, "holds files advisor pretrain did not write"),
        (("--model", "llama", "--out", out), 2, "a base is already at"),
        (("--model", "llama", "--out", a_file), 2, "is not a folder"),
        (("--model", "llama", "--steps", "0"), 2, "0 is not in the range x>=1"),
        (("--model", "gpt5"), 1, "cannot resolve model 'gpt5'"),
    ]
    for args, code, says in cases:
        result = invoke("pretrain", *args, "--preset", "tiny")
        assert result.exit_code == code, (args, result.output)
        assert says in result.output and "Traceback" not in result.output, (args, result.output)
    assert (mine / "notes.txt").read_text() == "keep me" and a_file.read_text() == "x"


def test_fit_asks_for_lora_as_an_adapter_not_as_a_strategy(invoke):
    result = invoke("fit", "--model", "llama-3.2-1b", "--gpu", "H100", "--strategy", "lora")
    assert result.exit_code == 2 and "--adapter lora --strategy standard" in result.output


def test_each_measured_strategy_is_a_configuration_of_advisor_fit():
    assert RULES.as_fit("standard") == ("full", "standard")
    assert RULES.as_fit("accumulation-equal-samples") == ("full", "accumulation")
    assert RULES.as_fit("lora") == ("lora", "standard")
    assert "lora" not in RULES.fit_strategies and "accumulation-equal-samples" not in RULES.fit_strategies
