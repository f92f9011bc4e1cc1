"""One validator for every way into a KB (advisor/kb/admission.py): the store's write path (import, merge,
build, measure, the Trainer callback) and the checks of a KB as it is read say the same rules, in Python
and in SQL; readers bound their time, name damage in a sentence, and show abandoned claims as crashed."""

import json
import os
import socket
import sqlite3

import pytest

from advisor.errors import KBError
from advisor.kb import admission, lease, store
from advisor.kb import open as kb_open
from advisor.kb.open import connect_kb_readonly, open_for_writing, release
from advisor.kb.queries import audit, for_report

from ..faults.test_fault_catalogue_kb import good_run, sql


@pytest.fixture
def kb(tmp_path):
    """A small valid KB of nine runs, written through the store."""
    path = tmp_path / "small.sqlite"  # (the test's kb.sqlite is a copy of the shipped KB)
    conn = open_for_writing(path)
    store.write_runs(conn, [good_run(i) for i in range(9)])
    release(conn)
    return path


# (column, stored value, whether the rules allow it): each written with raw SQL into run 1. Names the rules
# do not know but well formed are allowed as advisor's own writers write them and as a KB is read back
# (lenient); import and merge refuse them (test_unknown_names_are_refused_from_outside).
RUN_VALUES = [
    ("optimizer", "adamw", True),
    ("optimizer", "<script>", False),
    ("optimizer", "lion8bit", True),
    ("family", "klingon", True),
    ("family", "Klingon Empire", False),
    ("family", "unknown", True),
    ("strategy", "off load", False),
    ("seed", -5, False),
    ("seed", 3, True),
    ("seed", "zero", False),
    ("seed", 1.5, False),
    ("n_params", 1e300, False),
    ("n_params", 1000, True),
    ("host_memory_gb", -1.0, False),
    ("host_memory_gb", 9e999, False),
    ("host_memory_gb", 2e6, False),
    ("host_memory_gb", 64.0, True),
    ("hardware", "CPU\x1b[2J", False),
    ("hardware", "GPU: H200 ×8", True),
    ("model", "<img src=x>", False),
    ("model", "./my models/bert (v2)", True),
    ("config", "{not json", False),
    ("config", "[1, 2]", False),
    ("config", '{"lr": NaN}', False),
    ("config", '{"lr": 0.1}', True),
    ("preset", "Tiny!", False),
    ("source", "measured:tuning", True),
    ("source", "bad source", False),
    ("lease_until", "2999-01-01T00:00:00+00:00", True),
    ("lease_until", "tomorrow", False),
    ("uid", "a b", False),
]


@pytest.mark.parametrize("column,value,allowed", RUN_VALUES, ids=[f"{c}={v!r}" for c, v, _ in RUN_VALUES])
def test_python_and_sql_say_the_same_rule(kb, column, value, allowed):
    """The store's check (Python) and the reader's (SQL) agree on every value, valid or hostile."""
    conn = sqlite3.connect(kb, isolation_level=None)
    conn.execute("PRAGMA ignore_check_constraints = ON")
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = 1", [value])
    conn.close()
    ro = connect_kb_readonly(kb)
    stored = audit.stored_problems(ro, tables=["runs"])
    (run, *_) = for_report.export_runs(ro)
    python = admission.run_problem(run, lenient=True)
    assert (python is None) == allowed, python
    assert (not stored) == allowed, stored


@pytest.mark.parametrize(
    "column,value", [("family", "klingon"), ("optimizer", "lion8bit"), ("strategy", "offload")]
)
def test_unknown_names_are_refused_from_outside(column, value):
    """Import and merge (strict) take only the rules' names; a Trainer run may name its own optimizer."""
    assert f"unknown {column} {value!r}" in admission.run_problem(good_run(0, **{column: value}))
    trainer = good_run(0, protocol="trainer", **{column: value})
    assert (admission.run_problem(trainer) is None) == (column == "optimizer")


FIGURES = [
    ("epoch_time", -1e308, False),
    ("epoch_time", 1e10, False),
    ("epoch_time", 3.5, True),
    ("eval_loss", 1e308, False),
    ("eval_loss", -0.5, True),  # a Trainer's own loss may be negative; never infinite
    ("gpu_util", 100.0, True),
    ("gpu_util", 250.0, False),
    ("peak_rss_gb", 5e6, False),
    ("target_reached", 2.0, False),
]


