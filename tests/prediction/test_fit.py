"""`advisor fit` and `recommend --model --gpu`: answers about the user's model on the user's accelerator,
cached so a repeated question imports no torch; every bad input gets a sentence and an exit code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.prediction import accelerators
from advisor.rules import load_rules

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "tests/fixtures/configs/Qwen2-0.5B"
LLAMA_8B = REPO / "tests/fixtures/configs/Llama-3.1-8B"
QUICK = (  # the paper's corner of the menu: full fine-tuning, two optimizers, two strategies
    "--adapter",
    "full",
    "--offload",
    "none",
    "--seq-len",
    "256",
    "--optimizer",
    "sgd",
    "--optimizer",
    "adamw",
    "--strategy",
    "standard",
    "--strategy",
    "checkpointing",
)


@pytest.fixture(autouse=True)
def user_dir(tmp_path, monkeypatch):
    """The user's data directory (where fit caches predictions) is the test's own."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ADVISOR_DB", raising=False)
    return tmp_path / "xdg" / "advisor"


def fit_json(invoke, *args):
    result = invoke("fit", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_fit_answers_about_the_model_and_accelerator(invoke, user_dir):
    out = fit_json(invoke, "--model", QWEN, "--gpu", "T4", *QUICK)
    assert out["model"] == {
        "name": str(QWEN),
        "model_type": "qwen2",
        "family": "decoder",
        "parameters": 494_032_768,
        "hub_id": str(QWEN),  # what its code loads: the folder as given
        "architecture_of": None,
    }
    assert out["accelerator"]["name"] == "NVIDIA T4" and out["accelerator"]["memory_gb"] == pytest.approx(
        17.18, abs=0.01
    )
    assert out["dtypes"] == ["fp16-mixed"]  # a T4 has no bf16
    assert len(out["configurations"]) == 4 and out["assumptions"]
    row = out["configurations"][0]
    assert set(row["memory_gb"]) == {
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "temporaries",
        "overhead",
        "tensor_peak",
        "total",
    }
    memory = row["memory_gb"]
    assert memory["total"] == pytest.approx(memory["tensor_peak"] + memory["overhead"], abs=1e-3)
    assert memory["parameters"] == pytest.approx(494_032_768 * 4 / 1e9, rel=1e-3)  # fp32 master weights
    assert row["step_flops"] > 0 and row["predicted_step_s"] > 0 and row["training_arguments"]["fp16"] is True
    adamw = next(
        r for r in out["configurations"] if r["optimizer"] == "adamw" and r["strategy"] == "standard"
    )
    assert adamw["memory_gb"]["optimizer_state"] == pytest.approx(2 * memory["parameters"], rel=1e-3)
    assert adamw["training_arguments"]["optim"] == "adamw_torch_fused"
    assert (user_dir / "kb.sqlite").exists() and not out["cached"]


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_the_largest_micro_batch_is_the_last_that_fits(invoke):
    out = fit_json(invoke, "--model", QWEN, "--gpu", "L4", *QUICK, "--dtype", "bf16-mixed")
    row = next(
        r for r in out["configurations"] if r["optimizer"] == "sgd" and r["strategy"] == "checkpointing"
    )
    largest = row["max_batch_size"]
    assert largest > 1
    at = {
        b: fit_json(
            invoke, "--model", QWEN, "--gpu", "L4", *QUICK, "--dtype", "bf16-mixed", "--batch-size", str(b)
        )
        for b in (largest, largest + 1)
    }
    fits = {
        b: next(
            r for r in o["configurations"] if r["optimizer"] == "sgd" and r["strategy"] == "checkpointing"
        )["fits"]
        for b, o in at.items()
    }
    assert fits == {largest: True, largest + 1: False}


def test_a_repeated_question_imports_no_torch(invoke, tmp_path):
    fit_json(invoke, "--model", QWEN, "--gpu", "A100-40GB", *QUICK)
    code = (
        "import sys; from advisor.cli import cli\n"
        f"sys.argv = ['advisor', 'fit', '--model', {str(QWEN)!r}, '--gpu', 'A100-40GB', *{list(QUICK)!r}, '--json']\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert not e.code, e.code\n"
        "heavy = ('torch', 'transformers', 'rich', 'tomllib')\n"  # the drawing, the rules' parser: --json reads
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in heavy or m == 'importlib.metadata'))"
    )
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    for _ in range(
        2
    ):  # the first answer fills the data folder's cache (the parsed rules), the second reads it
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        ).stdout
    assert "HEAVY []" in out and '"cached": true' in out


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_when_nothing_as_asked_fits_the_ladder_quantifies_each_lever(invoke):
    """Full fine-tuning of an 8B model in 24 GB: pure bf16, 8-bit states, checkpointing, each with its GB, up
    to several GPUs, the fewest that hold it with ZeRO; nothing of the asked corner fits on one."""
    args = (
        "--model",
        LLAMA_8B,
        "--memory",
        "24",
        "--seq-len",
        "512",
        "--adapter",
        "full",
        "--offload",
        "none",
    )
    out = fit_json(invoke, *args, "--optimizer", "adamw", "--optimizer", "adamw_bnb_8bit")
    assert not any(r["fits"] for r in out["configurations"])
    # beyond the asked menu, the levers: LoRA makes it fit on the one GPU, and it is the pick, said so
    levers = {x["lever"]: x for x in out["levers"]}
    assert out["pick_lever"]["lever"] == "LoRA" and levers["LoRA"]["fits"]
    assert out["pick"].startswith("lora r16 · ") and levers["LoRA"]["configuration"]["adapter"] == "lora"
    assert "shorter sequences" not in levers  # the weights, gradients and state alone outgrow 24 GiB
    rungs = [r["rung"] for r in out["ladder"]]
    assert rungs == ["as asked", "pure bf16", "8-bit states", "checkpointing", "several GPUs"]
    assert all(r["memory_gb"] > 24 for r in out["ladder"][:-1])
    several = out["ladder"][-1]
    assert several["fits"] and several["memory_gb"] <= 24 and several["sharding"] in ("zero2", "zero3")
    assert several["gpus"] * several["nodes"] in (2, 4, 8, 16, 32, 64) and "adamw" in several["configuration"]
    row = out["several_gpus"]
    assert (
        row["sharding"] == several["sharding"]
        and row["fits"]
        and row["launch"]["command"].startswith("torchrun")
    )
    sizes = [r["memory_gb"] for r in out["ladder"][:-1]]
    assert sizes[0] > sizes[1] > sizes[2]  # each lever takes memory off
    text = invoke("fit", *args, "--optimizer", "adamw", "--verbose").output
    assert "The ladder" in text and "several GPUs" in text and "per rank" in text
    assert "one lever does: LoRA" in text and "this recipe pulls one lever, LoRA (--adapter lora)" in text


