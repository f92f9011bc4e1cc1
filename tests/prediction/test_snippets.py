"""The code `advisor fit` prints for a configuration runs, as printed, on a tiny model with warnings as errors:
TrainingArguments with no deprecated argument, peft's LoraConfig, bitsandbytes' BitsAndBytesConfig, the
Trainer's optim names and the optimizers Trainer cannot name. The TrainingArguments of every configuration
(one GPU, several, several nodes, a CPU) build as printed with warnings as errors, and a row's
`training_arguments` are the printed ones: `TrainingArguments(**advisor.fit(...).pick.training_arguments)`."""

import ast
import json
import os
import subprocess
import sys
import warnings
from dataclasses import fields
from pathlib import Path

import pytest

import advisor
from advisor.model_ref import resolve_model
from advisor.prediction.fit_request import FitRequest
from advisor.prediction.question import question
from advisor.prediction.training_code.recipe import Recipe, accumulates, learning_rate
from advisor.prediction.training_code.snippets import keyword_arguments, training_code
from advisor.rules import load_rules

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "tests/fixtures/configs/Qwen2-0.5B"
LLAMA_8B = REPO / "tests/fixtures/configs/Llama-3.1-8B"
# One warning is not the snippet's: peft 0.21 reads `is_gradient_checkpointing`, which transformers 5 deprecates,
# inside get_peft_model whatever the caller passes.
PEFTS_OWN = "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
# The user's data as the printed code reads it: train.jsonl with a "text" column, in the folder it runs in
RUNNER = """
import os, sys, json, warnings
warnings.simplefilter("error")
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
snippets = json.load(open(sys.argv[1]))
os.chdir(sys.argv[2])
with open("train.jsonl", "w") as f:
    for i in range(4):
        f.write(json.dumps({"text": " ".join(f"w{(i * 7 + j) % 50}" for j in range(12 + i))}) + "\\n")
for key, code in snippets.items():
    exec(compile(code, key, "exec"), {})
    print("ran", key, flush=True)
"""


def tiny_tokenizer():
    """A word-level tokenizer built here (nothing downloaded): what the printed code's AutoTokenizer loads."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<unk>", "<pad>", "<bos>", "<eos>", *(f"w{i}" for i in range(50))])}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    inner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


def recipe(q, c, rules) -> Recipe:
    """A configuration's recipe as a row prices it, at a micro-batch of 2."""
    return Recipe(2, 4 if accumulates(c.strategy) else 1, learning_rate(q, c, rules))


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
    tiny_tokenizer().save_pretrained(folder)
    return folder


def codes(invoke, model, gpu: str, wanted: list[tuple], db) -> dict[str, str]:
    result = invoke(
        "fit",
        "--model",
        model,
        "--gpu",
        gpu,
        "--seq-len",
        "16",
        "--method",
        "trainer",
        "--json",
        "--all",
        "--db",
        db,
    )  # Trainer's scripts (TRL's: test_the_printed_trl_scripts_...)
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
        (
            "lora",
            None,
            "fp32",
            "adamw",
            "selective-checkpointing",
            "none",
        ),  # QLoRA's pick's strategy, peft's model
        ("full", None, "fp32", "muon", "standard", "none"),
        ("full", None, "fp32", "schedule_free_adamw", "checkpointing+accumulation", "none"),
        ("full", None, "fp32", "adamw_bnb_8bit", "accumulation", "none"),
        ("full", None, "fp32", "adafactor", "standard", "none"),
    ]
    gpu = [
        ("qlora", 4, "bf16-mixed", "adamw", "checkpointing", "none"),
        ("full", None, "bf16", "adamw", "standard", "none"),
    ]
    snippets = codes(invoke, tiny_model, "cpu", cpu, db) | codes(invoke, tiny_model, "H100", gpu, db)
    for code in snippets.values():  # the user's script needs the libraries, never advisor
        assert "advisor" not in code.replace("advisor fit", ""), code
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
    q = question(resolve_model(str(QWEN), rules), FitRequest(gpu="A100-80GB", seq_len=256), rules)
    names = {f.name for f in fields(TrainingArguments)}
    for c in q.configs:
        args, code = training_code(q, c, q.adapter_of(c.adapter), rules, recipe(q, c, rules))
        assert set(args) <= names, (c, args)
        assert "gradient_checkpointing" not in code
        assert "optim" not in args or args["optim"] in {o.value for o in OptimizerNames}
        passed = rules.optimizer_info[c.optimizer].trainer is None
        assert ("optimizers=(optimizer, None)" in code) == passed
        assert ("LoraConfig(" in code) == (c.adapter != "full")
        assert ("BitsAndBytesConfig(load_in_4bit=True" in code) == (c.adapter == "qlora")
        assert ("deepspeed" in args) == (c.offload != "none")


