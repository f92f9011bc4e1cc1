"""`advisor kb merge`: KBs united by run identity, idempotently, provenance kept, conflicts reported."""

import json
import shutil
import sqlite3

from advisor.kb.open import open_for_writing
from advisor.kb.store import run_digest, run_digests, write_runs


def run(uid, hardware, status="ok", loss=1.0):
    return dict(
        uid=uid,
        source="measured",
        model="llama",
        family="decoder",
        optimizer="adam",
        strategy="standard",
        preset="tiny",
        seed=int(uid[-1]),
        hardware=hardware,
        device="cpu",
        status=status,
        config={},
        software={},
        started_at="2026-11-30",
        metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
    )


def kb_with(path, runs):
    db = open_for_writing(path)
    write_runs(db, runs)
    db.close()
    return path


def dump(path):
    conn = sqlite3.connect(path)
    try:
        return sorted(conn.execute("SELECT uid, hardware, status FROM runs").fetchall()), sorted(
            conn.execute("SELECT r.uid, m.name, m.value FROM metrics m JOIN runs r ON r.id = m.run_id")
        )
    finally:
        conn.close()


def test_merging_twice_is_merging_once(invoke, tmp_path):
    a = kb_with(tmp_path / "a.sqlite", [run(f"a{i}", "CPU: laptop") for i in range(3)])
    b = kb_with(
        tmp_path / "b.sqlite", [run(f"b{i}", "GPU: H100") for i in range(2)] + [run("a0", "CPU: laptop")]
    )
    target = tmp_path / "mine.sqlite"
    first = invoke("kb", "merge", a, b, "--db", target)
    assert first.exit_code == 0, first.output
    assert "5 runs added, 1 already there, 0 conflicts" in first.output  # a0 is in both: added once
    once = dump(target)
    again = invoke("kb", "merge", a, b, "--db", target)
    assert "0 runs added, 6 already there, 0 conflicts" in again.output
    assert dump(target) == once
    assert {h for _, h, _ in once[0]} == {"CPU: laptop", "GPU: H100"}  # provenance kept
    out = json.loads(invoke("kb", "stats", "--db", target, "--json").output)
    assert out["runs"] == 5


def test_a_conflict_is_reported_and_nothing_is_overwritten(invoke, tmp_path):
    target = kb_with(tmp_path / "mine.sqlite", [run("x1", "CPU: laptop", loss=1.0)])
    other = kb_with(tmp_path / "other.sqlite", [run("x1", "CPU: laptop", loss=2.0), run("x2", "CPU: laptop")])
    before = dump(target)
    result = invoke("kb", "merge", other, "--db", target)
    assert result.exit_code == 0 and "1 runs added, 0 already there, 1 conflicts" in result.output
    assert "conflict: run x1" in result.output and "differs from the one here: kept" in result.output
    after = dump(target)
    assert [r for r in after[1] if r[0] == "x1"] == [r for r in before[1] if r[0] == "x1"]


def test_merge_bad_input(invoke, tmp_path):
    assert invoke("kb", "merge").exit_code == 2  # no file
    assert invoke("kb", "merge", tmp_path / "missing.sqlite").exit_code == 2
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    result = invoke("kb", "merge", junk, "--db", tmp_path / "t.sqlite")
    assert result.exit_code == 1 and "Traceback" not in result.output
    target = kb_with(tmp_path / "self.sqlite", [run("s1", "CPU")])
    same = invoke("kb", "merge", target, "--db", target)
    assert same.exit_code == 2 and "is the KB merged into" in same.output


def test_a_cell_and_seed_measured_twice_on_one_hardware_is_merged_once(invoke, tmp_path):
    """Two KBs that each ran the same cell, seed and hardware (two users, or a shard run twice): the second
    run is a repeat of an outcome, not another seed, and is left out, as `measure` would skip it."""
    a = kb_with(tmp_path / "a.sqlite", [run("a0", "CPU: laptop"), run("a1", "CPU: laptop")])
    b = kb_with(tmp_path / "b.sqlite", [run("b0", "CPU: laptop", loss=1.2), run("b2", "CPU: laptop")])
    target = tmp_path / "t.sqlite"
    result = invoke("kb", "merge", a, b, "--db", target)
    assert result.exit_code == 0 and "1 repeats of a cell and seed" in result.output
    assert [uid for uid, _, _ in dump(target)[0]] == ["a0", "a1", "b2"]
    again = invoke("kb", "merge", b, "--db", target)
    assert "1 already there" in again.output and "1 repeats" in again.output
    assert len(dump(target)[0]) == 3


def test_runs_held_exactly_are_skipped_before_they_are_checked(invoke, tmp_path):
    """A source's run that the target holds exactly as it is (every column, figure and epoch) is already
    there: the merge neither checks nor stages it, so what the rules now refuse in the target's own rows
    refuses nothing. A held run that differs in any field is checked as ever: a field that breaks the
    rules refuses the merge, the target as it was."""
    target = kb_with(tmp_path / "t.sqlite", [run("a1", "CPU: laptop"), run("a2", "CPU: laptop")])
    with sqlite3.connect(target) as conn:  # a row the rules refuse, in the target (edited by hand)
        conn.execute("UPDATE runs SET optimizer = 'lion' WHERE uid = 'a1'")
    conn.close()
    source = tmp_path / "copy.sqlite"
    shutil.copy(target, source)
    kb_with(source, [run("a3", "CPU: laptop")])
    again = invoke("kb", "merge", source, "--db", target)
    assert again.exit_code == 0 and "1 runs added, 2 already there, 0 conflicts" in again.output
    with sqlite3.connect(source) as conn:  # the same status and figures, another field
        conn.execute("UPDATE runs SET optimizer = 'lion' WHERE uid = 'a2'")
    conn.close()
    before = dump(target)
    refused = invoke("kb", "merge", source, "--db", target)
    assert refused.exit_code == 1 and "lion" in refused.output and dump(target) == before


def test_figures_alike_to_nine_places_are_already_there(invoke, tmp_path):
    """The digest rounds figures to nine places: a copy that differs further out is the same run, not a
    conflict (the exact comparison that skips most held runs leaves it to the digest)."""
    target = kb_with(tmp_path / "mine.sqlite", [run("x1", "CPU: laptop", loss=1.0)])
    other = kb_with(tmp_path / "other.sqlite", [run("x1", "CPU: laptop", loss=1.0 + 1e-12)])
    result = invoke("kb", "merge", other, "--db", target)
    assert result.exit_code == 0 and "0 runs added, 1 already there, 0 conflicts" in result.output


def test_known_runs_are_found_in_one_query(tmp_path):
    """The runs a KB holds among a batch's uids, with their digests: one query, whatever the batch's size."""
    runs = [run(f"k{i}", "CPU: laptop", loss=1 + i / 10) for i in range(10)]
    conn = open_for_writing(kb_with(tmp_path / "k.sqlite", runs))
    statements = []
    conn.set_trace_callback(statements.append)
    digests = dict(run_digests(conn, [r["uid"] for r in runs] + ["not-there"]))
    conn.close()
    assert len(statements) == 1
    assert digests == {r["uid"]: run_digest(r) for r in runs}
