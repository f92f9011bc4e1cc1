"""What a configuration of `advisor fit` gives up in quality, read from the KB: an optimizer against AdamW, an
adapter (LoRA) against full fine-tuning, each from a group of the model's family that measured both sides."""

import json

import pytest

from advisor.kb.open import open_for_writing
from advisor.kb.store import write_runs

TINY_LLAMA = {  # a decoder small enough to trace in a second
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
}


def base_run(seed, strategy, loss):
    """A fine-tuning run of a pretrained decoder base: full (standard) or LoRA."""
    return dict(
        n_params=4_000_000,
        source="measured",
        model="my-decoder-base",
        family="decoder",
        optimizer="adamw",
        strategy=strategy,
        preset="custom",
        protocol="fair",
        seed=seed,
        hardware="CPU: the user's laptop",
        device="cpu",
        status="ok",
        pretrained=1,
        config={},
        software={},
        started_at="2026-12-01",
        metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
    )


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return folder


def fitted(folder):
    import advisor

    return advisor.fit(
        str(folder),
        gpu="RTX4090",
        adapters=("full", "lora"),
        optimizers=("adamw",),
        strategies=("standard",),
        dtype="bf16-mixed",
        seq_len=128,
    )


def test_lora_rows_quote_the_kbs_loss_against_full_fine_tuning_of_a_pretrained_base(model, kb_path):
    conn = open_for_writing(kb_path)
    # five seeds: the group answers prefer over the shipped KB's three-seed bases (rules/flowchart.toml)
    runs = [base_run(s, "standard", 2.0) for s in range(5)] + [base_run(s, "lora", 2.1) for s in range(5)]
    write_runs(conn, runs)
    conn.close()
    answer = fitted(model)
    rows = {r.adapter.kind: r for r in answer.rows}
    lora = rows["lora"]
    assert lora.adapter_evidence.startswith("held-out loss 2.1 (+5.0 %) against full fine-tuning's 2 in ")
    assert "my-decoder-base" in lora.adapter_evidence and "(5 runs each)" in lora.adapter_evidence
    assert lora.adapter_trade.startswith("trains rank-r adapters on frozen weights")
    assert lora.adapter_trade.endswith(lora.adapter_evidence)
    assert rows["full"].adapter_trade is None and rows["full"].adapter_evidence is None
    (listed,) = [c for c in answer.as_dict()["configurations"] if c["adapter"] == "lora"]
    assert (
        listed["adapter_evidence"] == lora.adapter_evidence and listed["adapter_trade"] == lora.adapter_trade
    )


def test_without_a_group_that_measured_both_an_adapter_quotes_no_group_of_yours(model, kb_path):
    conn = open_for_writing(kb_path)  # LoRA runs alone: nothing to read them against
    write_runs(conn, [base_run(s, "lora", 2.1) for s in range(5)])
    conn.close()
    lora = next(r for r in fitted(model).rows if r.adapter.kind == "lora")
    assert lora.adapter_trade.startswith("trains rank-r adapters on frozen weights")
    assert "my-decoder-base" not in (lora.adapter_evidence or "")  # the shipped bases may answer, never this
    assert lora.adapter_trade.endswith(lora.adapter_evidence or "no quality evidence in the KB")


def test_recommend_names_the_measured_cost_of_the_picks_adapter():
    from advisor.render.views import menu_lines

    row = dict(
        configuration="lora r16 · bf16-mixed · adamw · checkpointing", memory_gb=20e9, tokens_per_s=1000.0
    )
    measured = "held-out loss 2.1 (+5.0 %) against full fine-tuning's 2 in a group (3 runs each)"
    menu = dict(fitting=3, configurations=9, pick={**row, "adapter_evidence": measured}, best_for_metric=None)
    menu |= dict(ladder=[], quality="Quality evidence ...")
    assert f"  its adapter, measured: {measured}" in menu_lines(menu).splitlines()
    menu["pick"] = {**row, "adapter_evidence": None}
    assert "its adapter" not in menu_lines(menu)
