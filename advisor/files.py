"""Files advisor writes and reads back, done safely: a file written in one step (the pages, `claims
--markdown`, the caches), a file read only if it is a plain one of bounded size, and text that is slow to make
(the report's chart script) kept in a cache folder, checked when read. Standard library only, at the base of
the layers: the KB's remembered checks and the pages share it."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

MOST_CACHED = 32 << 20  # bytes: a kept file larger than this is not read (Vega's bundle is 0.9 MB)


def replace_file(path: Path, data: bytes) -> None:
    """`data` as the file at `path`, in one step: written to a new file beside it, then renamed onto the name.
    A reader never sees half a file, and a symbolic link at `path` is replaced, never written through:
    nothing outside the file's folder is touched. An OSError names `path`."""
    temp, made = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"), False
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
    return hashlib.sha256(data).hexdigest()
