"""The user's own KB: writes never go into the package; reads see the shipped KB and the user's together,
and answers prefer the user's own measurements and say so."""

import json

import pytest

from advisor.kb.store import open_for_writing, write_runs

from ..conftest import SHIPPED_KB


@pytest.fixture
def no_db(monkeypatch, tmp_path):
    """No --db and no $ADVISOR_DB: the defaults a user gets (the user data folder is the test's own)."""
    monkeypatch.delenv("ADVISOR_DB")
    return tmp_path / "xdg-data" / "advisor" / "kb.sqlite"


def user_run(seed, optimizer, loss):
    return dict(
        source="measured",
        model="vit",
        family="vision",
        optimizer=optimizer,
        strategy="standard",
        preset="tiny",
        protocol="fair",
        seed=seed,
        hardware="CPU: the user's laptop",
        device="cpu",
        status="ok",
        config={},
        software={},
        started_at="2026-11-30",
        metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
    )


def test_kb_path_says_where_things_are(invoke, no_db):
    out = json.loads(invoke("kb", "path", "--json").output)
    assert out["shipped_kb"] == str(SHIPPED_KB.resolve()) or out["shipped_kb"].endswith("results.sqlite")
    assert out["user_kb"] == str(no_db) and out["writes_to"] == str(no_db) and not out["user_kb_exists"]
    text = invoke("kb", "path").output
    assert f"user_kb: {no_db}" in text


def test_reads_see_the_shipped_kb_and_the_users_together(invoke, no_db):
    before = json.loads(invoke("kb", "stats", "--json").output)
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)
    write_runs(
        db, [user_run(s, o, loss) for s in range(3) for o, loss in (("adam", 1.0 + s / 100), ("sgd", 2.0))]
    )
    db.close()
    after = json.loads(invoke("kb", "stats", "--json").output)
    assert after["runs"] == before["runs"] + 6
    groups = {g["hardware"]: g for g in after["groups"]}
    assert groups["CPU: the user's laptop"]["yours"] and len(after["groups"]) == len(before["groups"]) + 1
    out = json.loads(invoke("recommend", "--arch", "vit", "--source", "measured", "--json").output)
    assert out["evidence"]["hardware"] == "CPU: the user's laptop" and out["evidence"]["yours"]
    assert out["evidence"]["label"].startswith("your KB: measured")
    assert out["recommendation"]["optimizer"] == "adam"
    paper = json.loads(invoke("recommend", "--arch", "vit", "--json").output)  # the paper still answers
    assert paper["recommendation"] is not None


def test_writes_go_to_the_users_kb_never_the_package(invoke, no_db):
    folder = no_db.parent.parent / "figures"
    folder.mkdir(parents=True)
    export = folder / "runs.json"
    export.write_text(json.dumps({"runs": [user_run(0, "adam", 1.0)]}))
    result = invoke("kb", "import", export)
    assert result.exit_code == 0 and str(no_db) in result.output
    assert no_db.exists()


def test_kb_build_writes_the_package_only_when_asked(invoke, tmp_path):
    result = invoke("kb", "build")
    assert result.exit_code == 2 and "--shipped" in result.output and "-o PATH" in result.output
    both = invoke("kb", "build", "-o", tmp_path / "x.sqlite", "--shipped")
    assert both.exit_code == 2


def test_migrate_without_a_kb_is_a_sentence(invoke, no_db):
    result = invoke("kb", "migrate")
    assert result.exit_code == 1 and "no knowledge base to migrate" in result.output


def test_a_group_is_selected_by_its_id_and_disagreeing_groups_are_shown(invoke, no_db):
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)  # the user's runs pick sgd on held-out loss, where the paper picks another
    write_runs(
        db, [user_run(s, o, loss) for s in range(3) for o, loss in (("adam", 2.0 + s / 100), ("sgd", 1.0))]
    )
    db.close()
    out = json.loads(invoke("recommend", "--arch", "vit", "--json").output)
    assert out["evidence"]["yours"] and out["recommendation"]["optimizer"] == "sgd"
    paper = next(g for g in out["other_evidence"] if g["source"].startswith("paper"))
    assert paper["select"] == f"--source {paper['source']} --group {paper['id']}"
    assert any(d["evidence"]["id"] == paper["id"] for d in out["disagreements"])
    chosen = json.loads(invoke("recommend", "--arch", "vit", "--group", paper["id"], "--json").output)
    assert chosen["evidence"]["id"] == paper["id"] and not chosen["evidence"]["yours"]
    text = invoke("recommend", "--arch", "vit").output
    assert "Other evidence picks differently" in text and f"--group {paper['id']}" in text
    none = invoke("recommend", "--arch", "vit", "--hardware", "CPU: nowhere")
    assert none.exit_code == 1 and "matching --hardware CPU: nowhere" in " ".join(none.output.split())
    assert invoke("recommend", "--arch", "vit", "--group", "0").exit_code == 2


@pytest.mark.parametrize("how", ["--db", "ADVISOR_DB"])
def test_naming_the_shipped_kb_as_the_one_to_write_is_refused(invoke, tmp_path, monkeypatch, how):
    other = tmp_path / "other.sqlite"
    assert invoke("kb", "build", "-o", other).exit_code == 0
    if how == "--db":
        result = invoke("kb", "merge", other, "--db", SHIPPED_KB)
    else:
        monkeypatch.setenv("ADVISOR_DB", str(SHIPPED_KB))
        result = invoke("kb", "merge", other)
    assert result.exit_code == 1 and "is the shipped KB" in result.output and "Traceback" not in result.output
