"""A user's KB checked once per version of its file: the full check (every page and every row) is slow on a
large KB, and answers read it every time. A pass is remembered in the data folder (cache/kb-checks.json),
keyed by what identifies that version of the file and by the check itself; only a pass is kept, and the
checks file is read as untrusted input (advisor.files.read_plain): anything odd counts as nothing
remembered, so a KB is then checked again, never let through."""

from __future__ import annotations

import hashlib
import json
import os
import time
from functools import cache
from pathlib import Path

from advisor.files import read_plain, replace_file
from advisor.kb.schema import KNOWN_MIGRATIONS
from advisor.places import user_dir
from advisor.rules import load_rules

CHECKS_FILE = "kb-checks.json"  # in user_dir() / "cache": the file versions whose full check passed
CHECKS_FORMAT = 1
REMEMBERED = 8  # files whose latest passed version is kept
MOST_CHECKS_BYTES = 64 << 10  # a checks file larger than this is not read
# A file written this recently is not remembered: a write within the same tick of the file system's clock
# may leave its size and times as they were (git's "racy clean"); 2 s covers the coarsest (FAT's).
STILL_NS = 2_000_000_000
# A WAL is keyed by its content (a digest), which no one can restore by setting times back; one larger than
# this is not remembered (its file is checked in full on every read instead of hashed on every read).
MOST_WAL_BYTES = 64 << 20


def file_version(path: Path) -> dict | None:
    """What identifies this version of a KB file, as the checks file keeps it: its resolved path; its
    device, inode, size, mtime and ctime (which no user call sets); its WAL's (where committed writes wait)
    size and the digest of its content: its times can be set back and its ctime moves as SQLite opens it,
    its bytes cannot be forged unseen; and the check (`checker`). None where it cannot be told: a stat that
    fails, a file written in the last STILL_NS, or a WAL over MOST_WAL_BYTES."""
    try:
        resolved = path.resolve()
        main, wal = os.stat(resolved), _wal_content(Path(f"{resolved}-wal"))
        check = checker()
    except (OSError, RuntimeError, ValueError):  # RuntimeError: a loop of links; ValueError: a WAL too large
        return None
    if time.time_ns() - max(main.st_mtime_ns, main.st_ctime_ns) < STILL_NS:
        return None
    return {
        "path": str(resolved),
        "file": [main.st_dev, main.st_ino, main.st_size, main.st_mtime_ns, main.st_ctime_ns],
        "wal": wal,
        "checker": check,
    }


def _wal_content(path: Path) -> list | None:
    """[size, sha256 of the bytes] of a KB's WAL, None where it has none; ValueError for one too large."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MOST_WAL_BYTES:
                raise ValueError(f"{path} holds {size} bytes")
            return [size, hashlib.file_digest(f, "sha256").hexdigest()]
    except FileNotFoundError:
        return None


@cache
def checker() -> str:
    """The check as a digest: the schema it expects, the rules it holds rows to (the user's included), and
    the code that checks (this module, schema.py, admission.py). A pass under another advisor or other
    rules is not this check's pass."""
    digest = hashlib.sha256(repr((KNOWN_MIGRATIONS, load_rules())).encode())
    for module in ("reader.py", "schema.py", "admission.py"):
        digest.update((Path(__file__).parent / module).read_bytes())
    return digest.hexdigest()


def checks_path() -> Path:
    return user_dir() / "cache" / CHECKS_FILE


def passed(version: dict) -> bool:
    """Whether this version of the file passed the full check before (and the pass was remembered)."""
    return _canonical(version) in passed_checks()


def passed_checks() -> set[str]:
    """The versions remembered as passed, each as canonical JSON (`_canonical`). The checks file is input
    like any other: a link, a pipe, a file too large, text of another shape count as nothing remembered,
    and an entry counts only where it equals a version exactly (types included)."""
    try:
        return {_canonical(e) for e in _remembered()}
    except (ValueError, RecursionError):  # an entry JSON cannot write back (nested too deep)
        return set()


def _remembered() -> list[dict]:
    data = read_plain(checks_path(), MOST_CHECKS_BYTES)
    try:
        kept = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError), or nested too deep
        return []
    if not isinstance(kept, dict) or kept.get("format") != CHECKS_FORMAT:
        return []
    entries = kept.get("passed")
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _canonical(version: dict) -> str:
    return json.dumps(version, sort_keys=True)


def remember_passed(version: dict) -> None:
    """Keep a passed version in the checks file (the latest of each file, REMEMBERED files at most), written
    in one step. A data folder that cannot be written remembers nothing: never an error."""
    others = [e for e in _remembered() if e.get("path") != version["path"]]
    try:
        data = json.dumps({"format": CHECKS_FORMAT, "passed": [version, *others][:REMEMBERED]}, indent=1)
    except (ValueError, RecursionError):  # an entry JSON cannot write back (nested too deep): this one alone
        data = json.dumps({"format": CHECKS_FORMAT, "passed": [version]}, indent=1)
    try:
        checks_path().parent.mkdir(parents=True, exist_ok=True)
        replace_file(checks_path(), data.encode())
    except OSError:
        pass