@pytest.mark.parametrize("name,value,allowed", FIGURES, ids=[f"{n}={v!r}" for n, v, _ in FIGURES])
def test_figures_keep_their_physical_bounds(kb, name, value, allowed):
    conn = sqlite3.connect(kb, isolation_level=None)
    conn.execute(
        "INSERT OR REPLACE INTO metrics (run_id, name, value, unit) VALUES (1, ?, ?, 'u')", [name, value]
    )
    conn.close()
    ro = connect_kb_readonly(kb)
    (run, *_) = for_report.export_runs(ro)
    assert (admission.run_problem(run, lenient=True) is None) == allowed
    assert (not audit.stored_problems(ro, tables=["metrics"])) == allowed


def test_the_rules_cover_every_column():
    """A new column of runs needs its rule: the validator is the allow-list, the schema its source."""
    from advisor.kb.schema import columns

    assert set(admission.run_rules()) == set(columns("runs"))
    assert set(admission.metric_rules()) | {"value"} == set(columns("metrics"))
    assert set(admission.VALIDATION_RULES) == set(columns("validations"))


def test_the_store_refuses_a_bad_run_naming_it(kb):
    """Every writer goes through the store: a bad run is refused with its identity and why, nothing written."""
    conn = open_for_writing(kb)
    count = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    with pytest.raises(store.BadRuns, match=r"run \(no uid\) \('vit' · 'adam' · 'standard'\): seed must not"):
        store.write_runs(conn, [good_run(20), good_run(21, seed=-5)])
    with pytest.raises(KBError, match="unknown family '<b>klingon</b>'"):
        with store.transaction(conn):
            store.insert_run(conn, good_run(22, family="<b>klingon</b>"))  # the callback's and claims' path
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == count
    release(conn)


def test_a_trainer_run_may_name_its_own_optimizer_and_figures(tmp_path):
    """The user's own Trainer runs name any well-formed optimizer; a live run's bad figure is left out and
    said, a bad epoch figure stored as not measured, rather than lose the run."""
    conn = open_for_writing(tmp_path / "t.sqlite")
    trainer = good_run(0, protocol="trainer", source="trainer", preset="custom", optimizer="lion8bit")
    with store.transaction(conn):
        run_id = store.insert_run(conn, {**trainer, "metrics": [], "epochs": [], "status": "running"})
    with pytest.raises(KBError, match="unknown optimizer"):
        with store.transaction(conn):
            store.insert_run(conn, {**trainer, "optimizer": "<b>x</b>", "metrics": [], "epochs": []})
    with pytest.raises(store.BadRuns, match="unknown family 'klingon'"):
        store.write_runs(conn, [good_run(1, family="klingon")])  # import, merge, build: the rules' names
    store.add_epoch(conn, run_id, {"epoch": 0, "steps": 4, "loss": float("inf"), "wall_s": -1.0})
    assert conn.execute("SELECT loss, wall_s FROM epochs").fetchone() == (None, None)
    store.finish_run(conn, run_id, "ok", None, [("step_time", 0.5, "s"), ("loss", float("nan"), "nats")])
    figures = conn.execute("SELECT name, value FROM metrics").fetchall()
    error = conn.execute("SELECT error FROM runs WHERE id = ?", [run_id]).fetchone()[0]
    assert figures == [("step_time", 0.5)] and "figure 'loss' left out: value must be finite" in error
    release(conn)


def test_import_says_the_same_rules(invoke, tmp_path, kb):
    export = tmp_path / "runs.json"
    runs = [good_run(0, optimizer="<script>alert(1)</script>"), good_run(1)]
    export.write_text(json.dumps({"runs": runs}))
    before = kb.read_bytes()
    result = invoke("kb", "import", export, "--db", kb)
    assert result.exit_code == 1 and "run 0: unknown optimizer '<script>alert(1)</script>'" in result.output
    assert kb.read_bytes() == before