# Every menu whose TrainingArguments differ: a CPU's, one GPU's (bf16 and, on a T4, fp16), 8 GPUs' (DDP, ZeRO,
# FSDP) and 2 nodes' (HSDP), with every adapter, precision, optimizer, strategy and offload that applies.
MENUS = [
    {"gpu": "cpu"},
    {"gpu": "H100"},
    {"gpu": "T4"},
    {"gpu": "H100", "gpus": 8},
    {"gpu": "H100", "gpus": 8, "nodes": 2},
]
BUILD = """
import json, logging, sys, warnings
warnings.simplefilter("error")
from accelerate.parallelism_config import ParallelismConfig
from transformers import TrainingArguments
from advisor.prediction.training_code.snippets import keyword_arguments

said = []
class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())
logging.getLogger("transformers").addHandler(Said(logging.WARNING))
for block, args, extra in json.load(open(sys.argv[1])):
    printed = {"TrainingArguments": TrainingArguments, "ParallelismConfig": ParallelismConfig}
    exec(block, printed)
    from_the_row = TrainingArguments(**keyword_arguments(args), **extra)
    assert printed["args"].to_dict() == from_the_row.to_dict(), block
    assert not said, (block, said)
try:  # the harness catches what users reported: the deprecated name raises here
    TrainingArguments(output_dir="out", gradient_checkpointing=True, use_cpu=True)
except FutureWarning:
    print("built", len(json.load(open(sys.argv[1]))), flush=True)
"""


def arguments_block(code: str) -> str:
    """The snippet's `args = TrainingArguments(...)` statement, as printed."""
    lines = code.splitlines()
    start = lines.index("args = TrainingArguments(")
    return "\n".join(lines[start : lines.index(")", start) + 1])


def printed_arguments(block: str) -> dict:
    """The keyword arguments a printed `TrainingArguments(...)` passes, as values (an object as its fields)."""
    call = ast.parse(block).body[0].value
    return {k.arg: _value(k.value) for k in call.keywords}


def _value(node: ast.expr):
    """A printed argument's value: a literal, or the fields of `ParallelismConfig(**{...})`."""
    return ast.literal_eval(node.keywords[0].value if isinstance(node, ast.Call) else node)


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_every_configurations_training_arguments_build_as_printed_with_warnings_as_errors(tmp_path):
    """Each distinct `args = TrainingArguments(...)` of the menus, exec'd as printed in `python -W error` (and
    transformers' logged warnings counted too), and built from the dict a row's training_arguments reads: the
    same arguments. A GPU's runs here with use_cpu=True added (bf16 without CUDA is a ValueError, not a
    warning); what the Trainer does later (bitsandbytes' optimizers, FSDP, DeepSpeed launched) is not run."""
    rules = load_rules()
    model = resolve_model(str(QWEN), rules)
    blocks: dict[str, tuple] = {}
    for menu in MENUS:
        q = question(model, FitRequest(seq_len=256, method="trainer", **menu), rules)  # Trainer's arguments
        for c in q.configs:
            args, code = training_code(q, c, q.adapter_of(c.adapter), rules, recipe(q, c, rules))
            block = arguments_block(code)
            assert printed_arguments(block) == args, c  # the code and the dict never drift
            extra = {} if q.device == "cpu" else {"use_cpu": True}  # a CPU's snippet has it already
            if extra:
                block = block.replace("(\n", "(\n    use_cpu=True,\n", 1)
            blocks.setdefault(block, (args, extra))
    assert {"fsdp", "deepspeed", "parallelism_config", "activation_checkpointing", "fp16", "bf16"} <= {
        k for args, _ in blocks.values() for k in args
    }
    (tmp_path / "blocks.json").write_text(json.dumps([[b, a, e] for b, (a, e) in blocks.items()]))
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", BUILD, str(tmp_path / "blocks.json")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"built {len(blocks)}" in run.stdout


def test_the_picks_training_arguments_make_trainers_arguments_without_a_warning():
    """The one-liner that takes the pick into a Trainer, with warnings as errors (the menu narrowed to full
    fine-tuning with AdamW: a cold trace of four configurations, not the whole menu's); the arguments are the
    printed snippet's (output_dir included), and a fresh dict each read."""
    import torch
    from transformers import TrainingArguments

    narrowed = dict(
        adapters=("full",), optimizers=("adamw",), strategies=("standard", "checkpointing"), method="trainer"
    )
    pick = advisor.fit(str(LLAMA_8B), gpu="H100", **narrowed).pick
    assert (
        pick.label == "full · bf16 · adamw · standard"
    )  # pure bf16: no bf16=True, which needs CUDA or use_cpu
    host = {} if torch.cuda.is_available() or not pick.training_arguments.get("bf16") else {"use_cpu": True}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        made = TrainingArguments(
            **advisor.fit(str(LLAMA_8B), gpu="H100", **narrowed).pick.training_arguments, **host
        )
    assert made.optim == "adamw_torch_fused" and made.activation_checkpointing is False
    assert pick.training_arguments == printed_arguments(arguments_block(pick.trainer_code))
    assert pick.training_arguments["output_dir"] == "out"
    pick.training_arguments["output_dir"] = "elsewhere"
    assert pick.training_arguments["output_dir"] == "out"


