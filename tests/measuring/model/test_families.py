"""The family registry: one module per family, in agreement with rules/families.toml; a fifth family is one
module plus one line of rules, and trains through the grid; an unknown family is an error, never another's."""

import sqlite3
import textwrap

import pytest

from advisor.answers.recommendation import recommend
from advisor.kb.migrations import STATUSES
from advisor.measuring.grid.local import run_grid
from advisor.measuring.grid.runner import plan_grid
from advisor.measuring.model.families import UnknownFamily, family, registered
from advisor.measuring.recipe import config, optimizers, strategies
from advisor.measuring.recipe.config import RunConfig
from advisor.places import shipped_kb_path, shipped_rules_dir
from advisor.rules import load_rules

from ...conftest import RULES, ref


@pytest.mark.parametrize("name", list(RULES.families))
def test_every_family_of_the_rules_has_its_module(name):
    fam = family(name, RULES)
    assert fam.name == name and fam.task
    for preset in RULES.presets[:2]:  # paper sizes are checked on their configs in test_models
        config_, shape = fam.reference_config(preset)
        assert config_.model_type and shape.seq_len > 0


def test_registry_and_code_lists_agree_with_the_rules():
    for name in RULES.families:
        family(name, RULES)
    assert set(registered()) <= set(RULES.families)
    assert set(optimizers.BUILDABLE) == set(RULES.optimizers) == set(config.DEFAULT_LR)
    assert set(strategies.STRATEGIES) == set(RULES.strategies)
    assert set(config.PRESET_DEFAULTS) == set(RULES.presets)
    assert set(RULES.reference_models().values()) == set(RULES.families)
    shipped = sqlite3.connect(shipped_kb_path())
    (sql,) = shipped.execute("SELECT sql FROM sqlite_master WHERE name = 'runs'").fetchone()
    assert f"status IN ({', '.join(repr(s) for s in STATUSES)})" in sql  # the schema's statuses are these


def test_an_unknown_family_is_an_error(tmp_path):
    with pytest.raises(UnknownFamily, match="unknown family 'audio'"):
        family("audio", RULES)
    custom = tmp_path / "rules"
    custom.mkdir()
    for f in shipped_rules_dir().glob("*.toml"):
        (custom / f.name).write_text(f.read_text())
    text = (custom / "families.toml").read_text()
    (custom / "families.toml").write_text(
        'families.speech = { module = "advisor.measuring.model.families.decoder", inputs = ["text"] }\n'
        + text
    )
    with pytest.raises(UnknownFamily, match="registers no family called 'speech'"):
        family("speech", load_rules(str(custom)))


TOY_FAMILY = '''
"""A throw-away family for the test: GPT-2 at a tiny size, trained on the decoder family's data."""
from advisor.measuring.model.families import register
from advisor.measuring.data.shape import Shape
from advisor.measuring.model.families.decoder import Decoder
from advisor.measuring.data.tokenizer import BYTE_VOCAB, SPECIAL_IDS


@register
class Toy(Decoder):
    name = "toy"
    task = "causal language modelling with GPT-2"

    def reference_config(self, preset):
        from transformers import GPT2Config

        config = GPT2Config(vocab_size=BYTE_VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, **SPECIAL_IDS)
        return config, Shape(seq_len=32, vocab_size=BYTE_VOCAB)
'''


@pytest.mark.slow
def test_a_fifth_family_is_one_module_and_one_line_of_rules(tmp_path, monkeypatch):
    (tmp_path / "toy_family.py").write_text(textwrap.dedent(TOY_FAMILY))
    monkeypatch.syspath_prepend(str(tmp_path))
    custom = tmp_path / "rules"
    custom.mkdir()
    for f in shipped_rules_dir().glob("*.toml"):
        (custom / f.name).write_text(f.read_text())
    line = 'families.toy = { module = "toy_family", reference_model = "gpt2-toy", inputs = ["text"] }\n'
    (custom / "families.toml").write_text(line + (custom / "families.toml").read_text())
    rules = load_rules(str(custom))

    base = RunConfig(preset="tiny", epochs=1, steps_per_epoch=4)
    configs = plan_grid([ref("gpt2-toy", rules)], rules, base=base)
    assert {(c.config.optimizer, c.config.strategy) for c in configs} == {
        (o, s) for o in rules.families["toy"].grid_optimizers for s in rules.families["toy"].grid_strategies
    }
    db = tmp_path / "toy.sqlite"
    results = run_grid(configs, db, rules)
    assert [r.status for r in results] == ["ok"] * len(configs), [(r.config.label, r.error) for r in results]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT DISTINCT family, model, preset FROM runs").fetchall() == [
        ("toy", "gpt2-toy", "tiny")
    ]
    answer = recommend(conn, "toy", "loss", rules)
    assert answer.recommendation is not None and answer.group.model == "gpt2-toy"
