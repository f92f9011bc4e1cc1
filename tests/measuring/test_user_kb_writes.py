"""measure and validate without --db: the package's KB stays byte-identical, the user's KB takes the runs,
and answers come from the user's own runs, naming them."""

import hashlib
import json
import sqlite3

from ..conftest import SHIPPED_KB


def test_measure_and_validate_write_the_users_kb_never_the_package(invoke, monkeypatch, tmp_path):
    monkeypatch.delenv("ADVISOR_DB")
    user_kb = tmp_path / "xdg-data" / "advisor" / "kb.sqlite"
    before = hashlib.sha256(SHIPPED_KB.read_bytes()).hexdigest()
    measured = invoke(
        "measure",
        "--model",
        "llama",
        "--preset",
        "tiny",
        "--optimizer",
        "adam",
        "--optimizer",
        "adamw",
        "--strategy",
        "standard",
        "--epochs",
        "2",
        "--steps-per-epoch",
        "4",
        "--seeds",
        "2",
        "--json",
    )
    assert measured.exit_code == 0, measured.output
    assert json.loads(measured.stdout)["db"] == str(user_kb)
    validated = invoke("validate", "--model", "llama")
    assert validated.exit_code == 0, validated.output
    assert hashlib.sha256(SHIPPED_KB.read_bytes()).hexdigest() == before
    conn = sqlite3.connect(user_kb)
    assert conn.execute("SELECT count(*) FROM runs WHERE status = 'ok'").fetchone()[0] == 4
    assert conn.execute("SELECT count(*) FROM validations").fetchone()[0] > 0
    conn.close()
    out = json.loads(invoke("recommend", "--arch", "llama", "--source", "measured", "--json").output)
    assert not out["evidence"]["yours"]  # a tiny grid is a smoke run: listed, never the default answer
    mine = next(g for g in out["other_evidence"] if g["yours"])
    assert mine["preset"] == "tiny" and "--evidence mine" in mine["passed_over"]
    out = json.loads(
        invoke("recommend", "--arch", "llama", "--source", "measured", "--evidence", "mine", "--json").output
    )
    assert out["evidence"]["yours"] and out["evidence"]["preset"] == "tiny"
    assert out["evidence"]["label"].startswith("your KB: measured")
    assert out["validation"]  # validated on this hardware: the user's validation, read beside the shipped KB
