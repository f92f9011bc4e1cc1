"""rules/ as data: families and aliases, model types, metric definitions, and that an edit needs no code."""

import shutil
import sqlite3

import pytest

from advisor.answers.evidence import GroupEvidence
from advisor.answers.recommendation import recommend
from advisor.errors import RulesError
from advisor.kb.reader import evidence_groups
from advisor.places import shipped_rules_dir
from advisor.rules import load_rules


def test_families_and_aliases():
    rules = load_rules()
    for alias, family in [
        ("vision", "vision"),
        ("vit", "vision"),
        ("encoder", "encoder"),
        ("modernbert", "encoder"),
        ("decoder", "decoder"),
        ("llama", "decoder"),
        ("vlm", "vlm"),
        ("nanovlm", "vlm"),
        ("ViT", "vision"),
    ]:
        assert rules.family(alias).name == family
    with pytest.raises(KeyError):
        rules.family("rnn")


def test_model_types_cover_common_models():
    rules = load_rules()
    all_types = [t for f in rules.families.values() for t in f.model_types]
    assert len(all_types) >= 25 and len(set(all_types)) == len(all_types)
    for model_type, family in [
        ("bert", "encoder"),
        ("gpt2", "decoder"),
        ("qwen2", "decoder"),
        ("idefics3", "vlm"),
        ("smolvlm", "vlm"),
        ("deit", "vision"),
        ("modernbert", "encoder"),
    ]:
        assert rules.family_of_model_type(model_type).name == family
    assert rules.family_of_model_type("wav2vec2") is None


def test_metrics_read_defined_measures():
    rules = load_rules()
    assert set(rules.flowchart["metrics"]) == {"loss", "time", "memory", "utilization"}
    assert rules.metric("utilization").direction == "max"
    # a GPU's allocator peak, else the peak of live tensor bytes (never RSS first: it holds the interpreter)
    assert rules.metric("memory").measures[:4] == (
        "gpu_mem_peak_gb",
        "tensor_peak_gb",
        "host_ram_gb",
        "host_ram",
    )
    assert rules.metric("loss").measures == ("eval_loss", "loss")  # held-out first, where measured
    assert rules.metric("utilization").measures[0] == "mfu"  # useful work, not busy cores


def test_divergence_threshold_lives_in_rules(tmp_path, kb_path):
    """Loosening the threshold in the rules file lets CGD on Llama back in: no code change."""
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (
        (custom / "flowchart.toml")
        .read_text()
        .replace("max_ratio_to_best = 3.0", "max_ratio_to_best = 100.0")
    )
    (custom / "flowchart.toml").write_text(text)
    conn = sqlite3.connect(kb_path)
    strict = recommend(conn, "decoder", "memory", load_rules())
    loose = recommend(conn, "decoder", "memory", load_rules(str(custom)))
    assert strict.recommendation.optimizer != "cgd"
    assert (loose.recommendation.optimizer, loose.recommendation.strategy) == ("cgd", "standard")


def test_adding_a_metric_is_a_rules_edit(tmp_path, kb_path):
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    with open(custom / "metrics.toml", "a") as f:
        f.write(
            '\n[metrics.final_loss]\ndirection = "min"\nunit = ""\nlabel = "final loss"\nmeasures = ["loss"]\n'
        )
    rules = load_rules(str(custom))
    answer = recommend(sqlite3.connect(kb_path), "vision", "final_loss", rules)
    assert answer.recommendation.optimizer == "adagrad"


def test_bad_rules_are_reported(tmp_path):
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    with open(custom / "metrics.toml", "a") as f:
        f.write('\n[metrics.bogus]\ndirection = "min"\nunit = ""\nlabel = "x"\nmeasures = ["nope"]\n')
    with pytest.raises(RulesError, match="undefined measures: nope"):
        load_rules(str(custom))


def test_memory_measure_converts_percent_of_host(kb_path):
    conn = sqlite3.connect(kb_path)
    rules = load_rules()
    (group,) = evidence_groups(conn, family="encoder", source="paper")
    ev = GroupEvidence(conn, group, rules)
    assert ev.measure("memory") == "host_ram"
    assert ev.value(ev.cells[("adam", "standard")], "memory") == pytest.approx(47.7184)
    assert ev.stat(ev.cells[("adam", "standard")], "memory").stated == "18.64 percent of 256 GB"


def test_caveats_match_context(invoke):
    import json

    enc = json.loads(invoke("recommend", "--arch", "encoder", "--json").output)
    assert any("ModernBERT" in c for c in enc["caveats"])
    vit = json.loads(invoke("recommend", "--arch", "vision", "--json").output)
    assert not any("ModernBERT" in c for c in vit["caveats"])
    assert any(
        "Checkpointing cannot regularize" in c for c in vit["caveats"]
    )  # the pick is adagrad+checkpointing


@pytest.mark.parametrize(
    "arms",
    [
        'arms = { "accumulation-equal-samples" = "nowhere" }',
        'arms = { "made-up" = "accumulation" }',
        'arms = { "accumulation" = "accumulation" }',
        'arms = "accumulation"',
    ],
)
def test_a_bad_arm_is_one_sentence(tmp_path, arms):
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (custom / "families.toml").read_text()
    assert 'arms = { "accumulation-equal-samples" = "accumulation" }' in text
    (custom / "families.toml").write_text(
        text.replace('arms = { "accumulation-equal-samples" = "accumulation" }', arms)
    )
    with pytest.raises(RulesError, match="families.toml: arms"):
        load_rules(str(custom))


def test_fit_refuses_a_measured_arm_and_names_its_strategy(invoke):
    result = invoke("fit", "--model", "llama", "--memory", "80", "--strategy", "accumulation-equal-samples")
    assert result.exit_code == 2 and "ask for --strategy accumulation" in " ".join(result.output.split())
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("file", "line", "bad"),
    [
        ("flowchart.toml", "match_scale_ratio = 2", "match_scale_ratio = 0.5"),
        ("flowchart.toml", "match_scale_ratio = 2", 'match_scale_ratio = "two"'),
        ("flowchart.toml", "scale_warning_ratio = 3", "scale_warning_ratio = true"),
        ("protocol.toml", "extend = 3", "extend = -1"),
        ("protocol.toml", "extend = 3", "extend = 1.5"),
    ],
)
def test_a_bad_evidence_or_tuning_number_is_one_sentence(tmp_path, file, line, bad):
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (custom / file).read_text()
    assert f"\n{line}\n" in text
    (custom / file).write_text(text.replace(f"\n{line}\n", f"\n{bad}\n"))
    with pytest.raises(RulesError, match=f"rules/{file}: .* must be"):
        load_rules(str(custom))
