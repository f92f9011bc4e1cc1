"""A hostile Hub cannot hang or flood `fit` (advisor/hub.py): one total deadline over the whole fetch and a size
cap on config.json, each failure one sentence; tested against local servers that misbehave on purpose."""

import http.server
import socket
import threading
import time

import pytest

from advisor.errors import ModelNotResolved
from advisor.model_ref import resolve_model
from advisor.rules import load_rules

DEADLINE = 1.5


class Hostile(http.server.BaseHTTPRequestHandler):
    """A Hub whose config.json endpoint misbehaves as `mode` says."""

    mode = "stall"

    def do_GET(self):
        if self.mode == "stall":  # headers sent, then nothing
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.flush()
            time.sleep(DEADLINE * 4)
        elif self.mode == "trickle":  # a byte at a time, each well inside any per-read timeout
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.1)
        elif self.mode in ("huge", "huge-unsized"):
            self.send_response(200)
            if self.mode == "huge":
                self.send_header("Content-Length", str(500 << 20))
            self.end_headers()
            try:
                for _ in range(8 << 10):  # up to 512 MiB, unless the reader stops
                    self.wfile.write(b" " * (64 << 10))
            except OSError:
                pass
        else:
            self.send_response(int(self.mode))
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    made = []

    def serve(mode: str):
        handler = type("Handler", (Hostile,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        # a stalled handler meets its closed client after the test: silent, not a traceback on whatever
        # stderr a later test in this process holds (a CliRunner's, which then fails to read its JSON)
        server.handle_error = lambda request, client_address: None
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        made.append(server)
        return server

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("ADVISOR_HUB_TIMEOUT", str(DEADLINE))
    yield serve
    for server in made:
        server.shutdown()
        server.server_close()


def resolved_within(seconds: float) -> str:
    start = time.monotonic()
    with pytest.raises(ModelNotResolved) as caught:
        resolve_model("someorg/hostile", load_rules())
    assert time.monotonic() - start < seconds
    return str(caught.value)


@pytest.mark.parametrize("mode", ["stall", "trickle"])
def test_a_hub_that_stalls_or_trickles_ends_at_the_deadline_with_one_sentence(hub, mode):
    hub(mode)
    said = resolved_within(DEADLINE + 1.5)
    assert f"within {DEADLINE:g} s" in said and "ADVISOR_HUB_TIMEOUT" in said and "\n" not in said


def test_a_hub_that_never_answers_ends_at_the_deadline(monkeypatch, hub):
    listener = socket.socket()  # accepts connections (the kernel's backlog) and never reads or replies
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    hub("stall")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{listener.getsockname()[1]}")
    try:
        assert f"within {DEADLINE:g} s" in resolved_within(DEADLINE + 1.5)
    finally:
        listener.close()


@pytest.mark.parametrize("mode", ["huge", "huge-unsized"])
def test_a_config_over_the_size_cap_is_refused_unread(hub, mode):
    hub(mode)
    said = resolved_within(DEADLINE + 1.5)
    assert "larger than 4 MiB" in said


@pytest.mark.parametrize(
    "status, words", [(404, "not a model"), (401, "gated or private"), (500, "HTTP 500")]
)
def test_a_hub_refusal_is_one_sentence(hub, status, words):
    hub(str(status))
    assert words in resolved_within(DEADLINE + 1.5)


@pytest.mark.parametrize("value", ["0", "-3", "soon", "1e9"])
def test_a_bad_deadline_is_refused_with_what_to_do(hub, monkeypatch, value):
    hub("404")
    monkeypatch.setenv("ADVISOR_HUB_TIMEOUT", value)
    assert "ADVISOR_HUB_TIMEOUT must be seconds" in resolved_within(5)
