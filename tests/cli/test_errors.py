"""Bad input gets a sentence and an exit code, never a traceback (CliRunner re-raises any exception)."""

import json
import os
import sqlite3

import pytest

from advisor.kb.open import open_for_writing


@pytest.mark.parametrize(
    "args,needle",
    [
        (["recommend", "--arch", "rnn"], "Choose from: vision, vit"),
        (
            ["recommend", "--arch", "vit", "--optimize", "speed"],
            "Choose from: loss, time, memory, utilization",
        ),
        (
            ["recommend", "--arch", "vit", "--source", "arxiv"],
            "Choose from: measured, measured:tuning, paper",
        ),
        (["recommend", "--arch", "vit", "--optimizer", "lion"], "unknown optimizer 'lion'"),
        (["recommend", "--arch", "vit", "--strategy", "offload"], "unknown strategy 'offload'"),
        (["recommend"], "exactly one of arch"),
        (["frontier", "--arch", "vit", "--x", "loss"], "must be different"),
        (["flowchart", "--source", "nope"], "unknown source"),
    ],
)
def test_unknown_choices_exit_2(invoke, args, needle):
    result = invoke(*args)
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output


def test_unresolvable_model_says_what_to_do(invoke):
    result = invoke("recommend", "--model", "someorg/not-downloaded")
    assert result.exit_code == 1
    assert "hf download someorg/not-downloaded config.json" in result.output
    assert "--arch" in result.output


def test_missing_kb(invoke, tmp_path):
    result = invoke("recommend", "--arch", "vit", "--db", tmp_path / "nope.sqlite")
    assert result.exit_code == 1 and "no knowledge base at" in result.output


def test_not_sqlite_kb(invoke, tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_text("id,loss\n1,0.5\n")
    result = invoke("kb", "stats", "--db", bad)
    assert result.exit_code == 1 and "not an SQLite file" in result.output


def test_truncated_kb(invoke, tmp_path, kb_path):
    cut = tmp_path / "cut.sqlite"
    data = kb_path.read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    result = invoke("recommend", "--arch", "vit", "--db", cut)
    assert result.exit_code == 1
    assert "corrupt or truncated" in result.output


def test_corrupt_kb(invoke, tmp_path, kb_path):
    bad = tmp_path / "corrupt.sqlite"
    data = bytearray(kb_path.read_bytes())
    data[100:4096] = os.urandom(3996)  # the header survives, the schema page does not
    bad.write_bytes(bytes(data))
    result = invoke("recommend", "--arch", "vit", "--db", bad)
    assert result.exit_code == 1
    assert "corrupt" in result.output or "cannot read" in result.output


def test_sqlite_but_not_a_kb(invoke, tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    result = invoke("kb", "runs", "--db", other)
    assert result.exit_code == 1 and "not an advisor knowledge base" in result.output


def test_kb_from_newer_schema(invoke, kb_path):
    conn = sqlite3.connect(kb_path)
    conn.execute(
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('advisor', '9999_future', 'x')"
    )
    conn.commit()
    conn.close()
    before = kb_path.read_bytes()
    for args in (["recommend", "--arch", "vit"], ["kb", "stats"]):
        result = invoke(*args)
        assert result.exit_code == 1 and "written by a newer advisor" in result.output
    result = invoke("kb", "import", kb_path.parent / "x.json")  # a write is refused too
    assert result.exit_code == 2
    with pytest.raises(Exception, match="newer advisor"):
        open_for_writing(kb_path)
    assert kb_path.read_bytes() == before, "nothing is changed in a newer KB"


def test_read_only_kb_serves_every_read(invoke, tmp_path, kb_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    ro = folder / "kb.sqlite"
    ro.write_bytes(kb_path.read_bytes())
    ro.chmod(0o444)
    folder.chmod(0o555)
    try:
        for args in (
            ["recommend", "--arch", "encoder", "--optimize", "memory"],
            ["frontier", "--arch", "vit"],
            ["flowchart"],
            ["kb", "stats"],
            ["kb", "runs"],
            ["kb", "export"],
        ):
            result = invoke(*args, "--db", ro)
            assert result.exit_code == 0, (args, result.output)
    finally:
        folder.chmod(0o755)


def test_read_only_wal_kb_in_read_only_folder(invoke, tmp_path, kb_path):
    """A WAL-mode KB whose folder cannot hold the -shm file is still readable."""
    folder = tmp_path / "walro"
    folder.mkdir()
    path = folder / "kb.sqlite"
    path.write_bytes(kb_path.read_bytes())
    open_for_writing(path).close()  # leaves the file in WAL mode
    folder.chmod(0o555)
    try:
        result = invoke("recommend", "--arch", "vit", "--db", path, "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["recommendation"]["optimizer"] == "adagrad"
    finally:
        folder.chmod(0o755)


def test_unwritable_db_path_for_import(invoke, tmp_path, kb_path):
    export = tmp_path / "runs.json"
    assert invoke("kb", "export", "-o", export).exit_code == 0
    result = invoke("kb", "import", export, "--db", tmp_path / "no" / "such" / "dir.sqlite")
    assert result.exit_code == 1 and "does not exist" in result.output
