"""The user's own KB: writes never go into the package; reads see the shipped KB and the user's together,
and answers prefer the user's own measurements where they match the question, and say so."""

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from advisor.kb import checks as remembered
from advisor.kb import open as kb_open
from advisor.kb.open import open_for_writing, release
from advisor.kb.store import write_runs

from ..conftest import SHIPPED_KB


@pytest.fixture
def no_db(monkeypatch, tmp_path):
    """No --db and no $ADVISOR_DB: the defaults a user gets (the user data folder is the test's own)."""
    monkeypatch.delenv("ADVISOR_DB")
    return tmp_path / "xdg-data" / "advisor" / "kb.sqlite"


PAPER_VIT = 85816343  # the paper's ViT-Base, as the shipped KB states it


def user_run(seed, optimizer, loss, n_params=None):
    return dict(
        n_params=n_params,
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
    small = 2723735  # the shipped CPU reference grid's small ViT: the user's runs are at its scale
    write_runs(
        db,
        [
            user_run(s, o, loss, small)
            for s in range(3)
            for o, loss in (("adam", 1.0 + s / 100), ("sgd", 2.0))
        ],
    )
    db.close()
    after = json.loads(invoke("kb", "stats", "--json").output)
    assert after["runs"] == before["runs"] + 6
    groups = {g["hardware"]: g for g in after["groups"]}
    assert groups["CPU: the user's laptop"]["yours"] and len(after["groups"]) == len(before["groups"]) + 1
    assert groups["CPU: the user's laptop"]["id"] == "u1"  # short: typed as --group u1
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


def test_kb_build_o_refuses_the_shipped_kb(invoke, tmp_path):
    """`kb build -o` names any file but the shipped KB, as every other writer (a link to it is the same file;
    were the refusal missing, the build would replace the link, never the shipped KB)."""
    link = tmp_path / "results.sqlite"
    link.symlink_to(SHIPPED_KB)
    before = SHIPPED_KB.read_bytes()
    result = invoke("kb", "build", "-o", link)
    assert (
        result.exit_code == 1
        and "is the shipped KB" in result.output
        and "-o writes another" in result.output
    )
    assert link.is_symlink() and SHIPPED_KB.read_bytes() == before


def test_migrate_without_a_kb_is_a_sentence(invoke, no_db):
    result = invoke("kb", "migrate")
    assert result.exit_code == 1 and "no knowledge base to migrate" in result.output


def test_a_group_is_selected_by_its_id_and_disagreeing_groups_are_shown(invoke, no_db):
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)  # the user's runs pick sgd on held-out loss, where the paper picks another
    write_runs(
        db,
        [
            user_run(s, o, loss, PAPER_VIT)
            for s in range(3)
            for o, loss in (("adam", 2.0 + s / 100), ("sgd", 1.0))
        ],
    )
    db.close()
    out = json.loads(invoke("recommend", "--arch", "vit", "--json").output)
    assert out["evidence"]["yours"] and out["recommendation"]["optimizer"] == "sgd"
    paper = next(g for g in out["other_evidence"] if g["source"].startswith("paper"))
    assert paper["select"] == f"--source {paper['source']} --group {paper['id']}"
    assert any(d["evidence"]["id"] == paper["id"] for d in out["disagreements"])
    chosen = json.loads(invoke("recommend", "--arch", "vit", "--group", paper["id"], "--json").output)
    assert chosen["evidence"]["id"] == paper["id"] and not chosen["evidence"]["yours"]
    text = invoke("recommend", "--arch", "vit", "--verbose").output
    assert "Other evidence picks differently" in text and f"--group {paper['id']}" in text
    none = invoke("recommend", "--arch", "vit", "--hardware", "CPU: nowhere")
    assert none.exit_code == 1 and "matching --hardware CPU: nowhere" in " ".join(none.output.split())
    for bad in ("0", "u", "x3", "-1"):
        wrong = invoke("recommend", "--arch", "vit", "--group", bad)
        assert wrong.exit_code == 2 and "is not a group id" in wrong.output, bad


def smoke_run(seed, optimizer, loss, model="vit"):
    """A seconds-long run of a 0.1 M-parameter model: what a user tries first."""
    return user_run(seed, optimizer, loss, 120_000) | dict(model=model)


ASKED = (
    ("recommend", "--arch", "vit"),
    ("recommend", "--arch", "vit", "--source", "measured"),
    ("recommend", "--model", "vit", "--optimize", "time"),
)


