"""Rules the user extends without editing the package: a TOML file in their rules folder, beside their KB."""

import json
import shutil

import pytest

from advisor.errors import RulesError
from advisor.places import shipped_rules_dir, user_rules_dir
from advisor.rules import load_rules
from advisor.rules_files import RULE_FILES, extended


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
    assert result.exit_code == 2 and "is not valid TOML" in result.output and "Traceback" not in result.output
    assert str(user_rules_dir() / "caveats.toml") in result.output


def test_a_users_file_holds_only_what_it_changes():
    """A user's file is checked as a part: it may leave out every key the shipped file has."""
    user_rules_dir().mkdir(parents=True)
    (user_rules_dir() / "flowchart.toml").write_text("[ranking]\ntie_tolerance = 0.002\n")
    ranking = load_rules().flowchart["ranking"]
    assert ranking["tie_tolerance"] == 0.002 and ranking["alpha"] == 0.05


def test_a_users_copy_of_a_whole_shipped_file_is_accepted():
    user_rules_dir().mkdir(parents=True)
    for name in ("flowchart", "caveats", "hardware"):
        shutil.copy(shipped_rules_dir() / f"{name}.toml", user_rules_dir())
    rules = load_rules()
    assert rules.caveats == load_rules(str(shipped_rules_dir())).caveats  # lists extended without repeats


def test_a_users_new_optimizer_and_accelerator_are_read():
    user_rules_dir().mkdir(parents=True)
    (user_rules_dir() / "optimizers.toml").write_text(
        '[optimizers.my_adam]\ntrainer = "adamw_torch"\nadamw = true\nbits = 32\nmenu = false\n'
    )
    (user_rules_dir() / "hardware.toml").write_text(
        '[accelerators.mine]\nname = "My card"\nmemory_gib = 12\ntflops = { fp16 = 30 }\nsource = "its box"\n'
    )
    rules = load_rules()
    assert rules.optimizer_info["my_adam"].adamw and rules.optimizers[-1] == "my_adam"
    assert rules.accelerators["mine"].memory_gib == 12


def test_a_problem_in_a_users_list_names_its_own_item_and_line():
    """The merged list holds the shipped items first: the sentence counts in the user's file, not in it."""
    user_rules_dir().mkdir(parents=True)
    path = user_rules_dir() / "flowchart.toml"
    path.write_text('# mine\n[ranking]\nprefer_optimizers = ["adam", "lion_8bit", "adamx"]\n')
    with pytest.raises(RulesError) as e:
        load_rules()
    assert str(e.value) == (
        f"{path}, line 3: ranking.prefer_optimizers[2] names 'adamx', not an optimizer of optimizers.toml; "
        "did you mean adam?"
    )


def test_a_bad_value_the_user_did_not_set_names_the_shipped_file(tmp_path):
    """A problem the shipped (or named) rules have is theirs, whatever the user's folder holds."""
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (custom / "fit.toml").read_text()
    (custom / "fit.toml").write_text(text.replace("headroom = 0.05", "headroom = -0.05"))
    with pytest.raises(RulesError, match=rf"^{custom / 'fit.toml'}, line \d+: fits.headroom must be"):
        load_rules(str(custom))


def test_the_parsed_rules_kept_between_runs_are_what_tomllib_gives_and_an_edit_is_read():
    """The rules' TOML, parsed once and kept in the data folder's cache (rules_files.toml_data), is keyed by
    the file's text: an edited file is read as it now is at the next load, and what is read back equals
    tomllib's parse, for the user's file, every shipped one and the models' index."""
    import tomllib

    from advisor.places import shipped_models_dir, user_dir
    from advisor.rules import _load_rules
    from advisor.rules_files import toml_data

    user_rules_dir().mkdir(parents=True)
    path = user_rules_dir() / "flowchart.toml"
    for tolerance in (0.002, 0.003):
        path.write_text(f"[ranking]\ntie_tolerance = {tolerance}\n")
        for _ in range(2):  # the first load parses and keeps, the second reads the kept parse
            _load_rules.cache_clear()  # as a new process loads them
            assert load_rules().flowchart["ranking"]["tie_tolerance"] == tolerance
    for file in [*sorted(shipped_rules_dir().glob("*.toml")), shipped_models_dir() / "index.toml"]:
        text = file.read_text()
        assert toml_data(file, text) == toml_data(file, text) == tomllib.loads(text), file
    assert len(list((user_dir() / "cache").glob("toml-*.json"))) >= len(RULE_FILES) + 1
