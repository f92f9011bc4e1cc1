"""Seeds and uncertainty: 95 % intervals over seeds, ties where they overlap, single-seed answers say so."""

import json

import pytest
from scipy import stats

from advisor.store import open_kb, write_runs


def measured_run(optimizer, strategy, seed, loss, time_s):
    return dict(
        source="measured",
        model="vit",
        family="vision",
        optimizer=optimizer,
        strategy=strategy,
        preset="small",
        seed=seed,
        hardware="CPU: test",
        device="cpu",
        host_memory_gb=24.0,
        status="ok",
        config={"optimizer": optimizer, "strategy": strategy},
        software={},
        started_at=f"2026-01-0{seed + 1}",
        metrics=[
            dict(name="loss", value=loss, unit="nats/target"),
            dict(name="epoch_time", value=time_s, unit="s/epoch"),
        ],
    )


@pytest.fixture
def seeded_kb(tmp_path):
    path = tmp_path / "seeds.sqlite"
    db = open_kb(path)
    runs = []
    for seed, (a, b, c) in enumerate([(1.08, 1.02, 2.0), (1.12, 1.05, 2.1), (1.04, 1.12, 1.9)]):
        runs += [
            measured_run("adam", "standard", seed, a, 1.0 + seed * 0.01),
            measured_run("sgd", "standard", seed, b, 0.8),
            measured_run("adagrad", "standard", seed, c, 0.9),
        ]
    write_runs(db, runs)
    db.close()
    return path


def test_intervals_are_student_t(invoke, seeded_kb):
    out = json.loads(
        invoke("recommend", "--arch", "vit", "--source", "measured", "--db", seeded_kb, "--json").output
    )
    rec = out["recommendation"]
    values = {"adam": [1.08, 1.12, 1.04], "sgd": [1.02, 1.05, 1.12]}[rec["optimizer"]]
    mean, sem = sum(values) / 3, stats.sem(values)
    lo, hi = stats.t.interval(0.95, df=2, loc=mean, scale=sem)
    assert rec["seeds"] == 3 and rec["ci95"] == pytest.approx([lo, hi])
    assert out["evidence"]["seeds"] == 3


def test_overlapping_intervals_are_ties_not_a_winner(invoke, seeded_kb):
    out = json.loads(
        invoke("recommend", "--arch", "vit", "--source", "measured", "--db", seeded_kb, "--json").output
    )
    assert out["recommendation"]["tied"] is True
    tied = {a["optimizer"]: a["tied"] for a in out["alternatives"]}
    assert tied == {"sgd": True, "adagrad": False} or tied == {"adam": True, "adagrad": False}
    text = invoke("recommend", "--arch", "vit", "--source", "measured", "--db", seeded_kb).output
    assert "95% intervals overlap" in text and "3 seeds, 95% CI" in text


def test_single_seed_answer_says_so(invoke):
    text = invoke("recommend", "--arch", "encoder", "--optimize", "memory").output
    assert "single-seed" in text
    out = json.loads(invoke("recommend", "--arch", "encoder", "--json").output)
    assert out["recommendation"]["seeds"] == 1 and out["recommendation"]["ci95"] is None


def test_frontier_marks_points_within_noise(invoke, seeded_kb):
    out = json.loads(
        invoke("frontier", "--arch", "vit", "--source", "measured", "--db", seeded_kb, "--json").output
    )
    points = {p["optimizer"]: p for p in out["points"]}
    assert points["sgd"]["on_frontier"]  # fastest, and its loss ties adam's
    assert points["adagrad"]["x_ci"] is not None
    # adam: slower than sgd beyond noise, but its loss interval overlaps sgd's: not clearly dominated
    assert not points["adam"]["on_frontier"] and points["adam"]["within_noise"]
    # adagrad: slower and worse than sgd beyond both intervals
    assert not points["adagrad"]["within_noise"]


def test_flowchart_reports_ties(invoke, seeded_kb):
    out = json.loads(invoke("flowchart", "--source", "measured", "--db", seeded_kb, "--json").output)
    loss = next(p for p in out["paths"] if p["family"] == "vision" and p["metric"] == "loss")
    assert loss["tied"] is True
