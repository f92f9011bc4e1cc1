"""A config.json checked by the model's own transformers config class before it is built (its fields' types
and validators, its activations, dtypes and layer types, the even width RoPE rotates): whatever transformers
would refuse, or build and then fail on in the first step, is one sentence naming its key. On the trace's path
(transformers is imported); the cheap checks every command makes live in advisor.model_config."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from advisor.errors import ModelNotResolved
from advisor.model_config import printable, sub_configs

# a field that names an activation (hidden_act, hidden_activation, activation_function, projector_hidden_act)
ACTIVATION = re.compile(r"(?:^|_)(?:act|activation|activation_function|act_fn)$")
LAYER_KINDS = ("layer_types", "mlp_layer_types")  # what PreTrainedConfig.validate_layer_type checks
ALIASES = {"torch_dtype": "dtype"}  # PreTrainedConfig takes torch_dtype, the older name, for dtype


def built(config: dict, path: Path):
    """The transformers config of a model's config.json, each value first checked by the model's own config
    class (its fields' types and validators, its activations, dtypes and layer types, the even width RoPE
    rotates): whatever transformers would refuse, or build and then fail on in the first step, is one sentence
    naming its key. What the class refuses past these checks is one sentence too."""
    from huggingface_hub.errors import StrictDataclassError

    cls = _config_class(config.get("model_type"), "model_type", path)
    try:
        _values(config, cls, "", path)
        return cls.from_dict(copy.deepcopy(config))
    except ModelNotResolved:
        raise
    except (StrictDataclassError, ValueError, TypeError, LookupError, AttributeError) as e:
        cause = e.__cause__ if isinstance(e, StrictDataclassError) and e.__cause__ else e
        _layer_types_refused(config, str(cause), path)
        raise ModelNotResolved(f"{path}: transformers' {cls.__name__} refuses it: {said(cause)}") from e


def _config_class(model_type, key: str, path: Path):
    """transformers' config class of a model_type (CONFIG_MAPPING), or a sentence naming the key."""
    from transformers import CONFIG_MAPPING, __version__

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ModelNotResolved(
            f"{path}: {key} {json.dumps(model_type)[:60]} is not one transformers {__version__} knows."
        )
    return CONFIG_MAPPING[model_type]


def _values(config: dict, cls, where: str, path: Path) -> None:
    """Every value of the config (`where`: a sub-config's key path) against `cls`: its fields' own validators
    (@strict's types, an interval), then what the class takes a free string for and fails on later (an
    activation, a dtype, a layer type), then each sub-config against its own class, then RoPE's width."""
    checks = getattr(cls, "__validators__", {})
    for key, value in config.items():
        name = cls.attribute_map.get(key, ALIASES.get(key, key))
        for index, check in enumerate(checks.get(name, ())):
            try:
                check(value)
            except (ValueError, TypeError) as e:
                reason = (
                    f"takes {_kind(cls, name)} there" if index == 0 else f"refuses it ({said(e).rstrip('.')})"
                )
                raise ModelNotResolved(
                    f"{path}: {where}{key} is {_shown(value)}; {cls.__name__} {reason}."
                ) from e
        _free_string(cls, name, value, f"{where}{key}", path)
    for key, spec in getattr(cls, "sub_configs_defaults", {}).items():
        sub = config.get(key)
        if isinstance(sub, dict) and key != "backbone_config":  # a backbone may be timm's, not a config
            _values(sub, _sub_class(spec, sub, f"{where}{key}.model_type", path), f"{where}{key}.", path)
    _rotary(config, cls, where, path)


def _sub_class(spec, sub: dict, key: str, path: Path):
    """The class a sub-config is built with, as SubConfigSpec.create_subconfig picks it."""
    from transformers import PreTrainedConfig

    if isinstance(spec.config_class, type) and issubclass(spec.config_class, PreTrainedConfig):
        return spec.config_class
    return _config_class(sub.get("model_type", spec.model_type), key, path)


