"""Where advisor keeps its files: the shipped KB and rules (package data, only ever read), the user's data
folder (their KB, their rules, shards), and which KB a command reads or writes."""

from __future__ import annotations

import os
import sys
from functools import cache
from importlib.util import find_spec
from pathlib import Path

from advisor.errors import KBError


@cache  # where the package lies does not change while it runs
def _data_dir(package: str) -> Path:
    """The folder of one of advisor's data packages as the import system finds it: a wheel's
    advisor/shipped/..., a checkout's rules/, kb/, models/ through the editable install. find_spec rather than
    importlib.resources, whose import (tempfile, zipfile) is 5 ms of a 0.2 s answer; these are plain folders."""
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise KBError(f"advisor's data package {package} is missing: reinstall advisor.")
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_kb_path() -> Path:
    return _data_dir("advisor.shipped.kb") / "results.sqlite"


def resolve_db_path(db: str | os.PathLike | None) -> Path:
    """The KB to use: --db, then $ADVISOR_DB, then the shipped kb/results.sqlite."""
    if db:
        return Path(db)
    if os.environ.get("ADVISOR_DB"):
        return Path(os.environ["ADVISOR_DB"])
    return shipped_kb_path()


def user_dir() -> Path:
    """Where advisor keeps the user's own files: the platform's user data directory
    (~/.local/share/advisor on Linux; $XDG_DATA_HOME moves it), as platformdirs says. Linux's two plain cases,
    an absolute $XDG_DATA_HOME or else an absolute $HOME, are spelled out here, where every platformdirs
    since 4.0 agrees (tests/test_places.py checks them against it): its import (tempfile, shutil, random) is
    7 ms of a 0.13 s answer. The rest (a relative or unset variable, macOS, Windows, Android) is its own."""
    if sys.platform == "linux" and not hasattr(sys, "getandroidapilevel"):
        xdg = os.environ.get("XDG_DATA_HOME", "")
        if xdg.startswith("/"):
            return Path(xdg) / "advisor"
        if os.environ.get("HOME", "").startswith("/"):
            return Path(os.path.expanduser("~/.local/share")) / "advisor"
    from platformdirs import user_data_path

    return user_data_path("advisor", appauthor=False)


def user_kb_path() -> Path:
    return user_dir() / "kb.sqlite"


def resolve_write_path(db: str | os.PathLike | None) -> Path:
    """The KB a command writes: --db, then $ADVISOR_DB, then the user's KB (its folder created). Never the
    shipped KB, which is package data: naming it is refused with a KBError."""
    named = db or os.environ.get("ADVISOR_DB")
    if named:
        if _same_file(Path(named), shipped_kb_path()):
            raise KBError(
                f"{named} is the shipped KB, the package's own data: write your own KB (the default; "
                "`advisor kb path` says where) or another --db. `advisor kb build --shipped` rebuilds it from "
                "kb/inputs/."
            )
        return Path(named)
    path = user_kb_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _same_file(path: Path, other: Path) -> bool:
    try:
        return path.exists() and path.samefile(other)
    except OSError:
        return False


def places() -> dict[str, str | bool | None]:
    """Where advisor reads and writes (`advisor kb path`)."""
    env = os.environ.get("ADVISOR_DB") or None
    return {
        "shipped_kb": str(shipped_kb_path()),
        "user_kb": str(user_kb_path()),
        "user_kb_exists": exists(user_kb_path()),
        "ADVISOR_DB": env,
        "writes_to": str(Path(env) if env else user_kb_path()),
        "reads": env or f"{shipped_kb_path()} + {user_kb_path()}",
    }


def exists(path: Path) -> bool:
    """Whether a file is there (a folder we may not look into, e.g. another user's, counts as absent)."""
    try:
        return path.exists()
    except OSError:
        return False


@cache  # where the package lies does not change while it runs; asked once per row of an answer
def shipped_models_dir() -> Path:
    """The published models' configs advisor ships (models/ in a checkout)."""
    return _data_dir("advisor.shipped.models")


def shipped_rules_dir() -> Path:
    return _data_dir("advisor.shipped.rules")


def shipped_inputs_dir() -> Path:
    """The versioned inputs the shipped KB is built from (kb/inputs/ in a checkout)."""
    return _data_dir("advisor.shipped.kb") / "inputs"


def user_rules_dir() -> Path:
    """The user's rules, beside their KB: TOML files named as in rules/ that extend or override it."""
    return user_dir() / "rules"
