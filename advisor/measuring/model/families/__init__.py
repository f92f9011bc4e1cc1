"""The model families of the measurement side, one module each, registered by name.

A family module subclasses `Family` (in `base.py`) and decorates it with `@register`; `rules/families.toml`
names the module of each family (`module = "advisor.measuring.model.families.decoder"`), and `family(name)`
imports it on first use (`family_of(model)`: a resolved model's). Adding a family is one module plus one
line in rules/families.toml.
"""

from __future__ import annotations

import importlib

from advisor.measuring.model.families.base import Family, UnknownFamily
from advisor.model_ref import ResolvedModel
from advisor.rules import Rules

_REGISTRY: dict[str, Family] = {}
# Where the family modules lived before, as a user's families.toml may still name them: `measure.families.`
# (the import name of advisor.measuring until 0.1) and `advisor.measuring.families.` (until measuring/ had wings).
_FORMER = ("measure.families.", "advisor.measuring.families.")
_HOME = "advisor.measuring.model.families."


def register(cls: type[Family]) -> type[Family]:
    """Class decorator: make a family known by its `name`."""
    _REGISTRY[cls.name] = cls()
    return cls


def family(name: str, rules: Rules) -> Family:
    """The family called `name` in the rules, its module imported; UnknownFamily if either lacks it."""
    spec = rules.families.get(name)
    if spec is None:
        raise UnknownFamily(f"unknown family {name!r}: rules/families.toml has {', '.join(rules.families)}.")
    if name not in _REGISTRY:
        if not spec.module:
            raise UnknownFamily(f"family {name!r} names no module in rules/families.toml (module = ...).")
        former = next((f for f in _FORMER if spec.module.startswith(f)), None)
        module = _HOME + spec.module.removeprefix(former) if former else spec.module
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UnknownFamily(f"family {name!r}: cannot import its module {spec.module!r} ({e}).") from e
        if name not in _REGISTRY:
            raise UnknownFamily(f"module {spec.module!r} registers no family called {name!r}.")
    return _REGISTRY[name]


def family_of(model: ResolvedModel, rules: Rules) -> Family:
    """The measurement side's Family of a resolved model: the one its rules record names."""
    return family(model.family.name, rules)


def registered() -> dict[str, Family]:
    """The families imported so far, by name."""
    return dict(_REGISTRY)


__all__ = ["Family", "UnknownFamily", "family", "family_of", "register", "registered"]
