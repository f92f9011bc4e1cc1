"""Published evidence groups (kb/inputs/paper-2509.02046, paper-2305.14314): figures copied from a cited table,
answers at their scale name them, and `advisor transfer` reads them as scale points without an interval."""

import json
import sqlite3

import pytest

from advisor.kb.ingest import read_figures, read_setup
from advisor.places import shipped_inputs_dir
from advisor.rules import load_rules

# A few cells, as printed in the cited tables (Wen et al.: each appendix table's tuned row 0, column Loss;
# QLoRA: Table 3, GLUE (Acc.) of RoBERTa-large). Each is checked in the shipped KB and in its input file.
CELLS = [
    ("paper:2509.02046", "llama-1.2b-wen", "adamw", "standard", "eval_loss", 2.905),
    ("paper:2509.02046", "llama-1.2b-wen", "muon", "standard", "eval_loss", 2.891),
    ("paper:2509.02046", "llama-1.2b-wen", "nadamw", "standard", "eval_loss", 2.902),
    ("paper:2509.02046", "llama-130m-wen", "nadamw", "standard", "eval_loss", 3.531),
    ("paper:2509.02046", "llama-300m-wen", "nadamw", "standard", "eval_loss", 3.248),
    ("paper:2305.14314", "roberta-large-qlora", "adamw", "standard", "eval_accuracy", 88.6),
    ("paper:2305.14314", "roberta-large-qlora", "adamw", "lora", "eval_accuracy", 88.8),
]


@pytest.mark.parametrize("source, model, optimizer, strategy, measure, value", CELLS)
def test_a_published_figure_is_in_the_shipped_kb_with_the_table_it_came_from(
    kb_path, source, model, optimizer, strategy, measure, value
):
    row = (
        sqlite3.connect(kb_path)
        .execute(
            "SELECT m.value, m.note, r.protocol FROM runs r JOIN metrics m ON m.run_id = r.id WHERE r.source = ? "
            "AND r.model = ? AND r.optimizer = ? AND r.strategy = ? AND m.name = ?",
            [source, model, optimizer, strategy, measure],
        )
        .fetchone()
    )
    assert row is not None and row[0] == value
    assert "able" in row[1] and ("row" in row[1])  # the table and row it was copied from
    assert row[2] == "fair"  # held-out figures at settings tuned per configuration


def test_every_input_figure_names_its_table_and_each_model_its_size():
    rules = load_rules()
    for folder in ("paper-2509.02046", "paper-2305.14314"):
        path = shipped_inputs_dir() / folder
        setup = read_setup(path / "setup.toml")
        assert all(m["n_params"] > 1e8 for m in setup["models"].values())
        for run in read_figures(path / "figures.csv", setup, rules):
            assert run["data"] and run["protocol"] == "fair"
            assert all(m["note"].startswith(("appendix", "Table")) for m in run["metrics"])


def test_a_loss_question_at_a_published_scale_is_answered_from_it_and_says_so(invoke):
    out = json.loads(invoke("recommend", "--model", "llama-3.2-1b", "--optimize", "loss", "--json").output)
    assert out["evidence"]["source"] == "paper:2509.02046" and out["evidence"]["model"] == "llama-1.2b-wen"
    assert out["scale"]["evidence"] == out["evidence"]["parameters"] == 1_200_000_000
    text = invoke("recommend", "--model", "llama-3.2-1b", "--optimize", "loss").output
    assert "paper 2509.02046" in text and "llama-1.2b-wen" in text and "1.2 B" in text


def test_a_table_of_losses_answers_no_time_question(invoke):
    out = json.loads(invoke("recommend", "--arch", "decoder", "--optimize", "time", "--json").output)
    assert out["evidence"]["source"] == "paper:2608.08961"  # the seed paper measured time; Wen et al. did not


def test_published_scales_are_scale_points_without_an_interval(kb_path):
    from advisor.answers.transfer import transfers

    conn = sqlite3.connect(kb_path)
    found = [t for t in transfers(conn, load_rules(), "decoder") if t.smaller.source == "paper:2509.02046"]
    assert [(t.smaller.model, t.larger.model, t.configurations) for t in found] == [
        ("llama-130m-wen", "llama-300m-wen", 3)  # 520M has no NAdamW table: two configurations, no tau
    ]
    assert found[0].interval is None and "one run each: no interval" in found[0].text
