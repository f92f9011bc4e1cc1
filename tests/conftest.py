"""Shared fixtures: every test gets its own KB copy through $ADVISOR_DB; the shipped KB is never written."""

import hashlib
import os
import shutil
import sqlite3
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from advisor.places import user_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Two xdist workers share two cores: one math thread each, or torch's pools oversubscribe them (2x slower).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The run's own user data folder, set before anything is collected: RULES below, module-level rules and session
# fixtures run before `kb_path` gives each test a folder of its own, and they left the rules' parse cache and the
# report's chart bundle in the user's ~/.local/share/advisor/cache. Removed as the run ends (pytest_unconfigure).
# The user's, as advisor finds it, read by the run's first process before the lines below replace it: xdist's
# workers inherit that environment (their user_dir() would be the run's folder), so they read it from here.
USER_DATA = Path(os.environ.setdefault("ADVISOR_TESTS_USER_DATA", str(user_dir())))
RUN_DATA = Path(tempfile.mkdtemp(prefix="advisor-tests-data-"))
os.environ["XDG_DATA_HOME"] = str(RUN_DATA)

REPO = Path(__file__).resolve().parent.parent
SHIPPED_KB = REPO / "kb" / "results.sqlite"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"


def pytest_unconfigure(config):
    shutil.rmtree(RUN_DATA, ignore_errors=True)


def _listing(folder: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in folder.rglob("*")} if folder.is_dir() else {}


USER_DATA_BEFORE = _listing(USER_DATA)  # taken before anything below (RULES) could write there


@pytest.fixture(scope="session", autouse=True)
def user_data_untouched():
    """Fails the session if anything wrote the user's own data folder (their KB, its cache) during the run."""
    yield
    assert _listing(USER_DATA) == USER_DATA_BEFORE, (
        f"a test wrote {USER_DATA} (or advisor ran beside the suite)"
    )


@pytest.fixture(scope="session", autouse=True)
def shipped_kb_untouched():
    """Fails the session if any test (or read command) wrote the shipped KB or left WAL files beside it."""
    before = _digest(SHIPPED_KB)
    yield
    assert _digest(SHIPPED_KB) == before, "a test wrote the shipped kb/results.sqlite"
    for suffix in ("-wal", "-shm"):
        assert not Path(str(SHIPPED_KB) + suffix).exists(), f"a test left {SHIPPED_KB}{suffix}"


