"""The fault catalogue of the pages advisor writes (issue 24). A script planted in every string a page shows
stays text on `frontier --html`, `flowchart --html` and `report`: in headless Chromium no dialog opens, the
title stays the page's, no global is set and every chart draws. And the files are written without surprise:
`report --out` refuses a folder of someone else's files unless --force, and nothing ever writes through a
symbolic link. Every case ends with exit code 0 and nothing run, or 1/2 with one sentence and no traceback,
within a time bound, and writes nothing outside its target.

Two routes bring planted strings to a page. `cli`: what a user meets, by the command line: a KB filled by
an ordinary `kb import` (the names and provenance it takes: quotes, entities, line separators; markup in
the free text it takes as it is), the user's rules folder, and a model's folder traced by `advisor fit`.
`planted`: what reading refuses today must still be safe by construction: a KB whose every name holds
`</script>` (another tool wrote it), drawn by the same functions the commands call, on its connection."""

import base64
import hashlib
import html
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "kb" / "results.sqlite"
QWEN = REPO / "tests" / "fixtures" / "configs" / "Qwen2-0.5B"
TIME_BOUND = 120  # seconds any one command may take: a case that hangs fails, it never stalls the suite
DATA_MARKS = "g.role-mark.mark-symbol path, g.role-mark.mark-rect path"  # Vega's SVG: points and cells
MODEL_FOLDER = "¤folder:<img src=x onerror=alert('folder')>"  # a model's folder ('/' cannot be in its name)
QUICK = (  # a corner of advisor fit's menu, traced in seconds
    *("--adapter", "full", "--offload", "none", "--seq-len", "256"),
    *("--optimizer", "sgd", "--strategy", "standard"),
)
IMPORTED = ("model", "hardware", "data", "settings", "device")  # `kb import` takes them without markup
FREE = ("error", "software")  # free text and JSON values: `kb import` takes markup in them as it is
RULES = ("caveat", "loss-label", "time-label", "accelerator")  # the user's rules folder
STORED = ("source", "model", "hardware", "preset", "data", "settings", "device")  # planted in the KB file
SHOWN = {  # (route, page) -> the planted strings the page shows; the others it is never given (a run's error
    # is on the report alone: a frontier names a failed configuration by its status)
    ("cli", "frontier"): ("model", "hardware", "data", "loss-label", "time-label"),
    ("cli", "flowchart"): ("model", "hardware", "data"),
    ("cli", "report"): (*IMPORTED, *FREE, *RULES, "folder"),
    ("planted", "frontier"): STORED[:5],
    ("planted", "flowchart"): STORED[:5],
    ("planted", "report"): (*STORED, *FREE, "when", "optimizer", "folder", "fit-model"),
}
PAGES = {"frontier": "frontier.html", "flowchart": "flowchart.html", "report": "site/index.html"}
ROUTES = [(route, page) for route in ("cli", "planted") for page in PAGES]


def tag(field: str) -> str:
    """How a planted string starts: its field, marked so that nothing else on a page reads the same (a page
    shows a run's start time by its first 10 characters: the tag and 4 more)."""
    return f"¤{field}:"


def payload(field: str) -> str:
    """A string that runs a script wherever a page writes it unescaped, in text, an attribute, JSON in a
    <script> or a comment; tagged with its field."""
    script = (
        f"window.pwned=(window.pwned||[]).concat('{field}');document.title='pwned {field}';alert('{field}')"
    )
    return (
        f"{tag(field)}</script><script>{script}</script><img src=x onerror=alert('{field}')>"
        f"<!--<script>'\"\u2028\u2029&amp;</SCRIPT ><svg onload=alert('{field}')>"
    )


def quoted(field: str) -> str:
    """What a name may hold and still be imported (no < or >): quotes that would end an attribute or a
    string, an entity that a page decoding twice would make a tag, line separators, a template literal."""
    return f'{tag(field)}" onfocus="alert(1)" \');alert(1);// &lt;img src=x onerror=alert(1)&gt;\u2028\u2029${{alert(1)}}'


