"""A model's config.json read as untrusted input: parsed, and its numbers and depth checked once, where it is
read (advisor.model_ref.read_config), so that no later step (a family's builder, the tracer, transformers
itself) meets a size of zero, a NaN, a string where a count belongs or nesting deep enough to exhaust
Python's stack. Each bad value is one sentence naming its key.

What only the model's own config class knows (a bool, a float, an activation, a dtype, a layer type, the
width RoPE rotates) is checked by that class where the config is built (advisor.measuring.model.config_class,
on the trace's path: it imports transformers, which an answer from the cache never does)."""

from __future__ import annotations

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
    for where, sub in sub_configs(config):
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


def sub_configs(config: dict, where: str = "") -> list[tuple[str, dict]]:
    """The config and every sub-config in it (any object under a key ending in _config), with its key path."""
    out = [(where, config)]
    for key, value in config.items():
        if isinstance(value, dict) and key.endswith("_config"):
            out += sub_configs(value, f"{where}{key}.")
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