def test_a_smoke_run_never_becomes_the_default_answer(invoke, no_db):
    before = {args: json.loads(invoke(*args, "--json").output) for args in ASKED}
    claims = json.loads(invoke("claims", "--json").output)
    flowchart = json.loads(invoke("flowchart", "--json").output)
    no_db.parent.mkdir(parents=True, exist_ok=True)  # the answers kept their parsed rules in its cache/
    db = open_for_writing(no_db)  # it picks sgd, far off what the reference evidence says
    write_runs(db, [smoke_run(s, o, loss) for s in range(3) for o, loss in (("adam", 9.0), ("sgd", 0.5))])
    db.close()
    for args, was in before.items():
        now = json.loads(invoke(*args, "--json").output)
        assert now["evidence"] == was["evidence"] and now["recommendation"] == was["recommendation"], args
        mine = next((g for g in now["other_evidence"] if g["yours"]), None)
        if "time" in args:  # its runs hold no time figure: no evidence for a time question, so not offered
            assert mine is None
            continue
        assert (
            "120 k parameters" in mine["passed_over"]
            and "--group u1 or --evidence mine" in mine["passed_over"]
        )
    assert json.loads(invoke("claims", "--json").output) == claims
    assert json.loads(invoke("flowchart", "--json").output) == flowchart
    text = invoke("recommend", "--arch", "vit", "--verbose").output
    assert "passed over, not the model asked about" in " ".join(text.split())
    picked = json.loads(invoke("recommend", "--arch", "vit", "--evidence", "mine", "--json").output)
    assert picked["evidence"]["yours"] and picked["recommendation"]["optimizer"] == "sgd"
    by_id = json.loads(invoke("recommend", "--arch", "vit", "--group", "u1", "--json").output)
    assert by_id["evidence"]["id"] == "u1"
    bad = invoke("recommend", "--arch", "vit", "--evidence", "all")
    assert bad.exit_code == 2 and "'matching'" in bad.output and "Traceback" not in bad.output


def test_the_users_own_model_is_matched_by_its_name(invoke, no_db, tmp_path):
    """Runs of the model asked about answer for it at any scale: they are its evidence."""
    folder = tmp_path / "my-vit"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            dict(
                model_type="vit",
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=128,
                image_size=32,
                patch_size=8,
            )
        )
    )
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)
    write_runs(
        db,
        [
            smoke_run(s, o, loss, model=str(folder))
            for s in range(3)
            for o, loss in (("adam", 1.0), ("sgd", 2.0))
        ],
    )
    db.close()
    out = json.loads(invoke("recommend", "--model", folder, "--json").output)
    assert out["evidence"]["yours"] and out["evidence"]["model"] == str(folder)
    other = json.loads(invoke("recommend", "--model", "vit", "--json").output)  # the paper's ViT-Base
    assert not other["evidence"]["yours"] and other["question_parameters"] == PAPER_VIT


def test_the_users_own_model_is_matched_by_its_config_wherever_it_is_typed_from(invoke, no_db, tmp_path):
    """A model's runs are its evidence by the config.json they recorded, not the path as typed: the same
    folder named from another directory (or copied) finds them; another config under the same name does not
    (larger than the runs' 2x: matching by family and scale would take them)."""
    bigger = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048)
    config = dict(model_type="vit", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=128, image_size=32, patch_size=8)  # fmt: skip
    here, there, edited = (tmp_path / d / "my-vit" for d in ("runs", "elsewhere", "edited"))
    for folder, cfg in ((here, config), (there, config), (edited, config | bigger)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(cfg))
    from advisor.model_ref import resolve_model
    from advisor.rules import load_rules

    digest = resolve_model(str(here), load_rules()).config_hash
    assert digest == resolve_model(str(there), load_rules()).config_hash
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)
    runs = [
        smoke_run(s, o, loss, model="my-vit") for s in range(3) for o, loss in (("adam", 1.0), ("sgd", 2.0))
    ]
    write_runs(db, [r | {"preset": "custom", "config": {"model_config_hash": digest}} for r in runs])
    db.close()
    out = json.loads(invoke("recommend", "--model", there, "--json").output)
    assert out["evidence"]["yours"] and out["evidence"]["model"] == "my-vit", "found by its config"
    other = json.loads(invoke("recommend", "--model", edited, "--json").output)
    assert not other["evidence"]["yours"], "another config under the same folder name is another model"
    mine = next(g for g in other["other_evidence"] if g["yours"])
    assert "not the model asked about" in mine["passed_over"]


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
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


