"""rules/ as data: families and aliases, model types, metric definitions, and that an edit needs no code."""

import ast
import copy
import datetime
import shutil
import sqlite3
import time
import tomllib
from pathlib import Path

import pytest

from advisor import rules_schema
from advisor.answers.evidence import GroupEvidence
from advisor.answers.recommendation import recommend
from advisor.errors import RulesError
from advisor.kb.queries.groups import evidence_groups
from advisor.places import shipped_rules_dir
from advisor.rules import load_rules
from advisor.rules_files import read_rules_file
from advisor.rules_schema import SCHEMAS, Problem, check, line_of


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


def test_a_sources_own_verdict_lives_in_rules(tmp_path, kb_path):
    """Dropping the paper's verdict on CGD from the rules file lets CGD on Llama back in: no code change."""
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (custom / "flowchart.toml").read_text()
    start = text.index("declared = [")
    (custom / "flowchart.toml").write_text(text[:start] + text[text.index("]\n", start) + 2 :])
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
    with pytest.raises(RulesError, match=r"metrics\.bogus\.measures\[0\] names 'nope', not a measure"):
        load_rules(str(custom))


def test_memory_measure_converts_percent_of_host(kb_path):
    conn = sqlite3.connect(kb_path)
    rules = load_rules()
    (group,) = evidence_groups(conn, family="encoder", source="paper:2608.08961")
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
    with pytest.raises(RulesError, match=r"families\.toml, line \d+: arms"):
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
    with pytest.raises(RulesError, match=rf"rules/{file}, line \d+: .* must be"):
        load_rules(str(custom))


def test_every_shipped_rules_file_passes_its_schema_and_the_schema_knows_every_key():
    """check() refuses a key its schema lacks, so passing it is the proof that the schema covers the file;
    claims.toml too, which `advisor claims` reads apart."""
    for name, schema in SCHEMAS.items():
        check(tomllib.loads((shipped_rules_dir() / f"{name}.toml").read_text()), schema)
    assert set(SCHEMAS) == {p.stem for p in shipped_rules_dir().glob("*.toml")}


def _leaves(data, path=()):
    """Every path of a parsed file, tables, lists and values."""
    yield path
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        yield from _leaves(value, (*path, key))


def _replaced(data, path, value):
    if not path:
        return value
    out = copy.copy(data)
    out[path[0]] = _replaced(data[path[0]], path[1:], value)
    return out


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_any_value_anywhere_is_a_problem_or_fine_never_a_crash(name):
    """Every value of every shipped file replaced by each kind of TOML value: the checker says a Problem with
    the path it was given, or accepts it, and raises nothing else."""
    data = tomllib.loads((shipped_rules_dir() / f"{name}.toml").read_text())
    kinds = ({}, [], [{}], "", "x", True, -1, 0, 1.5, float("nan"), 16**5000, datetime.date(2024, 1, 1))
    problems = 0
    for path in list(_leaves(data))[1:]:
        for value in kinds:
            try:
                check(_replaced(data, path, value), SCHEMAS[name])
            except Problem as p:
                assert p.path[: len(path)] == path or path[: len(p.path)] == p.path, (path, p.path)
                problems += 1
    assert problems


def test_a_key_the_schema_does_not_know_is_named_with_its_line_and_the_nearest_key(tmp_path):
    custom = tmp_path / "rules"
    shutil.copytree(shipped_rules_dir(), custom)
    text = (custom / "flowchart.toml").read_text()
    (custom / "flowchart.toml").write_text(text.replace("tie_tolerance = 0.001", "tie_tolerence = 0.001"))
    line = text[: text.index("tie_tolerance = 0.001")].count("\n") + 1
    with pytest.raises(RulesError) as e:
        load_rules(str(custom))
    assert str(e.value) == (
        f"{custom / 'flowchart.toml'}, line {line}: ranking.tie_tolerence is not a key advisor knows; "
        "did you mean tie_tolerance?"
    )


def test_the_line_of_a_key_is_found_by_its_table():
    text = "\n".join(
        [
            "# a comment: x = 0",  # 1
            "x = 1",  # 2
            'families.toy = { inputs = ["text"] }',  # 3
            "[a]",  # 4
            "b = 2",  # 5
            "[[c]]",  # 6
            'id = "p"',  # 7
            "[[c]]",  # 8
            'id = "q"',  # 9
            "when = { f = 1 }",  # 10
            '[ d . "e.f" ]',  # 11
            "  g = 3",  # 12
            '"h i" = 4',  # 13
        ]
    )
    assert line_of(text, ("x",)) == 2
    assert line_of(text, ("families", "toy", "inputs", 0)) == 3
    assert line_of(text, ("a", "b")) == 5
    assert line_of(text, ("a", "nope")) == 4
    assert line_of(text, ("c", 1, "id")) == 9
    assert line_of(text, ("c", 1, "when", "f")) == 10
    assert line_of(text, ("d", "e.f", "g")) == 12
    assert line_of(text, ("d", "e.f", "h i")) == 13
    assert line_of(text, ("elsewhere",)) is None


def test_the_schema_is_standard_library_only_and_cheap():
    """It runs on every command: no validation library, and the shipped files checked in a few milliseconds."""
    tree = ast.parse(Path(rules_schema.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert imported <= {"__future__", "difflib", "math", "re"}, imported
    data = {n: tomllib.loads((shipped_rules_dir() / f"{n}.toml").read_text()) for n in SCHEMAS}
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for name, schema in SCHEMAS.items():
            check(data[name], schema)
        times.append(time.perf_counter() - start)
    assert min(times) < 0.02, times  # about 0.3 ms on a shared 2-core machine


def test_claims_toml_is_checked_by_the_same_schema(tmp_path):
    """`advisor claims` reads claims.toml apart from the rest: read_rules_file is its checked reader."""
    shipped = read_rules_file(shipped_rules_dir() / "claims.toml", "claims")
    assert len(shipped["claims"]) >= 20
    bad = tmp_path / "claims.toml"
    text = (shipped_rules_dir() / "claims.toml").read_text()
    bad.write_text(text.replace('kind = "never_best"', 'kind = "never-best"', 1))
    with pytest.raises(
        RulesError, match=r"claims\[\d+\]\.kind must be one of .*; did you mean never_best\?$"
    ):
        read_rules_file(bad, "claims")