def test_hsdp_arguments_carry_accelerates_object_as_printed():
    """HSDP's parallelism_config: a ParallelismConfig in the keyword arguments (as the snippet builds it), its
    fields in the dict --json prints."""
    from accelerate.parallelism_config import ParallelismConfig

    rules = load_rules()
    options = FitRequest(gpu="H100", gpus=8, nodes=2, shardings=("hsdp",), seq_len=256)
    q = question(resolve_model(str(QWEN), rules), options, rules)
    args, code = training_code(
        q, q.configs[0], q.adapter_of(q.configs[0].adapter), rules, recipe(q, q.configs[0], rules)
    )
    made = keyword_arguments(args)["parallelism_config"]
    assert isinstance(made, ParallelismConfig) and (made.dp_replicate_size, made.dp_shard_size) == (2, 8)
    assert args["parallelism_config"] == {"dp_replicate_size": 2, "dp_shard_size": 8}
    assert "from accelerate.parallelism_config import ParallelismConfig" in code


# The columns each TRL method reads, as a user's train.jsonl holds them (four rows, words the tokenizer knows)
def _words(i: int, n: int) -> str:
    return " ".join(f"w{(i * 7 + j) % 50}" for j in range(n))


TRL_ROWS = {
    "sft": [{"text": _words(i, 12 + i)} for i in range(4)],
    "dpo": [
        {"prompt": _words(i, 4), "chosen": _words(i + 1, 6), "rejected": _words(i + 2, 5)} for i in range(4)
    ],
    "reward": [{"chosen": _words(i, 8), "rejected": _words(i + 3, 7)} for i in range(4)],
    "grpo": [{"prompt": _words(i, 6)} for i in range(4)],
}
TRL_RUNNER = """
import os, sys, json, warnings
warnings.simplefilter("error")
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# TRL 1.16's own: DPOTrainer's reference forward turns checkpointing off by transformers' deprecated names
warnings.filterwarnings("ignore", message="`gradient_checkpointing_(dis|en)able` is deprecated", category=FutureWarning)
scripts = json.load(open(sys.argv[1]))
os.chdir(sys.argv[2])
for key, (code, rows) in scripts.items():
    with open("train.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\\n" for r in rows)
    exec(compile(code, key, "exec"), {})
    print("ran", key, flush=True)
"""


@pytest.mark.slow
def test_the_printed_trl_scripts_train_a_tiny_model_on_their_columns(invoke, tiny_model, tmp_path):
    """SFT, DPO (the reference a frozen copy, the disabled adapter, precomputed), a reward model and GRPO
    (without a reference, with the disabled adapter, with a copy loaded from the model's folder): each printed
    TRL script trains the tiny model on a train.jsonl with its method's columns, warnings as errors."""
    db = tmp_path / "kb.sqlite"
    asked = [
        ("sft", "full", None, "checkpointing"),
        ("sft", "lora", None, "accumulation"),
        ("sft", "full", None, "selective-checkpointing"),
        ("dpo", "full", None, "standard"),
        ("dpo", "lora", None, "checkpointing"),
        ("dpo", "full", "precomputed", "standard"),
        ("reward", "lora", None, "standard"),
        ("reward", "full", None, "accumulation"),
        ("grpo", "full", None, "accumulation"),
        ("grpo", "lora", "adapter", "checkpointing"),
        ("grpo", "full", "model", "standard"),
    ]
    scripts = {}
    for method, adapter, reference, strategy in asked:
        extra = ["--reference", reference] if reference else []
        if method == "grpo":
            extra += ["--beta", "0.04"] if reference else []
        result = invoke(
            "fit", "--model", tiny_model, "--gpu", "cpu", "--seq-len", "16", "--method", method,
            "--adapter", adapter, "--optimizer", "adamw", "--strategy", strategy, *extra, "--json", "--db", db,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)["configurations"]
        code = rows[0]["code"]
        assert "advisor" not in code.replace("advisor fit", ""), code
        assert "MAX_LENGTH = 16" in code
        lengths = (
            "max_completion_length=MAX_COMPLETION_LENGTH" if method == "grpo" else "max_length=MAX_LENGTH"
        )
        assert lengths in code
        scripts[f"{method}/{adapter}/{reference}/{strategy}"] = (code, TRL_ROWS[method])
    (tmp_path / "scripts.json").write_text(json.dumps(scripts))
    run = subprocess.run(
        [sys.executable, "-c", TRL_RUNNER, str(tmp_path / "scripts.json"), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.count("ran ") == len(scripts)
