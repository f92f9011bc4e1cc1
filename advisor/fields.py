"""A request's field declared once: its default and the sentence that explains it, which the command line's
option reads (the pattern of torchtitan's `job_config.py`: the dataclass is the one place an option is
declared; the parser is derived from it)."""

from __future__ import annotations

from dataclasses import MISSING, Field, field, fields

HELP = "help"


def option(default=MISSING, help: str = "", *, factory=MISSING) -> Field:
    """A dataclass field with its default and its help, for a request dataclass."""
    if factory is not MISSING:
        return field(default_factory=factory, metadata={HELP: help})
    return field(default=default, metadata={HELP: help})


def declared(cls, name: str) -> Field:
    """The field `name` of the request dataclass `cls`; KeyError names it when it has none."""
    for f in fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


def default_of(cls, name: str):
    """The default of field `name` of `cls`, as the dataclass declares it (a factory called)."""
    f = declared(cls, name)
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


def help_of(cls, name: str) -> str:
    """The sentence that explains field `name` of `cls`."""
    return declared(cls, name).metadata.get(HELP, "")
