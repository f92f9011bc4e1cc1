"""The fault catalogue: hostile and broken input to every command. Each case must end with the exit code it
names (2: the user's usage, 1: the environment), a sentence and no traceback, and must leave every KB it
touched byte-identical. (Killed processes, concurrent writers and read-only mounts: tests/faults/test_faults.py.)"""

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO.parent / "kb" / "results.sqlite"
FIXTURES = REPO / "fixtures" / "configs"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


@pytest.fixture
def files(tmp_path, kb_path):
    """Broken and foreign files, made per test: name -> path (KB-like ones under their own names)."""
    f = {"kb": kb_path, "missing": tmp_path / "nope.sqlite", "folder": tmp_path, "devnull": Path("/dev/null")}
    (f.setdefault("empty", tmp_path / "empty.sqlite")).write_bytes(b"")
    (f.setdefault("text", tmp_path / "text.sqlite")).write_text("id,loss\n1,0.5\n")
    (f.setdefault("truncated", tmp_path / "cut.sqlite")).write_bytes(kb_path.read_bytes()[:5000])
    data = bytearray(kb_path.read_bytes())
    data[100:4096] = bytes(range(256)) * 15 + bytes(156)
    (f.setdefault("corrupt", tmp_path / "corrupt.sqlite")).write_bytes(bytes(data))
    foreign = sqlite3.connect(f.setdefault("foreign", tmp_path / "app.sqlite"))
    foreign.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT)")
    foreign.execute("INSERT INTO accounts (owner) VALUES ('someone')")
    foreign.commit()
    foreign.close()
    shutil.copy(kb_path, f.setdefault("newer", tmp_path / "newer.sqlite"))
    newer = sqlite3.connect(f["newer"])
    newer.execute(
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('advisor', '9999_future', 'x')"
    )
    newer.commit()
    newer.close()
    (f.setdefault("config-list", tmp_path / "m-list")).mkdir()
    (f["config-list"] / "config.json").write_text("[1, 2]")
    (f.setdefault("config-bytes", tmp_path / "m-bytes")).mkdir()
    (f["config-bytes"] / "config.json").write_bytes(b"\xff\xfe\x00")
    (f.setdefault("config-untyped", tmp_path / "m-untyped")).mkdir()
    (f["config-untyped"] / "config.json").write_text('{"hidden_size": 8}')
    (f.setdefault("config-alien", tmp_path / "m-alien")).mkdir()
    (f["config-alien"] / "config.json").write_text('{"model_type": "wav2vec2"}')
    (f.setdefault("no-config", tmp_path / "m-none")).mkdir()
    (f.setdefault("csv", tmp_path / "notes.csv")).write_text("a,b\n1,2\n")
    return f


# a folder is refused by the option itself (usage, 2); every other bad file by the KB checks (1)
BAD_DBS = {
    "missing": 1,
    "folder": 2,
    "devnull": 1,
    "empty": 1,
    "text": 1,
    "truncated": 1,
    "corrupt": 1,
    "foreign": 1,
    "newer": 1,
}
READERS = [
    ["recommend", "--arch", "vit"],
    ["frontier", "--arch", "vit"],
    ["flowchart"],
    ["claims"],
    ["kb", "stats"],
    ["kb", "runs"],
    ["kb", "export"],
]

