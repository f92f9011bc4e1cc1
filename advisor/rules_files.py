"""The rules' TOML files as read: the shipped ones (or a named folder's) and the user's beside them, each size-
capped, parsed and checked against its schema (rules_schema.py), merged, and every problem located by file and
line (rules.py builds the Rules from them)."""

from __future__ import annotations

import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from advisor.errors import RulesError
from advisor.files import kept_json
from advisor.places import user_dir
from advisor.rules_schema import (
    SCHEMAS,
    Problem,
    check,
    dotted,
    line_of,
    suggestion,
)


def readable_dir(path: Path) -> bool:
    """A folder we may read (a user data folder we cannot even look into counts as absent)."""
    try:
        return path.is_dir() and os.access(path, os.R_OK | os.X_OK)
    except OSError:
        return False


RULE_FILES = ("metrics", "families", "optimizers", "flowchart", "caveats", "hardware", "fit", "protocol")


MAX_BYTES = 1_000_000  # a rules file is a few kB; anything past this is not one


@dataclass(frozen=True)
class _Source:
    """One rules file as read: where it is, its text (for line numbers), its tables."""

    path: Path
    text: str
    data: dict


class RulesFiles:
    """The rules files of one load, the shipped (or named) ones and the user's: what says where a problem is."""

    def __init__(self, shipped: dict[str, _Source], user: dict[str, _Source]):
        self.shipped, self.user = shipped, user
        self.raw = {name: source.data for name, source in shipped.items()}

    def merged(self, name: str) -> dict:
        """A file's tables with the user's merged in, the whole checked against its schema."""
        if name in self.user:
            self.raw[name] = extended(self.shipped[name].data, self.user[name].data)
            try:
                check(self.raw[name], SCHEMAS[name])
            except Problem as p:
                self.fail(name, p.path, p.message)
        return self.raw[name]

    def fail(self, name: str, path: tuple, message: str) -> NoReturn:
        """RulesError naming the file that sets `path` of the merged tables (of the two, the one that holds
        more of it; the user's on a tie, as theirs wins the merge), its line and the key, then `message`."""
        source, merged = self.shipped[name], self.raw[name]
        held = _held(source.data, merged, path)
        user = self.user.get(name)
        if user is not None and len(theirs := _held(user.data, merged, path)) >= len(held):
            source, held = user, theirs
        path = (*held, *path[len(held) :])
        raise RulesError(_located(source.path, source.text, path, f"{dotted(path)} {message}"))


def _held(data, merged, path: tuple) -> tuple:
    """How much of `path` of the merged tables one file holds, as that file holds it (a list's item at its
    index there: the merged list puts the shipped items first)."""
    out: list = []
    for part in path:
        if (
            isinstance(part, int)
            and isinstance(data, list)
            and isinstance(merged, list)
            and part < len(merged)
        ):
            if merged[part] not in data:
                break
            part, merged = data.index(merged[part]), merged[part]
        elif isinstance(data, dict) and isinstance(merged, dict) and part in data:
            merged = merged.get(part)
        else:
            break
        data = data[part]
        out.append(part)
    return tuple(out)


def read_rules_file(path: Path, name: str) -> dict:
    """One rules file read and checked whole against the schema of `name` (claims.toml, which `advisor
    claims` reads apart from the rest), or RulesError with one sentence naming it."""
    return parsed(Path(path), name).data


def _located(path: Path, text: str, where: tuple, message: str) -> str:
    line = line_of(text, where)
    return f"{path}, line {line}: {message}" if line else f"{path}: {message}"


def parsed(path: Path, name: str, partial: bool = False) -> _Source:
    """A rules file read, parsed and checked against its schema (`partial`: the user's, which extends the
    shipped one and so may leave out what that one has), or RulesError with one sentence naming it."""
    text = _text(path)
    data = toml_data(path, text)
    try:
        check(data, SCHEMAS[name], partial)
    except Problem as p:
        raise RulesError(_located(path, text, p.path, str(p))) from None
    return _Source(path, text, data)


