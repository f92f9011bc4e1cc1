"""A shipped group of one particular model (a base pretrained here, fine-tuned in full and with LoRA) answers
the questions about that model only: never a family's default answer, the flowchart, the scale transfer, or
another answer's disagreements."""

import json

from advisor.kb.open import open_for_writing
from advisor.kb.store import write_runs

BASE = "my-decoder-base"


def base_run(seed, strategy, loss, seconds):
    return dict(
        n_params=4_000_000,
        source="measured",
        model=BASE,
        family="decoder",
        optimizer="adamw",
        strategy=strategy,
        preset="custom",
        protocol="fair",
        seed=seed,
        hardware="CPU: AMD EPYC (2 cores)",
        device="cpu",
        status="ok",
        pretrained=1,
        config={},
        software={},
        started_at="2026-12-01",
        metrics=[
            dict(name="eval_loss", value=loss, unit="nats/target"),
            dict(name="epoch_time", value=seconds, unit="s"),
        ],
    )


def answers(invoke) -> dict:
    asked = {
        "decoder": ("recommend", "--arch", "decoder", "--json"),
        "decoder-time": ("recommend", "--arch", "decoder", "--optimize", "time", "--json"),
        "flowchart": ("flowchart", "--json"),
        "transfer": ("transfer", "--json"),
    }
    out = {}
    for name, args in asked.items():
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        out[name] = json.loads(result.output)
    return out


def test_a_bases_group_answers_only_when_asked_for(invoke, kb_path):
    before = answers(invoke)
    conn = open_for_writing(kb_path)
    runs = [base_run(s, "standard", 1.0 + s / 100, 2.0) for s in range(3)]
    write_runs(conn, runs + [base_run(s, "lora", 0.9 + s / 100, 1.5) for s in range(3)])
    conn.close()
    after = answers(invoke)
    for name in ("flowchart", "transfer"):
        assert after[name] == before[name], name
    for name in ("decoder", "decoder-time"):
        assert after[name]["evidence"] == before[name]["evidence"]
        assert after[name]["recommendation"] == before[name]["recommendation"]
        assert BASE not in json.dumps(after[name]["disagreements"])
        listed = [g for g in after[name]["other_evidence"] if g["model"] == BASE]
        assert listed, "the base's group is listed as other evidence, to select"
    group = listed[0]["id"]
    chosen = json.loads(invoke("recommend", "--arch", "decoder", "--group", group, "--json").output)
    assert chosen["evidence"]["model"] == BASE
    assert (chosen["recommendation"]["optimizer"], chosen["recommendation"]["strategy"]) == ("adamw", "lora")


def test_a_base_that_is_all_the_evidence_answers_a_kb_read_alone(invoke, tmp_path):
    """Stepping aside is for a family's grid: a file of a base's runs alone (--db) answers the family."""
    db = tmp_path / "bases.sqlite"
    conn = open_for_writing(db)
    write_runs(
        conn,
        [base_run(s, k, v + s / 100, 2.0) for s in range(3) for k, v in (("standard", 1), ("lora", 0.9))],
    )
    conn.close()
    result = invoke("recommend", "--arch", "decoder", "--optimize", "loss", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["evidence"]["model"] == BASE and out["recommendation"]["strategy"] == "lora"