CASES = (
    # (args with {name} placeholders for files, exit code, needle)
    [(r + ["--db", "{" + db + "}"], code, None) for r in READERS for db, code in BAD_DBS.items()]
    + [
        (["recommend", "--arch", "rnn"], 2, "Choose from"),
        (["recommend", "--arch", "vit", "--optimize", "speed"], 2, "Choose from"),
        (["recommend", "--arch", "vit", "--source", "arxiv"], 2, "unknown source"),
        (["recommend", "--arch", "vit", "--optimizer", "lion"], 2, "unknown optimizer"),
        (["recommend", "--arch", "vit", "--exclude-optimizer", "lion"], 2, "unknown optimizer"),
        (["recommend", "--arch", "vit", "--strategy", "offload"], 2, "unknown strategy"),
        (["recommend", "--arch", "vit", "--max-memory", "nan"], 2, "finite"),
        (["recommend", "--arch", "vit", "--max-memory", "inf"], 2, "finite"),
        (["recommend", "--arch", "vit", "--max-memory", "-1"], 2, "--max-memory"),
        (["recommend", "--arch", "vit", "--max-memory", "lots"], 2, "--max-memory"),
        (["recommend", "--arch", "vit", "--max-time", "nan"], 2, "finite"),
        (["recommend", "--arch", "vit", "--max-time", "-3"], 2, "--max-time"),
        (["recommend"], 2, "exactly one"),
        (["recommend", "--arch", "vit", "--model", "vit"], 2, "exactly one"),
        (["recommend", "--arch", "vit", "--gpu", "T4"], 2, "pass --model"),
        (["recommend", "--model", "vit", "--memory", "nan"], 2, "finite"),
        (["recommend", "--model", "vit", "--memory", "0"], 2, "--memory"),
        (["recommend", "--model", "vit", "--gpu", "A1000"], 2, "Did you mean"),
        (["recommend", "--model", "someorg/not-downloaded"], 1, "hf download someorg/not-downloaded"),
        (["recommend", "--model", "{no-config}"], 1, "cannot resolve"),
        (["recommend", "--model", "{config-list}"], 1, "not a model config"),
        (["recommend", "--model", "{config-bytes}"], 1, "not UTF-8"),
        (["recommend", "--model", "{config-untyped}"], 1, "no model_type"),
        (["recommend", "--model", "{config-alien}"], 1, "belongs to no family"),
        (["frontier", "--arch", "vit", "--x", "loss"], 2, "must be different"),
        (["frontier", "--arch", "vit", "--x", "speed"], 2, "Choose from"),
        (["frontier"], 2, "--arch"),
        (["flowchart", "--source", "nope"], 2, "unknown source"),
        (["claims", "--source", "nope"], 2, "unknown source"),
        (["claims", "--markdown", "{folder}/no/such/claims.md"], 1, "No such file"),
        (["claims", "--markdown", "{folder}"], 2, "directory"),
        (["kb", "runs", "--status", "bogus"], 2, "bogus"),
        (["kb", "runs", "--limit", "0"], 2, "--limit"),
        (["kb", "runs", "--limit", "many"], 2, "--limit"),
        (["kb", "runs", "--family", "rnn"], 2, "unknown family"),
        (["kb", "export", "--format", "xml"], 2, "xml"),
        (["kb", "export", "-o", "{folder}/no/such/out.json"], 1, "No such file"),
        (["kb", "export", "-o", "{folder}"], 2, "directory"),
        (["kb", "import", "{missing}"], 2, "does not exist"),
        (["kb", "import", "{folder}"], 2, "directory"),
        (["kb", "import", "{csv}"], 1, "needs its setup"),
        (["kb", "import", "{csv}", "--setup", "{csv}"], 1, "not valid TOML"),
        (["kb", "build", "-o", "{devnull}"], 1, "not a regular file"),
        (["kb", "build", "-o", "{folder}"], 2, "directory"),
        (["kb", "build", "-o", "{folder}/no/such/kb.sqlite"], 1, "does not exist"),
        (["kb", "build", "-o", "{csv}"], 1, "not an advisor knowledge base"),
        (["kb", "build", "-o", "{foreign}"], 1, "not an advisor knowledge base"),
        (["kb", "build"], 2, "--shipped"),
        (["kb", "build", "--shipped", "-o", "{missing}"], 2, "say where to write"),
        (["kb", "merge"], 2, "FILES"),
        (["kb", "merge", "{missing}"], 2, "does not exist"),
        (["kb", "merge", "{folder}"], 2, "directory"),
        (["kb", "merge", "{csv}"], 1, "not a knowledge base"),
        (["kb", "merge", "{foreign}"], 1, "not an advisor knowledge base"),
        (["kb", "merge", "{truncated}"], 1, "corrupt or truncated"),
        (["kb", "path", "--bogus"], 2, "No such option"),
        (["recommend", "--arch", "vit", "--group", "0"], 2, "--group"),
        (["recommend", "--arch", "vit", "--group", "many"], 2, "--group"),
        (["recommend", "--arch", "vit", "--group", "99999"], 1, "matching --group 99999"),
        (["recommend", "--arch", "vit", "--hardware", "CPU: nowhere"], 1, "matching --hardware"),
        (["recommend", "--arch", "vit", "--preset", "huge"], 1, "matching --preset huge"),
        (["kb", "migrate", "--db", "{missing}"], 1, "no knowledge base"),
        (["kb", "migrate", "--db", "{foreign}"], 1, "another application"),
        (["kb", "migrate", "--db", "{devnull}"], 1, "not a regular file"),
        (["kb", "migrate", "--db", "{newer}"], 1, "newer advisor"),
        (["kb", "migrate", "--db", "{truncated}"], 1, "corrupt or truncated"),
        (["measure", "--model", "rnn", "--db", "{missing}"], 1, "cannot resolve"),
        (["measure", "--model", "vit", "--preset", "huge"], 2, "huge"),
        (["measure", "--model", "vit", "--epochs", "0"], 2, "--epochs"),
        (["measure", "--model", "vit", "--steps-per-epoch", "0"], 2, "--steps-per-epoch"),
        (["measure", "--model", "vit", "--seeds", "0"], 2, "--seeds"),
        (["measure", "--model", "vit", "--device", "tpu"], 2, "tpu"),
        (["measure", "--model", "vit", "--lr", "nan"], 2, "finite"),
        (["measure", "--model", "vit", "--lr", "0"], 2, "--lr"),
        (["measure", "--model", "vit", "--lr", "-1"], 2, "--lr"),
        (["measure", "--model", "vit", "--batch-size", "0"], 2, "--batch-size"),
        (["measure", "--model", "vit", "--accumulation-steps", "1"], 2, "--accumulation-steps"),
        (["measure", "--model", "vit", "--memory-cap", "nan"], 2, "finite"),
        (["measure", "--model", "vit", "--memory-cap", "0"], 2, "--memory-cap"),
        (["measure", "--model", "vit", "--optimizer", "lion"], 2, "unknown optimizer"),
        (["measure", "--model", "vit", "--strategy", "offload"], 2, "unknown strategy"),
        (
            [
                "measure",
                "--model",
                "vit",
                "--strategy",
                "accumulation",
                "--steps-per-epoch",
                "6",
                "--protocol",
                "paper",
            ],
            2,
            "not a multiple",
        ),
        (["measure", "--model", "vit", "--protocol", "vibes"], 2, "vibes"),
        (["measure", "--model", "vit", "--dtype", "fp8"], 2, "fp8"),
        (["measure", "--model", "vit", "--tune-lr", "--lr", "0.1"], 2, "drop --lr"),
        (["measure", "--model", "vit", "--tune-lr", "--protocol", "paper"], 2, "needs --protocol fair"),
        (["measure", "--model", "vit", "--order-seed", "-1"], 2, "--order-seed"),
        (["measure", "--model", "{config-list}"], 1, "not a model config"),
        (["measure", "--model", "vit", "--preset", "tiny", "--db", "{foreign}"], 1, "another application"),
        (["measure", "--model", "vit", "--preset", "tiny", "--db", "{devnull}"], 1, "not a regular file"),
        (["measure", "--model", "vit", "--preset", "tiny", "--db", "{folder}"], 2, "directory"),
        (["measure", "--model", "vit", "--preset", "tiny", "--db", "{newer}"], 1, "newer advisor"),
        (["validate", "--model", "rnn"], 2, "unknown model"),
        (["validate", "--preset", "huge"], 2, "huge"),
        (["validate", "--model", "vit", "--db", "{foreign}"], 1, "another application"),
        (["fit", "--model", "vit", "--gpu", "A1000"], 2, "Did you mean"),
        (["fit", "--model", "vit", "--gpu", "T4", "--batch-size", "0"], 2, "--batch-size"),
        (["fit", "--model", "vit", "--memory", "-5"], 2, "--memory"),
        (["fit", "--model", "{config-list}", "--gpu", "T4"], 1, "not a model config"),
        (["fit", "--model", "vit", "--gpu", "T4", "--db", "{foreign}"], 1, "another application"),
        (["fit", "--model", "qwen2.5-0.5b", "--gpu", "A100", "--nodes", "1000000000000000000"], 2, "--nodes"),
        (["kb", "migrate", "--db", "{corrupt}"], 1, "corrupt or truncated"),
        (["kb", "migrate", "--db", "{truncated}"], 1, "corrupt or truncated"),
        (["kb", "migrate", "--db", "{empty}"], 1, "an empty file, not a knowledge base"),
    ]
)