def advisor(*args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command line in its own process, within TIME_BOUND (a hang fails the case, it never stalls)."""
    return subprocess.run(
        [sys.executable, "-m", "advisor", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIME_BOUND,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        cwd=cwd,
    )


def one_sentence(result: subprocess.CompletedProcess) -> str:
    """A refusal's message: one sentence, no traceback."""
    said = " ".join((result.stdout + result.stderr).split())
    assert "Traceback" not in said and said.startswith("Error: ") and said.endswith("."), said
    assert not re.search(r"\. [A-Z]", said), f"more than one sentence: {said}"
    return said


def paper_runs(base: Path) -> list[dict]:
    """The paper's runs as `kb export` writes them, and a failed CGD run beside each accumulation one, its
    error planted (free text: `kb import` takes it as it is; the report lists it among the excluded). Under a
    source of their own: an import may not claim the shipped KB's published sources with other runs."""
    exported = base / "paper.json"
    assert advisor("kb", "export", "--source", "paper", "--db", SHIPPED, "-o", exported).returncode == 0
    runs = [{**r, "source": f"{r['source']}-copy"} for r in json.loads(exported.read_text())["runs"]]
    failed = [
        {**r, "optimizer": "cgd", "status": "failed", "error": payload("error"), "uid": None}
        for r in runs
        if r["strategy"] == "accumulation"
    ]
    return runs + failed


def import_runs(runs: list[dict], path: Path, env: dict) -> None:
    """The runs into the KB at `path`, by an ordinary `advisor kb import` of their JSON."""
    (path.parent / "runs.json").write_text(json.dumps({"runs": runs}))
    imported = advisor("kb", "import", path.parent / "runs.json", "--db", path, env=env)
    assert imported.returncode == 0, imported.stderr


def user_rules(folder: Path) -> None:
    """A user's rules folder whose caveat, metric labels and accelerator name carry planted strings."""
    folder.mkdir(parents=True)
    q = json.dumps  # a TOML basic string, as JSON writes it
    (folder / "caveats.toml").write_text(
        f"[[caveats]]\nid = 'planted'\nwhen = {{}}\ntext = {q(payload('caveat'))}\n"
    )
    labels = {"loss": payload("loss-label"), "time": payload("time-label")}
    (folder / "metrics.toml").write_text(
        "".join(f"[metrics.{m}]\nlabel = {q(t)}\n" for m, t in labels.items())
    )
    (folder / "hardware.toml").write_text(f"[accelerators.rtx4090]\nname = {q(payload('accelerator'))}\n")


def trace(base: Path, env: dict) -> subprocess.CompletedProcess:
    """advisor fit's traces, into the KB, of a model whose folder's name is planted."""
    shutil.copytree(QWEN, base / MODEL_FOLDER)
    return advisor("fit", "--model", MODEL_FOLDER, "--gpu", "rtx4090", *QUICK, env=env, cwd=base)


@pytest.fixture(scope="module")
def cli(tmp_path_factory) -> dict:
    """The three pages as the commands write them from a KB of quoted names and planted errors (imported),
    a planted user's rules folder and a planted model's folder."""
    base = tmp_path_factory.mktemp("cli")
    db = base / "kb.sqlite"
    env = {"XDG_DATA_HOME": str(base / "xdg"), "ADVISOR_DB": str(db)}
    runs = [
        r | {f: quoted(f) for f in IMPORTED} | {"software": {"torch": payload("software")}}
        for r in paper_runs(base)
    ]
    import_runs(runs, db, env)
    traced = trace(base, env)
    user_rules(base / "xdg" / "advisor" / "rules")
    commands = {
        "frontier": ["frontier", "--arch", "decoder", "--html", base / "frontier.html"],
        "flowchart": ["flowchart", "--html", base / "flowchart.html"],
        "report": ["report", "--out", base / "site"],
    }
    results = {page: advisor(*args, env=env, cwd=base) for page, args in commands.items()}
    return dict(base=base, traced=traced, results=results)


def plant(db: Path) -> None:
    """A KB another tool wrote: every run's names and provenance planted (what `kb import` and reading
    refuse), one configuration's optimizer name too, and a copy of each trace under a planted model name."""
    from advisor.kb import summaries

    conn = sqlite3.connect(db)
    sets = ", ".join(f"{c} = ?" for c in STORED)
    values = [payload(c) for c in STORED] + [json.dumps({"torch": payload("software")}), payload("when")]
    conn.execute(f"UPDATE runs SET {sets}, software = ?, started_at = ?", values)
    conn.execute(
        "UPDATE runs SET optimizer = ? WHERE family = 'decoder' AND optimizer = 'sgd' AND strategy = 'standard'",
        [payload("optimizer")],
    )
    cols = [r[1] for r in conn.execute("PRAGMA table_info(predictions)")]
    copied = ["key || '-planted'" if c == "key" else "?" if c == "model" else c for c in cols]
    conn.execute(
        f"INSERT INTO predictions SELECT {', '.join(copied)} FROM predictions", [payload("fit-model")]
    )
    summaries.rebuild(conn)
    conn.commit()
    conn.close()


@pytest.fixture(scope="module")
def planted(cli, tmp_path_factory) -> dict:
    """The three pages drawn from the `cli` route's KB with every name planted, by the functions the commands
    call (frontier, flowchart, report) on a read-only connection that skips only the reading checks, with
    the shipped rules."""
    from advisor.answers.flowchart import summary, walk
    from advisor.answers.frontier import frontier
    from advisor.answers.report_data import gather_report
    from advisor.api import traced_fits
    from advisor.kb.open import connect_kb_readonly
    from advisor.places import shipped_rules_dir
    from advisor.render import charts, site
    from advisor.rules import load_rules

    base = tmp_path_factory.mktemp("planted")
    shutil.copy(cli["base"] / "kb.sqlite", base / "kb.sqlite")
    plant(base / "kb.sqlite")
    rules, conn = load_rules(str(shipped_rules_dir())), connect_kb_readonly(base / "kb.sqlite")
    front = frontier(conn, "decoder", "time", "loss", rules, None)
    paths = walk(conn, rules)
    for page, chart in (
        ("frontier", charts.frontier_chart(front, rules)),
        ("flowchart", charts.flowchart_chart(paths, summary(paths), rules)),
    ):
        charts.replace_file(base / PAGES[page], charts.html_page(chart).encode())
    data = gather_report(conn, rules, None, lambda: traced_fits(conn))
    site.write_site(data, base / "site", rules, "a planted KB")
    conn.close()
    return dict(base=base)


def page_of(request, route: str, page: str) -> tuple[Path, str]:
    """A route's page (its fixture made once) and its text; the command that wrote it ended with exit 0."""
    made = request.getfixturevalue(route)
    if route == "cli":
        result = made["results"][page]
        assert result.returncode == 0, result.stdout + result.stderr
    path = made["base"] / PAGES[page]
    return path, path.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("route,page,field", [(*k, f) for k, fields in SHOWN.items() for f in fields])
def test_a_planted_string_reaches_its_page_as_text(request, route, page, field):
    """Each string a page shows is on it (the case is not empty), every character that could end or start
    markup escaped for where it is: in text and attributes as entities, in JSON in a <script> \\u-escaped."""
    if (route, field) == ("cli", "folder"):
        traced = request.getfixturevalue("cli")["traced"]
        if traced.returncode != 0:  # advisor fit refused the folder's name: a sentence, the case is that
            one_sentence(traced)
            return
    _, text = page_of(request, route, page)
    found = [m.end() for m in re.finditer(re.escape(tag(field)), text)]
    assert found, f"{field} is not on the {page} page"
    opened = [text[i : i + 6] for i in found if not text.startswith(ESCAPED, i)]
    assert opened == [], f"{field} is written unescaped: {opened}"


ESCAPED = ("&lt;", "&#34;", "\\u003c", '\\"')  # < and " as text and attributes, and as JSON in a <script>


OWN_SCRIPTS = {
    "chart": [
        '<script type="application/json" id="spec">',
        '<script type="application/json" id="embed-options">',
        "<script>",
    ],
    "report": ['<script type="application/json" id="embed-options">', '<script src="vega.js">'],
}


@pytest.mark.slow
@pytest.mark.parametrize("route,page", ROUTES)
def test_every_tag_of_a_page_is_its_own(request, route, page):
    """No planted tag survives: the page's <script> elements are exactly its template's, no <img>, <svg> or
    comment is in it, and no line separator is raw in a <script>."""
    _, text = page_of(request, route, page)
    scripts = re.findall(r"<script\b[^>]*>", text, flags=re.I)
    if page == "report":
        specs = re.findall(r'<script type="application/json" id="spec-[\w-]+">', text)
        assert len(specs) >= 2 and scripts == [*specs, *OWN_SCRIPTS["report"]], scripts
    else:
        assert scripts == OWN_SCRIPTS["chart"], scripts
    ours = re.sub(r"<script>.*?</script>", "", text, flags=re.S)  # all else: Vega's own code holds '<img'
    assert not re.search(r"<(img|svg)\b|<!--", ours, flags=re.I)
    bodies = re.findall(r"<script\b[^>]*>(.*?)</script>", text, flags=re.S | re.I)
    assert not [b for b in bodies if "\u2028" in b or "\u2029" in b]


@pytest.mark.slow
@pytest.mark.parametrize("route,page", ROUTES)
def test_every_page_runs_only_its_own_scripts(request, route, page):
    """The page's policy comes before any script and names what runs: the hash of each inline script (a
    chart page's one), or 'self' (the report's vega.js, no inline script); no 'unsafe-inline', no
    'unsafe-eval' (Vega's expressions are interpreted: embed option ast)."""
    _, text = page_of(request, route, page)
    found = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', text)
    assert found and found.start() < text.index("<script"), "no policy before the first script"
    policy = html.unescape(found.group(1))
    script_src = re.search(r"script-src ([^;]+)", policy).group(1).split()
    assert "default-src 'none'" in policy and "'unsafe-eval'" not in policy
    inline = re.findall(r"<script>(.*?)</script>", text, flags=re.S)
    hashes = [
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'" for s in inline
    ]
    assert script_src == (["'self'"] if page == "report" else hashes) and len(inline) == (page != "report")


# Each chart as its menu's "Save as PNG" makes it (a data: URL the policy allows): the start of each
EXPORTS = "Promise.all(Object.values(window.views).map(v => v.toImageURL('png'))).then(u => u.map(x => x.slice(0, 14)))"


def visit(browser, path: Path, charts: bool = True) -> dict:
    """Open a page from disk and hover its marks (tooltips draw planted strings too); what ran: the dialogs
    it opened, its title, the global a planted script sets, the marks each chart drew, console errors."""
    page = browser.new_page(viewport={"width": 1366, "height": 800})
    dialogs, errors = [], []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    if charts:
        page.wait_for_selector("body[data-charts]", timeout=60_000)
        for mark in page.locator(DATA_MARKS).all()[:24]:
            mark.hover(timeout=5_000, force=True)
    seen = dict(
        dialogs=dialogs,
        title=page.title(),
        pwned=page.evaluate("window.pwned || null"),
        charts=page.evaluate("document.body.dataset.charts || null"),
        marks=page.evaluate(
            f"Array.from(document.querySelectorAll('.chart')).map(c => c.querySelectorAll({DATA_MARKS!r}).length)"
        ),
        exports=page.evaluate(EXPORTS) if charts else [],
        errors=errors,
    )
    page.close()
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("route,page", ROUTES)
def test_no_planted_script_runs(request, browser, route, page):
    """Every planted string on the page, in a browser: nothing runs, the title is the page's, every chart
    drawn and exported as its menu's PNG, and no script was even refused (the escaping held: the policy had
    nothing to stop)."""
    path, text = page_of(request, route, page)
    seen = visit(browser, path)
    assert seen["dialogs"] == [] and seen["pwned"] is None, seen
    assert seen["title"] == html.unescape(re.search(r"<title>(.*?)</title>", text).group(1))
    assert seen["charts"] == "ready" and seen["marks"] and all(seen["marks"]), seen
    assert seen["exports"] == ["data:image/png"] * len(seen["marks"])
    assert seen["errors"] == []


# What a template that forgot to escape would let through: scripts alone (an open comment would hide the rest
# of the page, charts and all: markup the escaping stops, no policy can)
RAW_SCRIPTS = (
    "<script>window.pwned=['raw'];document.title='pwned raw';alert('raw')</script>"
    "<img src=x onerror=alert('raw')><svg onload=alert('raw')></svg>"
)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["policy", "escaping"])
@pytest.mark.parametrize("page", PAGES)
def test_each_defence_holds_alone(request, browser, page, layer):
    """The policy alone stops a script written into the page raw (as a template that forgot to escape
    would); the escaping alone keeps every planted string text (the policy taken out)."""
    path, text = page_of(request, "planted", page)
    if layer == "policy":
        text = text.replace("<body>", "<body>" + RAW_SCRIPTS, 1)
    else:
        text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    copy = path.with_name(f"{layer}-{path.name}")  # beside it: the report's vega.js is found
    copy.write_text(text, encoding="utf-8")
    seen = visit(browser, copy)
    assert seen["dialogs"] == [] and seen["pwned"] is None, seen
    assert seen["charts"] == "ready" and all(seen["marks"]), seen


