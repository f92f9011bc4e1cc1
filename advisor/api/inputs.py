"""Input checking every API call shares: a value as the command line's types make it, else one InputError."""

from __future__ import annotations

import math
import os
import types
import typing
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

from advisor.errors import InputError
from advisor.model_ref import ResolvedModel, reference_models, resolve_model
from advisor.rules import Rules

PathLike = str | os.PathLike


def _given(request, kind: type, who: str):
    """`request` if it is a `kind` (None: the default one); else InputError naming what was passed."""
    if request is None:
        return kind()
    if not isinstance(request, kind):
        raise InputError(f"{who} takes a {kind.__name__} as its request, not {type(request).__name__}.")
    return request


def _model(name: str | os.PathLike | ResolvedModel, rules: Rules) -> ResolvedModel:
    """A model as the API takes it: resolved already, or a name, folder or Hugging Face id (a str or a path)."""
    if isinstance(name, ResolvedModel):
        return name
    name = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(name, str):
        raise InputError(
            f"--model must be a model's name, folder or Hugging Face id (a str or a path), not {_shown(name)}.",
            "model",
        )
    return resolve_model(name, rules)


def _models(name: str | ResolvedModel, rules: Rules) -> list[ResolvedModel]:
    return reference_models(rules) if name == "all" else [_model(name, rules)]


def _family(arch: str, rules: Rules) -> str:
    try:
        return rules.family(arch).name
    except KeyError:
        raise InputError(
            f"unknown architecture {arch!r}. Choose from: {', '.join(rules.family_choices())}.", "arch"
        ) from None


def _check_names(rules: Rules, metric: str, optimizers: tuple, strategies: tuple) -> None:
    if metric not in rules.metrics:
        raise InputError(f"unknown metric {metric!r}. Choose from: {', '.join(rules.metrics)}.", "optimize")
    for name in optimizers:
        if name not in rules.optimizers:
            raise InputError(
                f"unknown optimizer {name!r}. Choose from: {', '.join(rules.optimizers)}.", "optimizers"
            )
    for name in strategies:
        if name not in rules.strategies:
            raise InputError(
                f"unknown strategy {name!r}. Choose from: {', '.join(rules.strategies)}.", "strategies"
            )


# --- each field of a request as its annotation says, as the command line's types make it --------------------

FLAGS = {
    "adapters": "--adapter",
    "shardings": "--sharding",
    "optimizers": "--optimizer",
    "exclude_optimizers": "--exclude-optimizer",
    "strategies": "--strategy",
}  # the option of a field whose flag is not its name with dashes


def _flag(field: str) -> str:
    """How a sentence names a field: as the command line spells it, which the API's errors share."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _typed(request):
    """`request` (a request dataclass: RecommendRequest, FitRequest, MeasureRequest, RunConfig) with every field
    holding what its annotation says, as the command line's types make them: a str where a name belongs (a
    path taken as its str), a whole number (not a bool) where a count does, a finite number where a number does,
    a tuple of names (one name, or a list, taken as one); a request inside it checked so too. InputError naming
    the option otherwise."""
    hints = typing.get_type_hints(type(request))
    fixed = {}
    for f in fields(request):
        value, hint = getattr(request, f.name), hints[f.name]
        if isinstance(value, os.PathLike) and not _fits(value, hint) and _fits(os.fspath(value), hint):
            value = fixed[f.name] = os.fspath(value)  # a folder (--model, --data) given as a Path
        if isinstance(value, str | list) and _is_tuple(hint) and not _fits(value, hint):
            value = fixed[f.name] = (value,) if isinstance(value, str) else tuple(value)
        if not _fits(value, hint):
            raise InputError(f"{_flag(f.name)} must be {_described(hint)}, not {_shown(value)}.", f.name)
        if is_dataclass(value) and not isinstance(value, type) and not isinstance(value, ResolvedModel):
            fixed[f.name] = _typed(value)
    return replace(request, **fixed) if fixed else request


def _fits(value, hint) -> bool:
    """Whether `value` is of the annotation `hint` (a bool is no number; a float finite; a str a path)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in typing.get_args(hint))
    if _is_tuple(hint):
        return isinstance(value, tuple) and all(_fits(v, typing.get_args(hint)[0]) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is Path:
        return isinstance(value, str | os.PathLike)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _is_tuple(hint) -> bool:
    """tuple[X, ...], or a union holding one."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_tuple(arm) for arm in typing.get_args(hint))
    return typing.get_origin(hint) is tuple


WORDS = {str: "a str", int: "a whole number", float: "a finite number", bool: "True or False", Path: "a path"}


def _described(hint) -> str:
    """An annotation in words: 'a finite number or None', 'a str or a tuple of str'."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_described(arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if _is_tuple(hint):
        return f"a tuple of {_described(typing.get_args(hint)[0]).removeprefix('a ')}"
    return WORDS.get(hint) or f"a {getattr(hint, '__name__', hint)}"


def _shown(value) -> str:
    """A wrong value as a sentence quotes it: short, its type named."""
    text, kind = repr(value), type(value).__name__
    return f"{text[:60]}{'…' if len(text) > 60 else ''} ({'an' if kind[0] in 'aeiou' else 'a'} {kind})"


def _path(value, field: str):
    """A path the caller names (a str or an os.PathLike), or None; InputError naming the field otherwise."""
    if value is None or isinstance(value, str | os.PathLike):
        return value
    raise InputError(f"{_flag(field)} must be a path (a str or an os.PathLike), not {_shown(value)}.", field)
