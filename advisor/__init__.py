"""advisor: which optimizer and memory strategy for this transformer, under this constraint, from evidence.

The Python API (advisor/api.py): `advisor.recommend(...)`, `advisor.fit(...)`, `advisor.measure(...)`, `advisor.pretrain(...)`,
`advisor.open_kb(...)`, imported on first call so that `import advisor` (and the CLI) stays cheap. Every
error they raise derives from `advisor.Error`.
"""

from __future__ import annotations

from advisor.errors import Error, FitError, InputError, KBError, ModelNotResolved, NoEvidence, RulesError


def recommend(*args, **kwargs):
    """`advisor recommend` in Python: see advisor.api.recommend."""
    from advisor import api

    return api.recommend(*args, **kwargs)


def fit(*args, **kwargs):
    """`advisor fit` in Python: see advisor.api.fit."""
    from advisor import api

    return api.fit(*args, **kwargs)


def measure(*args, **kwargs):
    """`advisor measure` in Python: see advisor.api.measure."""
    from advisor import api

    return api.measure(*args, **kwargs)


def pretrain(*args, **kwargs):
    """`advisor pretrain` in Python: see advisor.api.pretrain."""
    from advisor import api

    return api.pretrain(*args, **kwargs)


def open_kb(*args, **kwargs):
    """The KB answers come from, read-only: see advisor.api.open_kb."""
    from advisor import api

    return api.open_kb(*args, **kwargs)


__all__ = [
    "Error",
    "FitError",
    "InputError",
    "KBError",
    "ModelNotResolved",
    "NoEvidence",
    "RulesError",
    "fit",
    "measure",
    "open_kb",
    "pretrain",
    "recommend",
]