@pytest.mark.slow
def test_the_browser_sees_a_planted_script_that_runs(browser, tmp_path):
    """The check itself: the payload written raw into a page without a policy runs, and is seen."""
    path = tmp_path / "naive.html"
    path.write_text(
        f"<!DOCTYPE html><html><head><title>naive</title></head><body><p>{payload('x')}</p></body></html>"
    )
    seen = visit(browser, path, charts=False)
    assert seen["pwned"] == ["x"] and seen["title"] == "pwned x" and "x" in seen["dialogs"]


# --- `kb import` of a run with a planted string in one field ---------------------------------------------

RUN_FIELDS = ("source", "model", "hardware", "preset", "data", "settings", "device", "error", "started_at")


@pytest.mark.parametrize("field", [*RUN_FIELDS, "software", "optimizer", "protocol", "note", "unit"])
def test_a_planted_field_is_imported_as_text_or_refused(tmp_path, field):
    """A run whose field holds a script: imported as it is (then a page shows it as text, above), or refused
    with one sentence (exit 1) and the KB left as it was."""
    run = json.loads((REPO / "tests" / "fixtures" / "run.json").read_text()) | {"uid": None}
    if field in ("note", "unit"):
        run["metrics"][0][field] = payload(field)
    else:
        run[field] = {"torch": payload(field)} if field == "software" else payload(field)
    path, db = tmp_path / "planted.json", tmp_path / "kb.sqlite"
    path.write_text(json.dumps({"runs": [run]}))
    shutil.copy(SHIPPED, db)
    before = digest(db)
    result = advisor("kb", "import", path, "--db", db)
    assert result.returncode in (0, 1), result.stderr
    if result.returncode == 1:
        one_sentence(result)
        assert digest(db) == before


