"""Files advisor writes and reads back, done safely: an output FILE the user names refused where writing
it would lose something (`output_problem`), a file written in one step (the pages, `claims --markdown`, the
caches), a file read only if it is a plain one of bounded size, and what is slow to make kept in a cache
folder (the report's chart script, checked when read; the parsed rules, by their text).
Standard library only, at the base of the layers: the KB's remembered checks and the pages share it."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path

MOST_CACHED = 32 << 20  # bytes: a kept file larger than this is not read (Vega's bundle is 0.9 MB)
MOST_KEPT = 4 << 20  # bytes: a kept value's file larger than this is not read (the parsed rules: ~0.1 MB)


def replace_file(path: Path, data: bytes) -> None:
    """`data` as the file at `path`, in one step: written to a new file beside it, then renamed onto the name.
    A reader never sees half a file, and a symbolic link at `path` is replaced, never written through:
    nothing outside the file's folder is touched. An OSError names `path`."""
    temp, made = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp"), False
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        made = True
        with os.fdopen(fd, "wb") as f:
            _keep_mode(path, f.fileno())
            f.write(data)
        os.replace(temp, path)
    except OSError as e:
        if made:
            temp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from e


# The first bytes of what SQLite writes: a database, its write-ahead log (either byte order), its rollback journal
SQLITE_MAGIC = (
    b"SQLite format 3\x00",
    b"\x37\x7f\x06\x82",
    b"\x37\x7f\x06\x83",
    b"\xd9\xd5\x05\xf9\x20\xa1\x63\xd7",
)
SQLITE_SIDES = ("", "-wal", "-shm", "-journal")  # a KB's file and those SQLite keeps beside it


def output_problem(path: Path, force: bool, kept: dict[Path, str], replaces_kb: bool = False) -> str | None:
    """Why a command may not write its output FILE at `path`, in a sentence that says what to do, else None:
    one of the KBs in `kept` (path -> what it is) or a file SQLite keeps beside one, named or reached through
    a link; an SQLite database or journal, which an output never replaces, not even with `force` (unless the
    output is itself a KB: `replaces_kb`); anything else already there, a link or a pipe too, without `force`.
    Asked before any work; the file is then written by replace_file (a link replaced, never followed)."""
    for kb, what in kept.items():
        if _is_kb(path, kb):
            return f"{path} is {what}, never an output: name a new file."
    if not replaces_kb and _sqlite_header(path):
        return (
            f"{path} is an SQLite database (a knowledge base?), which an output never replaces, not even "
            "with --force: name a new file."
        )
    if not force and os.path.lexists(path):
        return f"{path} already exists: pass --force to replace it, or name a new file."
    return None


def _is_kb(path: Path, kb: Path) -> bool:
    """Whether `path` names the KB `kb` or a file SQLite keeps beside it (its folders' links resolved), or
    leads to one of them through a link."""
    named = _named(path)
    return any(
        (named is not None and named == _named(other)) or _same_file(path, other)
        for other in (kb.with_name(f"{kb.name}{side}") for side in SQLITE_SIDES)
    )


def _named(path: Path) -> Path | None:
    """`path` with the links of its folders resolved (not its own: a link is named by its name), or None."""
    try:
        return path.parent.resolve() / path.name
    except (OSError, RuntimeError):  # a loop of links, a folder we may not look into
        return None


def _same_file(path: Path, other: Path) -> bool:
    """Whether both names lead to one file (links followed); False where either is missing or unreadable."""
    try:
        return os.path.samefile(path, other)
    except (OSError, ValueError):
        return False


def _sqlite_header(path: Path) -> bool:
    """Whether the plain file at `path` (a link followed: what it leads to is kept too) starts as SQLite's
    files do; a pipe or a device is never opened to block, nor read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        head = os.read(fd, 16)
    except OSError:
        return False
    finally:
        os.close(fd)
    return any(head.startswith(magic) for magic in SQLITE_MAGIC)


def _keep_mode(path: Path, fd: int) -> None:
    """The new file's permissions those of the plain file it replaces, if one (a link's target's are not asked)."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISREG(old.st_mode):
        os.fchmod(fd, stat.S_IMODE(old.st_mode))


def cached_text(folder: Path, stem: str, build: Callable[[], str]) -> str:
    """build()'s text, kept in `folder` as '<stem>-<its sha256>.js' so that the next process reads it rather
    than building it again. A kept file is input like any other: served only if it is a plain file (never a
    link followed, nor a pipe opened to hang on) of at most MOST_CACHED bytes whose sha256 is the one its
    name states, so a half-written, truncated or edited one is built again and replaced. A folder that cannot
    be read or written costs the build, never the command."""
    for path, digest in _candidates(folder, stem):
        text = _verified(path, digest)
        if text is not None:
            return text
    text = build()
    data = text.encode("utf-8")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(folder / f"{stem}-{_digest(data)}.js", data)
    except OSError:
        pass  # a read-only data folder, a file where the folder goes: built in memory, and on we go
    return text


def kept_json(folder: Path, name: str, key: str, build: Callable[[], object]) -> object:
    """build()'s value, kept in `folder` as '<name>.json' beside `key` (everything the value depends on, as
    text: a file's content, not a digest of it), so that the next process with the same key reads it rather
    than building it again (parsing the rules' TOML: 10 ms of a 0.15 s answer); another key
    builds it again and takes the name. Only a value JSON gives back equal is kept (no tuple, datetime or
    NaN). The file is input like any other (`read_plain`: a plain file, bounded; text that is not this
    shape counts as nothing kept); a folder that cannot be read or written costs the build, never the
    command."""
    path = folder / f"{name}.json"
    data = read_plain(path, MOST_KEPT)
    if data is not None:
        try:
            kept = json.loads(data)
        except (ValueError, RecursionError):  # not JSON (a UnicodeDecodeError is a ValueError), too deep
            kept = None
        if isinstance(kept, dict) and kept.get("key") == key and "value" in kept:
            return kept["value"]
    value = build()
    try:
        text = json.dumps({"key": key, "value": value}, allow_nan=False)
        if json.loads(text)["value"] != value:
            return value
    except (TypeError, ValueError, RecursionError):  # not JSON's (a datetime, a NaN), or nested too deep
        return value
    try:
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(path, text.encode("utf-8"))
    except OSError:
        pass  # a read-only data folder, a file where the folder goes: built, and on we go
    return value


def _candidates(folder: Path, stem: str) -> list[tuple[Path, str]]:
    """The files in `folder` named as kept text of `stem`, each with the digest its name states; none where
    the folder cannot be listed."""
    named = re.compile(re.escape(stem) + r"-([0-9a-f]{64})\.js")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [(folder / n, m[1]) for n in names if (m := named.fullmatch(n))]


def _verified(path: Path, digest: str) -> str | None:
    """The text of a kept file whose bytes hash to `digest`, else None."""
    data = read_plain(path, MOST_CACHED)
    if data is None or _digest(data) != digest:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_plain(path: Path, most: int) -> bytes | None:
    """The bytes of a plain file of at most `most` bytes, else None (a link, a folder, a pipe, a device, a
    bigger file, or one that cannot be opened): nothing is followed, and nothing blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        plain = stat.S_ISREG(os.fstat(fd).st_mode)  # asked first: a folder's fd cannot even be made a file
    except OSError:
        plain = False
    if not plain:
        os.close(fd)
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(most + 1)
    except OSError:
        return None
    return data if len(data) <= most else None


def _digest(data: bytes) -> str:
    """sha256 of `data`, in hex."""
    import hashlib  # 3 ms (OpenSSL): only where kept text is checked

    return hashlib.sha256(data).hexdigest()
