"""Writing a file the user named, in one step: the page files and `claims --markdown` share it. Standard
library only, so a command that writes text needs no plots extra."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path


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
