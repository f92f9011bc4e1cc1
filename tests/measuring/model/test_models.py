"""Models: presets build offline, and a local folder trains with its family from model_type."""

import json
import sqlite3

import pytest

from advisor.measuring.model.builder import build_model
from advisor.model_ref import resolve_model

from ...conftest import RULES, ref


@pytest.mark.parametrize(
    "model,family", [("vit", "vision"), ("modernbert", "encoder"), ("llama", "decoder"), ("nanovlm", "vlm")]
)
def test_presets_build(model, family):
    tiny, small = build_model(ref(model), "tiny", RULES), build_model(ref(model), "small", RULES)
    assert tiny.family.name == small.family.name == family
    assert 10_000 < tiny.n_params < small.n_params < 10_000_000
    assert not tiny.pretrained


def test_paper_preset_configs_are_the_papers_models():
    """The real sizes, checked on the configs (building 1B parameters here would take minutes)."""
    from advisor.measuring.model.families import family

    vit, _ = family("vision", RULES).reference_config("paper")
    assert (vit.hidden_size, vit.num_hidden_layers, vit.patch_size, vit.image_size) == (768, 12, 16, 224)
    llama, shape = family("decoder", RULES).reference_config("paper")
    assert (llama.hidden_size, llama.num_hidden_layers, llama.vocab_size, shape.seq_len) == (
        2048,
        16,
        128256,
        512,
    )
    bert, _ = family("encoder", RULES).reference_config("paper")
    assert (bert.hidden_size, bert.num_hidden_layers) == (768, 22)
    vlm, shape = family("vlm", RULES).reference_config("paper")
    assert vlm.vision_config.hidden_size == 768 and vlm.text_config.hidden_size == 576
    assert vlm.scale_factor == 2 and shape.image_tokens == 49


@pytest.mark.parametrize("with_weights", [False, True])
def test_local_folder_model_trains_and_records_weights(tmp_path, invoke, with_weights):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "my-llama"
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    if with_weights:
        LlamaForCausalLM(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    db = tmp_path / "m.sqlite"
    result = invoke(
        "measure",
        "--model",
        folder,
        "--optimizer",
        "sgd",
        "--strategy",
        "standard",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "2",
        "--db",
        db,
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["results"][0]["status"] == "ok"
    row = (
        sqlite3.connect(db)
        .execute("SELECT family, preset, pretrained, n_params, model, config FROM runs")
        .fetchone()
    )
    assert row[:3] == ("decoder", "custom", int(with_weights)) and row[3] > 0 and row[4] == str(folder)
    # its identity: the name given, its size, and its config's hash (never a reference model's name)
    assert json.loads(row[5])["model_config_hash"] == resolve_model(str(folder), RULES).config_hash


def test_a_config_without_architectures_builds(tmp_path, invoke):
    """DeiT maps to two classes (with and without a teacher); without `architectures` transformers cannot
    choose and raised a TypeError: the plain head is built."""
    folder = tmp_path / "deit"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "deit",
                "hidden_size": 32,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "intermediate_size": 64,
                "image_size": 32,
                "patch_size": 8,
            }
        )
    )
    result = invoke(
        "measure",
        "--model",
        folder,
        "--optimizer",
        "sgd",
        "--strategy",
        "standard",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--batch-size",
        "2",
        "--db",
        tmp_path / "m.sqlite",
        "--json",
    )
    assert json.loads(result.stdout)["results"][0]["status"] == "ok", result.output


def test_a_model_predicted_not_to_fit_is_not_built(tmp_path, invoke):
    """{"model_type": "qwen2"} is transformers' default 7B configuration: predicted, skipped, never built
    (under a 4 GiB cap, whatever this machine has: cells run in their own process, so the cap is an option,
    not a patch; a cap above what is available would not apply, and a busy machine can have under 16)."""
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    result = invoke(
        "measure",
        "--model",
        folder,
        "--preset",
        "tiny",
        "--optimizer",
        "sgd",
        "--strategy",
        "standard",
        "--epochs",
        "1",
        "--steps-per-epoch",
        "2",
        "--memory-cap",
        "4",
        "--db",
        tmp_path / "m.sqlite",
        "--json",
    )
    (cell,) = json.loads(result.stdout)["results"]
    assert cell["status"] == "skipped" and "predicted" in cell["error"] and "not built" in cell["error"]
    assert "> 3.6 GiB available under --memory" in cell["error"]  # 90 % of --memory-cap 4 (GiB)
