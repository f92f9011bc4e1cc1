"""advisor: which optimizer and memory strategy for this transformer, under this constraint, from evidence.

The Python API (advisor/api.py): `advisor.recommend(...)`, `advisor.fit(...)`, `advisor.open_kb(...)`, imported
on first call so that `import advisor` (and the CLI) stays cheap.
"""

from __future__ import annotations

import sys
import types


def recommend(*args, **kwargs):
    """`advisor recommend` in Python: see advisor.api.recommend."""
    from advisor import api

    return api.recommend(*args, **kwargs)


def fit(*args, **kwargs):
    """`advisor fit` in Python: see advisor.api.fit."""
    from advisor import api

    return api.fit(*args, **kwargs)


def open_kb(*args, **kwargs):
    """The KB answers come from, read-only: see advisor.api.open_kb."""
    from advisor import api

    return api.open_kb(*args, **kwargs)


_API = {"recommend": recommend, "fit": fit, "open_kb": open_kb}


class _Package(types.ModuleType):
    """The API's `recommend` and `fit` share their names with the modules advisor/recommend.py and
    advisor/fit.py: importing those modules must not replace the functions on the package (the modules
    stay importable by their full names, e.g. `from advisor.recommend import Answer`)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _API and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __getattr__(self, name: str):
        if name in ("KBError", "NoEvidence"):
            from advisor import api

            return getattr(api, name)
        raise AttributeError(f"module 'advisor' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package

__all__ = ["recommend", "fit", "open_kb", "KBError", "NoEvidence"]
