"""The maintained summaries (advisor/kb/summaries.py) equal what a rebuild from the runs computes, after every
kind of write; and a KB from before them migrates with its runs intact."""

import random
import sqlite3

import pytest

from advisor.kb import lease, store
from advisor.kb.open import open_for_writing
from advisor.kb.queries.for_answers import group_aggregates, group_cells, group_pairs
from advisor.kb.queries.groups import evidence_groups

from ..conftest import kb_before

SUMMARY_KEYS = {  # natural keys (group ids differ between a maintained KB and its rebuild)
    "cell_status": "g.source, g.model, g.protocol, s.optimizer, s.strategy, s.settings, s.status, s.n",
    "cell_stats": "g.source, g.model, g.protocol, s.optimizer, s.strategy, s.measure, s.scale, s.n, "
    "round(s.total, 9), round(s.total_sq, 9), s.first_value, s.first_unit",
    "seed_stats": "g.source, g.model, s.measure, s.seed, s.optimizer, s.strategy, s.n, round(s.total, 9)",
    "pair_stats": "g.source, g.model, s.measure, s.a_optimizer, s.a_strategy, s.b_optimizer, s.b_strategy, "
    "s.n, round(s.sum_d, 9), round(s.sum_dd, 9)",
}


def snapshot(conn) -> dict:
    out = {
        t: sorted(conn.execute(f"SELECT {cols} FROM {t} s JOIN groups g ON g.id = s.grp").fetchall())
        for t, cols in SUMMARY_KEYS.items()
    }
    out["groups"] = sorted(
        conn.execute("SELECT source, hardware, preset, model, family, protocol, n_params FROM groups")
    )
    out["unassigned"] = conn.execute("SELECT count(*) FROM runs WHERE grp IS NULL").fetchone()[0]
    return out


def rebuilt(conn, tmp_path) -> dict:
    copy = tmp_path / f"rebuilt-{len(list(tmp_path.iterdir()))}.sqlite"
    conn.execute("VACUUM INTO ?", [str(copy)])
    other = open_for_writing(copy)
    store.rebuild_summaries(other)
    return snapshot(other)


def run(rng, i, **over) -> dict:
    opt = rng.choice(["sgd", "adam", "adagrad"])
    strat = rng.choice(["standard", "checkpointing"])
    status = rng.choice(["ok"] * 6 + ["diverged", "oom"])
    return {
        "source": "measured",
        "model": "vit",
        "family": "vision",
        "optimizer": opt,
        "strategy": strat,
        "preset": rng.choice(["tiny", "small"]),
        "seed": rng.choice([0, 1, 2, None]),
        "hardware": "test machine",
        "host_memory_gb": rng.choice([16.0, None]),
        "status": status,
        "settings": rng.choice([None, "lr=0.1"]),
        "protocol": rng.choice(["fair", "paper"]),
        "n_params": rng.choice([None, 1000, 2000]),
        "started_at": f"2026-01-01T00:00:{i:02d}",
        "metrics": [
            {"name": "loss", "value": rng.uniform(0.5, 2.0), "unit": ""},
            {"name": "host_ram", "value": rng.uniform(1, 5), "unit": "%"},
        ]
        + ([{"name": "epoch_time", "value": rng.uniform(1, 3), "unit": "s"}] if rng.random() < 0.7 else []),
        **over,
    }


@pytest.mark.parametrize("seed", range(4))
def test_maintained_summaries_equal_a_rebuild_after_every_kind_of_write(tmp_path, seed):
    rng = random.Random(seed)
    conn = open_for_writing(tmp_path / "t.sqlite")
    store.write_runs(conn, [run(rng, i) for i in range(40)])  # bulk, set-based
    assert snapshot(conn) == rebuilt(conn, tmp_path)
    with store.transaction(conn):  # one at a time
        for i in range(40, 50):
            store.insert_run(conn, run(rng, i))
    claimed = []
    for i in range(50, 56):  # claims, then finished or left running
        r = run(rng, i, cell_key=f"k{i}", status="running", owner="elsewhere:1", metrics=[])
        run_id, _ = lease.claim_run(conn, r, pid_alive=lambda _: True)
        claimed.append(run_id)
    store.finish_run(conn, claimed[0], "ok", None, [("loss", 0.7, ""), ("epoch_time", 2.0, "s")])
    store.finish_run(conn, claimed[1], "diverged", "loss became nan", [("loss", 9.0, "")])
    store.update_run(conn, claimed[2], n_params=5000, config={"lr": 0.1})
    store.update_run(conn, claimed[0], settings="lr=0.3")  # an ok run changes its settings
    conn.execute("UPDATE runs SET lease_until = '2000-01-01' WHERE id = ?", [claimed[3]])
    assert lease.mark_crashed(conn, pid_alive=lambda _: True) == 1
    store.write_runs(conn, [run(rng, i) for i in range(56, 70)])  # more seeds of existing cells
    assert snapshot(conn) == rebuilt(conn, tmp_path)
    assert snapshot(conn)["unassigned"] == 0


