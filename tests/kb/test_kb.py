"""The KB: migrations, the shipped file matching its sources, import and export, stats and runs."""

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.kb.build import build_kb, import_file
from advisor.kb.ingest import ImportRowsError
from advisor.kb.open import open_for_writing, release
from advisor.kb.schema import KNOWN_MIGRATIONS, schema_sql

from ..conftest import RULES, kb_before

REPO = Path(__file__).resolve().parents[2]
SHIPPED_KB = REPO / "kb" / "results.sqlite"


def dump(path):
    """The logical content of a KB: every table's rows, migrations without their timestamps."""
    conn = sqlite3.connect(path)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
    out = {}
    for t in tables:
        cols = "migration_set, name" if t == "_sqlite_migrations" else "*"
        out[t] = conn.execute(f"SELECT {cols} FROM {t} ORDER BY 1, 2").fetchall()
    return out, schema_sql(conn)


def test_shipped_kb_matches_what_build_makes(tmp_path):
    built = tmp_path / "built.sqlite"
    build_kb(built, RULES)
    assert dump(built) == dump(SHIPPED_KB), "kb/results.sqlite is stale: run `make kb` (advisor kb build)"
    assert sqlite3.connect(SHIPPED_KB).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_blank_and_shipped_kb_migrate_to_same_schema(tmp_path):
    blank = tmp_path / "blank.sqlite"
    open_for_writing(blank).close()
    copy = tmp_path / "shipped.sqlite"
    copy.write_bytes(SHIPPED_KB.read_bytes())
    open_for_writing(copy).close()
    assert schema_sql(sqlite3.connect(blank)) == schema_sql(sqlite3.connect(copy))
    applied = [
        r[0] for r in sqlite3.connect(blank).execute("SELECT name FROM _sqlite_migrations ORDER BY id")
    ]
    assert applied == KNOWN_MIGRATIONS


def test_the_reference_schema_is_read_from_the_shipped_kb_only_where_it_is_at_these_migrations(
    tmp_path, monkeypatch
):
    """A KB is checked against what the migrations create: read from the shipped KB (no 10 ms of schema
    statements per answer) where it records exactly the known migrations, else made in memory; both equal."""
    from advisor.kb import migrations
    from advisor.kb import schema as kb_schema

    made = kb_schema._migrated_schema()
    kb_schema.reference_schema.cache_clear()
    assert kb_schema._shipped_schema() == made and kb_schema.reference_schema() == made
    older = tmp_path / "older.sqlite"
    conn = sqlite3.connect(older)
    migrations.migrate(conn, until=KNOWN_MIGRATIONS[-2])
    conn.commit()
    conn.close()
    for shipped in (older, tmp_path / "missing.sqlite", tmp_path):  # at other migrations, absent, a folder
        monkeypatch.setattr(kb_schema, "shipped_kb_path", lambda shipped=shipped: shipped)
        kb_schema.reference_schema.cache_clear()
        assert kb_schema._shipped_schema() is None and kb_schema.reference_schema() == made
    kb_schema.reference_schema.cache_clear()


