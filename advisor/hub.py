"""A model's config.json from the Hugging Face Hub, fetched alone under one total deadline and a size cap.

Written by hand, not with huggingface_hub's hf_hub_download: that call bounds each connect and read but not
the whole transfer, so a server that trickles bytes holds it for as long as it likes, and it downloads a file
of any size before anyone can look at it. Here one deadline covers connecting, every read and the rest, and
the body stops at MOST_CONFIG_BYTES. What arrives is kept where huggingface_hub keeps its cache (models--org--
name/snapshots/<commit>/config.json), so both find it again offline.

A redirect is followed as huggingface_hub and requests follow one, and more strictly (_Hops): the token goes
only to the scheme, host and port it was meant for; never from https down to http, nor to a scheme but
http(s); never to a private, loopback or link-local address unless HF_ENDPOINT itself is one (a mirror on the
user's own network may send them to its neighbours).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from advisor.errors import ModelNotResolved
from advisor.files import replace_file

# The local cap's twin (model_config.MOST_CONFIG_BYTES; the layers keep the two modules apart, a test compares them):
# a config.json is a few kB, the largest published ones tens of kB.
MOST_CONFIG_BYTES = 4 << 20

DEADLINE_S = 10.0  # the whole fetch, connect to last byte; ADVISOR_HUB_TIMEOUT overrides it
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
        opener = urllib.request.build_opener(_Hops)
        with opener.open(request, timeout=limit) as response:
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
    except _Refused as e:
        found["error"] = ModelNotResolved(
            f"the Hub sent the request for {repo_id}'s config.json on to {e.where}, which is not followed "
            f"({e.why}): check HF_ENDPOINT, or pass a folder that holds its config.json."
        )
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


class _Refused(Exception):
    """A redirect that is not followed: where it pointed (scheme://host:port) and why."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class _Hops(urllib.request.HTTPRedirectHandler):
    """urllib's redirects made safe. Hand-written on urllib's own handler (the fetch is urllib's, for its one
    deadline): requests and huggingface_hub drop the token on a change of host too, but neither refuses a
    downgrade to http or a private target, and neither can be given this fetch's deadline and size cap."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        """The next hop's request, refused where _why_not says, without the token where the origin changes."""
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None:
            return None
        why = _why_not(req.full_url, new.full_url)
        if why:
            fp.close()
            raise _Refused(_where(new.full_url), why)
        if _origin(new.full_url) != _origin(req.full_url):  # urllib copies every header to the next hop
            new.remove_header("Authorization")
        return new


def _why_not(old: str, new: str) -> str | None:
    """Why a hop from `old` to `new` is not followed (a scheme but http(s), https down to http, a private
    address where HF_ENDPOINT is public), or None."""
    scheme, target = urllib.parse.urlsplit(old).scheme, urllib.parse.urlsplit(new)
    if target.scheme not in ("http", "https"):
        return f"{target.scheme or 'no'} scheme: only http and https are fetched"
    if scheme == "https" and target.scheme == "http":
        return "from https down to http"
    if not target.hostname:
        return "no host"
    address = _private_address(target.hostname)
    if address is not None and not _endpoint_private():  # a mirror on the user's network: its neighbours too
        return f"{address} is a private, loopback or link-local address, and HF_ENDPOINT is not one"
    return None


def _endpoint_private() -> bool:
    """Whether HF_ENDPOINT's host is itself a private address (a mirror on the user's network)."""
    return _private_address(urllib.parse.urlsplit(endpoint()).hostname or "") is not None


def _private_address(host: str) -> str | None:
    """The first address `host` resolves to that is not a public one (private, loopback, link-local,
    reserved, multicast), or None; every address is checked, as the connection may use any of them. A name
    that does not resolve is None: its connection fails on its own."""
    if not host:
        return None
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None
    for *_, sockaddr in found:
        address = ipaddress.ip_address(sockaddr[0].split("%")[0])  # an IPv6 zone id is no part of it
        if address.version == 6 and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not address.is_global or address.is_multicast:
            return str(address)
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    """A URL's scheme, host and port (the scheme's own port where none is written): what a token is for."""
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _where(url: str) -> str:
    """scheme://host:port of a URL, for a sentence (urllib has already quoted whatever else it held)."""
    scheme, host, port = _origin(url)
    return f"{scheme}://{host}" + (f":{port}" if port else "")


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