# --- where the files go: report --out, frontier --html/--png ---------------------------------------------


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


CACHE = "xdg-data/advisor/cache"  # advisor's own cache in the data folder: the chart script a picture keeps


def tree(root: Path) -> dict[str, str]:
    """Every entry under root, as what it is: a file's digest, a link's target, a folder, a pipe; the cache
    and the folders above it aside."""
    out = {}
    for p in sorted(root.rglob("*")):
        mode = p.lstat().st_mode
        key = str(p.relative_to(root))
        if f"{CACHE}/".startswith(f"{key}/") or key.startswith(f"{CACHE}/"):
            continue
        if stat.S_ISLNK(mode):
            out[key] = "-> " + os.readlink(p)
        elif stat.S_ISREG(mode):
            out[key] = digest(p)
        else:
            out[key] = "folder" if stat.S_ISDIR(mode) else "other"
    return out


OUTSIDE = "outside.html"  # a file beside the folder a link planted in it points to


def arrange(tmp_path: Path, case: str) -> Path:
    """The folder `report --out` is given, as the case leaves it; beside it, a file a link may point to."""
    out = tmp_path / "site"
    (tmp_path / OUTSIDE).write_text("the user's own page")
    if case == "report's own folder":
        return out  # made by the case's first run
    out.mkdir()
    what = {
        "a folder of the user's": lambda: (out / "notes.txt").write_text("mine"),
        "index.html a link out": lambda: (out / "index.html").symlink_to(tmp_path / OUTSIDE),
        "vega.js a link out": lambda: (out / "vega.js").symlink_to(tmp_path / OUTSIDE),
        "index.html a dangling link": lambda: (out / "index.html").symlink_to(
            tmp_path / "made-by-a-link.html"
        ),
        "index.html a folder": lambda: (out / "index.html").mkdir(),
        "index.html a pipe": lambda: os.mkfifo(out / "index.html"),
        "index.html a link to a report": lambda: (out / "index.html").symlink_to(
            tmp_path / "elsewhere" / "index.html"
        ),
        "an empty folder": lambda: None,
    }
    what[case]()
    return out


