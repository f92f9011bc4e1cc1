"""Building the model of a cell: a family's reference model at a preset (tiny, small, paper), or a user's
model from its config (a local folder or a cached Hugging Face id), both from a `ResolvedModel`.

Models are built from configs (random init) unless pretrained weights are on disk; the run records which.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from advisor.measuring.data.shape import Shape
from advisor.measuring.data.tokenizer import carries_tokenizer, from_folder
from advisor.measuring.model.config_class import built
from advisor.measuring.model.families import Family, family_of
from advisor.measuring.model.families.base import Sizes, from_config
from advisor.model_ref import ResolvedModel
from advisor.rules import Rules

MARKER = "advisor-base.json"  # what makes a folder a base advisor pretrain wrote (and may replace)


@dataclass
class BuiltModel:
    model: object  # a transformers PreTrainedModel
    family: Family
    shape: Shape
    pretrained: bool
    n_params: int
    name: str
    base: dict | None = (
        None  # what advisor pretrain recorded of the weights (advisor-base.json), if it made them
    )


def build_model(
    model: ResolvedModel,
    preset: str,
    rules: Rules,
    dropout: float | None = None,
    seed: int = 0,
    sizes: Sizes | None = None,
) -> BuiltModel:
    """A reference model at a preset, or a user's model; sized to the data (`sizes`: sequence length, image
    size, classes; ValueError where a model cannot be)."""
    import torch

    torch.manual_seed(seed)  # random init is part of the seed's run
    fam = family_of(model, rules)
    if model.reference:
        config, shape = sized_reference(fam, preset, sizes or Sizes(), rules)
        if dropout is not None:
            set_dropout(config, dropout)
        net, pretrained = from_config(fam.model_class(), config), False
    else:
        net, shape, pretrained = _user_model(model, fam, dropout, sizes or Sizes(), rules)
    net.train()
    n_params = sum(p.numel() for p in net.parameters())
    return BuiltModel(
        net, fam, shape, pretrained, n_params, model.name, base_record(model) if pretrained else None
    )


def base_record(model: ResolvedModel) -> dict | None:
    """What a run records of a base advisor pretrain made: the recipe, the reference model and preset it
    started from, its final held-out losses, where and with what it was trained (its advisor-base.json, less
    the curve); None for weights from elsewhere, or a record that does not read."""
    path = model.config_path.parent / MARKER
    try:
        if path.stat().st_size > 1_000_000:  # a record is a few kB
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        keep = ("model", "preset", "parameters", "recipe", "trained_s", "hardware", "versions")
        out = {**{k: record[k] for k in keep}, "final": record["curve"][-1]}
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    return out if _plain(out) else None  # it comes from a file: only short plain values reach the KB


def _plain(value, depth: int = 0) -> bool:
    """Whether a JSON value holds only finite numbers and short strings without markup or control
    characters, nested at most three deep."""
    if isinstance(value, dict):
        return depth < 3 and all(_plain(k, depth) and _plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    return (
        isinstance(value, str)
        and len(value) <= 200
        and not any(c in value for c in "<>&")
        and value.isprintable()
    )


def reference_config(fam: Family, preset: str, rules: Rules):
    if preset not in rules.presets:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(rules.presets)}")
    return fam.reference_config(preset)


def sized_reference(fam: Family, preset: str, sizes: Sizes, rules: Rules):
    """(config, shape) of a family's reference model at a preset, built to the sizes asked for."""
    config, shape = reference_config(fam, preset, rules)
    return fam.sized(config, shape, sizes, reference=True)


def model_config(model: ResolvedModel, rules: Rules):
    """The transformers config of a model: a reference model's at its preset, a user's from its
    config.json as it was read."""
    if model.reference:
        return reference_config(family_of(model, rules), model.preset, rules)[0]
    return transformers_config(model)


def transformers_config(model: ResolvedModel):
    """A user's model's config as transformers builds it, from the config.json read once (no second read),
    each value checked by its own config class first (advisor.measuring.model.config_class.built): ModelNotResolved, one
    sentence naming the key."""
    return built(dict(model.config), model.config_path or model.name)


def user_config(model: ResolvedModel, rules: Rules):
    """(transformers config, family, data shape) of a user's model, offline."""
    config = transformers_config(model)
    fam = family_of(model, rules)
    return config, fam, fam.shape_of(config)


def sized_user_config(model: ResolvedModel, sizes: Sizes, rules: Rules):
    """(config, family, shape) of a user's model, with the tokenizer and image normalisation its folder
    carries, checked against the sizes asked for (ValueError saying what does not fit)."""
    config, fam, shape = user_config(model, rules)
    config, shape = fam.sized(config, shape, carried(model.config_path.parent, sizes), reference=False)
    return config, fam, shape


def carried(folder, sizes: Sizes) -> Sizes:
    """The sizes with what a model's folder carries: its tokenizer, its image processor's normalisation."""
    if sizes.tokenizer is None and carries_tokenizer(folder):
        sizes = replace(sizes, tokenizer=from_folder(folder, folder.name))
    processor = folder / "preprocessor_config.json"
    if processor.is_file() and sizes.image_mean is None:
        spec = json.loads(processor.read_text())
        mean, std = spec.get("image_mean"), spec.get("image_std")
        if mean and std and spec.get("do_normalize", True):
            sizes = replace(sizes, image_mean=tuple(mean), image_std=tuple(std))
    return sizes


def reference_shape(model: ResolvedModel, preset: str, rules: Rules) -> tuple[Family, Shape]:
    """The family and data shape of a reference model at a preset, without building (initialising) it."""
    if not model.reference:
        raise ValueError(f"{model.name!r} is not a reference model")
    fam = family_of(model, rules)
    return fam, reference_config(fam, preset, rules)[1]


def has_weights(model: ResolvedModel) -> bool:
    """Whether a model is built with pretrained weights: a user's folder that holds them (a reference model,
    or a config alone, is initialised at random)."""
    if model.reference or model.config_path is None:
        return False
    folder = model.config_path.parent
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))


def set_dropout(config, p: float) -> None:
    """Every dropout probability of a config (and its sub-configs) set to p."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and "dropout" in key:
            setattr(config, key, p)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            set_dropout(value, p)


def _user_model(model: ResolvedModel, fam: Family, dropout: float | None, sizes: Sizes, rules: Rules):
    """A user's model: its config sized to the run, weights when its folder holds them."""
    config, _, shape = sized_user_config(model, sizes, rules)
    folder = model.config_path.parent
    if dropout is not None:
        set_dropout(config, dropout)
    cls = fam.model_class()
    pretrained = has_weights(model)
    if pretrained:
        net = cls.from_pretrained(str(folder), config=config, local_files_only=True)
    else:
        net = from_config(cls, config)
    return net, shape, pretrained