def _text(path: Path) -> str:
    """A rules file's text (UTF-8, a byte-order mark allowed), or RulesError saying why it cannot be read."""
    try:
        kind = os.stat(path).st_mode
        if stat.S_ISDIR(kind):
            raise RulesError(f"{path} is a folder, not a rules file: remove it, or put a TOML file there.")
        if not stat.S_ISREG(kind):
            raise RulesError(f"{path} is not a regular file (a pipe or a device?): remove it.")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError as e:
        raise RulesError(_missing(path)) from e
    except PermissionError as e:
        raise RulesError(f"cannot read {path}: permission denied; make it readable, or remove it.") from e
    except OSError as e:
        raise RulesError(f"cannot read {path}: {e.strerror or e}; fix it, or remove it.") from e
    if len(data) > MAX_BYTES:
        raise RulesError(
            f"{path} is over {MAX_BYTES:,} bytes, too large for a rules file: keep the keys you change."
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise RulesError(
            f"{path}, line {line}: byte 0x{data[e.start]:02x} is not UTF-8 text; save the file as UTF-8."
        ) from None


def _missing(path: Path) -> str:
    if path.is_symlink():
        return f"{path} is a link to a file that is not there: fix the link, or remove it."
    return f"rules file {path} is missing: reinstall advisor, or name a folder that has every rules file."


def toml_data(path: Path, text: str) -> dict:
    """The parsed file, or RulesError: invalid TOML (with tomllib's line and column), nesting too deep to
    parse, or a number too long to convert. Kept parsed in the data folder's cache, keyed by the text itself
    (tomllib's import and parse are 15 ms of a 0.2 s answer; a kept file's JSON reads in well under one),
    one slot per file's path: what is checked after is what tomllib gave."""
    slot = (
        f"toml-{path.stem[:40]}-{zlib.crc32(os.fsencode(path)):08x}"  # a slot's name: a clash costs a parse
    )
    return kept_json(user_dir() / "cache", slot, text, lambda: _parse_toml(path, text))


def _parse_toml(path: Path, text: str) -> dict:
    """`toml_data` without the cache."""
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        said = str(e)
        raise RulesError(f"{path} is not valid TOML: {said[:1].lower()}{said[1:]}; fix that line.") from None
    except RecursionError:
        raise RulesError(f"{path} nests lists or tables too deeply to read: flatten it.") from None
    except ValueError:
        raise RulesError(f"{path} holds a number too long to read: shorten it.") from None


def user_files(folder: Path) -> dict[str, _Source]:
    """The user's rules files, each checked as a part of the shipped one it extends; a TOML file advisor
    would not read is an error, not silence."""
    out = {}
    for path in _toml_files(folder):
        if path.stem not in RULE_FILES:
            raise RulesError(_unread(path))
        out[path.stem] = parsed(path, path.stem, partial=True)
    return out


def _toml_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.suffix == ".toml" and not p.name.startswith("."))
    except OSError as e:
        raise RulesError(
            f"cannot list your rules folder {folder}: {e.strerror or e}; make it readable."
        ) from e


def _unread(path: Path) -> str:
    """Why a TOML file in the user's rules folder is not one advisor reads, and what to do."""
    if path.stem == "claims":
        return f"{path} is not read: the claims are the paper's, rules/claims.toml only; remove it."
    return f"{path} is not a rules file advisor reads" + suggestion(
        path.name, [f"{n}.toml" for n in RULE_FILES]
    )


def extended(base: dict, user: dict) -> dict:
    """The shipped rules with the user's merged in: tables merged key by key, lists extended with the
    user's new items (a model_type added to a family), any other value replaced by the user's."""
    out = dict(base)
    for key, value in user.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = extended(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        else:
            out[key] = value
    return out