@pytest.fixture(autouse=True)
def kb_path(tmp_path, monkeypatch) -> Path:
    """A private copy of the shipped KB, which $ADVISOR_DB points at for the test; and a private user data
    directory ($XDG_DATA_HOME), so that no test reads or writes the user's own KB."""
    path = tmp_path / "kb.sqlite"
    shutil.copy(SHIPPED_KB, path)
    monkeypatch.setenv("ADVISOR_DB", str(path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    return path


@pytest.fixture(scope="session")
def shared_traces(tmp_path_factory, worker_id) -> Path:
    """Where the whole run's traces are shared: a KB beside the workers' temp folders (both xdist workers
    see the same one). Tracing a model costs 2-97 s; the same question asked by twenty tests is traced once."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if worker_id != "master" else base) / "traces.sqlite"


@pytest.fixture(autouse=True)
def traces_from_the_run(request, shared_traces, monkeypatch):
    """advisor fit's cache reads the test's own KB first, then the run's shared traces (keyed as the KB keys
    them, so a hit is the same trace); what a test traces is written to its own KB, as always, and to the
    shared one. A test marked `cold` sees its own KB alone: it checks what a first trace does."""
    if request.node.get_closest_marker("cold"):
        return
    from advisor.errors import KBError
    from advisor.kb.open import connect_kb_readonly
    from advisor.kb.queries.for_prediction import prediction_payloads
    from advisor.prediction.cache import PredictionCache, keys_of, software

    own_get, own_put = PredictionCache.get, PredictionCache.put

    def get(self, keys):
        found = own_get(self, keys)
        rest = [k for k in keys if k not in found]
        if rest and self.read is not None and shared_traces.exists():  # a KB the test's fit may read
            try:
                conn = connect_kb_readonly(shared_traces)
            except KBError:
                return found  # the other worker is creating it: trace
            try:
                found |= prediction_payloads(conn, rest)
            finally:
                conn.close()
        return found

    def put(self, q, fresh, keys, soft):
        own_put(self, q, fresh, keys, soft)
        if self.read is not None and self.unwritten is None:  # only what a usable KB would have cached
            shared = PredictionCache(None, shared_traces)
            try:
                own_put(shared, q, fresh, keys, soft)
            except (KBError, sqlite3.OperationalError):
                pass  # the other worker holds it: this trace is simply not shared

    def missing(self, q, rules):
        keys = set(keys_of(q, rules, software()).values())
        return self.read is None or len(self.get(list(keys))) < len(keys)

    monkeypatch.setattr(PredictionCache, "get", get)
    monkeypatch.setattr(PredictionCache, "put", put)
    monkeypatch.setattr(PredictionCache, "missing", missing)


@pytest.fixture
def runner():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the CLI in-process: invoke('recommend', '--arch', 'vit') -> click Result."""
    from advisor.cli import cli

    def _invoke(*args, **kwargs):
        return runner.invoke(
            cli, [str(a) for a in args], catch_exceptions=kwargs.pop("catch_exceptions", False), **kwargs
        )

    return _invoke


# The paper's protocol: these tests pin down the KB's mechanics (claims, leases, skips), and four updates of
# tiny ViT are too few for the fair protocol's "did not train" check to pass on every seed.
TINY_VIT = (
    "--model",
    "vit",
    "--preset",
    "tiny",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "4",
    "--protocol",
    "paper",
)


@pytest.fixture
def measure_tiny(invoke):
    """`advisor measure` on tiny ViT cells (one epoch of four micro-batches) into db, plus extra options."""

    def _measure(db, *extra):
        return invoke("measure", *TINY_VIT, *extra, "--db", db)

    return _measure


@pytest.fixture(scope="session")
def rules():
    """The shipped rules (no user rules: every test has its own empty user data folder)."""
    from advisor.places import shipped_rules_dir
    from advisor.rules import load_rules

    return load_rules(str(shipped_rules_dir()))


def cells(*configs, rules=None):
    """Run configurations as grid cells, each model resolved once (advisor.measuring.grid.runner.plan_grid)."""
    from advisor.measuring.recipe.config import GridCell
    from advisor.model_ref import resolve_model
    from advisor.places import shipped_rules_dir
    from advisor.rules import load_rules

    rules = rules or load_rules(str(shipped_rules_dir()))
    return [GridCell(c, resolve_model(c.model, rules)) for c in configs]


def grid(models, optimizers, strategies, seeds, base, rules=None):
    """Cells in run order: model, then seed, then optimizer × strategy (each model's own lists)."""
    return cells(
        *(
            replace(base, model=m, optimizer=o, strategy=s, seed=seed)
            for m in models
            for seed in seeds
            for o in optimizers[m]
            for s in strategies[m]
        ),
        rules=rules,
    )


def measured_run(**changes) -> dict:
    """A finished run of the tiny ViT under the fair protocol, as measure writes it, with `changes` applied."""
    return (
        dict(
            source="measured",
            model="vit",
            family="vision",
            optimizer="adam",
            strategy="standard",
            preset="tiny",
            protocol="fair",
            seed=0,
            hardware="CPU: a test host",
            device="cpu",
            status="ok",
            data="generated",
            config={},
            software={},
            started_at="2026-12-01",
            metrics=[],
        )
        | changes
    )


def kb_before(path, count):
    """A KB as an older advisor wrote it: its first `count` migrations, applied through sqlite-utils'
    Migrations as advisor did until it kept its own (the bookkeeping table is the same)."""
    from sqlite_utils import Database
    from sqlite_utils.migrations import Migrations

    from advisor.kb.migrations import MIGRATION_SET, MIGRATIONS

    db = Database(path)
    migrations = Migrations(MIGRATION_SET)
    for name, fn in list(MIGRATIONS.items())[:count]:
        migrations(name=name)(lambda db, fn=fn: fn(db.conn))
    migrations.apply(db)
    return db


def _shipped_rules():
    from advisor.places import shipped_rules_dir
    from advisor.rules import load_rules

    return load_rules(str(shipped_rules_dir()))


RULES = _shipped_rules()


def one_cell(config, rules=None):
    """One run configuration as its grid cell."""
    return cells(config, rules=rules)[0]


def ref(name: str, rules=None):
    """A model resolved as `--model NAME` resolves it (a reference name, a folder, a cached id)."""
    from advisor.model_ref import resolve_model

    return resolve_model(str(name), rules or RULES)


CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
# Chromium as root, on a closed network: no sandbox, no GPU, no background connections (refused here).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's), driven by playwright; skipped only where Chromium is not installed
    (a failure under CI, where `make browser` installs it)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(
                f"{CHROMIUM} is missing in CI: `make browser` installs it (apt-get install chromium)."
            )
        pytest.skip(f"{CHROMIUM} is not installed (`make browser`, or apt-get install chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="pip install -e '.[dev]' installs playwright"
    )
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
