"""A model's config.json read as untrusted input: parsed, and its numbers and depth checked once, where it is
read (advisor.model_ref.read_config), so that no later step (a family's builder, the tracer, transformers
itself) meets a size of zero, a NaN, a string where a count belongs or nesting deep enough to exhaust
Python's stack. Each bad value is one sentence naming its key.

What only the model's own config class knows (a bool, a float, an activation, a dtype, a layer type, the
width RoPE rotates) is checked by that class where the config is built (`built`, on the trace's path: it
imports transformers, which an answer from the cache never does)."""

from __future__ import annotations

import copy
import json
import math
import re
import unicodedata
from pathlib import Path

from advisor.errors import ModelNotResolved

# a config.json read from a folder is capped as advisor.hub caps one from the Hub (a test holds them equal): the
# largest published ones are tens of kB
MOST_CONFIG_BYTES = 4 << 20  # a config.json is a few kB; the largest published ones are tens of kB
MOST_DEPTH = 16  # configs nest a few levels (text_config, rope_scaling, quantization_config); 16 is plenty
MOST_SIZE = 2**31 - 1
# The counts and sizes a model is built from, wherever they appear (the top level or a sub-config such as
# text_config and vision_config): each a whole number of at least 1, or null where transformers takes null.
SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "n_embd",
    "n_head",
    "n_layer",
    "n_inner",
    "n_positions",
    "d_model",
    "num_layers",
    "num_heads",
    "patch_size",
    "num_channels",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
SIZE_LISTS = ("image_size",)  # a whole number, or a list of them ([height, width])
# RoPE variants transformers builds (transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS, and the plain
# one): listed here because importing transformers costs seconds on the answer path; a test compares them.
ROPE_TYPES = ("default", "dynamic", "linear", "llama3", "longrope", "proportional", "yarn")
ROPE_ALIASES = ("mrope",)  # Qwen2-VL's configs name the default so; its config class maps it back


def parse(data: bytes, path: Path) -> dict:
    """The config as a dict, or ModelNotResolved: not UTF-8, not JSON, NaN or Infinity, nested too deep, not
    an object."""
    try:
        config = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ModelNotResolved(f"{path} is not UTF-8 text, so not a config.json.") from e
    except RecursionError as e:
        raise ModelNotResolved(f"{path} is nested too deeply to be a model config.") from e
    except json.JSONDecodeError as e:
        raise ModelNotResolved(f"{path} is not valid JSON ({e.msg} at line {e.lineno}).") from e
    except ValueError as e:  # _no_constant: NaN, Infinity
        raise ModelNotResolved(f"{path} holds {e}, which no model config holds.") from e
    if not isinstance(config, dict):
        raise ModelNotResolved(
            f"{path} holds a JSON {type(config).__name__}, not a model config (an object)."
        )
    check(config, path)
    return config


def _no_constant(name: str):
    raise ValueError(name)


def check(config: dict, path: Path) -> None:
    """Its depth, then the names, every size, and the shapes of it and of its sub-configs, and its RoPE type."""
    _depth(config, path)
    for where, sub in _configs(config):
        _names(sub, where, path)
        for key in SIZES:
            if key in sub and sub[key] is not None:
                _whole(sub[key], f"{where}{key}", path)
        for key in SIZE_LISTS:
            value = sub.get(key)
            for item in value if isinstance(value, list) else [value] if value is not None else []:
                _whole(item, f"{where}{key}", path)
        _shapes(sub, where, path)
    _rope(config, path)


def _configs(config: dict, where: str = "") -> list[tuple[str, dict]]:
    """The config and every sub-config in it (any object under a key ending in _config), with its key path."""
    out = [(where, config)]
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config"):
            out += _configs(value, f"{where}{key}.")
    return out


def _depth(config: dict, path: Path) -> None:
    """Nesting beyond MOST_DEPTH, found without recursion (the check must not be what overflows)."""
    stack = [(config, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MOST_DEPTH:
            raise ModelNotResolved(
                f"{path} nests {MOST_DEPTH} levels deep and more: no model config does; pass the model's own "
                "config.json."
            )
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack += [(c, depth + 1) for c in children if isinstance(c, dict | list)]


NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")  # a model_type or a class name: what answers print back


def _names(config: dict, where: str, path: Path) -> None:
    """model_type and architectures (of the config or a sub-config, `where`) as names, so that nothing printed
    from them can carry a terminal's escape codes or control characters."""
    model_type = config.get("model_type")
    if model_type is not None and not (isinstance(model_type, str) and NAME.fullmatch(model_type)):
        raise ModelNotResolved(
            f"{path}: {where}model_type is not a name (letters, digits, _ . -): {ascii(model_type)[:60]}."
        )
    archs = config.get("architectures")
    if archs is None:
        return
    if not isinstance(archs, list) or not all(isinstance(a, str) and NAME.fullmatch(a) for a in archs):
        raise ModelNotResolved(
            f"{path}: {where}architectures must be a list of class names (letters, digits, _): "
            f"{ascii(archs)[:60]}."
        )


CONTROL = ("Cc", "Cf", "Zl", "Zp")  # controls, format characters (bidi overrides), line and paragraph breaks


def printable(text: str) -> str:
    """`text` with every control character (a terminal's escape codes, a carriage return, a bidi override)
    written as its escape, so that a name or a library's message can be printed as it is."""
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) in CONTROL else c for c in text)


def _whole(value, key: str, path: Path) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST_SIZE:
        shown = json.dumps(value)[:40]
        raise ModelNotResolved(
            f"{path}: {key} is {shown}; it must be a whole number of at least 1 (a count or a size)."
        )


def _shapes(sub: dict, where: str, path: Path) -> None:
    """Heads that divide the width (where no head_dim says otherwise), and key-value heads that divide the
    heads: what every attention layer assumes."""
    hidden, heads = sub.get("hidden_size"), sub.get("num_attention_heads")
    kv = sub.get("num_key_value_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and sub.get("head_dim") is None and hidden % heads:
        raise ModelNotResolved(
            f"{path}: {where}hidden_size {hidden} is not a multiple of {where}num_attention_heads {heads}, and "
            "no head_dim is given: no attention layer can be built from it."
        )
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ModelNotResolved(
            f"{path}: {where}num_attention_heads {heads} is not a multiple of {where}num_key_value_heads {kv}."
        )


def _rope(config: dict, path: Path) -> None:
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if not isinstance(rope, dict):
            continue
        kind = rope.get("rope_type", rope.get("type"))
        if kind is not None and kind not in ROPE_TYPES + ROPE_ALIASES:
            shown = json.dumps(kind)[:40]
            raise ModelNotResolved(
                f"{path}: {key}.rope_type is {shown}, not one transformers builds ({', '.join(ROPE_TYPES)})."
            )
        factor = rope.get("factor")
        if factor is not None and (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not math.isfinite(factor)
            or factor <= 0
        ):
            raise ModelNotResolved(
                f"{path}: {key}.factor is {json.dumps(factor)[:40]}; it must be a positive number."
            )


# --- the model's own config class, where the config is built (the trace's path: transformers is imported) ---

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
    for where, sub in _configs(config):
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
