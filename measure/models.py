"""Building the model of a cell: a family's reference model at a preset (tiny, small, paper), or a user's
model from a local folder or a cached Hugging Face id.

Models are built from configs (random init) unless pretrained weights are on disk; the run records which.
"""

from __future__ import annotations

from dataclasses import dataclass

from measure.families import Family, Shape, family
from measure.families.base import Sizes, from_config


@dataclass
class BuiltModel:
    model: object  # a transformers PreTrainedModel
    family: Family
    shape: Shape
    pretrained: bool
    n_params: int
    name: str


def reference_family(model: str, rules=None) -> Family | None:
    """The family whose reference model is called `model` ('vit', 'llama', ...), or None."""
    from advisor.rules import load_rules

    rules = rules or load_rules()
    name = rules.reference_models().get(model)
    return family(name, rules) if name else None


def build_model(
    model: str,
    preset: str,
    dropout: float | None = None,
    seed: int = 0,
    rules=None,
    sizes: Sizes | None = None,
) -> BuiltModel:
    """A reference model ('vit', 'modernbert', 'llama', 'nanovlm') at a preset, or an HF id / local folder;
    sized to the data (`sizes`: sequence length, image size, classes; ValueError where a model cannot be)."""
    import torch

    torch.manual_seed(seed)  # random init is part of the seed's run
    fam = reference_family(model, rules)
    if fam is not None:
        config, shape = sized_reference(fam, preset, sizes or Sizes(), rules)
        if dropout is not None:
            set_dropout(config, dropout)
        net = from_config(fam.model_class(), config)
        pretrained = False
    else:
        net, fam, shape, pretrained = _user_model(model, dropout, rules, sizes or Sizes())
    net.train()
    n_params = sum(p.numel() for p in net.parameters())
    return BuiltModel(net, fam, shape, pretrained, n_params, model)


def reference_config(fam: Family, preset: str, rules=None):
    from advisor.rules import load_rules

    presets = (rules or load_rules()).presets
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(presets)}")
    return fam.reference_config(preset)


def sized_reference(fam: Family, preset: str, sizes: Sizes, rules=None):
    """(config, shape) of a family's reference model at a preset, built to the sizes asked for."""
    config, shape = reference_config(fam, preset, rules)
    return fam.sized(config, shape, sizes, reference=True)


def sized_user_config(name: str, sizes: Sizes, rules=None):
    """(config, family, shape) of a user's model, with the tokenizer and image normalisation its folder
    carries, checked against the sizes asked for (ValueError saying what does not fit)."""
    config, fam, shape = user_config(name, rules)
    config, shape = fam.sized(config, shape, carried(model_folder(name, rules), sizes), reference=False)
    return config, fam, shape


def model_folder(name: str, rules=None):
    """The local folder (or cached snapshot) of a user's model."""
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    return resolve_model(name, rules or load_rules()).config_path.parent


def carried(folder, sizes: Sizes) -> Sizes:
    """The sizes with what a model's folder carries: its tokenizer, its image processor's normalisation."""
    import json
    from dataclasses import replace

    from measure.tokenizer import carries_tokenizer, from_folder

    if sizes.tokenizer is None and carries_tokenizer(folder):
        sizes = replace(sizes, tokenizer=from_folder(folder, folder.name))
    processor = folder / "preprocessor_config.json"
    if processor.is_file() and sizes.image_mean is None:
        spec = json.loads(processor.read_text())
        mean, std = spec.get("image_mean"), spec.get("image_std")
        if mean and std and spec.get("do_normalize", True):
            sizes = replace(sizes, image_mean=tuple(mean), image_std=tuple(std))
    return sizes


def reference_shape(model: str, preset: str, rules=None) -> tuple[Family, Shape]:
    """The family and data shape of a reference model at a preset, without building (initialising) it."""
    fam = reference_family(model, rules)
    if fam is None:
        raise ValueError(f"{model!r} is not a reference model")
    return fam, reference_config(fam, preset, rules)[1]


def set_dropout(config, p: float) -> None:
    """Every dropout probability of a config (and its sub-configs) set to p."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and "dropout" in key:
            setattr(config, key, p)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            set_dropout(value, p)


def user_config(name: str, rules=None):
    """(transformers config, family, data shape) of a local folder or a cached HF id, offline."""
    from transformers import AutoConfig

    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    rules = rules or load_rules()
    resolved = resolve_model(name, rules)
    config = AutoConfig.from_pretrained(str(resolved.config_path.parent), local_files_only=True)
    fam = family(resolved.family.name, rules)
    return config, fam, fam.shape_of(config)


def _user_model(name: str, dropout: float | None, rules, sizes: Sizes):
    """A local folder or a cached HF id: family from model_type via rules/, weights when present."""
    from advisor.rules import load_rules

    rules = rules or load_rules()
    config, fam, shape = sized_user_config(name, sizes, rules)
    folder = model_folder(name, rules)
    if dropout is not None:
        set_dropout(config, dropout)
    cls = fam.model_class()
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if has_weights:
        net = cls.from_pretrained(str(folder), config=config, local_files_only=True)
    else:
        net = from_config(cls, config)
    return net, fam, shape, has_weights