def fill(args: list[str], files: dict) -> list[str]:
    return [a.format(**{k: str(v) for k, v in files.items()}) if "{" in a else a for a in args]


@pytest.mark.parametrize("args,code,needle", CASES, ids=[" ".join(a)[:70] for a, _, _ in CASES])
def test_bad_input(invoke, files, args, code, needle):
    before = {k: digest(p) for k, p in files.items() if isinstance(p, Path)}
    result = invoke(*fill(args, files))
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.output.strip()
    if needle:
        assert needle in result.output, result.output
    assert {k: digest(p) for k, p in files.items() if isinstance(p, Path)} == before, (
        "a KB or file was changed"
    )
    assert not Path("/dev/null-journal").exists()


GOOD_RUN = json.loads((REPO / "fixtures" / "run.json").read_text())


def with_change(path, change):
    run = json.loads(json.dumps(GOOD_RUN))
    change(run)
    return run


IMPORTS = {
    "unknown field (a key that would be SQL)": lambda r: r.update(
        {"status) VALUES (1); DROP TABLE runs; --": 1}
    ),
    "unknown field": lambda r: r.update({"colour": "red"}),
    "seed not an integer": lambda r: r.update(seed=1.5),
    "seed negative": lambda r: r.update(seed=-1),
    "seed text": lambda r: r.update(seed="zero"),
    "seed boolean": lambda r: r.update(seed=True),
    "n_params negative": lambda r: r.update(n_params=-5),
    "host memory NaN": lambda r: r.update(host_memory_gb=float("nan")),
    "host memory infinite": lambda r: r.update(host_memory_gb=float("inf")),
    "status unknown": lambda r: r.update(status="great"),
    "family unknown": lambda r: r.update(family="audio"),
    "optimizer unknown": lambda r: r.update(optimizer="lion"),
    "strategy unknown": lambda r: r.update(strategy="offload"),
    "source missing": lambda r: r.pop("source"),
    "hardware missing": lambda r: r.pop("hardware"),
    "model not text": lambda r: r.update(model=7),
    "config not an object": lambda r: r.update(config=[1, 2]),
    "metrics not a list": lambda r: r.update(metrics={"loss": 1}),
    "metric value boolean": lambda r: r["metrics"][0].update(value=True),
    "metric value text": lambda r: r["metrics"][0].update(value="fast"),
    "metric value negative": lambda r: r["metrics"][0].update(value=-0.5),
    "metric value NaN": lambda r: r["metrics"][0].update(value=float("nan")),
    "metric name unknown": lambda r: r["metrics"][0].update(name="vibes"),
    "metric unit missing": lambda r: r["metrics"][0].pop("unit"),
    "metric unknown field": lambda r: r["metrics"][0].update(colour="red"),
    "epoch wall time negative": lambda r: r["epochs"][0].update(wall_s=-1.0),
    "epoch number fractional": lambda r: r["epochs"][0].update(epoch=0.5),
    "epoch unknown field": lambda r: r["epochs"][0].update(mood="ok"),
    "epochs not a list": lambda r: r.update(epochs="none"),
    "run not an object": lambda r: r.clear() or r.update({"__list__": True}),
}