# case -> (exit code without --force, with it, what a refusal says beside the folder's name)
OUT_CASES = {
    "an empty folder": (0, 0, None),
    "report's own folder": (0, 0, None),  # a report made there first, and a file of the user's added
    "a folder of the user's": (1, 0, "--force"),
    "index.html a link out": (1, 0, "--force"),
    "vega.js a link out": (1, 0, "--force"),
    "index.html a dangling link": (1, 0, "--force"),
    "index.html a pipe": (1, 0, "--force"),
    "index.html a link to a report": (1, 0, "--force"),  # a report elsewhere is not this folder's own
    "index.html a folder": (1, 1, "a folder"),
}


@pytest.mark.slow
@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize("case", OUT_CASES)
def test_report_out_never_surprises(tmp_path, case, force):
    """Refused (exit 1, one sentence naming the folder and what to do) where the folder holds what a report
    did not write, unless --force; then index.html and vega.js are written as files in the folder, a link
    there replaced, never written through, a pipe never opened; nothing outside the folder changes, nothing
    else in it either."""
    if case == "index.html a link to a report":
        assert advisor("report", "--out", tmp_path / "elsewhere").returncode == 0
    out = arrange(tmp_path, case)
    if case == "report's own folder":
        assert advisor("report", "--out", out).returncode == 0
        (out / "notes.txt").write_text("mine")
    before = tree(tmp_path)
    result = advisor("report", "--out", out, *(["--force"] if force else []))
    code, code_forced, needle = OUT_CASES[case]
    assert result.returncode == (code_forced if force else code), result.stdout + result.stderr
    after = tree(tmp_path)
    if result.returncode:
        said = one_sentence(result)
        assert str(out) in said and needle in said, said
        assert after == before
        return
    assert {k: v for k, v in after.items() if not k.startswith("site/")} == {
        k: v for k, v in before.items() if not k.startswith("site/")
    }
    ours = ("site/index.html", "site/vega.js")
    kept = {k: v for k, v in before.items() if k.startswith("site/") and k not in ours}
    assert {k: after.get(k) for k in kept} == kept and set(after) - set(before) <= set(ours)
    assert all(stat.S_ISREG((tmp_path / k).lstat().st_mode) for k in ours)
    assert "advisor report" in (out / "index.html").read_text()[:1000]