def test_a_read_has_a_time_bound(kb, monkeypatch):
    """SQLite's progress handler ends a stretch of work past the bound: 'interrupted', said in a sentence."""
    monkeypatch.setenv("ADVISOR_READ_TIMEOUT_S", "0.3")
    conn = connect_kb_readonly(kb)
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        conn.execute(endless).fetchone()
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 9  # the next query starts afresh


def test_damage_met_mid_answer_is_one_sentence(invoke, kb, monkeypatch):
    """A KB read alone above the size whose pages are checked on every read: damage SQLite meets while
    answering ends the command with a sentence naming the KB, not a traceback."""
    monkeypatch.setattr(kb_open, "MAX_CHECKED_BYTES_ALONE", 0)
    conn = sqlite3.connect(kb)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(kb.read_bytes())
    data[(root - 1) * size : root * size] = (
        b"\x0d" + bytes(range(255)) * (size // 255) + bytes(size % 255 - 1)
    )
    kb.write_bytes(bytes(data))
    result = invoke("kb", "runs", "--db", kb, catch_exceptions=True)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert str(kb) in result.output and "advisor kb check" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_abandoned_claims_show_as_crashed_and_the_next_writer_marks_them(invoke, kb):
    """Readers never write: a `running` run whose owner is dead on this host, or whose lease is forged (until
    2999), is shown crashed with why; the next writer marks it so."""
    dead = f"{socket.gethostname()}:{2**22 + 12345}"
    sql(
        f"UPDATE runs SET status = 'running', owner = '{dead}', lease_until = '2999-01-01T00:00:00+00:00' "
        "WHERE id = 1",
        "UPDATE runs SET status = 'running', owner = 'far-away:7', lease_until = '2999-01-01T00:00:00+00:00' "
        "WHERE id = 2",
        f"UPDATE runs SET status = 'running', owner = '{socket.gethostname()}:{os.getpid()}', "
        "lease_until = strftime('%Y-%m-%dT%H:%M:%S+00:00', 'now', '+60 seconds') WHERE id = 3",
    )(kb)
    before = kb.read_bytes()
    runs = json.loads(invoke("kb", "runs", "--db", kb, "--status", "crashed", "--json").output)
    assert [r["id"] for r in runs] == [1, 2] and all("shown as crashed" in r["error"] for r in runs)
    stats = json.loads(invoke("kb", "stats", "--db", kb, "--json").output)
    assert stats["by_status"] == {"ok": 6, "crashed": 2, "running": 1}  # run 3: this process holds it
    assert kb.read_bytes() == before
    conn = open_for_writing(kb)
    assert lease.mark_crashed(conn, lease.pid_alive_here) == 2
    release(conn)


def test_a_merge_streams_its_source_in_batches(invoke, tmp_path, monkeypatch):
    """More runs than one batch: every batch staged, all added in one transaction."""
    from advisor.kb import build

    monkeypatch.setattr(build, "MERGE_BATCH", 4)
    source = tmp_path / "node.sqlite"
    conn = open_for_writing(source)
    store.write_runs(conn, [good_run(i) for i in range(30)])
    release(conn)
    result = invoke("kb", "merge", source, "--db", tmp_path / "mine.sqlite")
    assert result.exit_code == 0 and "30 runs added" in result.output
    again = invoke("kb", "merge", source, "--db", tmp_path / "mine.sqlite")
    assert "0 runs added, 30 already there, 0 conflicts" in again.output


def test_a_forged_summary_read_alone_is_refused(invoke, kb):
    """A KB named with --db has the summaries answers compute from checked: a forged total is refused."""
    sql("UPDATE cell_stats SET total = -1e308 WHERE measure = 'epoch_time'")(kb)
    result = invoke("recommend", "--arch", "vit", "--db", kb, catch_exceptions=True)
    assert (
        result.exit_code == 1 and "break advisor's rules" in result.output and "cell_stats" in result.output
    )


def test_a_read_past_its_bound_is_one_sentence(invoke, monkeypatch):
    """The bound at work through a command: the read is stopped and said, never a traceback or a hang."""
    monkeypatch.setenv("ADVISOR_READ_TIMEOUT_S", "0.0001")
    result = invoke("recommend", "--arch", "vit", catch_exceptions=True)
    assert result.exit_code == 1 and "took longer than 0.0001 s and was stopped" in result.output, (
        result.output
    )
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
