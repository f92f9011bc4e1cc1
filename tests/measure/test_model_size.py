"""advisor's torch-free parameter count of a config (the scale an answer states) against the model
transformers builds from it, on the meta device (no memory)."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from advisor.model_ref import config_params  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures"
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
