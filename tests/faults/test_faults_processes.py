"""Faults of whole processes: kill -9 at random moments of import, build and measure; four importers and a
measure on one KB at once; leases that expire; a full disk; a KB written in WAL mode, read from a read-only
folder by a user who cannot write there. Each ends with an intact KB: nothing lost, nothing twice."""

import json
import os
import random
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import pytest

from advisor.kb.store import rebuild_summaries

from ..processes import advisor, query, wait_until_ended

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "kb" / "results.sqlite"
GOOD_RUN = json.loads((REPO / "tests" / "fixtures" / "run.json").read_text())


def export_file(path: Path, n: int, tag: str) -> Path:
    """An export of n distinct runs (the fixture run with its own identity and seed each)."""
    runs = [
        dict(GOOD_RUN, uid=f"{tag}-{i:08d}", seed=i, started_at=f"2026-02-01T00:00:{i % 60:02d}+00:00")
        for i in range(n)
    ]
    path.write_text(json.dumps({"runs": runs}))
    return path


def content(db) -> dict:
    """A KB's rows, table by table (migrations without their timestamps)."""
    tables = [r[0] for r in query(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    return {
        t: query(db, f"SELECT {'name' if t == '_sqlite_migrations' else '*'} FROM {t} ORDER BY 1")
        for t in tables
    }


def runs_of(db) -> int:
    return query(db, "SELECT count(*) FROM runs")[0][0]


@pytest.mark.slow
def test_kill_9_during_an_import_leaves_all_or_nothing(tmp_path):
    big = export_file(tmp_path / "big.json", 20_000, "big")
    db = tmp_path / "kb.sqlite"
    shutil.copy(SHIPPED, db)
    before = runs_of(db)
    rng = random.Random(9)
    for _ in range(3):
        proc = advisor("kb", "import", big, "--db", db)
        time.sleep(rng.uniform(0.3, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert query(db, "PRAGMA integrity_check") == [("ok",)]
        assert runs_of(db) in (before, before + 20_000), "an import is atomic from a reader's view"
    done = advisor("kb", "import", big, "--db", db)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    assert runs_of(db) == before + 20_000
    assert query(db, "SELECT count(*) - count(DISTINCT uid) FROM runs") == [(0,)]
    again = advisor("kb", "import", big, "--db", db)
    assert "20000 already there" in again.communicate(timeout=300)[0]


@pytest.mark.slow
def test_kill_9_during_a_build_keeps_the_old_kb_and_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "built.sqlite"
    assert advisor("kb", "build", "-o", out).wait(timeout=120) == 0
    reference = content(out)
    rng = random.Random(3)
    for _ in range(3):
        proc = advisor("kb", "build", "-o", out, "--force")  # an earlier build: replaced, as asked
        time.sleep(rng.uniform(0.2, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert query(out, "PRAGMA integrity_check") == [("ok",)]
        assert runs_of(out) == runs_of(SHIPPED)
    assert advisor("kb", "build", "-o", out, "--force").wait(timeout=120) == 0
    assert content(out) == reference
    assert not list(tmp_path.glob(".build-*")), "a killed build's files are cleaned up"


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
    "--epochs",
    "3",
    "--steps-per-epoch",
    "8",
]


@pytest.mark.slow
def test_kill_9_at_random_moments_of_measure(tmp_path):
    db = tmp_path / "m.sqlite"
    rng = random.Random(5)
    for _ in range(3):
        proc = advisor("measure", *GRID, "--db", db)
        time.sleep(rng.uniform(2.0, 6.0))
        spawned = psutil.Process(proc.pid).children(recursive=True)  # the fork server, the cell's process
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert wait_until_ended(spawned) == [], "no cell goes on running after its grid was killed"
        if db.exists():
            assert query(db, "PRAGMA integrity_check") == [("ok",)]
    done = advisor("measure", *GRID, "--db", db, "--json")
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    per_cell = query(
        db, "SELECT optimizer, sum(status = 'ok'), sum(status = 'running') FROM runs GROUP BY optimizer"
    )
    assert sorted(per_cell) == [("adam", 1, 0), ("sgd", 1, 0)], per_cell  # one ok run each, none left running


@pytest.mark.slow
def test_four_importers_and_a_measure_share_a_kb(tmp_path):
    db = tmp_path / "shared.sqlite"
    shutil.copy(SHIPPED, db)
    before = runs_of(db)
    files = [export_file(tmp_path / f"part{i}.json", 3000, f"part{i}") for i in range(4)]
    procs = [advisor("kb", "import", f, "--db", db) for f in files]
    procs.append(
        advisor(
            "measure",
            "--model",
            "vit",
            "--preset",
            "tiny",
            "--optimizer",
            "sgd",
            "--strategy",
            "standard",
            "--epochs",
            "2",
            "--steps-per-epoch",
            "4",
            "--db",
            db,
        )
    )
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err
    assert runs_of(db) == before + 4 * 3000 + 1
    assert query(db, "PRAGMA integrity_check") == [("ok",)]
    assert query(db, "PRAGMA journal_mode") == [("delete",)], "the last writer leaves rollback journaling"


def test_an_expired_lease_is_crashed_on_any_host_and_its_cell_runs_again(tmp_path, measure_tiny):
    db = tmp_path / "lease.sqlite"
    assert measure_tiny(db, "--optimizer", "sgd", "--strategy", "standard").exit_code == 0
    conn = sqlite3.connect(db)
    conn.execute(
        "UPDATE runs SET status = 'running', owner = 'another-host:4242', lease_until = '2000-01-01T00:00:00+00:00'"
    )
    conn.commit()
    rebuild_summaries(conn)  # a raw edit bypasses the summaries store.py keeps
    conn.close()
    result = measure_tiny(db, "--optimizer", "sgd", "--strategy", "standard", "--json")
    assert json.loads(result.stdout)["results"][0]["status"] == "ok"
    rows = query(db, "SELECT status, error FROM runs ORDER BY id")
    assert rows[0][0] == "crashed" and "stopped renewing its lease" in rows[0][1] and rows[1][0] == "ok"


def test_a_live_lease_on_another_host_holds_its_cell(tmp_path, measure_tiny):
    db = tmp_path / "lease.sqlite"
    assert measure_tiny(db, "--optimizer", "sgd", "--strategy", "standard").exit_code == 0
    conn = sqlite3.connect(db)
    # a live lease, as a heartbeat keeps it (a lease further ahead than an hour counts as forged: lease.py)
    until = (datetime.now(UTC) + timedelta(minutes=30)).isoformat(timespec="seconds")
    conn.execute("UPDATE runs SET status = 'running', owner = 'another-host:4242', lease_until = ?", [until])
    conn.commit()
    rebuild_summaries(conn)  # a raw edit bypasses the summaries store.py keeps
    conn.close()
    result = measure_tiny(db, "--optimizer", "sgd", "--strategy", "standard", "--json")
    assert json.loads(result.stdout)["results"][0]["status"] == "skipped"
    assert query(db, "SELECT count(*) FROM runs") == [(1,)]


def test_the_heartbeat_renews_leases():
    from advisor.kb import lease, store
    from advisor.kb.open import open_for_writing, release

    folder = Path(tempfile.mkdtemp())
    try:
        db = folder / "hb.sqlite"
        conn = open_for_writing(db)
        run = dict(GOOD_RUN, status="running", lease_until="2000-01-01T00:00:00+00:00", metrics=[], epochs=[])
        with store.transaction(conn):
            run_id = store.insert_run(conn, run)
        with lease.Heartbeat(db, interval=0.05) as beat:
            beat.hold(run_id)
            time.sleep(0.3)
        (until,) = conn.execute("SELECT lease_until FROM runs WHERE id = ?", [run_id]).fetchone()
        assert until > store.now()
        release(conn)
    finally:
        shutil.rmtree(folder)


def _file_size_limit(limit):
    def apply():
        signal.signal(
            signal.SIGXFSZ, signal.SIG_IGN
        )  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
def test_a_full_disk_is_a_sentence_and_the_kb_stays_intact(tmp_path):
    db = tmp_path / "kb.sqlite"
    shutil.copy(SHIPPED, db)
    before = runs_of(db)
    big = export_file(tmp_path / "big.json", 5000, "full")
    # the import's pages go to the write-ahead log first: a limit well below what 5,000 runs take there
    proc = advisor("kb", "import", big, "--db", db, preexec_fn=_file_size_limit(1_000_000))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, (out, err)
    assert "full" in err or "space" in err or "too large" in err, err
    assert "Traceback" not in err
    assert query(db, "PRAGMA integrity_check") == [("ok",)] and runs_of(db) == before
    export = advisor(
        "kb", "export", "--db", db, "-o", tmp_path / "out.json", preexec_fn=_file_size_limit(100_000)
    )
    _, err = export.communicate(timeout=120)
    assert export.returncode == 1 and "Free some space" in err and "Traceback" not in err


def _unprivileged():
    """A way to run as a user who cannot write the folder: `nobody` via setpriv when root, else as is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no unprivileged user to test a read-only folder")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_wal_kb_in_a_read_only_folder_serves_every_read_command():
    folder = Path(tempfile.mkdtemp(prefix="advisor-ro-"))
    try:
        folder.chmod(0o755)
        db = folder / "kb.sqlite"
        shutil.copy(SHIPPED, db)
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)  # written in WAL mode
        conn.execute("UPDATE runs SET error = NULL")
        conn.commit()
        conn.close()
        db.chmod(0o444)
        folder.chmod(0o555)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(folder)}
        for args in (
            ["recommend", "--arch", "encoder", "--optimize", "memory"],
            ["frontier", "--arch", "vit"],
            ["flowchart"],
            ["claims"],
            ["kb", "stats"],
            ["kb", "runs", "--limit", "3"],
            ["kb", "export"],
        ):
            cmd = [*_unprivileged(), sys.executable, "-m", "advisor", *args, "--db", str(db)]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder)
            assert done.returncode == 0, (args, done.stderr)
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)


def test_a_write_command_leaves_the_kb_in_rollback_journal_mode(tmp_path, invoke, kb_path):
    export = tmp_path / "one.json"
    export.write_text(json.dumps({"runs": [GOOD_RUN]}))
    assert invoke("kb", "import", export).exit_code == 0
    assert query(kb_path, "PRAGMA journal_mode") == [("delete",)]
    assert not Path(f"{kb_path}-wal").exists() and not Path(f"{kb_path}-shm").exists()
