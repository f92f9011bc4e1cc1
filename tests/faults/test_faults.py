"""A KB that survives faults: kill -9 mid-cell, two writers at once, diverging and out-of-memory cells."""

import json
import signal

import pytest

from ..processes import advisor, query, wait_for

GRID = [
    "--model",
    "llama",
    "--preset",
    "tiny",
    "--optimizer",
    "sgd",
    "--optimizer",
    "adam",
    "--strategy",
    "standard",
    "--strategy",
    "accumulation",
    "--epochs",
    "3",
    "--steps-per-epoch",
    "8",
]


@pytest.mark.slow
def test_kill_9_mid_cell_then_rerun_completes_the_grid(tmp_path):
    db = tmp_path / "kill.sqlite"
    proc = advisor("measure", *GRID, "--db", db)
    # the first cell is done and the second has committed an epoch: kill in the middle of a cell
    wait_for(
        db,
        "SELECT count(*) FROM runs r WHERE status = 'running' AND EXISTS "
        "(SELECT 1 FROM epochs e WHERE e.run_id = r.id) AND (SELECT count(*) FROM runs WHERE status='ok') >= 1",
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
    statuses = dict(query(db, "SELECT status, count(*) FROM runs GROUP BY status"))
    assert statuses.get("ok", 0) >= 1 and statuses.get("running") == 1
    # no run is half-written: every ok run has its summary and all its epochs
    assert query(
        db,
        "SELECT count(*) FROM runs r WHERE status = 'ok' AND ((SELECT count(*) FROM epochs e "
        "WHERE e.run_id = r.id) != 3 OR NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = r.id "
        "AND m.name = 'loss'))",
    ) == [(0,)]
    rerun = advisor("measure", *GRID, "--db", db, "--json")
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    results = json.loads(out)["results"]
    assert sorted(r["status"] for r in results).count("skipped") == statuses["ok"]
    per_cell = query(
        db,
        "SELECT optimizer, strategy, sum(status = 'ok'), sum(status = 'crashed') FROM runs "
        "GROUP BY optimizer, strategy",
    )
    assert len(per_cell) == 4 and all(ok == 1 for _, _, ok, _ in per_cell), per_cell
    assert sum(c for *_, c in per_cell) == 1  # the killed run is kept, as crashed
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.slow
def test_two_processes_share_a_kb(tmp_path):
    db = tmp_path / "shared.sqlite"
    grid_a = [
        "--model",
        "llama",  # tiny Llama trains in 8 updates on every seed (the fair protocol's "did not train" check)
        "--preset",
        "tiny",
        "--epochs",
        "2",
        "--steps-per-epoch",
        "4",
        "--strategy",
        "standard",
        "--optimizer",
        "adamw",
        "--optimizer",
        "adam",
        "--optimizer",
        "adagrad",
        "--seeds",
        "2",
    ]
    procs = [advisor("measure", *grid_a, "--db", db, "--json") for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "database is locked" not in err
    results = [r for out, _ in outs for r in json.loads(out)["results"]]
    assert len(results) == 12  # 6 cells, offered to both processes
    assert (
        sum(r["status"] == "ok" for r in results) == 6 and sum(r["status"] == "skipped" for r in results) == 6
    )
    assert query(db, "SELECT count(*), count(DISTINCT optimizer || seed) FROM runs WHERE status = 'ok'") == [
        (6, 6)
    ]
    assert query(db, "SELECT count(*) FROM epochs") == [(12,)]  # no lost rows
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_diverging_and_oom_cells_are_stored_and_excluded_with_reasons(tmp_path, invoke, measure_tiny):
    db = tmp_path / "faults.sqlite"
    assert measure_tiny(db, "--strategy", "standard", "--optimizer", "adam").exit_code == 0
    diverging = measure_tiny(db, "--strategy", "standard", "--optimizer", "sgd", "--lr", "1e6", "--json")
    assert json.loads(diverging.stdout)["results"][0]["status"] == "diverged"
    oom = measure_tiny(
        db, "--strategy", "standard", "--optimizer", "adagrad", "--memory-cap", "0.001", "--json"
    )
    assert json.loads(oom.stdout)["results"][0]["status"] == "oom"
    out = json.loads(invoke("kb", "runs", "--db", db, "--json").output)
    assert sorted(r["status"] for r in out) == ["diverged", "ok", "oom"]
    # one evidence group (same source, hardware, preset, model): the failed cells are listed with reasons
    answer = json.loads(
        invoke("recommend", "--model", "vit", "--source", "measured", "--db", db, "--json").output
    )
    reasons = {e["optimizer"]: e["reason"] for e in answer["excluded"]}
    assert reasons["sgd"].startswith("diverged") and "loss" in reasons["sgd"]
    assert reasons["adagrad"].startswith("oom") and "--memory" in reasons["adagrad"]
    assert answer["recommendation"]["optimizer"] == "adam"


def test_unusable_db_paths_for_measure(invoke, tmp_path, kb_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    result = invoke("measure", "--model", "vit", "--preset", "tiny", "--db", blocker / "kb.sqlite")
    assert result.exit_code == 1 and "Pass --db with a writable path" in result.output
    result = invoke(
        "measure", "--model", "vit", "--preset", "tiny", "--db", tmp_path / "missing" / "kb.sqlite"
    )
    assert result.exit_code == 1 and "does not exist" in result.output
    corrupt = tmp_path / "corrupt.sqlite"
    corrupt.write_bytes(kb_path.read_bytes()[:5000])
    before = corrupt.read_bytes()
    result = invoke("measure", "--model", "vit", "--preset", "tiny", "--db", corrupt)
    assert result.exit_code == 1 and "corrupt or truncated" in result.output
    assert corrupt.read_bytes() == before, "nothing already stored is lost"


def test_answers_flag_evidence_that_mixes_settings(tmp_path, invoke, measure_tiny):
    db = tmp_path / "mixed.sqlite"
    assert measure_tiny(db, "--strategy", "standard", "--optimizer", "adam").exit_code == 0
    assert (
        measure_tiny(db, "--strategy", "standard", "--optimizer", "sgd", "--batch-size", "2").exit_code == 0
    )
    answer = json.loads(
        invoke("recommend", "--model", "vit", "--source", "measured", "--db", db, "--json").output
    )
    assert answer["mixed_protocols"] == {
        "epochs=1, steps_per_epoch=4": ["adam+standard"],
        "epochs=1, steps_per_epoch=4, batch_size=2": ["sgd+standard"],
    }
    text = invoke("recommend", "--model", "vit", "--source", "measured", "--db", db).output
    assert "mixes runs measured with different settings" in text
    shipped = json.loads(invoke("recommend", "--arch", "vit", "--source", "measured", "--json").output)
    assert shipped["mixed_protocols"] == {}  # the reference grid: one protocol


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_the_fork_server_dies_with_its_grid_even_while_it_imports(tmp_path):
    """kill -9 of `advisor measure` while its fork server still imports torch: the server goes at once
    (advisor.measuring.machine.orphans), instead of importing on for minutes holding the caller's pipes."""
    import time

    import psutil

    proc = advisor("measure", *GRID, "--db", tmp_path / "kb.sqlite")
    deadline, server = time.monotonic() + 60, None
    while server is None and time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        server = next((c for c in children if "forkserver" in " ".join(c.cmdline())), None)
        time.sleep(0.05)
    assert server is not None, "no fork server started"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    gone, _ = psutil.wait_procs([server], timeout=10)
    assert gone, "the fork server outlived its grid"
