"""Data is part of the evidence group (migration 0009): runs on different data are never ranked together,
answers name the data, and runs that do not say (older KBs, older files) get theirs from their provenance."""

import json
import sqlite3

import pytest

from advisor.answers.evidence import select_group
from advisor.kb import store
from advisor.kb.open import open_for_writing
from advisor.kb.queries.groups import Group, evidence_groups
from advisor.kb.summaries import PAPER_DATA
from advisor.rules import load_rules

from ..conftest import kb_before


def a_run(i: int, **over) -> dict:
    """One ok measured run of tiny llama with a loss; `over` changes its provenance."""
    return {
        "source": "measured",
        "model": "llama",
        "family": "decoder",
        "optimizer": "adam" if i % 2 else "sgd",
        "strategy": "standard",
        "preset": "tiny",
        "seed": 0,
        "hardware": "test machine",
        "status": "ok",
        "protocol": "fair",
        "config": {"data": {"train": "generated MM-IMDb-like corpus (offline)"}},
        "started_at": f"t{i}",
        "metrics": [{"name": "loss", "value": 1.0 + i, "unit": "nats"}],
        **over,
    }


def test_runs_on_other_data_are_other_evidence_groups_and_answers_name_the_data(tmp_path):
    conn = open_for_writing(tmp_path / "data.sqlite")
    mine = "corpus.jsonl sha256:0123456789ab"
    store.write_runs(conn, [a_run(i) for i in range(2)] + [a_run(i + 2, data=mine) for i in range(2)])
    groups = {g.data: g for g in evidence_groups(conn, family="decoder")}
    assert set(groups) == {"generated", mine} and all(g.n_runs == 2 for g in groups.values())
    selection = select_group(conn, load_rules(), "decoder")
    chosen, others = selection.group, selection.others
    assert chosen.data == mine and [g.data for g in others] == ["generated"]  # real data over generated
    assert f"data {mine}" in chosen.label and "generated data" in others[0].label
    assert chosen.as_dict()["data"] == mine


def test_runs_that_do_not_say_get_their_data_from_their_provenance(tmp_path):
    conn = open_for_writing(tmp_path / "data.sqlite")
    paper = a_run(0, source="paper:2608.08961", config={})
    trainer = a_run(1, source="trainer", config={})
    old_string = a_run(2, config={"data": "generated MM-IMDb-like corpus (offline)"})  # an older recording
    store.write_runs(conn, [paper, trainer, old_string, a_run(3)])
    data = dict(conn.execute("SELECT started_at, data FROM runs").fetchall())
    assert data == {"t0": PAPER_DATA, "t1": "", "t2": "generated", "t3": "generated"}
    unstated = next(g for g in evidence_groups(conn) if g.source == "trainer")
    assert "data not stated" in unstated.label


def test_a_kb_from_before_0009_migrates_its_runs_into_groups_by_data(tmp_path):
    path = tmp_path / "old.sqlite"
    db = kb_before(path, 8)  # through 0008: groups without data
    for i, (source, config) in enumerate(
        [
            ("paper:2608.08961", {}),
            ("measured", {"data": {"train": "generated MM-IMDb-like corpus (offline)"}}),
        ]
    ):
        db.execute(
            "INSERT INTO runs (cell_key, source, model, family, optimizer, strategy, preset, seed, hardware, "
            "status, config, uid, protocol) VALUES ('k', ?, 'llama', 'decoder', 'adam', 'standard', 'tiny', 0, "
            "'cpu', 'ok', ?, ?, 'paper')",
            [source, json.dumps(config), f"u{i}"],
        )
    db.conn.commit()
    db.conn.close()
    conn = open_for_writing(path)
    assert sorted(r[0] for r in conn.execute("SELECT data FROM runs")) == ["generated", PAPER_DATA]
    assert sorted(g.data for g in evidence_groups(conn)) == ["generated", PAPER_DATA]
    assert conn.execute("SELECT count(*) FROM runs WHERE grp IS NULL").fetchone()[0] == 0


def test_a_group_label_says_what_it_trained_on():
    group = Group("measured", "cpu", "tiny", "llama", "decoder", 2, 1, protocol="fair", data="generated")
    assert (
        group.label
        == "measured, llama, cpu, preset tiny, fair protocol, generated data, 1 run per configuration"
    )


def test_a_kb_from_before_0010_relabels_its_trainer_runs_and_takes_the_trainer_protocol(tmp_path):
    path = tmp_path / "old.sqlite"
    db = kb_before(path, 9)  # through 0009: a Trainer run was stored under the paper's protocol
    built = {"model_type": "llama", "hidden_size": 64, "_name_or_path": ""}
    for i, source in enumerate(["trainer", "measured"]):
        db.execute(
            "INSERT INTO runs (cell_key, source, model, family, optimizer, strategy, preset, seed, hardware, "
            "status, config, uid, protocol, data) VALUES ('k', ?, 'llama', 'decoder', 'adam', 'standard', "
            "'custom', 0, 'cpu', 'ok', ?, ?, 'paper', '')",
            [source, json.dumps({"model_config": built}), f"u{i}"],
        )
    with pytest.raises(sqlite3.IntegrityError):  # the old CHECK
        db.execute("UPDATE runs SET protocol = 'trainer'")
    db.conn.commit()
    db.conn.close()
    conn = open_for_writing(path)
    assert dict(conn.execute("SELECT source, protocol FROM runs")) == {
        "trainer": "trainer",
        "measured": "paper",
    }
    indexes = {
        r[0]
        for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'")
    }
    assert {"runs_uid", "runs_not_ok", "runs_grp_seed"} <= indexes
    assert {g.protocol for g in evidence_groups(conn)} == {"trainer", "paper"}
    # a Trainer run stored under its bare model_type now carries the identity AdvisorCallback gives it
    models = dict(conn.execute("SELECT source, model FROM runs"))
    assert models == {"trainer": "llama config e42dd1c6", "measured": "llama"}
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE runs SET protocol = 'mine'")
