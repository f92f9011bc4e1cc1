"""advisor's torch-free parameter count of a config (the scale an answer states) against the model
transformers builds from it, on the meta device (no memory)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from advisor.model_ref import config_params  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
CONFIGS = sorted(
    p.parent for p in (FIXTURES / "configs").glob("*/config.json") if p.parent.name != "t5-small"
)


@pytest.mark.parametrize("folder", CONFIGS, ids=lambda p: p.name)
def test_the_count_from_the_config_is_within_two_percent_of_the_built_model(folder):
    config = transformers.AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        try:
            model = transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:  # not a causal LM: the base model (ViT, ModernBERT)
            model = transformers.AutoModel.from_config(config)
    built = sum(p.numel() for p in model.parameters())
    counted = config_params(json.loads((folder / "config.json").read_text()))
    assert counted == pytest.approx(built, rel=0.02), folder.name  # decoders within 0.01 %


def test_a_config_without_dimensions_has_no_count():
    assert config_params({"model_type": "t5"}) is None


# The published parameter counts of the models advisor ships configs of (models/index.toml), as their model
# cards state them (Llama 3.x, Qwen2.5 and Gemma give them exactly; the rest to the digits shown).
PUBLISHED = {
    "Llama-3.2-1B": 1.24e9,
    "Llama-3.2-3B": 3.21e9,
    "Llama-3.1-8B": 8.03e9,
    "Llama-3.1-70B": 70.6e9,
    "Llama-3.3-70B-Instruct": 70.6e9,
    "Llama-3.1-405B": 406e9,
    "Mistral-7B-v0.3": 7.25e9,
    "Mistral-Nemo-Base-2407": 12.2e9,
    "Mixtral-8x7B-v0.1": 46.7e9,
    "Mixtral-8x22B-v0.1": 141e9,
    "Qwen2.5-0.5B": 0.49e9,
    "Qwen2.5-1.5B": 1.54e9,
    "Qwen2.5-3B": 3.09e9,
    "Qwen2.5-7B": 7.61e9,
    "Qwen2.5-14B": 14.7e9,
    "Qwen2.5-32B": 32.5e9,
    "Qwen2.5-72B": 72.7e9,
    "gemma-2-2b": 2.61e9,
    "gemma-2-9b": 9.24e9,
    "gemma-2-27b": 27.2e9,
    "gemma-3-1b-pt": 1.0e9,
    "gemma-3-4b-pt": 4.3e9,
    "gemma-3-12b-pt": 12.2e9,
    "gemma-3-27b-pt": 27.4e9,
    "SmolLM2-1.7B": 1.71e9,
    "Qwen3-0.6B": 0.6e9,
    "Qwen3-1.7B": 1.72e9,  # the card rounds to 1.7B: 1.4B besides embeddings of 151,936 x 2,048
    "Qwen3-4B": 4.0e9,
    "Qwen3-8B": 8.2e9,
    "Qwen3-14B": 14.8e9,
    "Qwen3-32B": 32.8e9,
    "Qwen3-30B-A3B": 30.5e9,
    "Qwen3-235B-A22B": 235e9,
    "Phi-3-mini-4k-instruct": 3.82e9,
    "Phi-3-medium-4k-instruct": 14.0e9,
    "phi-4": 14.7e9,
    "SmolLM3-3B": 3.08e9,
    "Mistral-Small-24B-Base-2501": 23.6e9,
    "gpt-oss-20b": 20.9e9,  # 21B on the card; 3.6B active
    "gpt-oss-120b": 116.8e9,  # 117B on the card; 5.1B active
}
MODELS = Path(__file__).parents[1] / "models"


def test_every_shipped_config_builds_the_published_model():
    """Each shipped config (written by hand from the model's published one) builds, on the meta device,
    the parameter count its model card states: a wrong width, depth or vocabulary would show."""
    shipped = {p.parent.name for p in MODELS.glob("*/config.json")}
    assert shipped == set(PUBLISHED)
    for name, published in PUBLISHED.items():
        config = transformers.AutoConfig.from_pretrained(MODELS / name)
        auto = transformers.AutoModelForImageTextToText if config.model_type == "gemma3" else None
        with torch.device("meta"):
            model = (auto or transformers.AutoModelForCausalLM).from_config(config)
        built = sum(p.numel() for p in model.parameters())
        assert built == pytest.approx(published, rel=0.01), name