def test_a_smoke_run_of_another_source_needs_asking_for(invoke, no_db):
    """--source narrows the kind of evidence, not the matching: a Trainer smoke run is the only trainer
    group, and still does not answer for the family unless selected by name."""
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)
    runs = [
        smoke_run(s, o, loss) | dict(source="trainer", protocol="trainer")
        for s in range(3)
        for o, loss in (("adam", 9.0), ("sgd", 0.5))
    ]
    write_runs(db, runs)
    db.close()
    refused = invoke("recommend", "--arch", "vit", "--source", "trainer")
    assert refused.exit_code == 1 and "none of your vision runs matches this question" in refused.output
    assert "--evidence mine" in refused.output and "Traceback" not in refused.output
    mine = json.loads(
        invoke("recommend", "--arch", "vit", "--source", "trainer", "--evidence", "mine", "--json").output
    )
    assert mine["evidence"]["source"] == "trainer"
    default = json.loads(invoke("recommend", "--arch", "vit", "--json").output)
    assert not any(
        d["evidence"]["yours"] for d in default["disagreements"]
    )  # passed over: not a disagreement


# --- the user's KB checked once per version of its file (advisor.kb.remembered.file_version) ----------------

STILL_S = 0.05  # how long a file must be still before its pass is remembered, in these tests (2 s in use)


@pytest.fixture
def checks(monkeypatch, no_db):
    """The user's KB, written (and released, as advisor's writers leave it) and still; the count of full
    checks (quick_check and every row) run on it."""
    monkeypatch.setattr(remembered, "STILL_NS", int(STILL_S * 1e9))
    no_db.parent.mkdir(parents=True)
    db = open_for_writing(no_db)
    write_runs(db, [user_run(s, o, 1.0 + s / 10) for s in range(3) for o in ("adam", "sgd")])
    release(db)
    time.sleep(STILL_S * 2)
    counted = []
    real = kb_open._check_pages_and_rows
    monkeypatch.setattr(kb_open, "_check_pages_and_rows", lambda *a: counted.append(a[1]) or real(*a))
    return counted


def answers(invoke) -> bool:
    result = invoke("recommend", "--arch", "vit", "--json", catch_exceptions=True)
    assert "Traceback" not in result.output
    return result.exit_code == 0


def test_a_passed_check_is_remembered_for_that_version_of_the_file(invoke, no_db, checks):
    assert answers(invoke) and answers(invoke) and answers(invoke)
    assert checks == [no_db]  # checked once; the two later reads found it remembered
    kept = json.loads(remembered.checks_path().read_text())["passed"]
    info = no_db.stat()
    assert kept == [
        {
            "path": str(no_db.resolve()),
            "file": [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns],
            "wal": None,
            "checker": remembered.checker(),
        }
    ]


def test_a_touched_file_is_checked_again_and_an_edited_one_refused(invoke, no_db, checks):
    assert answers(invoke)
    size = no_db.stat().st_size
    os.utime(no_db, ns=(no_db.stat().st_atime_ns, no_db.stat().st_mtime_ns - 10**10))  # same bytes
    time.sleep(STILL_S * 2)
    assert answers(invoke) and answers(invoke) and len(checks) == 2  # once more, then remembered again
    conn = sqlite3.connect(no_db)
    conn.execute("UPDATE runs SET seed = -5 WHERE id = 1")  # a row that breaks the rules, same size
    conn.commit()
    conn.close()
    time.sleep(STILL_S * 2)
    assert no_db.stat().st_size == size
    result = invoke("recommend", "--arch", "vit")
    assert result.exit_code == 1 and "seed = -5" in result.output and len(checks) == 3
    assert not answers(invoke) and len(checks) == 4  # a refusal is never remembered
    assert len(json.loads(remembered.checks_path().read_text())["passed"]) == 1  # the earlier version's pass


def test_writes_waiting_in_the_wal_are_a_new_version(invoke, no_db, checks):
    """A KB a writer holds open in WAL mode: what it committed is in the -wal file, the KB file unchanged."""
    writer = sqlite3.connect(no_db, isolation_level=None)
    assert writer.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute("SELECT count(*) FROM runs")  # the -wal file made
    time.sleep(STILL_S * 2)
    assert answers(invoke) and answers(invoke) and len(checks) == 1
    before = no_db.stat()
    writer.execute("UPDATE runs SET seed = -5 WHERE id = 1")
    time.sleep(STILL_S * 2)
    assert (no_db.stat().st_mtime_ns, no_db.stat().st_size) == (before.st_mtime_ns, before.st_size)
    result = invoke("recommend", "--arch", "vit")
    assert result.exit_code == 1 and "seed = -5" in result.output and len(checks) == 2
    writer.close()


