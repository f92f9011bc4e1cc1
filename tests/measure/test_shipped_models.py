"""Every published model advisor ships a config of (`advisor fit --list-models`) traces a training step on one
GPU: a shipped config that cannot be traced (Gemma 3's vision inputs once) fails here, not in a user's hands.
The menu is narrowed to one LoRA row at a short sequence: what breaks is building the model and its inputs,
which every row shares."""

import pytest

import advisor
from advisor.model_ref import shipped_models

NARROW = dict(
    gpu="H200",
    adapters=("lora",),
    optimizers=("adamw",),
    strategies=("standard",),
    dtype="bf16-mixed",
    seq_len=64,
)


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ADVISOR_DB", raising=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(shipped_models()))
def test_every_shipped_model_traces_on_one_gpu(name):
    answer = advisor.fit(name, **NARROW)
    (row,) = answer.rows
    assert answer.n_params > 1e8 and row.memory_gb["parameters"] > 0 and row.trainable_parameters > 0
    assert row.code_of and row.trainer_code.count(f"'{answer.question.model.hub_id}',") == 1


def test_gemma_3_traces_with_its_image_inputs():
    """Gemma 3 (4B and up) is a vision-language model whose vision tower takes (batch, 3, H, W) pixels and
    whose image tokens are pooled to mm_tokens_per_image: its step traces, the image's tokens counted."""
    with_image = advisor.fit("gemma-3-4b", **NARROW)
    more_text = advisor.fit("gemma-3-4b", **{**NARROW, "seq_len": 128})
    (a,), (b,) = with_image.rows, more_text.rows
    assert a.fits and b.memory_gb["activations"] > a.memory_gb["activations"]
