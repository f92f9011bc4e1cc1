"""A figure as the views print it: four significant digits and its unit, a dash for none; a count with
its noun."""

from __future__ import annotations


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.4g} {unit}".strip()


def counted(n: int, noun: str) -> str:
    """'1 cell', '2 cells': a count with its noun in the right number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