def _free_string(cls, name: str, value, key: str, path: Path) -> None:
    """A string the class takes as any string and the model fails on later: an activation that ACT2FN lacks
    (a field named so whose default is one of ACT2FN's), a dtype torch lacks."""
    field = cls.__dataclass_fields__.get(name)
    default = field.default if field else None
    if isinstance(value, str) and isinstance(default, str) and ACTIVATION.search(name):
        from transformers.activations import ACT2FN

        if default in ACT2FN and value not in ACT2FN:
            raise ModelNotResolved(
                f"{path}: {key} is {_shown(value)}, not an activation transformers has: "
                f"{', '.join(sorted(ACT2FN))}."
            )
    if name == "dtype" and isinstance(value, str):
        import torch

        if not isinstance(getattr(torch, value, None), torch.dtype):
            raise ModelNotResolved(
                f"{path}: {key} is {_shown(value)}, not a torch dtype (float32, bfloat16, float16, ...)."
            )


def _layer_types_refused(config: dict, message: str, path: Path) -> None:
    """Layer types the class refused (PreTrainedConfig.validate_layer_type, after the class's own __post_init__
    made them what it builds), said with the key and the entry at fault where the config.json holds it."""
    for where, sub in sub_configs(config):
        for key in LAYER_KINDS:
            if f"`{key}`" in message and sub.get(key) is not None:
                _layer_types(sub[key], f"{where}{key}", path)


def _layer_types(value, key: str, path: Path) -> None:
    """Each entry one of the layer types transformers builds, its older names mapped as transformers maps them."""
    from transformers.configuration_utils import (
        ALLOWED_ATTN_LAYER_TYPES,
        ALLOWED_MLP_LAYER_TYPES,
        remap_legacy_layer_types,
    )

    allowed = ALLOWED_MLP_LAYER_TYPES if key.endswith("mlp_layer_types") else ALLOWED_ATTN_LAYER_TYPES
    if not isinstance(value, list):
        raise ModelNotResolved(f"{path}: {key} is {_shown(value)}; it must be a list of layer types.")
    for entry in value:
        if not isinstance(entry, str) or remap_legacy_layer_types([entry])[0] not in allowed:
            raise ModelNotResolved(
                f"{path}: {key} holds {_shown(entry)}, not a layer type transformers builds: "
                f"{', '.join(allowed)}."
            )


def _rotary(config: dict, cls, where: str, path: Path) -> None:
    """A head RoPE rotates whole is of even width (rotate_half splits it in two): transformers refuses an odd
    one above 4 dimensions, builds one of 3 and then fails in the first step. Its width as the class derives
    it: head_dim, else hidden_size // num_attention_heads, the class's defaults where the config is silent."""
    fields = cls.__dataclass_fields__
    if "rope_parameters" not in fields:  # not a model that rotates
        return
    value = lambda key: config.get(key, getattr(fields.get(key), "default", None))  # noqa: E731
    hidden, heads, head_dim = value("hidden_size"), value("num_attention_heads"), value("head_dim")
    derived = head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0
    if derived:
        head_dim = hidden // heads if hidden % heads == 0 else None  # else refused where it is read (_shapes)
    if not isinstance(head_dim, int) or head_dim % 2 == 0:
        return
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    rope = rope if isinstance(rope, dict) else {}
    factor = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if isinstance(factor, int | float) and int(head_dim * factor) != head_dim:
        return  # a partial rotary part is rounded up to even, and fits
    source = f" ({where}hidden_size {hidden} / {where}num_attention_heads {heads})" if derived else ""
    raise ModelNotResolved(
        f"{path}: {where}head_dim is {head_dim}{source}, an odd width: RoPE rotates pairs of dimensions, so "
        "a head it rotates whole must be even."
    )


def _kind(cls, name: str) -> str:
    """A field's annotation as words: 'a bool', 'one of int | float | None' (module paths left out)."""
    kind = cls.__dataclass_fields__[name].type
    text = re.sub(
        r"\b(?:[A-Za-z_]\w*\.)+(\w+)", r"\1", kind.__name__ if isinstance(kind, type) else str(kind)
    )
    return f"one of {text}" if "|" in text else f"a {text}"


def _shown(value) -> str:
    """A config value as JSON, escaped and short: what a sentence quotes of it."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "…"


def said(e: BaseException) -> str:
    """A library's message as part of a sentence: its first line, control characters escaped, at most 200
    characters (a validator may quote a whole list back)."""
    lines = str(e).strip().splitlines() or [type(e).__name__]
    text = printable(lines[0] if not isinstance(e, KeyError) else f"no {lines[0]}")
    return text if len(text) <= 200 else text[:200] + "…"
