"""The KB fault catalogue (issue 24): hostile and broken KBs handed to `advisor kb merge`, and put in place of
the user's own KB under every read command. Each case must end with exit code 1 or 2, one sentence and no
traceback, within a time bound (no hang), with the target KB byte-identical and no file written beside it;
a source's `running` runs are merged as crashed, never as claims. Hostile files are made with raw SQL (the
store refuses to write them), each from one small valid KB copied per case."""

import hashlib
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from advisor.kb import store
from advisor.kb.open import open_for_writing, release

HANG_S = 30  # a case still running after this long is a hang
READ_COMMANDS = [
    ["recommend", "--arch", "vit"],
    ["frontier", "--arch", "vit"],
    ["flowchart"],
    ["claims"],
    ["transfer"],
    ["kb", "stats"],
    ["kb", "runs"],
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


def good_run(i: int, **over) -> dict:
    """A valid measured run of tiny ViT (seed i), with figures and an epoch."""
    optimizer = ("adam", "sgd", "adadelta")[i % 3]
    return {
        "source": "measured",
        "model": "vit",
        "family": "vision",
        "optimizer": optimizer,
        "strategy": "standard",
        "preset": "tiny",
        "protocol": "fair",
        "seed": i // 3,
        "hardware": "CPU: a colleague's laptop",
        "device": "cpu",
        "status": "ok",
        "config": {"model": "vit", "optimizer": optimizer, "strategy": "standard", "lr": 0.001},
        "software": {},
        "started_at": f"2026-11-30T00:00:{i:02d}+00:00",
        "metrics": [
            {"name": "eval_loss", "value": 1.0 + i / 10, "unit": "nats/target"},
            {"name": "epoch_time", "value": 2.0 + i / 10, "unit": "s"},
        ],
        "epochs": [{"epoch": 0, "steps": 4, "loss": 1.5, "wall_s": 0.5}],
        **over,
    }


@pytest.fixture(scope="module")
def base_kb(tmp_path_factory) -> Path:
    """One small valid KB (nine runs), made once: every hostile file starts as a copy of it."""
    path = tmp_path_factory.mktemp("base") / "base.sqlite"
    conn = open_for_writing(path)
    store.write_runs(conn, [good_run(i) for i in range(9)])
    release(conn)
    return path


def sql(*statements: str, checks: bool = True):
    """A change made with raw SQL (CHECK constraints off where asked): what a hand-crafted file holds."""

    def apply(path: Path) -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        if not checks:
            conn.execute("PRAGMA ignore_check_constraints = ON")
        for s in statements:
            conn.execute(s)
        conn.close()

    return apply


def replace_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def corrupt_pages(path: Path) -> None:
    """Garbage over the middle of the file: the header and schema page intact, table pages not."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8192] = bytes((i * 37) % 256 for i in range(8192))
    path.write_bytes(bytes(data))


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:5000])


RECURSIVE = (
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
    "SELECT 1 AS grp, 'adadelta' AS optimizer, 'standard' AS strategy, 'eval_loss' AS measure, '' AS scale, "
    "1 AS n, 0.0 AS total, 0.0 AS total_sq, 0.0 AS first_value, 'x' AS first_unit FROM n"
)
FORGED_STATS = (
    "SELECT grp, 'adadelta' AS optimizer, 'standard' AS strategy, measure, scale, n, 0.0 AS total, "
    "0.0 AS total_sq, 0.0 AS first_value, first_unit FROM stats_saved"
)

# Hostile files: name -> how a copy of the base KB is made hostile. Shared by both catalogues.
HOSTILE = {
    "script in optimizer": sql("UPDATE runs SET optimizer = '<script>alert(1)</script>' WHERE id = 1"),
    "script in model": sql("UPDATE runs SET model = '<img src=x onerror=alert(1)>' WHERE id = 1"),
    "escape codes in hardware": sql("UPDATE runs SET hardware = 'CPU' || char(27) || '[2J' WHERE id = 2"),
    "unknown family": sql("UPDATE runs SET family = 'klingon' WHERE id = 1"),
    "negative seed": sql("UPDATE runs SET seed = -5 WHERE id = 1"),
    "seed as text": sql("UPDATE runs SET seed = 'zero' WHERE id = 1"),
    "epoch_time -1e308": sql("UPDATE metrics SET value = -1e308 WHERE name = 'epoch_time'"),
    "loss +1e308": sql("UPDATE metrics SET value = 1e308 WHERE name = 'eval_loss' AND run_id = 1"),
    "figure infinite": sql("UPDATE metrics SET value = 9e999 WHERE name = 'eval_loss' AND run_id = 2"),
    "figure NaN (as text)": sql("UPDATE metrics SET value = 'NaN' WHERE name = 'eval_loss' AND run_id = 3"),
    "epoch wall time negative": sql("UPDATE epochs SET wall_s = -3 WHERE run_id = 1"),
    "invalid group (protocol)": sql("UPDATE runs SET protocol = 'vibes' WHERE id = 1", checks=False),
    "invalid status": sql("UPDATE runs SET status = 'exploded' WHERE id = 1", checks=False),
    "config not JSON": sql("UPDATE runs SET config = '{not json' WHERE id = 1"),
    "config a JSON list": sql("UPDATE runs SET config = '[1, 2]' WHERE id = 1"),
    "n_params 1e300": sql("UPDATE runs SET n_params = 1e300 WHERE id = 1"),
    "view for a table": sql(
        "CREATE TABLE stats_saved AS SELECT * FROM cell_stats",
        "DROP TABLE cell_stats",
        f"CREATE VIEW cell_stats AS {FORGED_STATS}",
    ),
    "recursive view": sql("DROP TABLE cell_stats", f"CREATE VIEW cell_stats AS {RECURSIVE}"),
    "trigger": sql(
        "CREATE TRIGGER spy AFTER INSERT ON runs BEGIN UPDATE runs SET model = 'pwned'; END",
    ),
    "virtual table": sql("CREATE VIRTUAL TABLE notes USING fts5(body)"),
    "extra column": sql("ALTER TABLE runs ADD COLUMN payload TEXT"),
    "corrupt pages": corrupt_pages,
    "truncated file": truncated,
    "not SQLite": lambda p: replace_bytes(p, b"id,loss\n1,0.5\n" * 50),
    "empty file": lambda p: replace_bytes(p, b""),
    "newer schema": sql(
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('advisor', '9999_future', 'x')"
    ),
    "another application's database": lambda p: (
        replace_bytes(p, b""),
        sql("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)")(p),
    ),
}
MERGE_CASES = list(HOSTILE)
USER_CASES = [
    "view for a table",
    "recursive view",
    "trigger",
    "virtual table",
    "corrupt pages",
    "truncated file",
    "not SQLite",
    "newer schema",
    "script in optimizer",
    "epoch_time -1e308",
    "config not JSON",
    "extra column",
    "another application's database",
]
FORGED_SUMMARY = sql("UPDATE cell_stats SET total = -1e308 WHERE measure = 'epoch_time'")


def hostile(base: Path, folder: Path, case: str, name: str = "hostile.sqlite") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    shutil.copy(base, path)
    HOSTILE[case](path)
    return path


def run_bounded(invoke, args: list) -> tuple[object, float]:
    """invoke(*args) in a thread: (its result, seconds), or (None, seconds) when it hangs past HANG_S."""
    box: dict = {}
    start = time.monotonic()

    def target():
        box["result"] = invoke(*args, catch_exceptions=True)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG_S)
    return box.get("result"), time.monotonic() - start


def outcome(result) -> str:
    """'refused' (exit 1 or 2, one sentence, no traceback), else what went wrong."""
    if result is None:
        return "hang"
    text = result.output.strip()
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"traceback: {type(result.exception).__name__}: {result.exception}"
    if "Traceback" in text:
        return "traceback"
    if result.exit_code == 0:
        return "answered"
    if result.exit_code not in (1, 2) or not text or len(text.splitlines()) > 2:
        return f"exit {result.exit_code}: {text[:300]}"
    return "refused"


def files_in(folder: Path) -> dict[str, str]:
    return {p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("case", MERGE_CASES)
def test_a_hostile_source_is_refused_by_merge(invoke, base_kb, tmp_path, case):
    source = hostile(base_kb, tmp_path / "from", case)
    target = tmp_path / "to" / "mine.sqlite"
    target.parent.mkdir()
    shutil.copy(base_kb, target)  # the user's own KB, with runs
    before = {**files_in(source.parent), **files_in(target.parent)}
    result, seconds = run_bounded(invoke, ["kb", "merge", source, "--db", target])
    assert outcome(result) == "refused", (case, outcome(result), result and result.output)
    assert {**files_in(source.parent), **files_in(target.parent)} == before, "a file was changed or added"
    assert seconds < HANG_S


def test_running_runs_are_merged_as_crashed_never_as_claims(invoke, base_kb, tmp_path):
    """A source's `running` runs, leased until 2999, become crashed runs with their origin said."""
    source = tmp_path / "node.sqlite"
    shutil.copy(base_kb, source)
    sql(
        "UPDATE runs SET status = 'running', owner = 'elsewhere:1', lease_until = '2999-01-01T00:00:00+00:00' "
        "WHERE id <= 3"
    )(source)
    target = tmp_path / "mine.sqlite"
    result, _ = run_bounded(invoke, ["kb", "merge", source, "--db", target])
    assert result.exit_code == 0 and "3 runs still running in their KB copied as crashed" in result.output
    rows = sqlite3.connect(target).execute("SELECT status, lease_until, error FROM runs").fetchall()
    assert [r for r in rows if r[0] == "running"] == []
    crashed = [r for r in rows if r[0] == "crashed"]
    assert len(crashed) == 3 and all("was running in node.sqlite" in r[2] and r[1] is None for r in crashed)
    again, _ = run_bounded(invoke, ["kb", "merge", source, "--db", target])
    assert "0 runs added, 9 already there, 0 conflicts" in again.output  # idempotent as ever


@pytest.fixture
def user_kb(monkeypatch, tmp_path) -> Path:
    """Where the user's own KB is read from (no --db, no $ADVISOR_DB)."""
    monkeypatch.delenv("ADVISOR_DB")
    return tmp_path / "xdg-data" / "advisor" / "kb.sqlite"


@pytest.mark.parametrize("case", USER_CASES)
def test_a_hostile_user_kb_answers_nothing(invoke, base_kb, user_kb, case):
    """Every read command ends in one sentence: no traceback, no hang, no answer over a forged or damaged
    KB, and the file untouched."""
    hostile(base_kb, user_kb.parent, case, user_kb.name)
    before = files_in(user_kb.parent)
    outcomes = {}
    for args in READ_COMMANDS:
        result, _ = run_bounded(invoke, args)
        outcomes[" ".join(args)] = outcome(result)
        if outcomes[" ".join(args)] == "refused":
            assert str(user_kb) in result.output, result.output  # the sentence names the KB
    assert set(outcomes.values()) == {"refused"}, outcomes
    assert files_in(user_kb.parent) == before


def test_a_forged_summary_is_refused(invoke, base_kb, user_kb):
    """Summaries edited by hand past any physical bound (the overflow that once crashed recommend)."""
    shutil.copy(base_kb, user_kb.parent.mkdir(parents=True) or user_kb)
    FORGED_SUMMARY(user_kb)
    result, _ = run_bounded(invoke, ["recommend", "--arch", "vit", "--evidence", "mine"])
    assert outcome(result) == "refused" and "break advisor's rules" in result.output, result.output


def test_kb_check_names_what_is_wrong(invoke, base_kb, user_kb, tmp_path):
    shutil.copy(base_kb, user_kb.parent.mkdir(parents=True) or user_kb)
    ok = invoke("kb", "check")
    assert ok.exit_code == 0 and ok.output.count(": ok") == 2, ok.output
    for case, needle in (
        ("corrupt pages", "corrupt"),
        ("view for a table", "view"),
        ("negative seed", "seed = -5"),
    ):
        path = hostile(base_kb, tmp_path / case.replace(" ", "-"), case)
        before = digest(path)
        result = invoke("kb", "check", "--db", path, catch_exceptions=True)
        assert result.exit_code == 1 and needle in result.output and "Traceback" not in result.output, (
            case,
            result.output,
        )
        assert digest(path) == before


def test_the_catalogue_is_large():
    assert len(MERGE_CASES) >= 25 and len(USER_CASES) * len(READ_COMMANDS) >= 13 * 7