def test_pairs_are_the_seed_paired_differences_of_per_seed_means(tmp_path):
    conn = open_for_writing(tmp_path / "t.sqlite")
    rows = []
    values = {
        ("adam", 0): [1.0, 3.0],
        ("adam", 1): [2.5],
        ("sgd", 0): [1.5],
        ("sgd", 1): [2.0],
        ("sgd", 2): [9],
    }
    for (opt, seed), losses in values.items():
        for i, v in enumerate(losses):
            rows.append(
                run(
                    random.Random(0),
                    len(rows),
                    optimizer=opt,
                    strategy="standard",
                    seed=seed,
                    status="ok",
                    preset="small",
                    protocol="fair",
                    settings=None,
                    metrics=[{"name": "loss", "value": v, "unit": ""}],
                    started_at=f"t{opt}{seed}{i}",
                )
            )
    store.write_runs(conn, rows)
    (group,) = evidence_groups(conn)
    pairs = group_pairs(conn, group, {"loss": 1.0})["loss"]
    p = pairs[(("adam", "standard"), ("sgd", "standard"))]
    # seed 0: mean(1, 3) - 1.5 = 0.5; seed 1: 2.5 - 2.0 = 0.5; seed 2: adam has none
    assert (p.n, p.sum_d, p.sum_dd) == (2, 1.0, 0.5)
    agg = group_aggregates(conn, group, {"loss": (2.0, None)})["loss"][("sgd", "standard")]
    assert (agg.n, agg.mean) == (3, 2 * (1.5 + 2.0 + 9) / 3)


def test_failed_seeds_are_the_seeds_without_an_ok_run(tmp_path):
    conn = open_for_writing(tmp_path / "t.sqlite")
    base = dict(optimizer="adam", strategy="standard", preset="small", protocol="fair", settings=None)
    outcomes = [(0, "ok"), (1, "diverged"), (2, "crashed"), (2, "ok"), (3, "untrained"), (4, "running")]
    store.write_runs(
        conn,
        [
            run(random.Random(0), i, seed=s, status=st, started_at=f"t{i}", error=f"why {i}", **base)
            for i, (s, st) in enumerate(outcomes)
        ],
    )
    (group,) = evidence_groups(conn)
    (cell,) = group_cells(conn, group)
    assert [(f.seed, f.status) for f in cell.failed] == [(1, "diverged"), (3, "untrained")]
    assert cell.n_ok == 2 and cell.seeds_total == 4
    assert cell.flag == "2 of 4 seeds ok; seed 1 diverged, seed 3 untrained"


def _old_kb(path):
    """A KB as advisor wrote it before migration 0008 (its first seven migrations, via sqlite-utils)."""
    db = kb_before(path, 7)
    for i, (status, protocol) in enumerate([("ok", "preset defaults"), ("diverged", "lr=0.1"), ("ok", None)]):
        db.execute(
            "INSERT INTO runs (cell_key, source, model, family, optimizer, strategy, preset, seed, hardware, "
            "status, protocol, uid) VALUES ('k', 'measured', 'vit', 'vision', 'adam', 'standard', 'small', ?, "
            "'cpu', ?, ?, ?)",
            [i, status, protocol, f"u{i}"],
        )
        db.execute(
            "INSERT INTO metrics (run_id, name, value, unit) VALUES (?, 'loss', ?, '')", [i + 1, 1.0 + i]
        )
        db.execute("INSERT INTO epochs (run_id, epoch, steps, loss) VALUES (?, 0, 4, 2.0)", [i + 1])
    db.conn.commit()
    db.conn.close()


def test_a_kb_from_before_the_summaries_migrates_with_its_runs_intact(tmp_path):
    path = tmp_path / "old.sqlite"
    _old_kb(path)
    conn = open_for_writing(path)
    rows = conn.execute("SELECT status, settings, protocol, grp IS NOT NULL FROM runs ORDER BY id").fetchall()
    assert rows == [
        ("ok", "preset defaults", "paper", 1),
        ("diverged", "lr=0.1", "paper", 1),
        ("ok", None, "paper", 1),
    ]
    assert conn.execute("SELECT count(*) FROM metrics").fetchone()[0] == 3  # the rebuild cascaded nothing
    assert conn.execute("SELECT count(*) FROM epochs").fetchone()[0] == 3
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert snapshot(conn) == rebuilt(conn, tmp_path)
    (group,) = evidence_groups(conn)
    assert (group.protocol, group.n_runs) == ("paper", 3)


def test_an_export_from_before_0008_imports_its_settings(tmp_path):
    """Files exported before 0008 named a run's settings `protocol`; they import as settings."""
    conn = open_for_writing(tmp_path / "t.sqlite")
    r = run(random.Random(1), 1, protocol="lr=0.01, epochs=8", status="ok")
    r.pop("settings")
    store.write_runs(conn, [r])
    assert conn.execute("SELECT settings, protocol FROM runs").fetchone() == ("lr=0.01, epochs=8", "paper")


def test_update_run_refuses_to_set_a_group(tmp_path):
    from advisor.errors import KBError

    conn = open_for_writing(tmp_path / "t.sqlite")
    store.write_runs(conn, [run(random.Random(2), 1)])
    with pytest.raises(KBError, match="group"):
        store.update_run(conn, 1, grp=7)


def test_raw_sqlite_check_rejects_an_unknown_status_and_protocol(tmp_path):
    """The store refuses them (advisor.kb.admission); below it, the schema's own CHECK does too."""
    from advisor.errors import KBError

    conn = open_for_writing(tmp_path / "t.sqlite")
    for column, value in (("status", "exploded"), ("protocol", "vibes")):
        r = run(random.Random(3), 1, **{column: value})
        with pytest.raises(KBError, match=f"{column} is {value!r}, not one of"):
            with store.transaction(conn):
                store.insert_run(conn, r)
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(
                "INSERT INTO runs (cell_key, source, model, family, optimizer, strategy, preset, hardware, "
                f"status, {'protocol' if column == 'protocol' else 'settings'}) "
                "VALUES ('k', 'measured', 'vit', 'vision', 'sgd', 'standard', 'tiny', 'CPU', ?, ?)",
                ["ok" if column == "protocol" else value, value],
            )