@pytest.mark.slow
def test_the_default_menu_answers_an_8b_fine_tune_on_a_24_gb_and_an_80_gb_gpu(invoke):
    """The published Llama-3.1-8B config: on an RTX 4090 a configuration that fits (the ladder's first rung
    that does) with its code; on an H100 an AdamW-class optimizer first. One trace serves both."""
    rtx = fit_json(invoke, "--model", LLAMA_8B, "--gpu", "RTX4090")
    pick = rtx["configurations"][0]
    assert pick["fits"] and pick["adamw_class"] and rtx["pick"] and rtx["ladder"][-1]["fits"]
    assert "trainer.train()" in pick["code"] and pick["memory_gb"]["total"] <= 25.8
    h100 = fit_json(invoke, "--model", LLAMA_8B, "--gpu", "H100")
    assert h100["cached"] and h100["configurations"][0]["adamw_class"] and h100["configurations"][0]["fits"]
    assert [r["rung"] for r in h100["ladder"]] == ["as asked", "pure bf16"] and h100["ladder"][-1]["fits"]
    assert h100["configurations"][0]["adapter"] == "full" and h100["configurations"][0]["dtype"] == "bf16"
    for key in (
        "adapter",
        "base_bits",
        "trainable_parameters",
        "optimizer",
        "strategy",
        "dtype",
        "attention",
        "offload",
        "host_gb",
        "tokens_per_s",
        "code",
        "fits",
        "max_batch_size",
        "memory_gb",
        "step_flops",
        "predicted_step_s",
    ):
        assert key in pick, key
    text = invoke("fit", "--model", LLAMA_8B, "--gpu", "RTX4090", "--verbose").output
    shown = text.split("Configurations")[1].split("Where the memory goes")[0]
    assert len([line for line in shown.splitlines() if line.strip()[:1].isdigit()]) <= 12


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_mixtral_gpt2_with_a_pad_token_and_t5_get_answers_or_one_sentence(invoke, tmp_path):
    mixtral = fit_json(
        invoke,
        "--model",
        REPO / "tests/fixtures/configs/Mixtral-8x7B-v0.1",
        "--gpu",
        "H100",
        "--adapter",
        "qlora",
        "--optimizer",
        "adamw",
        "--strategy",
        "checkpointing",
        "--seq-len",
        "256",
    )
    assert mixtral["model"]["parameters"] == 46_702_792_704 and mixtral["configurations"]
    assert any("experts" in a for a in mixtral["assumptions"])
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "architectures": ["GPT2LMHeadModel"],
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 128,
                "vocab_size": 512,
                "pad_token_id": 0,
            }
        )
    )
    assert fit_json(invoke, "--model", gpt2, "--gpu", "T4", *QUICK[:4])["configurations"]
    t5 = invoke("fit", "--model", REPO / "tests/fixtures/configs/t5-small", "--gpu", "T4")
    assert t5.exit_code == 1 and "encoder-decoder" in t5.output and t5.output.count(". ") <= 1
    assert "--arch" not in invoke("recommend", "--model", REPO / "tests/fixtures/configs/t5-small").output


