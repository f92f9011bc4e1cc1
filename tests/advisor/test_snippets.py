"""The code `advisor fit` prints for a configuration runs, as printed, on a tiny model with warnings as errors:
TrainingArguments with no deprecated argument, peft's LoraConfig, bitsandbytes' BitsAndBytesConfig, the
Trainer's optim names and the optimizers Trainer cannot name."""

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from advisor.model_ref import resolve_model
from advisor.prediction.question import FitOptions, question
from advisor.prediction.snippets import training_code
from advisor.rules import load_rules

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "tests/fixtures/configs/Qwen2-0.5B"
# One warning is not the snippet's: peft 0.21 reads `is_gradient_checkpointing`, which transformers 5 deprecates,
# inside get_peft_model whatever the caller passes.
PEFTS_OWN = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
RUNNER = """
import os, sys, json, warnings
warnings.simplefilter("error")
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
snippets = json.load(open(sys.argv[1]))
for key, code in snippets.items():
    os.chdir(sys.argv[2])
    namespace = {"train_dataset": [{"input_ids": list(range(i, i + 16)), "labels": list(range(i, i + 16))} for i in range(4)]}
    exec(compile(code, key, "exec"), namespace)
    print("ran", key, flush=True)
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny Llama saved with weights, as a user's model folder is."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def codes(invoke, model, gpu: str, wanted: list[tuple], db) -> dict[str, str]:
    result = invoke("fit", "--model", model, "--gpu", gpu, "--seq-len", "16", "--json", "--all", "--db", db)
    assert result.exit_code == 0, result.output
    out = {}
    for c in json.loads(result.output)["configurations"]:
        key = (c["adapter"], c["base_bits"], c["dtype"], c["optimizer"], c["strategy"], c["offload"])
        if key in wanted:
            code = c["code"]
            if gpu != "cpu":  # a GPU's configuration, run on this CPU: the one switch a CPU run needs
                code = code.replace(
                    "args = TrainingArguments(\n", "args = TrainingArguments(\n    use_cpu=True,\n"
                )
            out["/".join(map(str, key))] = code
    assert len(out) == len(wanted), sorted(out)
    return out


@pytest.mark.slow
def test_the_printed_code_trains_a_tiny_model_with_warnings_as_errors(invoke, tiny_model, tmp_path):
    db = tmp_path / "kb.sqlite"
    cpu = [
        ("full", None, "fp32", "adamw", "standard", "none"),  # the pick on a CPU
        ("lora", None, "fp32", "adamw", "checkpointing", "none"),
        ("full", None, "fp32", "adamw", "selective-checkpointing", "none"),
        ("full", None, "fp32", "muon", "standard", "none"),
        ("full", None, "fp32", "adamw_bnb_8bit", "accumulation", "none"),
        ("full", None, "fp32", "adafactor", "standard", "none"),
    ]
    gpu = [
        ("qlora", 4, "bf16-mixed", "adamw", "checkpointing", "none"),
        ("full", None, "bf16", "adamw", "standard", "none"),
    ]
    snippets = codes(invoke, tiny_model, "cpu", cpu, db) | codes(invoke, tiny_model, "H100", gpu, db)
    (tmp_path / "snippets.json").write_text(json.dumps(snippets))
    run = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-W",
            PEFTS_OWN,
            "-c",
            RUNNER,
            str(tmp_path / "snippets.json"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("ran ") == len(snippets)


def test_training_arguments_are_trainers_own():
    """Every configuration of the menu: arguments TrainingArguments has, optim names Trainer knows, the
    deprecated gradient_checkpointing never."""
    from transformers import TrainingArguments
    from transformers.training_args import OptimizerNames

    rules = load_rules()
    q = question(resolve_model(str(QWEN), rules), FitOptions(gpu="A100-80GB", seq_len=256), rules)
    names = {f.name for f in fields(TrainingArguments)}
    for c in q.configs:
        args, code = training_code(q, c, q.adapter_of(c.adapter), rules)
        assert set(args) <= names, (c, args)
        assert "gradient_checkpointing" not in code
        assert "optim" not in args or args["optim"] in {o.value for o in OptimizerNames}
        passed = rules.optimizer_info[c.optimizer].trainer is None
        assert ("optimizers=(optimizer, None)" in code) == passed
        assert ("LoraConfig(" in code) == (c.adapter != "full")
        assert ("BitsAndBytesConfig(load_in_4bit=True" in code) == (c.adapter == "qlora")
        assert ("deepspeed" in args) == (c.offload != "none")