def test_open_for_writing_sets_wal_and_busy_timeout(tmp_path):
    db = open_for_writing(tmp_path / "w.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000


def test_paper_figures_carry_provenance(kb_path):
    conn = sqlite3.connect(kb_path)
    conn.row_factory = sqlite3.Row
    run = conn.execute(
        "SELECT * FROM runs WHERE model='llama' AND optimizer='cgd' AND strategy='standard'"
    ).fetchone()
    assert run["source"] == "paper:2608.08961" and run["hardware"] == "NVIDIA A100 40GB"
    assert run["preset"] == "paper" and run["host_memory_gb"] == 256 and run["status"] == "ok"
    assert json.loads(run["config"])["lr"] == 2e-5
    metric = conn.execute("SELECT * FROM metrics WHERE run_id = ? AND name='loss'", [run["id"]]).fetchone()
    assert (metric["value"], metric["certainty"]) == (996.59, "stated")
    assert "CGD" in metric["note"]
    n_csv = len((REPO / "kb/inputs/paper-2608.08961/figures.csv").read_text().strip().splitlines()) - 1
    paper_figures = (
        "SELECT count(*) FROM metrics JOIN runs ON runs.id = run_id WHERE source = 'paper:2608.08961'"
    )
    assert conn.execute(paper_figures).fetchone()[0] == n_csv
    # holes are absent rows, never zeros
    assert conn.execute(paper_figures + " AND value = 0").fetchone()[0] == 0


def test_import_with_bad_rows_imports_nothing(tmp_path, kb_path, invoke):
    src = REPO / "kb/inputs/paper-2608.08961"
    csv_path = tmp_path / "figures.csv"
    lines = (src / "figures.csv").read_text().splitlines()
    lines.insert(5, "vit,lion,standard,loss,0.1,loss,stated,x")
    lines.insert(7, "vit,sgd,standard,loss,not-a-number,loss,stated,x")
    csv_path.write_text("\n".join(lines) + "\n")
    target = tmp_path / "target.sqlite"
    with pytest.raises(ImportRowsError, match="2 bad row"):
        import_file(target, csv_path, RULES, src / "setup.toml")
    result = invoke("kb", "import", csv_path, "--setup", src / "setup.toml", "--db", kb_path)
    assert result.exit_code == 1
    assert "line 6: unknown optimizer 'lion'" in result.output and "nothing was imported" in result.output
    assert dump(kb_path) == dump(SHIPPED_KB)


def test_export_import_round_trip(tmp_path, invoke):
    export = tmp_path / "all.json"
    assert invoke("kb", "export", "-o", export).exit_code == 0
    target = tmp_path / "copy.sqlite"
    result = invoke("kb", "import", export, "--db", target)
    total = sqlite3.connect(SHIPPED_KB).execute("SELECT count(*) FROM runs").fetchone()[0]
    assert result.exit_code == 0 and f"Imported {total} runs" in result.output
    again = invoke("kb", "import", export, "--db", target)
    assert "0 runs" in again.output and f"{total} already there" in again.output
    assert dump(target)[0]["metrics"] == dump(SHIPPED_KB)[0]["metrics"]


def test_bad_json_import(tmp_path, invoke):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"source": "measured", "model": "vit"}]}))
    result = invoke("kb", "import", bad)
    assert result.exit_code == 1 and "run 0: missing family" in result.output
    bad.write_text("{not json")
    assert "not valid JSON" in invoke("kb", "import", bad).output


def test_export_csv(invoke):
    result = invoke("kb", "export", "--format", "csv", "--source", "paper:2608.08961")
    rows = result.output.strip().splitlines()
    assert rows[0].startswith("source,model,family,optimizer,strategy")
    assert len(rows) == 107


def test_stats_and_runs(invoke):
    stats = json.loads(invoke("kb", "stats", "--json").output)
    assert {"source": "paper:2608.08961", "runs": 51} in stats["by_source"]
    inputs = Path(__file__).parents[2] / "kb" / "inputs"
    parts = {p: len(json.loads(p.read_text())["runs"]) for p in inputs.glob("measured-cpu-*.json")}
    assert (
        len(parts) == 8
    )  # the grid at two scales, LoRA's bases, Muon re-measured: each with its tuning runs
    grid = sum(n for p, n in parts.items() if not p.name.endswith("-tuning.json"))
    assert {"source": "measured", "runs": grid} in stats["by_source"]  # the reference measurements
    tuning = sum(n for p, n in parts.items() if p.name.endswith("-tuning.json"))
    assert {"source": "measured:tuning", "runs": tuning} in stats["by_source"]  # the rates it tried
    assert set(stats["by_status"]) == {"ok", "diverged", "untrained"}  # the last two: tuning rates
    assert {g["family"] for g in stats["groups"]} == {"vision", "encoder", "decoder", "vlm"}
    runs = json.loads(
        invoke("kb", "runs", "--family", "llama", "--source", "paper:2608.08961", "--json").output
    )
    assert len(runs) == 15
    assert {"id", "source", "model", "family", "optimizer", "strategy", "status"} <= set(runs[0])
    assert "A100" in invoke("kb", "runs", "--limit", "3").output


def _open_when_released(path, barrier, results):
    barrier.wait()
    try:
        open_for_writing(path).close()
        results.put("ok")
    except Exception as e:  # the failure is the finding: report it to the parent
        results.put(repr(e))


