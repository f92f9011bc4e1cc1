"""Rules the user extends without editing the package: a TOML file in their rules folder, beside their KB."""

import json

from advisor.places import user_rules_dir
from advisor.rules import extended, load_rules


def test_a_users_model_type_joins_a_family(invoke, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "my_decoder"}))
    refused = invoke("recommend", "--model", folder)
    assert refused.exit_code == 1 and str(user_rules_dir() / "families.toml") in " ".join(
        refused.output.split()
    )
    user_rules_dir().mkdir(parents=True)
    (user_rules_dir() / "families.toml").write_text('[families.decoder]\nmodel_types = ["my_decoder"]\n')
    answered = invoke("recommend", "--model", folder, "--json")
    assert answered.exit_code == 0, answered.output
    assert json.loads(answered.output)["evidence"]["family"] == "decoder"
    rules = load_rules()
    assert "llama" in rules.families["decoder"].model_types  # extended, not replaced


def test_extending_merges_tables_extends_lists_and_replaces_values():
    base = {"a": {"x": 1, "ys": [1, 2]}, "b": "old"}
    assert extended(base, {"a": {"ys": [2, 3], "z": 0}, "b": "new"}) == {
        "a": {"x": 1, "ys": [1, 2, 3], "z": 0},
        "b": "new",
    }
    assert base == {"a": {"x": 1, "ys": [1, 2]}, "b": "old"}


def test_a_broken_user_rules_file_is_one_sentence(invoke):
    user_rules_dir().mkdir(parents=True)
    (user_rules_dir() / "caveats.toml").write_text("[[caveats]\n")
    result = invoke("recommend", "--arch", "vit")
    assert result.exit_code == 1 and "is not valid TOML" in result.output and "Traceback" not in result.output
