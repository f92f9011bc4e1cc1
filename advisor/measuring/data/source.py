"""The data a grid trains on (`--data`), resolved once per `advisor measure`, in its own process, before
the grid starts; then every cell reads local files only.

- `generated`: the default, offline and deterministic corpus of `advisor.measuring.data.corpus`.
- `mmimdb`: the paper's MM-IMDb, pinned to the commit the paper cites, through the Hugging Face cache.
- a Hugging Face dataset id (`owner/name`, or `owner/name@revision`), pinned to the commit it resolves to.
- a local path: a JSONL, JSON, CSV, Parquet or text file, a folder of them, a folder written by
  `save_to_disk`, or an image folder (class subfolders, or a metadata.jsonl with captions).

Hub data is downloaded here, once, its size stated before it starts. Whether the hub can be reached is
asked once, with one short request (about a second, no retries); when it cannot, the data comes from the
local cache if it is there, else the command stops or falls back to the generated corpus, as the user
chose, in one line, and every run records it. Each run records what it trained on: the data's identity (a
revision or a content hash) is part of its evidence group, so runs on different data are never ranked
together.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from advisor.errors import Error
from advisor.measuring.data.folder import DataError, files_read

GENERATED, MMIMDB = "generated", "mmimdb"
MMIMDB_REPO = "pranavmr/MM-IMDb"
MMIMDB_REVISION = "ad5b99488129e67641e4044e4a3c947af61a3c5b"  # the commit the paper cites (its ref. 21)
PROBE_TIMEOUT_S = 1.0  # one request; DNS included (a machine without network may take 20 s to say so)
DEFAULT_ENDPOINT = "https://huggingface.co"
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class HubUnreachable(Error):
    """The Hugging Face hub cannot give the data asked for: the machine's network, not the user's argument."""


@dataclass(frozen=True)
class DataChoice:
    """What --data resolved to: what the cells read, and the identity runs record and are grouped by."""

    data: str  # as asked: generated, mmimdb, owner/name[@revision], or the absolute path
    path: str | None  # the local file or folder the cells read (None: the generated corpus)
    identity: str  # 'generated', 'pranavmr/MM-IMDb@ad5b994', 'corpus.jsonl sha256:1a2b3c4d5e6f'
    # what happened on the way (a fallback, the cache used offline): the same words every time, since the
    # cell key hashes it (the reason, which varies, is said once on the terminal)
    note: str | None = None

    def config_fields(self) -> dict:
        """The RunConfig fields that carry this choice into every cell. The generated corpus leaves data_id at
        its default (None), so that its cells keep the keys they had before --data: a re-run skips them."""
        identity = None if self.identity == GENERATED else self.identity
        return dict(data=self.data, data_path=self.path, data_id=identity, data_note=self.note)


def resolve(spec: str, fallback: bool = False, say: Callable[[str], None] = lambda line: None) -> DataChoice:
    """The data --data names, ready for the cells: hub data downloaded (or found in the cache), a local
    path checked and hashed. Raises DataError with a sentence to act on."""
    spec = (spec or GENERATED).strip()
    if spec == GENERATED:
        return DataChoice(GENERATED, None, GENERATED)
    if spec == MMIMDB:
        return _from_hub(MMIMDB_REPO, MMIMDB_REVISION, spec, fallback, say)
    path = Path(spec).expanduser()
    _refuse_special(path)
    if path.exists():
        return _local(path)
    if HUB_ID.match(spec) and path.suffix.lower() not in FILE_BUILDERS:
        repo, _, revision = spec.partition("@")
        return _from_hub(repo, revision or None, spec, fallback, say)
    raise DataError(
        f"no file or folder at {spec}, and it is not a Hugging Face dataset id (owner/name): pass "
        "generated, mmimdb, a dataset id, or the path of a JSONL, CSV, Parquet file or a dataset folder."
    )


# --- the hub --------------------------------------------------------------------------------------------


def endpoint() -> str:
    """The hub's address as huggingface_hub reads it ($HF_ENDPOINT), read now, not at import."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_by_env() -> bool:
    """Whether the user told the Hugging Face libraries to stay offline."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def unreachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached, or None when it answers one request within `timeout` seconds. Any
    HTTP answer counts; the request runs in a thread so that a DNS lookup that hangs cannot hold us."""
    if offline_by_env():
        return "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"
    outcome: dict[str, str | None] = {}

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint(), method="HEAD"), timeout=timeout).close()
            outcome["why"] = None
        except urllib.error.HTTPError:
            outcome["why"] = None  # it answered
        except Exception as e:  # noqa: BLE001  no route, no DNS, refused, TLS: unreachable all the same
            outcome["why"] = f"{endpoint()}: {getattr(e, 'reason', e)}"

    probe = threading.Thread(target=ask, name="advisor-hub-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    return outcome.get("why", f"{endpoint()} did not answer within {timeout:g} s")


def _from_hub(repo: str, revision: str | None, asked: str, fallback: bool, say) -> DataChoice:
    """A hub dataset as a local snapshot: downloaded at a pinned commit when the hub answers, else from the
    local cache, else the generated corpus (fallback) or a DataError."""
    why = unreachable()
    if why is None:
        folder = _download(repo, revision, asked, say)
        return DataChoice(asked, folder, f"{repo}@{Path(folder).name[:7]}")
    folder = _cached(repo, revision or "main")
    if folder is not None:
        say(f"The Hugging Face hub cannot be reached ({why}): {repo} from the local cache.")
        return DataChoice(
            asked, folder, f"{repo}@{Path(folder).name[:7]}", "hub unreachable: the local cache's copy"
        )
    if not fallback:
        raise HubUnreachable(
            f"the Hugging Face hub cannot be reached ({why}) and {repo} is not in the local cache: connect, "
            "pass --fallback to measure on generated data instead, or --data with a local copy."
        )
    say(f"The Hugging Face hub cannot be reached ({why}): measuring on generated data instead (recorded).")
    return DataChoice(
        GENERATED, None, GENERATED, f"asked for {asked}; hub unreachable: generated data instead"
    )


def _download(repo: str, revision: str | None, asked: str, say) -> str:
    """The dataset's snapshot at its pinned commit, its size said before any download starts."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=endpoint()).dataset_info(repo, revision=revision, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise DataError(
            f"the hub has no dataset {repo}" + (f" at revision {revision}" if revision else "") + " that you "
            "can read (a private or gated one needs `hf auth login`): check the id."
        ) from e
    except HfHubHTTPError as e:
        raise HubUnreachable(f"the hub refused {repo}: {e}") from e
    cached = _cached(repo, info.sha)
    size = sum(s.size or 0 for s in info.siblings or [])
    where = (
        "in the local cache"
        if cached
        else f"{size / 1e9:.2f} GB to download once into the Hugging Face cache"
    )
    say(f"{asked}: {repo} at commit {info.sha[:7]}, {where}.")
    return cached or snapshot_download(repo, repo_type="dataset", revision=info.sha, endpoint=endpoint())


def _cached(repo: str, revision: str) -> str | None:
    """The dataset's snapshot in the local Hugging Face cache at that revision, or None; never the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None


# --- local files ----------------------------------------------------------------------------------------

SPECIAL_FILES = {
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISSOCK: "a socket",
}


def _refuse_special(path: Path) -> None:
    """Refuse a path that is there but is no regular file or folder (a device such as /dev/zero, a pipe, a
    socket), or a symbolic link that leads nowhere: reading one would never end, or fail deep inside."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if path.is_symlink():
            where = "a loop of symbolic links" if e.errno == errno.ELOOP else f"a link to {os.readlink(path)}"
            raise DataError(
                f"{path} is {where}, which leads to no file: pass the data file or folder itself."
            ) from e
        return  # not there: resolve says what it takes
    kind = next((what for test, what in SPECIAL_FILES.items() if test(mode)), None)
    if kind is not None:
        raise DataError(
            f"{path} is {kind}, not a regular file or folder: pass a data file or a folder of them."
        )


def _local(path: Path) -> DataChoice:
    """A local file or folder: checked to be a format we read, and named by its content's hash."""
    path = path.resolve()
    if path.is_file() and path.suffix.lower() not in FILE_BUILDERS:
        raise DataError(
            f"cannot read {path.name}: {path.suffix or 'no extension'} is not a format measure reads. Use JSONL, "
            "JSON, CSV, Parquet or text files, a save_to_disk folder, or an image folder."
        )
    named = set()
    if path.is_dir():
        _one_kind(path)
        named = _inside(path)
    try:
        digest = content_hash(path, named)
    except OSError as e:  # unreadable: permissions, a file removed meanwhile
        raise DataError(
            f"cannot read {e.filename or path} ({e.strerror or e}): check the path and its permissions."
        ) from e
    return DataChoice(str(path), str(path), f"{path.name} sha256:{digest[:12]}")


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
METADATA = {"metadata.jsonl", "metadata.csv", "metadata.parquet"}  # an image folder's captions or labels


def _one_kind(folder: Path) -> None:
    """Refuse a folder of several kinds of data (JSONL beside CSV, files beside images): datasets would read
    one kind and silently leave out the others."""
    kinds = set()
    for f in _data_files(folder):
        suffix = f.suffix.lower()
        if f.name not in METADATA and (suffix in IMAGE_SUFFIXES or suffix in FILE_BUILDERS):
            kinds.add("images" if suffix in IMAGE_SUFFIXES else FILE_BUILDERS[suffix])
    if len(kinds) > 1:
        raise DataError(
            f"{folder.name} mixes {', '.join(sorted(kinds))} files: only one kind would be read. Put one kind "
            "in a folder (an image folder may add a metadata.jsonl), or pass one file."
        )


def _inside(folder: Path) -> set[Path]:
    """Refuse a folder that reads data from outside it: a file linked from elsewhere, or a path its dataset
    card (or a save_to_disk folder's JSON) names that leads out (`advisor.measuring.data.folder`). Returns the
    files datasets reads by name, hidden ones included: the run's identity hashes them with the folder's own."""
    for f in _data_files(folder):
        if not f.resolve().is_relative_to(folder):
            raise DataError(
                f"{folder.name}/{f.relative_to(folder)} links to a file outside the folder: copy the data in, so "
                "that what the runs train on is what they record."
            )
    return files_read(folder)


def content_hash(path: Path, named: set[Path] = frozenset()) -> str:
    """sha256 of a file's bytes, or of a folder's files and those read by name (`named`: a card, hidden files it
    names), relative paths and bytes in name order. A folder without hidden files read keeps its old hash."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted({*_data_files(path), *named})
    for f in files:
        if path.is_dir():
            digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _data_files(folder: Path) -> list[Path]:
    """A folder's files, hidden ones (a .cache, .git) left out."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(s.startswith(".") for s in p.relative_to(folder).parts)
    ]