# what is at FILE before `frontier --html FILE --png FILE`: every case ends with exit 0 and the picture at
# FILE as a plain file (a link replaced, never written through; a pipe replaced, never opened)
PICTURE_CASES = ("a new file", "an existing file", "a link out", "a dangling link", "a pipe")


def occupy(path: Path, case: str, tmp_path: Path) -> None:
    """Put at `path` what the case says is there."""
    if case == "an existing file":
        path.write_text("old")
        path.chmod(0o600)
    elif case == "a link out":
        path.symlink_to(tmp_path / OUTSIDE)
    elif case == "a dangling link":
        path.symlink_to(tmp_path / f"made-by-{path.name}")
    elif case == "a pipe":
        os.mkfifo(path)


@pytest.mark.slow
@pytest.mark.parametrize("case", PICTURE_CASES)
def test_a_picture_replaces_what_is_at_its_name(tmp_path, case):
    """The user names the file and --force: whatever is there is replaced by the picture, in one step (its
    permissions kept); a link planted at the name is replaced, and its target (the user's own page) is never
    written. (Without --force a file there is refused: tests/faults/test_fault_catalogue_files.py.)"""
    folder = tmp_path / "pictures"
    folder.mkdir()
    (tmp_path / OUTSIDE).write_text("the user's own page")
    paths = {"--html": folder / "frontier.html", "--png": folder / "frontier.png"}
    for path in paths.values():
        occupy(path, case, tmp_path)
    before = tree(tmp_path)
    result = advisor(
        "frontier", "--arch", "decoder", *[a for flag, path in paths.items() for a in (flag, path)], "--force"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    after = tree(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("pictures")} == {
        k: v for k, v in before.items() if not k.startswith("pictures")
    }
    assert sorted(os.listdir(folder)) == ["frontier.html", "frontier.png"]  # no temporary file left
    for flag, path in paths.items():
        assert stat.S_ISREG(path.lstat().st_mode)
        assert path.read_bytes().startswith(b"<!DOCTYPE html>" if flag == "--html" else b"\x89PNG")
        assert case != "an existing file" or stat.S_IMODE(path.stat().st_mode) == 0o600