@pytest.mark.parametrize("case", list(IMPORTS))
def test_bad_import_rows_import_nothing(invoke, kb_path, tmp_path, case):
    run = with_change(GOOD_RUN, IMPORTS[case])
    body = {"runs": [GOOD_RUN, [1] if "__list__" in run else run]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(body, allow_nan=True))
    before = digest(kb_path)
    result = invoke("kb", "import", path)
    assert result.exit_code == 1 and "nothing was imported" in result.output, result.output
    assert "run 1:" in result.output and "Traceback" not in result.output
    assert digest(kb_path) == before


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"\xff\xfe not text", "not UTF-8"),
        (b"{broken", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"runs": [], "extra": 1}', "unknown keys"),
        (b'{"runs": {"a": 1}}', "expected a list of runs"),
        (b'{"runs": [], "validations": {"x": 1}}', "must be a list"),
        (b'{"runs": [], "validations": [{"name": "x"}]}', "missing"),
        (b'"just text"', "expected a list of runs"),
    ],
)
def test_bad_import_files_import_nothing(invoke, kb_path, tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    before = digest(kb_path)
    result = invoke("kb", "import", path)
    assert result.exit_code == 1 and needle in result.output, result.output
    assert "Traceback" not in result.output and digest(kb_path) == before


@pytest.mark.parametrize(
    "setup,needle",
    [
        (b"this is = not [toml", "not valid TOML"),
        (b"\xff\xfe", "not UTF-8"),
        (b'source = "x"\n', "lacks"),
    ],
)
def test_bad_setup_toml(invoke, kb_path, tmp_path, setup, needle):
    figures = REPO.parent / "kb/inputs/paper-2608.08961/figures.csv"
    shutil.copy(figures, tmp_path / "figures.csv")
    (tmp_path / "setup.toml").write_bytes(setup)
    before = digest(kb_path)
    result = invoke("kb", "import", tmp_path / "figures.csv")
    assert result.exit_code == 1 and needle in result.output, result.output
    assert "Traceback" not in result.output and digest(kb_path) == before


def test_the_catalogue_is_large(request):
    n = len(CASES) + len(IMPORTS) + 8 + 3
    assert n >= 100, n