@pytest.mark.slow
def test_processes_creating_one_new_kb_at_once_all_succeed(tmp_path):
    """The race CI found: two `advisor measure` on a new --db both created the schema."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for trial in range(8):
        path = tmp_path / f"new-{trial}.sqlite"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open_when_released, args=(path, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        outcomes = [results.get() for _ in procs]
        assert outcomes == ["ok"] * 4, outcomes
        assert sqlite3.connect(path).execute("SELECT count(*) FROM _sqlite_migrations").fetchone() == (
            len(KNOWN_MIGRATIONS),
        )


def test_validations_travel_with_an_export(tmp_path, invoke):
    """advisor validate's checks and fit's GPU checks are evidence too: export and import carry them."""
    from advisor.kb import store
    from advisor.kb.open import open_for_writing
    from advisor.kb.store import Check

    source = tmp_path / "source.sqlite"
    source.write_bytes(SHIPPED_KB.read_bytes())
    conn = open_for_writing(source)
    machine = {"hardware": "NVIDIA H200", "device": "cuda", "software": {"torch": "2.11"}}
    store.add_validations(
        conn, machine, "paper", [Check("fit_tensor_peak_vs_cuda_allocated", "llama", True, -0.002, 0.05, "x")]
    )
    conn.close()
    export = tmp_path / "all.json"
    assert invoke("kb", "export", "--db", source, "-o", export).exit_code == 0
    target = tmp_path / "copy.sqlite"
    assert invoke("kb", "import", export, "--db", target).exit_code == 0
    assert invoke("kb", "import", export, "--db", target).exit_code == 0  # twice: no duplicate
    rows = sqlite3.connect(target).execute("SELECT hardware, name, value FROM validations").fetchall()
    assert rows == [("NVIDIA H200", "fit_tensor_peak_vs_cuda_allocated", -0.002)]


def fresh_advisor(*argv) -> str:
    """advisor run with argv in a fresh interpreter: its output, then the sqlite_utils modules it loaded."""
    code = (
        f"import sys; sys.argv = ['advisor', *{[str(a) for a in argv]!r}]\n"
        "from advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert e.code in (0, None), e.code\n"
        "print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] == 'sqlite_utils'))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
@pytest.mark.parametrize("command", ["import", "merge"])
def test_a_write_into_a_current_kb_imports_no_sqlite_utils(tmp_path, invoke, command):
    """A write with nothing to migrate reads the recorded migrations with the standard library alone."""
    target = tmp_path / "current.sqlite"
    release(open_for_writing(target))
    source = tmp_path / "runs.json"
    if command == "import":
        assert invoke("kb", "export", "-o", source).exit_code == 0
    else:
        source = SHIPPED_KB
    out = fresh_advisor("kb", command, source, "--db", target)
    total = sqlite3.connect(SHIPPED_KB).execute("SELECT count(*) FROM runs").fetchone()[0]
    assert f"{total} runs" in out and "LOADED []" in out, out[-300:]


def test_a_write_into_an_older_kb_migrates_it(tmp_path):
    """A KB an older advisor wrote (its first seven migrations, through sqlite-utils) is brought to the
    current schema by the next write, which then writes into it."""
    old = tmp_path / "old.sqlite"
    kb_before(old, 7).conn.close()
    out = fresh_advisor("kb", "merge", SHIPPED_KB, "--db", old)
    conn = sqlite3.connect(old)
    applied = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY id")]
    runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    assert applied == KNOWN_MIGRATIONS and "LOADED []" in out
    assert runs == sqlite3.connect(SHIPPED_KB).execute("SELECT count(*) FROM runs").fetchone()[0]


def test_every_shipped_input_is_in_the_build_order_and_the_order_keeps_the_ids():
    """kb/inputs/ORDER lists every input: a new one is appended (its groups numbered after the others), so
    the ids people type keep their meaning; an input it does not list would be read after all of them."""
    from advisor.kb.build import ORDER_FILE, build_order

    inputs = Path(__file__).parents[2] / "kb" / "inputs"
    listed = (inputs / ORDER_FILE).read_text().split()
    assert [p.name for p in build_order(inputs)] == listed
    assert listed[0] == "paper-2608.08961" and len(set(listed)) == len(listed)
