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


def file_version(path: Path, opened: dict[str, str] | None = None) -> dict | None:
    """What identifies this version of a KB file, as the checks file keeps it: its resolved path; its
    device, inode, size, mtime and ctime (which no user call sets); its WAL's (where committed writes wait)
    and a hot journal's size and the digest of their content: their times can be set back and the file's
    ctime moves as SQLite opens it, their bytes cannot be forged unseen; and the check (`checker`). With
    `opened` (the descriptors SQLite holds, `opened_since`), the file and WAL are read through them, so a name
    swapped after the open cannot stand in for what SQLite reads, and the name must still lead to that file.
    None where it cannot be told: a stat that fails, a name that now leads elsewhere, a file written in the
    last STILL_NS, or a WAL over MOST_WAL_BYTES. The -shm is not keyed: every reader writes its read marks
    into it (its bytes change on each read), and it is an index SQLite derives from the WAL, which is."""
    try:
        resolved = path.resolve()
        named = os.stat(resolved)
        main = os.stat(opened["main"]) if opened else named
        wal = _wal_content(
            Path(opened.get("wal") or f"{resolved}-wal") if opened else Path(f"{resolved}-wal")
        )
        journal = _wal_content(Path(f"{resolved}-journal"))
        check = checker()
    except (
        OSError,
        RuntimeError,
        ValueError,
        KeyError,
    ):  # RuntimeError: a loop of links; ValueError: too large
        return None
    if (named.st_dev, named.st_ino) != (main.st_dev, main.st_ino):
        return None  # the name leads to another file than the one SQLite opened: a swap, or a race
    if time.time_ns() - max(main.st_mtime_ns, main.st_ctime_ns) < STILL_NS:
        return None
    version = {
        "path": str(resolved),
        "file": [main.st_dev, main.st_ino, main.st_size, main.st_mtime_ns, main.st_ctime_ns],
        "wal": wal,
        "checker": check,
    }
    return version | ({"journal": journal} if journal else {})


def descriptors() -> dict[str, tuple[int, int]] | None:
    """This process's open file descriptors and the file each holds (device, inode), from Linux's
    /proc/self/fd; None where the system does not list them: there no pass is remembered (`opened_since`
    gives None) and a user's KB is checked on every read. Numbers are reused, so a file is told by both."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    out = {}
    for fd in names:
        try:
            st = os.stat(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        out[fd] = (st.st_dev, st.st_ino)
    return out


def opened_since(before: dict[str, tuple[int, int]] | None, path: Path) -> dict[str, str] | None:
    """The KB file (and WAL) SQLite opened since `before` (descriptors()), as paths through this process's
    descriptors: {'main': '/proc/self/fd/N', 'wal': ...}. None where they cannot be told: no listing, or not
    exactly one file for the KB (a new descriptor, or the one this process already held, which SQLite reuses)."""
    after = descriptors()
    if before is None or after is None:
        return None
    found: dict[str, list[str]] = {}
    for fd in sorted((fd for fd, held in after.items() if before.get(fd) != held), key=int):
        link = f"/proc/self/fd/{fd}"
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if not target.startswith(f"{path.resolve().parent}/"):
            continue  # another file this process opened meanwhile
        role = next((r for r in ("wal", "shm", "journal") if target.endswith(f"-{r}")), "main")
        found.setdefault(role, []).append(link)
    if "main" not in found:  # SQLite reuses a descriptor of a file this process already has open
        found["main"] = _held(after, path.resolve())
    if len(found.get("main", [])) != 1 or len(found.get("wal", [])) > 1:
        return None
    return {role: links[0] for role, links in found.items() if role in ("main", "wal")}


def _held(held: dict[str, tuple[int, int]], path: Path) -> list[str]:
    """The descriptors that hold the file at `path` (one, if they all hold the same file; else none: which
    one SQLite reads cannot be told)."""
    links = []
    for fd in held:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                links.append(fd)
        except OSError:
            continue
    files = {held[fd] for fd in links}
    return [f"/proc/self/fd/{min(links, key=int)}"] if len(files) == 1 else []


def _wal_content(path: Path) -> list | None:
    """[size, sha256 of the bytes] of a KB's WAL (or journal), None where it has none; ValueError for one too
    large."""
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
    the code that checks (this module, open.py, schema.py, admission.py, queries/audit.py). A pass under
    another advisor or other rules is not this check's pass."""
    digest = hashlib.sha256(repr((KNOWN_MIGRATIONS, load_rules())).encode())
    for module in ("open.py", "schema.py", "admission.py", "queries/audit.py"):
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
