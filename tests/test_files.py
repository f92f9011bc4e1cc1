"""advisor/files.py's kept values (`kept_json`): built once and read back by key, rebuilt whenever what is kept
cannot be trusted to be the value, never an error."""

import json
import math
import os
from datetime import date

import pytest

from advisor.files import MOST_KEPT, kept_json


class Builder:
    """A build that counts its calls."""

    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self):
        self.calls += 1
        return self.value


VALUE = {"a": [1, 2.5, "x", None, True], "b": {"c": -3}}


def test_a_value_is_built_once_then_read_back_by_its_key(tmp_path):
    build = Builder(VALUE)
    assert kept_json(tmp_path, "v", "key 1", build) == VALUE
    assert kept_json(tmp_path, "v", "key 1", build) == VALUE
    assert build.calls == 1
    assert json.loads((tmp_path / "v.json").read_text()) == {"key": "key 1", "value": VALUE}


def test_another_key_builds_again_and_takes_the_name(tmp_path):
    kept_json(tmp_path, "v", "old text", Builder("old"))
    newer = Builder("new")
    assert kept_json(tmp_path, "v", "new text", newer) == "new" and newer.calls == 1
    assert kept_json(tmp_path, "v", "new text", newer) == "new" and newer.calls == 1


@pytest.mark.parametrize(
    "kept",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"key": "k"}',
        b'{"key": "other", "value": 1}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["text", "bytes", "list", "no-value", "other-key", "too-deep"],
)
def test_a_kept_file_of_another_shape_is_built_again_and_replaced(tmp_path, kept):
    (tmp_path / "v.json").write_bytes(kept)
    build = Builder(VALUE)
    assert kept_json(tmp_path, "v", "k", build) == VALUE and build.calls == 1
    assert kept_json(tmp_path, "v", "k", build) == VALUE and build.calls == 1


def test_a_link_a_pipe_or_a_huge_file_is_never_read(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"key": "k", "value": "forged"}))
    (tmp_path / "link.json").symlink_to(target)
    assert kept_json(tmp_path, "link", "k", Builder("built")) == "built"
    assert json.loads(target.read_text())["value"] == "forged"  # the link replaced, its target untouched
    os.mkfifo(tmp_path / "pipe.json")
    assert kept_json(tmp_path, "pipe", "k", Builder("built")) == "built"  # no hang on the pipe
    (tmp_path / "huge.json").write_text(json.dumps({"key": "k", "value": "x" * MOST_KEPT}))
    assert kept_json(tmp_path, "huge", "k", Builder("built")) == "built"


@pytest.mark.parametrize("value", [(1, 2), math.nan, math.inf, date(2026, 12, 6), {1: "int key"}])
def test_a_value_json_would_not_give_back_equal_is_never_kept(tmp_path, value):
    build = Builder(value)
    for _ in range(2):
        assert kept_json(tmp_path, "v", "k", build) is value
    assert build.calls == 2 and not (tmp_path / "v.json").exists()


def test_a_folder_that_cannot_be_written_costs_the_build_never_the_command(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would go")
    build = Builder(VALUE)
    assert kept_json(blocker / "cache", "v", "k", build) == VALUE
    assert kept_json(blocker / "cache", "v", "k", build) == VALUE and build.calls == 2