def _wal_after(kb, seed: int, into) -> tuple[bytes, bytes]:
    """(the KB file, its WAL) of a copy of `kb` whose writer committed `UPDATE runs SET seed = <seed>` into the
    WAL and has not checkpointed it: read while the writer holds it open."""
    into.write_bytes(kb.read_bytes())
    writer = sqlite3.connect(into, isolation_level=None)
    assert writer.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
    writer.execute("PRAGMA wal_autocheckpoint = 0")
    writer.execute(f"UPDATE runs SET seed = {seed} WHERE id = 1")
    out = into.read_bytes(), Path(f"{into}-wal").read_bytes()
    writer.close()
    return out


def test_a_forged_wal_of_the_same_size_and_times_is_checked_again(invoke, no_db, checks, tmp_path):
    """The attack: a passed KB with writes waiting in its WAL; the WAL's frames rewritten at the same size,
    its times set back, the -shm removed. The WAL is keyed by its content: the forged rows are checked."""
    good_db, good_wal = _wal_after(no_db, 1, tmp_path / "good.sqlite")
    _, forged_wal = _wal_after(no_db, -5, tmp_path / "forged.sqlite")
    assert len(good_wal) == len(forged_wal)
    wal = Path(f"{no_db}-wal")
    no_db.write_bytes(good_db)
    wal.write_bytes(good_wal)
    time.sleep(STILL_S * 2)
    assert answers(invoke) and answers(invoke) and len(checks) == 1  # passed, remembered
    stamp = wal.stat()
    wal.write_bytes(forged_wal)
    os.utime(wal, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    Path(f"{no_db}-shm").unlink(missing_ok=True)
    assert wal.stat().st_size == stamp.st_size and wal.stat().st_mtime_ns == stamp.st_mtime_ns
    result = invoke("recommend", "--arch", "vit")
    assert result.exit_code == 1 and "seed = -5" in result.output and len(checks) == 2


def test_a_wal_too_large_to_hash_is_checked_on_every_read(invoke, no_db, checks, monkeypatch, tmp_path):
    db, wal = _wal_after(no_db, 1, tmp_path / "copy.sqlite")
    no_db.write_bytes(db)
    Path(f"{no_db}-wal").write_bytes(wal)
    monkeypatch.setattr(remembered, "MOST_WAL_BYTES", len(wal) - 1)
    time.sleep(STILL_S * 2)
    assert answers(invoke) and answers(invoke) and len(checks) == 2 and not remembered.checks_path().exists()


def test_a_file_written_just_now_is_checked_on_every_read(invoke, no_db, checks, monkeypatch):
    """A write within the same tick of the file system's clock may keep a file's size and times: a file
    not still for STILL_NS is checked each time, and nothing is remembered of it."""
    monkeypatch.setattr(remembered, "STILL_NS", 3600 * 10**9)
    assert answers(invoke) and answers(invoke)
    assert len(checks) == 2 and not remembered.checks_path().exists()


def forged_pass(path) -> bytes:
    """A checks file that claims this very version of `path` passed (what an attacker able to write the
    cache could write)."""
    return json.dumps({"format": 1, "passed": [remembered.file_version(path)]}).encode()


HOSTILE_CHECKS = {
    "not JSON": lambda kb: b"\x00\xff{not json",
    "nested too deep": lambda kb: b"[" * 100_000 + b"]" * 100_000,
    "another shape": lambda kb: json.dumps({"format": 1, "passed": {"x": 1}}).encode(),
    "entries of another kind": lambda kb: json.dumps({"format": 1, "passed": [1, "x", None, []]}).encode(),
    "another format": lambda kb: json.dumps({"format": 2, "passed": [remembered.file_version(kb)]}).encode(),
    "too large": lambda kb: forged_pass(kb) + b" " * (remembered.MOST_CHECKS_BYTES + 1),
    "a pass of another file": lambda kb: json.dumps(
        {"format": 1, "passed": [remembered.file_version(kb) | {"path": str(kb) + ".other"}]}
    ).encode(),
    "a pass under another check": lambda kb: json.dumps(
        {"format": 1, "passed": [remembered.file_version(kb) | {"checker": "0" * 64}]}
    ).encode(),
    "a pass with its numbers as text": lambda kb: json.dumps(
        {"format": 1, "passed": [(v := remembered.file_version(kb)) | {"file": [str(x) for x in v["file"]]}]}
    ).encode(),
}


@pytest.mark.parametrize("case", [*HOSTILE_CHECKS, "a link to a forged pass", "a pipe"])
def test_a_hostile_checks_file_never_lets_a_bad_kb_through(invoke, no_db, checks, case, tmp_path):
    conn = sqlite3.connect(no_db)
    conn.execute("UPDATE runs SET seed = -5 WHERE id = 1")
    conn.commit()
    conn.close()
    time.sleep(STILL_S * 2)
    cache = remembered.checks_path()
    cache.parent.mkdir(parents=True)
    if case == "a link to a forged pass":
        (tmp_path / "forged.json").write_bytes(forged_pass(no_db))
        cache.symlink_to(tmp_path / "forged.json")
    elif case == "a pipe":
        os.mkfifo(cache)  # opened, it would wait for a writer forever
    else:
        cache.write_bytes(HOSTILE_CHECKS[case](no_db))
    result = invoke("recommend", "--arch", "vit", catch_exceptions=True)
    assert result.exit_code == 1 and "seed = -5" in result.output and "Traceback" not in result.output
    assert checks == [no_db]


def test_a_hostile_checks_file_is_replaced_by_a_good_kbs_pass(invoke, no_db, checks):
    remembered.checks_path().parent.mkdir(parents=True)
    remembered.checks_path().write_bytes(b"\x00\xff{not json")
    assert answers(invoke) and answers(invoke) and len(checks) == 1
    assert json.loads(remembered.checks_path().read_text())["passed"][0]["path"] == str(no_db.resolve())


def test_a_forged_pass_still_meets_the_schema_check(invoke, no_db, checks):
    """The checks kept on every read, remembered or not: a file that is not a KB at our schema is refused
    even where the checks file says its very version passed."""
    conn = sqlite3.connect(no_db)
    conn.execute("ALTER TABLE runs ADD COLUMN payload TEXT")
    conn.commit()
    conn.close()
    time.sleep(STILL_S * 2)
    remembered.checks_path().parent.mkdir(parents=True)
    remembered.checks_path().write_bytes(forged_pass(no_db))
    result = invoke("recommend", "--arch", "vit", catch_exceptions=True)
    assert result.exit_code == 1 and "not an advisor KB at this schema" in result.output


@pytest.mark.parametrize("blocked", ["cache is a file", "checks file is a folder"])
def test_a_data_folder_that_cannot_be_written_remembers_nothing(invoke, no_db, checks, blocked):
    cache = remembered.checks_path()
    if blocked == "cache is a file":
        cache.parent.write_text("not a folder")
    else:
        cache.mkdir(parents=True)
    assert answers(invoke) and answers(invoke)
    assert len(checks) == 2  # checked every time, never an error
    if blocked == "checks file is a folder":
        assert os.listdir(cache.parent) == [cache.name]  # no temporary file left


def test_a_kb_read_alone_is_not_remembered(invoke, no_db, checks, monkeypatch):
    """--db and $ADVISOR_DB: a KB read alone has its summaries checked on every read, as before."""
    monkeypatch.setenv("ADVISOR_DB", str(no_db))
    assert answers(invoke) and answers(invoke)
    assert len(checks) == 2 and not remembered.checks_path().exists()


def test_a_link_flipped_after_the_open_never_records_a_forged_kb_as_passed(
    invoke, no_db, checks, monkeypatch, tmp_path
):
    """The race: the user's KB is a link to a good KB; right after SQLite opens it, the link is flipped to a
    forged one. The check reads the good file; the pass is keyed on the file SQLite opened (its descriptor),
    and the name now leads elsewhere, so nothing is remembered, and the forged KB is checked (and refused)
    when it is read. Before, the name was resolved again to key the pass: the forged file was recorded as
    passed and then read unchecked."""
    good, forged = tmp_path / "good.sqlite", tmp_path / "forged.sqlite"
    no_db.rename(good)
    forged.write_bytes(good.read_bytes())
    conn = sqlite3.connect(forged)
    conn.execute("UPDATE runs SET seed = -5 WHERE id = 1")
    conn.commit()
    conn.close()
    no_db.symlink_to(good)
    time.sleep(STILL_S * 2)

    real, flips = kb_open.check_schema, []

    def flip_then_check(*args):  # the attacker's moment: after the open, before the pass is keyed
        if not flips:
            no_db.unlink()
            no_db.symlink_to(forged)
            flips.append(forged)
        return real(*args)

    monkeypatch.setattr(kb_open, "check_schema", flip_then_check)
    assert answers(invoke)  # the good file, read and checked
    assert flips and no_db.resolve() == forged
    assert not remembered.checks_path().exists() or str(forged) not in remembered.checks_path().read_text()
    result = invoke("recommend", "--arch", "vit", catch_exceptions=True)
    assert result.exit_code == 1 and "seed = -5" in result.output, result.output
