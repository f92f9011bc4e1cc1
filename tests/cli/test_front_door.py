"""The front door: models and GPUs by the names people use, memory in the unit on the box, and a first
answer short enough to read."""

import ast
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from advisor.errors import ModelNotResolved
from advisor.model_ref import resolve_model, shipped_model, shipped_models
from advisor.prediction import accelerators
from advisor.rules import load_rules

QUICK = ("--adapter", "full", "--dtype", "bf16-mixed", "--optimizer", "adamw", "--strategy", "standard")


@pytest.mark.parametrize("name", sorted(shipped_models()))
def test_a_published_model_answers_to_its_name_hub_id_and_aliases(name):
    rules = load_rules()
    entry = shipped_models()[name]
    spellings = [name, name.upper(), name.lower().replace("-", "_"), entry["hub"], *entry.get("aliases", ())]
    for spelling in spellings:
        model = resolve_model(spelling, rules)
        assert model.name == name and model.config_path == shipped_model(name)[1], spelling
    family = "vlm" if model.model_type == "gemma3" else "decoder"
    assert model.family.name == family and model.approx_params > 4e8
    assert model.hub_id == entry["hub"] and model.architecture_of is None
    for variant, hub in entry.get("variants", {}).items():  # an instruct model: its own name and Hub id
        for spelling in (variant, variant.lower(), hub):
            named = resolve_model(spelling, rules)
            assert (named.name, named.hub_id, named.architecture_of) == (variant, hub, name), spelling
            assert named.config_hash == model.config_hash  # the base's config: its traces serve both


def test_a_folder_of_the_same_name_wins_over_the_shipped_config(tmp_path, monkeypatch):
    folder = tmp_path / "llama-3.1-8b"
    folder.mkdir()
    config = json.loads(shipped_model("llama-3.1-8b")[1].read_text()) | {"num_hidden_layers": 2}
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    model = resolve_model("llama-3.1-8b", load_rules())
    assert model.name == "llama-3.1-8b" and model.config["num_hidden_layers"] == 2


def test_an_unknown_hub_id_offline_gives_the_command_that_fetches_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotResolved, match="hf download someorg/some-model config.json"):
        resolve_model("someorg/some-model", load_rules())


def test_an_ambiguous_gpu_lists_the_choices_and_a_unique_prefix_resolves():
    rules = load_rules()
    with pytest.raises(accelerators.UnknownAccelerator, match="a100-40gb .40 GB., a100-80gb .80 GB."):
        accelerators.resolve("A100", rules)
    with pytest.raises(accelerators.UnknownAccelerator, match="v100-16gb"):
        accelerators.resolve("v100", rules)
    assert accelerators.resolve("mi300", rules).key == "mi300x"
    assert accelerators.resolve("NVIDIA A100-SXM4-40GB", rules).key == "a100-40gb"  # as CUDA names it


def test_memory_is_shown_and_taken_in_the_unit_on_the_box(invoke):
    """A "24 GB" RTX 4090 shows as 24 GiB, and --memory 24 is the same budget as that card."""
    qwen = "qwen2.5-0.5b"
    text = invoke("fit", "--model", qwen, "--gpu", "RTX4090", *QUICK).output
    assert "NVIDIA GeForce RTX 4090: 24 GiB" in text
    card = json.loads(invoke("fit", "--model", qwen, "--gpu", "RTX4090", *QUICK, "--json").output)
    budget = json.loads(invoke("fit", "--model", qwen, "--memory", "24", *QUICK, "--json").output)
    assert (
        budget["accelerator"]["memory_gb"] == card["accelerator"]["memory_gb"] == round(24 * 2**30 / 1e9, 3)
    )
    assert card["accelerator"]["memory_gib"] == 24
    listed = invoke("fit", "--list-gpus").output
    assert "24" in next(line for line in listed.splitlines() if line.startswith("rtx4090"))


def test_the_first_answer_is_short_and_the_rest_is_a_flag_away(invoke):
    args = ("fit", "--model", "qwen2.5-0.5b", "--gpu", "L4", *QUICK)
    short, whole = invoke(*args).output, invoke(*args, "--verbose").output
    assert len(short.splitlines()) <= 20 and "The pick" in short and "--verbose" in short
    assert "Where the memory goes" in whole and "Assumptions" in whole and "SFTConfig(" in whole  # TRL's SFT
    code = invoke(*args, "--code").output
    ast.parse(code)  # the pick's code alone: it parses as Python, nothing else printed
    assert "SFTConfig(" in code and "SFTTrainer(" in code and "advisor fit" not in code
    answer = invoke("recommend", "--arch", "encoder", "--optimize", "memory", "--max-memory", "24").output
    assert len(answer.splitlines()) <= 20 and "not applied" in answer and "--verbose" in answer


