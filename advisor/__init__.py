"""advisor: which optimizer and memory strategy for this transformer, under this constraint, from evidence.

The Python API (advisor/api/): `advisor.recommend(...)`, `advisor.fit(...)`, `advisor.measure(...)`,
`advisor.plan(...)`, `advisor.pretrain(...)`, `advisor.open_kb(...)`, and the request objects each takes
(`advisor.FitRequest`, `advisor.RecommendRequest`, `advisor.MeasureRequest`), imported on first use so that
`import advisor` (and the CLI) stays cheap. Every error they raise derives from `advisor.Error`.
"""

from __future__ import annotations

from advisor.errors import Error, FitError, InputError, KBError, ModelNotResolved, NoEvidence, RulesError


def recommend(*args, **kwargs):
    """`advisor recommend` in Python: see advisor.api.recommend."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.recommend(*args, **kwargs)


def fit(*args, **kwargs):
    """`advisor fit` in Python: see advisor.api.fit."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.fit(*args, **kwargs)


def plan(*args, **kwargs):
    """`advisor measure --plan` in Python: see advisor.api.plan."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.plan(*args, **kwargs)


def measure(*args, **kwargs):
    """`advisor measure` in Python: see advisor.api.measure."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.measure(*args, **kwargs)


def pretrain(*args, **kwargs):
    """`advisor pretrain` in Python: see advisor.api.pretrain."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.pretrain(*args, **kwargs)


def __getattr__(name: str):
    """The request objects (`advisor.FitRequest`, `RecommendRequest`, `MeasureRequest`), imported on first use."""
    if name in ("FitRequest", "RecommendRequest"):
        from advisor import api  # on first use: `import advisor` stays cheap

        return getattr(api, name)
    if name == "MeasureRequest":
        from advisor.measuring.request import MeasureRequest  # numpy and psutil: only when asked for

        return MeasureRequest
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")


def open_kb(*args, **kwargs):
    """The KB answers come from, read-only: see advisor.api.open_kb."""
    from advisor import api  # on first use: `import advisor` stays cheap

    return api.open_kb(*args, **kwargs)


__all__ = [
    "Error",
    "FitError",
    "FitRequest",
    "InputError",
    "KBError",
    "MeasureRequest",
    "ModelNotResolved",
    "NoEvidence",
    "RecommendRequest",
    "RulesError",
    "fit",
    "measure",
    "open_kb",
    "plan",
    "pretrain",
    "recommend",
]