def test_gpu_names_as_people_type_them():
    rules = load_rules()
    for name, key in [
        ("A100-80GB", "a100-80gb"),
        ("a100_40gb", "a100-40gb"),
        ("H100", "h100-80gb"),
        ("RTX4090", "rtx4090"),
        ("rtx 3090", "rtx3090"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("Tesla T4", "t4"),
        ("mi300x", "mi300x"),
    ]:
        assert accelerators.resolve(name, rules).key == key, name
    with pytest.raises(accelerators.UnknownAccelerator, match="Did you mean: .*a100"):
        accelerators.resolve("A1000", rules)
    assert accelerators.find("CPU: AMD EPYC 7B13 (2 cores)", rules) is None


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["--model", QWEN, "--gpu", "A1000"], 2, "Did you mean"),
        (["--model", QWEN, "--gpu", "T4", "--batch-size", "0"], 2, "--batch-size"),
        (["--model", QWEN, "--gpu", "T4", "--seq-len", "200000"], 2, "beyond"),
        (["--model", QWEN, "--memory", "-1"], 2, "--memory"),
        (["--model", QWEN, "--memory", "nan"], 2, "not a finite number"),
        (["--model", QWEN, "--memory", "0"], 2, "--memory"),
        (["--model", QWEN], 2, "pass --gpu"),
        (["--model", QWEN, "--gpu", "T4", "--dtype", "bf16-mixed"], 2, "no bf16"),
        (["--model", QWEN, "--gpu", "T4", "--image-size", "224"], 2, "takes text, not images"),
        (
            [
                "--model",
                REPO / "tests/fixtures/configs/vit-base-patch16-224",
                "--gpu",
                "T4",
                "--seq-len",
                "64",
            ],
            2,
            "--seq-len does not apply",
        ),
        (["--model", QWEN, "--gpu", "T4", "--mfu", "0"], 2, "--mfu"),
        (["--model", QWEN, "--gpu", "T4", "--mfu", "2"], 2, "--mfu"),
        (["--model", QWEN, "--gpu", "T4", "--optimizer", "lion"], 2, "unknown optimizer"),
        (["--model", QWEN, "--gpu", "T4", "--dtype", "int8"], 2, "--dtype"),
        (["--gpu", "T4"], 2, "pass --model"),
        (["--model", QWEN, "--gpu", "T4", "--adapter", "dora"], 2, "--adapter"),
        (["--model", QWEN, "--gpu", "T4", "--lora-r", "0"], 2, "--lora-r"),
        (["--model", QWEN, "--gpu", "T4", "--lora-alpha", "-2"], 2, "--lora-alpha"),
        (["--model", QWEN, "--gpu", "T4", "--base-bits", "2"], 2, "--base-bits"),
        (["--model", QWEN, "--gpu", "T4", "--attention", "flash3"], 2, "--attention"),
        (["--model", QWEN, "--gpu", "T4", "--method", "ppo"], 2, "--method"),
        (["--model", QWEN, "--gpu", "T4", "--method", "dpo", "--reference", "policy"], 2, "--reference"),
        (["--model", QWEN, "--gpu", "T4", "--reference", "model"], 2, "add --method dpo"),
        (["--model", QWEN, "--gpu", "T4", "--loss", "chunked"], 2, "--loss"),
        (["--model", QWEN, "--gpu", "T4", "--method", "sft", "--loss", "fused"], 2, "drop --loss"),
        (["--model", QWEN, "--gpu", "cpu", "--loss", "fused"], 2, "Triton"),
        (["--model", "vit", "--gpu", "T4", "--loss", "fused"], 2, "Liger has no fused loss"),
        (["--model", QWEN, "--gpu", "T4", "--completion-len", "64"], 2, "add --method grpo"),
        (["--model", QWEN, "--gpu", "T4", "--generations", "4"], 2, "add --method grpo"),
        (["--model", QWEN, "--gpu", "T4", "--beta", "0.04"], 2, "add --method grpo"),
        (["--model", QWEN, "--gpu", "T4", "--generation", "vllm-server"], 2, "add --method grpo"),
        (
            ["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--completion-len", "0"],
            2,
            "--completion-len",
        ),
        (["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--generations", "0"], 2, "--generations"),
        (["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--beta", "-1"], 2, "--beta"),
        (["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--beta", "nan"], 2, "--beta"),
        (["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--generation", "sglang"], 2, "--generation"),
        (["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--reference", "model"], 2, "add --beta"),
        (
            [
                "--model",
                QWEN,
                "--gpu",
                "T4",
                "--method",
                "grpo",
                "--beta",
                "0.1",
                "--reference",
                "precomputed",
            ],
            2,
            "nothing to precompute",
        ),
        (
            [
                "--model",
                QWEN,
                "--gpu",
                "T4",
                "--method",
                "grpo",
                "--seq-len",
                "256",
                "--completion-len",
                "256",
            ],
            2,
            "leaves no prompt",
        ),
        (
            ["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--effective-batch", "12"],
            2,
            "multiple of it",
        ),
        (
            ["--model", QWEN, "--gpu", "T4", "--gpus", "2", "--method", "grpo", "--sharding", "zero3"],
            2,
            "GRPO is predicted on one GPU and under DDP",
        ),
        (
            [
                "--model",
                QWEN,
                "--gpu",
                "T4",
                "--method",
                "dpo",
                "--adapter",
                "full",
                "--reference",
                "adapter",
            ],
            2,
            "with --adapter full",
        ),
        (["--model", "vit", "--gpu", "T4", "--method", "sft"], 2, "causal language model"),
        (["--model", QWEN, "--gpu", "T4", "--offload", "disk"], 2, "--offload"),
        (
            ["--model", QWEN, "--gpu", "H100", "--adapter", "qlora", "--dtype", "fp32"],
            2,
            "QLoRA computes in half",
        ),
        (["--model", QWEN, "--gpu", "cpu", "--adapter", "qlora"], 2, "CUDA"),
        (
            ["--model", QWEN, "--gpu", "H100", "--adapter", "lora", "--optimizer", "muon"],
            2,
            "trains full only",
        ),
        (
            ["--model", QWEN, "--gpu", "H100", "--adapter", "lora", "--offload", "optimizer"],
            2,
            "offload applies",
        ),
        (
            ["--model", QWEN, "--gpu", "H100", "--adapter", "full", "--lora-r", "8"],
            2,
            "applies to --adapter lora",
        ),
        (
            [
                "--model",
                QWEN,
                "--gpu",
                "H100",
                "--adapter",
                "lora",
                "--lora-targets",
                "nonexistent_proj",
                "--optimizer",
                "adamw",
                "--strategy",
                "standard",
                "--seq-len",
                "64",
            ],
            2,
            "match no linear layer",
        ),
        (
            ["--model", QWEN, "--gpu", "H100", "--adapter", "lora", "--base-bits", "8"],
            2,
            "add --adapter qlora",
        ),
        (["--model", QWEN, "--gpu", "cpu", "--attention", "flash_attention_2"], 2, "FlashAttention-2 needs"),
        (["--model", QWEN, "--gpu", "T4", "--attention", "flash_attention_2"], 2, "not NVIDIA T4"),
        (
            ["--model", QWEN, "--gpu", "H100", "--attention", "flash_attention_2", "--dtype", "fp32"],
            2,
            "fp16 or bf16",
        ),
        (
            [
                "--model",
                QWEN,
                "--gpu",
                "H100",
                "--adapter",
                "lora",
                "--lora-targets",
                "self_attn",
                "--optimizer",
                "adamw",
                "--strategy",
                "standard",
                "--seq-len",
                "64",
            ],
            2,
            "match no linear layer",
        ),
        (["--model", "someorg/not-cached", "--gpu", "T4"], 1, "hf download someorg/not-cached config.json"),
        (["--model", "not-a-model", "--gpu", "T4"], 1, "advisor fit --list-models"),
        (["--model", "llama-3.1-8b", "--gpu", "A100"], 2, "a100-40gb (40 GB), a100-80gb (80 GB)"),
    ],
)
def test_bad_input_gets_a_sentence_and_an_exit_code(invoke, args, code, needle):
    result = invoke("fit", *args)
    assert result.exit_code == code, result.output
    assert needle in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            b'{"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "modeling.Mine"}}',
            "trust_remote_code",
        ),
        (b'["not", "a", "config"]', "not a model config"),
        (b"\xff\xfe not utf-8", "not UTF-8"),
        (b"{not json", "not valid JSON"),
        (b'{"hidden_size": 8}', "no model_type"),
        (b'{"model_type": "mamba-9000", "architectures": ["Mamba9000Model"]}', "cannot tell what"),
        (
            b'{"model_type": "nonexistent_arch", "architectures": ["FooForCausalLM"]}',
            "transformers cannot build",
        ),
    ],
)
def test_configs_that_are_not_models_are_refused(invoke, tmp_path, content, needle):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_bytes(content)
    result = invoke("fit", "--model", folder, "--gpu", "T4")
    assert result.exit_code == 1, result.output
    assert needle in result.output and "Traceback" not in result.output


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_recommend_excludes_what_does_not_fit_and_ranks_memory_by_prediction(invoke):
    """Trainer's step (the model's own loss, its logits whole), as the evidence was measured with."""
    result = invoke(
        "recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "time", "--method", "trainer", "--json"
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["model"]["parameters"] == 494_032_768 and out["model"]["accelerator"] == "NVIDIA T4"
    predicted_out = [e for e in out["excluded"] if (e["reason"] or "").startswith("predicted")]
    assert predicted_out and all("on NVIDIA T4 (advisor fit)" in e["reason"] for e in predicted_out)
    memory = json.loads(
        invoke("recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "memory", "--json").output
    )
    assert memory["metric"]["measure"] == "predicted_gb" and memory["recommendation"]["predicted"] is True
    values = [memory["recommendation"]["value"]] + [a["value"] for a in memory["alternatives"]]
    assert values == sorted(values)
    text = invoke("recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "memory").output
    flat = " ".join(text.translate(str.maketrans("│╭╮╰╯", "     ")).split())
    assert "predicted (advisor fit)" in flat and "Your model" in flat
    assert "Scale: the question is about 494 M parameters" in flat  # stated, with what it means for memory
    assert "this ranking is advisor fit's prediction for the model asked about" in flat
    time = json.loads(  # time too: the model's own predicted time per sample, the evidence's beside it
        invoke("recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "time", "--json").output
    )
    assert time["metric"]["measure"] == "predicted_time_per_ksample"
    ranked = [time["recommendation"], *time["alternatives"]]
    assert all(e["predicted"] and e["unit"] == "s/1k samples" for e in ranked)
    assert [e["value"] for e in ranked] == sorted(e["value"] for e in ranked)
    assert time["recommendation"]["measured"]["unit"] == "s/epoch" and not time["disagreements"]
    assert any("Ranked by advisor fit's prediction" in c for c in time["caveats"])
    assert not any("host (CPU) RAM" in c for c in memory["caveats"])


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_recommend_predicts_the_method_asked_and_says_so(invoke):
    """`recommend --model --method dpo`: the measured configurations are predicted as DPO steps (a pair's two
    sequences and the reference's copy held), so more of them are excluded than for Trainer's step; the
    answer names the step (TRL's SFT by default for a causal LM), and a bad method option is refused as fit
    refuses it."""
    args = ("recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "memory", "--json")
    assert json.loads(invoke(*args).output)["model"]["method"] == "sft"
    plain = json.loads(invoke(*args, "--method", "trainer").output)
    dpo = json.loads(invoke(*args, "--method", "dpo").output)
    assert plain["model"]["method"] == "trainer" and dpo["model"]["method"] == "dpo"

    def excluded(out):
        return sum((e["reason"] or "").startswith("predicted") for e in out["excluded"])

    assert excluded(dpo) > excluded(plain)
    text = invoke(*args[:-1], "--method", "dpo").output
    assert "TRL's DPO step" in " ".join(text.translate(str.maketrans("│╭╮╰╯", "     ")).split())
    bad = invoke("recommend", "--model", QWEN, "--gpu", "T4", "--optimize", "memory", "--beta", "0.1")
    assert bad.exit_code == 2 and "add --method grpo" in bad.output


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_recommend_warns_when_the_evidence_model_is_ten_times_off(invoke, tmp_path):
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 256,
    }
    (tiny / "config.json").write_text(json.dumps(config))
    out = json.loads(
        invoke("recommend", "--model", tiny, "--memory", "8", "--source", "paper", "--json").output
    )
    scale = out["scale"]
    assert (
        scale["warning"]
        and "smaller)" in scale["text"]
        and scale["evidence"] == out["evidence"]["parameters"]
    )
    assert out["evidence"]["source"].startswith("paper:") and scale["evidence"] >= 130_000_000  # the nearest
    assert "need not hold at the other" in scale["text"] and scale["question"] == out["model"]["parameters"]


def test_recommend_gpu_needs_a_model(invoke):
    result = invoke("recommend", "--arch", "decoder", "--gpu", "T4")
    assert result.exit_code == 2 and "pass --model too" in result.output


def test_fit_names_how_its_predictions_were_checked_on_gpus(invoke, tmp_path, monkeypatch):
    from advisor.kb import store
    from advisor.kb.open import open_for_writing
    from advisor.kb.store import Check

    db = tmp_path / "mine.sqlite"
    conn = open_for_writing(db)
    machine = {"hardware": "NVIDIA H200", "device": "cuda", "software": {}}
    checks = [
        Check("fit_tensor_peak_vs_cuda_allocated", "llama", True, v, 0.05, "x") for v in (-0.002, 0.01, -0.03)
    ]
    store.add_validations(conn, machine, "paper", checks)
    conn.close()
    out = fit_json(invoke, "--model", QWEN, "--gpu", "H200", *QUICK, "--db", db)
    assert any(
        "Checked on NVIDIA H200: 3 configurations of Trainer's step" in a and "median |error| 1.0%" in a
        for a in out["assumptions"]
    )


def test_list_gpus_names_every_accelerator_with_its_memory_and_link(invoke):
    """`--list-gpus`: each accelerator of rules/hardware.toml by its --gpu key, with its link's GB/s (what
    several GPUs' communication time is read at); the CPU has no link."""
    from advisor.rules import load_rules

    out = invoke("fit", "--list-gpus").output
    for key, acc in load_rules().accelerators.items():
        line = next(ln for ln in out.splitlines() if ln.startswith(key + " "))
        assert (f"{acc.link_gbs:g}" in line) if acc.link_gbs else line.rstrip().endswith("—"), line


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_when_nothing_fits_the_levers_say_what_would_and_the_code_is_a_levers_said_so(invoke):
    """Qwen2.5-7B-Instruct's LoRA on an L4 at 4,096 tokens with Trainer's step (its logits whole; TRL's SFT
    step, the default, fits as asked): none of the asked configurations fits. The answer
    asks each lever (Liger's fused loss, attention-only LoRA, QLoRA, shorter sequences, a second GPU), each
    with its figure; the pick is the first that fits on the one GPU (the fused loss: the same training, its
    152k-vocabulary logits never whole), said as a lever, and its code loads the Instruct model it was asked
    about, cut to the length it was priced at, with Liger's fused loss alone."""
    args = ("--model", "qwen2.5-7b-instruct", "--gpu", "L4", "--adapter", "lora", "--seq-len", "4096")
    args += ("--method", "trainer")
    out = fit_json(invoke, *args, "--optimizer", "adamw")
    assert not any(c["fits"] for c in out["configurations"])
    levers = {x["lever"]: x for x in out["levers"]}
    assert {"fused loss", "attention-only LoRA", "QLoRA", "shorter sequences", "a second GPU"} <= set(levers)
    for lever in levers.values():  # each with its figure
        assert lever["configuration"]["memory_gb"]["total"] > 0 and lever["flags"].startswith("--")
    assert levers["QLoRA"]["fits"] and levers["fused loss"]["fits"]
    assert out["pick_lever"]["lever"] == "fused loss" and levers["fused loss"]["flags"] == "--loss fused"
    assert levers["shorter sequences"]["flags"] == "--seq-len 2048"
    assert not levers["a second GPU"]["own_hardware"]  # shown with its figure, never the pick
    assert out["model"]["name"] == "Qwen2.5-7B-Instruct" and out["model"]["architecture_of"] == "Qwen2.5-7B"
    code = invoke("fit", *args, "--optimizer", "adamw", "--code").output
    assert code.startswith("# Nothing as asked fits with AdamW: this recipe pulls one lever, fused loss")
    assert "use_liger_kernel=True" in code
    assert "'Qwen/Qwen2.5-7B-Instruct'," in code and "Qwen2.5-7B's architecture" in code
    assert "MAX_LENGTH = 4096" in code and "truncation=True, max_length=MAX_LENGTH" in code


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_code_refuses_with_a_sentence_when_nothing_fits(invoke):
    """Llama-3.1-70B's LoRA on a 16 GB T4, checkpointed: no lever fits either; --code prints no recipe that
    does not fit (it printed SGD's), it exits 1 with what to do."""
    args = ("--model", "llama-3.1-70b", "--gpu", "T4", "--adapter", "lora", "--optimizer", "adamw")
    result = invoke("fit", *args, "--strategy", "checkpointing", "--code")
    assert result.exit_code == 1 and "no code to print" in result.output and "Traceback" not in result.output
    text = invoke("fit", *args, "--strategy", "checkpointing").output
    assert "None of" in text and "The levers" in text


@pytest.mark.slow
def test_a_mixture_of_experts_on_one_gpu_is_not_picked_with_sgd(invoke):
    """Qwen3-30B-A3B's LoRA on an H100 (128 experts, each adapted by all-linear: about 1 B trained weights):
    AdamW's 32-bit states do not fit, SGD's no state does; the pick is an AdamW-class lever (8-bit states),
    never SGD, and each lever carries its figure."""
    out = fit_json(invoke, "--model", "qwen3-30b-a3b", "--gpu", "H100", "--adapter", "lora",
                   "--optimizer", "adamw", "--optimizer", "sgd", "--strategy", "checkpointing+accumulation")  # fmt: skip
    assert any(c["fits"] and c["optimizer"] == "sgd" for c in out["configurations"])
    assert not any(c["fits"] and c["optimizer"] == "adamw" for c in out["configurations"])
    assert "sgd" not in out["pick"] and out["pick_lever"]["lever"] in ("8-bit states", "attention-only LoRA")
    levers = {x["lever"]: x for x in out["levers"]}
    assert {"8-bit states", "attention-only LoRA", "QLoRA", "a second GPU"} <= set(levers)
    assert all(x["configuration"] for x in levers.values())


@pytest.mark.slow
def test_dpo_answers_the_trade_of_a_reference_copy_against_the_disabled_adapter(invoke, tmp_path):
    """DPO on two GPUs: full fine-tuning holds a frozen copy (not predicted under ZeRO: left out, said), LoRA
    disables its adapter; the answer names TRL's trainer, the reference and the pick's figure per phase, and
    the JSON counts pairs' two sequences in tokens/s."""
    args = ["--model", QWEN, "--gpu", "RTX4090", "--gpus", "2", "--method", "dpo", "--seq-len", "512"]
    args += ["--optimizer", "adamw", "--strategy", "checkpointing", "--db", tmp_path / "kb.sqlite"]
    shown = invoke("fit", *args)
    assert shown.exit_code == 0, shown.output
    assert "TRL's DPOTrainer" in shown.output and "per phase" in shown.output
    data = json.loads(invoke("fit", *args, "--json", "--all").output)
    assert data["method"] == {
        "name": "dpo",
        "reference": None,
        "sequences_per_sample": 2,
        "rollout": None,
        "loss": "logits",
    }
    rows = data["configurations"]
    full = [r for r in rows if r["adapter"] == "full"]
    lora = [r for r in rows if r["adapter"] == "lora"]
    assert full and lora and not any(r["sharding"].startswith("zero") for r in full)
    assert all("reference" in r["phases_gb"] for r in full + lora)
    one = next(r for r in full if r["sharding"] == "ddp")
    twin = next(r for r in lora if r["sharding"] == "ddp")
    # the copy's weights: fp32 under mixed precision, on every DDP rank, beyond LoRA's frozen bf16 base
    assert one["memory_gb"]["parameters"] > 2 * twin["memory_gb"]["parameters"]
    assert "DPOTrainer(" in one["code"] and "precompute_ref_log_probs" not in one["code"]


@pytest.mark.slow
def test_grpo_answers_with_each_phase_a_pick_and_its_generation(invoke, tmp_path):
    """GRPO of Qwen3-8B on a 24 GB card (the done-when question): TRL's GRPOTrainer named with its
    generation settings, the pick's figure per phase (prefill and decoding of the whole generation batch
    among them), a pick that fits, its generation's speed, and a GRPOConfig script with the reward
    placeholder named as such."""
    args = ["--model", "qwen3-8b", "--gpu", "RTX4090", "--method", "grpo", "--optimizer", "adamw"]
    args += ["--seq-len", "1024", "--completion-len", "768", "--db", tmp_path / "kb.sqlite"]
    shown = invoke("fit", *args)
    assert shown.exit_code == 0, shown.output
    assert "TRL's GRPOTrainer" in shown.output and "8 completions of up to 768 tokens" in shown.output
    assert "per phase" in shown.output and "Generation: about" in shown.output
    data = json.loads(invoke("fit", *args, "--json").output)
    assert data["method"]["rollout"] == {
        "completion": 768,
        "generations": 8,
        "beta": 0.0,
        "generation": "transformers",
    }
    pick = next(r for r in data["configurations"] if r["fits"])
    assert {"prefill", "decode", "forward", "backward"} <= set(pick["phases_gb"])
    assert pick["generation_tokens_per_s"] > 0
    code = pick["code"]
    assert "GRPOConfig(" in code and "num_generations=8" in code and "reward_funcs=reward_placeholder" in code
    assert "PLACEHOLDER" in code


@pytest.mark.slow
def test_the_fused_loss_shows_its_saving_on_gemma_3s_vocabulary(invoke, tmp_path):
    """Gemma 3's 262,144-token vocabulary: the model's own loss holds [tokens, vocabulary] logits (and an fp32
    copy of them); Liger's fused loss never makes them. The same configuration, at the same micro-batch,
    takes several GiB less, and its script turns Liger's fused loss on alone."""
    args = ["--model", "gemma-3-27b", "--gpu", "H100", "--adapter", "lora", "--optimizer", "adamw"]
    args += ["--strategy", "checkpointing", "--batch-size", "2", "--json", "--db", tmp_path / "kb.sqlite"]
    rows = {}
    for loss in ("logits", "fused"):
        result = invoke("fit", *args, "--loss", loss)
        assert result.exit_code == 0, result.output
        rows[loss] = json.loads(result.output)["configurations"][0]
    saved = rows["logits"]["memory_gb"]["total"] - rows["fused"]["memory_gb"]["total"]
    logits = 2 * 2048 * 262_144 * 2 / 1e9  # one bf16 copy of two samples' logits
    assert saved > logits, (saved, logits)
    assert rows["fused"]["max_batch_size"] > rows["logits"]["max_batch_size"]
    arguments = rows["fused"]["training_arguments"]
    assert arguments["use_liger_kernel"] is True
    assert arguments["liger_kernel_config"]["fused_linear_cross_entropy"] is True
    assert not any(
        v for k, v in arguments["liger_kernel_config"].items() if k != "fused_linear_cross_entropy"
    )


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_grpo_generation_by_vllm_beside_training_takes_its_share_of_the_gpu(invoke, tmp_path):
    """vLLM colocated holds 30 % of the GPU: less left to training; a vLLM server's generation holds none of
    it (no generation phase traced), and the script asks TRL for it."""
    base = ["--model", QWEN, "--gpu", "T4", "--method", "grpo", "--seq-len", "128", "--completion-len", "64"]
    base += [
        "--optimizer",
        "adamw",
        "--strategy",
        "standard",
        "--adapter",
        "lora",
        "--json",
        "--db",
        tmp_path / "kb",
    ]
    answers = {}
    for generation in ("transformers", "vllm-colocate", "vllm-server"):
        result = invoke("fit", *base, "--generation", generation)
        assert result.exit_code == 0, result.output
        answers[generation] = json.loads(result.output)["configurations"][0]
    assert answers["vllm-colocate"]["max_batch_size"] < answers["vllm-server"]["max_batch_size"]
    assert "decode" in answers["transformers"]["phases_gb"]
    assert "decode" not in answers["vllm-server"]["phases_gb"]
    assert "scoring" in answers["vllm-server"]["phases_gb"]
    assert "vllm_mode='server'" in answers["vllm-server"]["code"]
    assert "vllm_mode='colocate'" in answers["vllm-colocate"]["code"]


def test_dpo_with_the_adapter_as_reference_leaves_full_fine_tuning_out_and_says_so(invoke, tmp_path):
    args = ["--model", QWEN, "--gpu", "T4", "--method", "dpo", "--reference", "adapter", "--seq-len", "64"]
    args += ["--optimizer", "adamw", "--strategy", "standard", "--json", "--db", tmp_path / "kb.sqlite"]
    result = invoke("fit", *args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {r["adapter"] for r in data["configurations"]} == {"lora", "qlora"}
    assert any("--reference adapter" in why for why in data["left_out"]), data["left_out"]
