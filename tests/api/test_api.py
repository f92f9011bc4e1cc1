"""The Python API, called as users call it: the same answers as the CLI, errors as exceptions that say
what to do, and `import advisor` as cheap as ever."""

import json
import subprocess
import sys

import pytest

import advisor
from advisor.rules import load_rules


def test_recommend_gives_the_clis_answer(invoke):
    answer = advisor.recommend(arch="encoder", optimize="memory")
    cli = json.loads(invoke("recommend", "--arch", "encoder", "--optimize", "memory", "--json").output)
    assert json.loads(json.dumps(answer.as_dict(load_rules()))) == cli
    assert (answer.recommendation.optimizer, answer.recommendation.strategy) == ("adam", "standard")
    by_model = advisor.recommend(model="vit", optimize="time", exclude_optimizers=("adam",))
    assert by_model.recommendation.optimizer != "adam"


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_recommend_takes_what_the_command_takes(invoke):
    """model, gpu, memory (GiB), preset, group, source and the menu's options as keywords, as the CLI's
    options; `as_dict()` needs no argument."""
    args = (
        "--model",
        "qwen2.5-0.5b",
        "--gpu",
        "H100",
        "--gpus",
        "2",
        "--adapter",
        "lora",
        "--optimize",
        "memory",
    )
    cli = json.loads(invoke("recommend", *args, "--json").output)
    api = advisor.recommend(model="qwen2.5-0.5b", gpu="H100", gpus=2, adapters=("lora",), optimize="memory")
    assert json.loads(json.dumps(api.as_dict())) == cli
    grouped = advisor.recommend(arch="decoder", group=cli["evidence"]["id"])
    assert grouped.as_dict()["evidence"]["id"] == cli["evidence"]["id"]
    small = advisor.recommend(arch="vit", preset="small", source="measured").as_dict()["evidence"]
    assert (small["preset"], small["source"]) == ("small", "measured")
    with pytest.raises(advisor.Error, match="takes no colour"):
        advisor.recommend(arch="vit", colour="red")


def test_bad_arguments_are_value_errors_with_the_choices():
    with pytest.raises(ValueError, match="exactly one of arch .* and model"):
        advisor.recommend()
    with pytest.raises(ValueError, match="unknown metric 'speed'. Choose from: loss"):
        advisor.recommend(arch="vit", optimize="speed")
    with pytest.raises(ValueError, match="unknown architecture 'rnn'"):
        advisor.recommend(arch="rnn")
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        advisor.recommend(arch="vit", optimizers=("lion",))
    with pytest.raises(advisor.NoEvidence):
        advisor.recommend(arch="vit", source="no-such-source")


def test_open_kb_is_read_only(kb_path):
    conn = advisor.open_kb(kb_path)
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    with pytest.raises(Exception, match="readonly|read-only"):
        conn.execute("DELETE FROM runs")
    with pytest.raises(advisor.KBError, match="not a knowledge base|empty"):
        (kb_path.parent / "empty.sqlite").write_bytes(b"")
        advisor.open_kb(kb_path.parent / "empty.sqlite")


def test_fit_answers_for_a_reference_model():
    fitted = advisor.fit(
        "vit",
        gpu="A100-80GB",
        optimizers=("adam",),
        strategies=("standard",),
        adapters=("full",),
        dtype="bf16",
    )
    (row,) = fitted.rows
    assert row.optimizer == "adam" and row.fits and row.memory_gb["total"] > 0 and row.dtype == "bf16"
    lora = advisor.fit(
        "vit", gpu="A100-80GB", optimizers=("adamw",), strategies=("standard",), adapters=("lora",), lora_r=4
    )
    assert lora.rows[0].adapter.r == 4 and lora.rows[0].trainable_parameters < lora.n_params / 10
    with pytest.raises(advisor.InputError, match="--lora-r"):
        advisor.fit("vit", gpu="A100-80GB", adapters=("lora",), lora_r=0)
    with pytest.raises(advisor.InputError, match="takes no rank"):
        advisor.fit("vit", gpu="A100-80GB", rank=4)
    for bad, flag in [
        (dict(batch_size=0), "--batch-size"),
        (dict(accumulation_steps=1), "--accumulation-steps"),
        (dict(memory=-1.0), "--memory"),
        (dict(mfu=2.0), "--mfu"),
        (dict(lora_r=8.5), "--lora-r"),
        (dict(adapters="dora"), "unknown adapter"),
    ]:
        with pytest.raises(advisor.InputError, match=flag):
            advisor.fit("vit", **{"gpu": "A100-80GB", **bad})
    single = advisor.fit(
        "vit", gpu="A100-80GB", adapters="full", optimizers="adamw", strategies="standard", dtype="bf16"
    )
    assert len(single.rows) == 1


def test_import_advisor_stays_cheap():
    code = "import sys, advisor; print(sorted(m for m in sys.modules if m.startswith('advisor')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['advisor', 'advisor.errors']"  # the errors: a few classes, no import