def test_list_models_names_every_shipped_model(invoke):
    listed = invoke("fit", "--list-models").output
    assert all(name in listed for name in shipped_models())


class _Hub(http.server.BaseHTTPRequestHandler):
    """The Hugging Face Hub's file endpoint (GET of /{repo}/resolve/main/{file}, its commit in X-Repo-Commit),
    for one config.json, on this machine."""

    body = json.dumps(json.loads(shipped_model("qwen2.5-0.5b")[1].read_text())).encode()
    asked: list[str] = []

    def _headers(self) -> bool:
        self.asked.append(f"{self.command} {self.path}")
        if self.path != "/someorg/small-qwen/resolve/main/config.json":
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            return False
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.sha1(self.body).hexdigest()}"')
        self.send_header("X-Repo-Commit", "a" * 40)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        return True

    def do_HEAD(self):
        self._headers()

    def do_GET(self):
        if self._headers():
            self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_a_hub_id_fetches_its_config_alone_when_online_then_answers_offline(tmp_path):
    """Online, a Hub id nothing local has fetches config.json (and nothing else) into the HF cache; offline
    afterwards, the cache answers. The Hub is a local server speaking its download protocol (HF_ENDPOINT)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    code = (
        "from advisor.model_ref import resolve_model; from advisor.rules import load_rules\n"
        "m = resolve_model('someorg/small-qwen', load_rules()); print(m.name, m.family.name, m.approx_params)"
    )
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HOME": str(tmp_path)}
    try:
        for offline in ("0", "1"):
            out = subprocess.run(
                [sys.executable, "-c", code],
                env=env | {"HF_HUB_OFFLINE": offline},
                capture_output=True,
                text=True,
            )
            assert out.stdout.split() == ["someorg/small-qwen", "decoder", "493961216"], out.stderr
    finally:
        server.shutdown()
    fetched = [a for a in _Hub.asked if "/resolve/" in a]
    assert fetched == ["GET /someorg/small-qwen/resolve/main/config.json"]  # once, then the cache


@pytest.mark.parametrize(
    "typed, nearest",
    [
        ("lama-3.1-8b", "Llama-3.1-8B"),
        ("qwen-2.5-7b-instrct", "Qwen2.5-7B-Instruct"),
        ("qwen3-30b-a3", "Qwen3-30B-A3B"),
    ],
)
def test_a_misspelled_model_gets_the_nearest_names(invoke, typed, nearest):
    result = invoke("fit", "--model", typed, "--gpu", "H100")
    assert result.exit_code != 0 and "Did you mean:" in result.output and nearest in result.output
    assert "Traceback" not in result.output


def test_list_models_shows_every_name_whole_with_current_families(invoke):
    """Qwen3 dense and mixture-of-experts, SmolLM2, each with its model type, aliases and instruct variants."""
    result = invoke("fit", "--list-models", env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for needle in (
        "Qwen3-8B",
        "qwen3",
        "Qwen3-30B-A3B",
        "qwen3_moe",
        "SmolLM2-1.7B-Instruct",
        "Qwen2.5-7B-Instruct",
    ):
        assert needle in result.output, needle


def test_advisor_help_points_to_fit_first(invoke):
    result = invoke("--help")
    commands = result.output.split("Commands:")[1].split()
    assert commands[0] == "fit" and "advisor fit --model" in result.output.split("Commands:")[0]


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_a_cold_trace_prints_its_stages_and_no_librarys_notices(tmp_path):
    """torchao's absent CUDA kernels, bitsandbytes' `kernels` trust check with the Hub offline, torch's notices
    of torchao's registrations: none reaches the user's terminal while a trace runs; its stages do."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("ADVISOR_DB", None)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    config = json.loads(shipped_model("qwen2.5-0.5b")[1].read_text()) | {"num_hidden_layers": 2}
    config.pop("layer_types")  # one per layer: transformers refuses a list of another length
    (tiny / "config.json").write_text(json.dumps(config))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "advisor",
            "fit",
            "--model",
            str(tiny),
            "--gpu",
            "A10G",
            "--adapter",
            "qlora",
            "--optimizer",
            "adamw_torch_8bit",
            "--strategy",
            "standard",
            "--seq-len",
            "32",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # fmt: skip
    )
    assert run.returncode == 0, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines and all(line.startswith(("tracing ", "[")) for line in lines), lines
