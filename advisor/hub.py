"""A model's config.json from the Hugging Face Hub, fetched alone under one total deadline and a size cap.

Written by hand, not with huggingface_hub's hf_hub_download: that call bounds each connect and read but not
the whole transfer, so a server that trickles bytes holds it for as long as it likes, and it downloads a file
of any size before anyone can look at it. Here one deadline covers connecting, every read and the rest, and
the body stops at MOST_CONFIG_BYTES. What arrives is kept where huggingface_hub keeps its cache (models--org--
name/snapshots/<commit>/config.json), so both find it again offline.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from advisor.errors import ModelNotResolved
from advisor.files import replace_file

DEADLINE_S = 10.0  # the whole fetch, connect to last byte; ADVISOR_HUB_TIMEOUT overrides it
MOST_CONFIG_BYTES = 4 << 20  # a config.json is a few kB; the largest published ones are tens of kB
CHUNK = 64 << 10


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def cache_dir() -> Path:
    """The Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))
    return Path(os.environ.get("HF_HUB_CACHE") or home / "hub").expanduser()


def deadline_s() -> float:
    """The fetch's total deadline in seconds: ADVISOR_HUB_TIMEOUT where it is a positive number."""
    given = os.environ.get("ADVISOR_HUB_TIMEOUT")
    if given is None:
        return DEADLINE_S
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise ModelNotResolved(
            f"ADVISOR_HUB_TIMEOUT must be seconds between 0 and 3600 (got {given!r}); unset it for {DEADLINE_S:g} s."
        )
    return value


def fetch_config(repo_id: str) -> Path:
    """config.json of `repo_id` (owner/name) from the Hub into the hub cache, or ModelNotResolved with one
    sentence: past the deadline, over the size cap, gated, not found, or the network's own error."""
    limit = deadline_s()
    found: dict = {}
    worker = threading.Thread(target=_fetch, args=(repo_id, limit, found), daemon=True)
    worker.start()
    worker.join(limit)  # a worker still blocked in a read is left to its socket timeout: it is a daemon
    fetch = f"hf download {repo_id} config.json"
    if worker.is_alive() or found.get("late"):
        raise ModelNotResolved(
            f"the Hub did not send {repo_id}'s config.json within {limit:g} s (ADVISOR_HUB_TIMEOUT): run "
            f"`{fetch}` where it is reachable, or pass a folder that holds its config.json."
        )
    if "error" in found:
        raise found["error"]
    body, commit = found["body"], found["commit"]
    path = cache_dir() / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, body)
    return path


def _fetch(repo_id: str, limit: float, found: dict) -> None:
    """Read the file into found['body'] (and its commit), or set found['error'] / found['late']."""
    started = time.monotonic()
    url = f"{endpoint()}/{urllib.parse.quote(repo_id)}/resolve/main/config.json"
    request = urllib.request.Request(url, headers=_headers())
    try:
        with urllib.request.urlopen(request, timeout=limit) as response:
            size = response.headers.get("Content-Length")
            if size is not None and size.isdigit() and int(size) > MOST_CONFIG_BYTES:
                found["error"] = _too_large(repo_id)
                return
            chunks, total = [], 0
            while chunk := response.read1(CHUNK):  # what has arrived: the deadline is checked between
                total += len(chunk)
                if total > MOST_CONFIG_BYTES:
                    found["error"] = _too_large(repo_id)
                    return
                if time.monotonic() - started > limit:
                    found["late"] = True
                    return
                chunks.append(chunk)
            commit = response.headers.get("X-Repo-Commit") or "main"
            found["body"], found["commit"] = b"".join(chunks), _safe(commit)
    except urllib.error.HTTPError as e:
        found["error"] = _refused(repo_id, e.code)
    except TimeoutError:
        found["late"] = True
    except (OSError, ValueError) as e:  # no route, refused, a proxy, a broken reply: one sentence
        reason = getattr(e, "reason", None) or e
        found["error"] = ModelNotResolved(
            f"cannot fetch {repo_id}'s config.json from {endpoint()} ({reason}): run "
            f"`hf download {repo_id} config.json` where the Hub is reachable, or pass a folder that holds it."
        )


def _headers() -> dict[str, str]:
    """A token where the user logged in (gated models need one); nothing else is sent."""
    try:
        from huggingface_hub import get_token  # reads the token file; no network

        token = get_token()
    except Exception:  # no huggingface_hub, or a token file it cannot read: ask without one
        token = None
    return {"Authorization": f"Bearer {token}"} if token else {}


def _safe(commit: str) -> str:
    """A commit id as a folder name: 40 hex digits, else 'main' (a header is input like any other)."""
    return commit if len(commit) == 40 and all(c in "0123456789abcdef" for c in commit) else "main"


def _too_large(repo_id: str) -> ModelNotResolved:
    return ModelNotResolved(
        f"{repo_id}'s config.json on the Hub is larger than {MOST_CONFIG_BYTES >> 20} MiB: no model config is "
        "that large. Pass a folder that holds the config.json you expect."
    )


def _refused(repo_id: str, status: int) -> ModelNotResolved:
    if status in (401, 403):
        return ModelNotResolved(
            f"{repo_id} is gated or private on the Hub: accept its licence on huggingface.co, log in "
            "(`hf auth login`) and ask again, or pass a folder that holds its config.json."
        )
    if status == 404:
        return ModelNotResolved(f"{repo_id} is not a model on the Hugging Face Hub (or it is private).")
    return ModelNotResolved(
        f"the Hub answered HTTP {status} for {repo_id}'s config.json: try again later, or pass a folder that "
        "holds its config.json."
    )
