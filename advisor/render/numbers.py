"""A figure as the views print it: four significant digits and its unit, a dash for none."""

from __future__ import annotations


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.4g} {unit}".strip()
