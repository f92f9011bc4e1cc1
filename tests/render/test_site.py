"""`advisor report --out DIR`: a static site of the shipped KB, checked as text and in headless Chromium
(Debian's, driven by playwright): no console error, every chart drawn with its points, not a blank page."""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from advisor.api import REPORT_GPUS as FIT_GPUS
from advisor.cli import cli
from advisor.kb.open import open_for_writing
from advisor.kb.store import write_runs
from advisor.render.chart_layout import least_span
from advisor.render.site import phase_words, shown_path, without_paths
from advisor.rules import load_rules

REPO = Path(__file__).resolve().parents[2]
SHIPPED_KB = REPO / "kb" / "results.sqlite"
DATA_MARKS = "g.role-mark.mark-symbol path, g.role-mark.mark-rect path"  # Vega's SVG: points and cells
QWEN = REPO / "tests" / "fixtures" / "configs" / "Qwen2-0.5B"
QUICK = (  # a corner of advisor fit's menu, traced in seconds: full fine-tuning, two optimizers, two strategies
    *("--adapter", "full", "--offload", "none", "--seq-len", "256"),
    *("--optimizer", "sgd", "--optimizer", "adamw", "--strategy", "standard", "--strategy", "checkpointing"),
)
SMALL_VIT = 2723735  # the shipped CPU grid's small ViT: the user's runs below are at its scale


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The report of the shipped KB, made once for the module (read-only: --db)."""
    out = tmp_path_factory.mktemp("site")
    result = CliRunner().invoke(cli, ["report", "--out", str(out), "--db", str(SHIPPED_KB)])
    assert result.exit_code == 0, result.output
    return out


def test_report_shows_every_answer_claim_and_group(site):
    page = (site / "index.html").read_text()
    assert (site / "vega.js").stat().st_size > 100_000
    assert '<script src="vega.js">' in page and "http://" not in page.split("<footer")[1]
    assert page.count('<div class="metric">') == 16  # every family × metric answer
    for family in ("vision", "encoder", "decoder", "vlm"):
        assert f'<section id="{family}">' in page
        assert f"advisor recommend --arch {family} --source paper:2608.08961 --group" in page  # provenance
    assert page.count('<span class="verdict') == len(json.loads(_claims_json()))
    assert page.count('data-spec="spec-') == 11  # the flowchart and 10 frontiers that have points
    assert "No configuration has both a memory and a loss figure" in page  # ViT's memory: said, not drawn
    assert "NVIDIA A100 40GB" in page and "adagrad + checkpointing" in page


def user_run(seed: int, optimizer: str, loss: float, seconds: float, busy: float) -> dict:
    """One of the user's own ViT runs (their KB), at the shipped small grid's scale: a held-out loss, a time
    per epoch and a CPU utilization."""
    return dict(
        n_params=SMALL_VIT,
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
        metrics=[
            dict(name="eval_loss", value=loss, unit="nats/target"),
            dict(name="epoch_time", value=seconds, unit="s/epoch"),
            dict(name="cpu_util", value=busy, unit="%"),
        ],
    )


@pytest.fixture(scope="module")
def sent(tmp_path_factory) -> dict:
    """A report a user sends: their own KB (in their data folder) holds their ViT runs, whose times differ by
    0.04 % and whose utilization is near 100 %, and advisor fit's traces of a model in a folder of theirs;
    read with the shipped KB, so that one family answers from the user's runs and the others from the
    reference measurements. Every path involved is absolute and must not reach the page."""
    base = tmp_path_factory.mktemp("sender")
    data, model, out = base / "xdg-data", base / "models" / "Qwen2-0.5B", base / "site"
    shutil.copytree(QWEN, model)
    env = {"XDG_DATA_HOME": str(data), "ADVISOR_DB": None}
    runner = CliRunner(env=env)
    assert runner.invoke(cli, ["fit", "--model", str(model), "--gpu", "rtx4090", *QUICK]).exit_code == 0
    runs = [
        user_run(s, o, loss + s / 100, seconds + s / 1000, busy + s / 5)
        for s in range(3)
        for o, loss, seconds, busy in (("adam", 1.0, 10.000, 99.4), ("sgd", 2.0, 10.004, 97.0))
    ]
    with open_for_writing(data / "advisor" / "kb.sqlite") as conn:
        write_runs(conn, runs)
    result = runner.invoke(cli, ["report", "--out", str(out), "--source", "measured"])
    assert result.exit_code == 0, result.output
    fits = {
        gpu: json.loads(
            runner.invoke(cli, ["fit", "--model", str(model), "--gpu", gpu, *QUICK, "--json"]).output
        )
        for gpu in FIT_GPUS
    }
    return dict(out=out, page=(out / "index.html").read_text(), paths=[base, data, model], fits=fits)


@pytest.mark.slow  # over 6 s in a full run (issue 49: make test-fast under 5 minutes)
def test_a_sent_report_names_no_absolute_path(sent):
    """The user's KB, their model's folder, the folder the report was made in: none in any written file."""
    written = {p.name: p.read_text() for p in sent["out"].iterdir()}
    assert sorted(written) == ["index.html", "vega.js"]
    for path in [*sent["paths"], REPO, Path.home()]:
        for name, text in written.items():
            assert str(path) not in text, f"{path} in {name}"
    page = sent["page"]
    assert "yours (kb.sqlite)" in page  # the user's KB by its file's name
    assert (
        '<h3 class="fit-model">Qwen2-0.5B ' in page
        and "&#39;Qwen2-0.5B&#39;,  # or your weights&#39; folder" in page
    )


def test_the_fit_section_is_advisor_fits_answer_per_accelerator(sent):
    """A model a table, an accelerator a row: fits or not, the largest micro-batch, advisor fit's own pick
    (the command's answer from the same traces), no internal phase name."""
    page = sent["page"]
    section = page[page.index('<section id="fit">') : page.index('<section id="evidence">')]
    rows = re.findall(
        r'<tr data-fits="(yes|no)" data-gpu="([^"]+)" data-pick="([^"]*)" data-batch="(\d*)">', section
    )
    assert [r[1] for r in rows] == list(FIT_GPUS)
    for fits, gpu, pick, batch in rows:
        asked = sent["fits"][gpu]
        assert (fits == "yes") == (asked["pick"] is not None)
        assert pick == asked["pick"]
        chosen = next(c for c in asked["configurations"] if c["fits"])
        assert int(batch) == chosen["max_batch_size"] > 1
    assert "backward0" not in page and "optimizer_step" not in page
    assert re.search(r"<td>(forward|backward|optimizer step)</td>", section)  # where the peak is, in words
    assert section.count("<pre><code>") == len(FIT_GPUS)  # the pick's code, under each row


def test_the_fit_section_answers_for_the_accelerators_asked(sent, tmp_path):
    """--gpu: the accelerators of the fit section; one whose precision was not traced (T4 has no bf16) says
    so and how to trace it, instead of a guess."""
    env = {"XDG_DATA_HOME": str(sent["paths"][1]), "ADVISOR_DB": None}
    args = ["report", "--out", str(tmp_path / "site"), "--gpu", "T4", "--gpu", "L4"]
    assert CliRunner(env=env).invoke(cli, args).exit_code == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert re.findall(r'<tr data-fits="(\w+)" data-gpu="([^"]+)"', page) == [("unknown", "t4"), ("yes", "l4")]
    assert (
        "not traced in NVIDIA T4&#39;s precision (fp16-mixed): advisor fit --model Qwen2-0.5B --gpu t4."
        in page
    )


def test_phase_words_and_shown_paths(tmp_path):
    assert [phase_words(p) for p in ("backward0", "backward1", "forward0", "optimizer_step")] == [
        "backward",
        "backward",
        "forward",
        "optimizer step",
    ]
    cwd, home = tmp_path / "work", tmp_path / "home"
    assert shown_path(cwd / "kb" / "runs.sqlite", cwd, home) == "kb/runs.sqlite"
    assert shown_path(home / ".local" / "kb.sqlite", cwd, home) == "~/.local/kb.sqlite"
    assert shown_path("/srv/models/llama", cwd, home) == "llama"
    assert shown_path("models/llama", cwd, home) == "models/llama"
    text = '<td>3.1 s/epoch</td> <a href="http://x.org/a">, "model": "/srv/models/llama", (/data/x.jsonl)'
    assert (
        without_paths(text) == '<td>3.1 s/epoch</td> <a href="http://x.org/a">, "model": "llama", (x.jsonl)'
    )


def _unprivileged() -> list[str]:
    """A way to run as a user who cannot write a read-only folder: `nobody` via setpriv when root (root
    writes anywhere), else as is."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: no unprivileged user to test a read-only folder")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_read_only_data_folder_still_yields_a_report(site):
    """A data folder (and home) the user cannot write: the chart script is bundled in memory, the report
    written whole, and nothing is left in the folder."""
    base = Path(tempfile.mkdtemp(prefix="advisor-ro-"))
    data, out = base / "data", base / "site"
    try:
        base.chmod(0o755)
        data.mkdir()
        data.chmod(0o555)
        out.mkdir()
        out.chmod(0o777)
        env = {k: v for k, v in os.environ.items() if k != "ADVISOR_DB"}
        env |= {"XDG_DATA_HOME": str(data), "HOME": str(data)}
        cmd = [*_unprivileged(), sys.executable, "-m", "advisor", "report", "--out", out, "--db", SHIPPED_KB]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=base)
        assert done.returncode == 0, done.stderr
        assert (out / "vega.js").read_bytes() == (site / "vega.js").read_bytes()
        assert "Wrote" in done.stdout and (out / "index.html").stat().st_size > 100_000
        assert list(data.iterdir()) == []
    finally:
        data.chmod(0o755)
        shutil.rmtree(base)


def _claims_json() -> str:
    result = CliRunner().invoke(cli, ["claims", "--json", "--db", str(SHIPPED_KB)])
    return json.dumps(json.loads(result.output)["claims"])


def test_report_into_a_used_folder_replaces_its_own_files_only(invoke, tmp_path):
    """A folder of the user's is refused (its files would be replaced without a word) unless --force; a folder a
    report wrote is rewritten, and nothing but index.html and vega.js is touched."""
    out = tmp_path / "site"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "index.html").write_text("STALE REPORT")
    refused = invoke("report", "--out", out)
    assert refused.exit_code == 1 and "--force" in refused.output and str(out) in refused.output
    assert (out / "index.html").read_text() == "STALE REPORT" and not (out / "vega.js").exists()
    assert invoke("report", "--out", out, "--force").exit_code == 0
    assert invoke("report", "--out", out).exit_code == 0  # its own folder now: no --force needed
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "notes.txt", "vega.js"]
    assert (out / "notes.txt").read_text() == "mine" and "STALE" not in (out / "index.html").read_text()


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["report", "--out", "{file}"], 2, "is a file"),
        (["report", "--out", "{file}/site"], 1, "is a file, not a folder"),
        (["report", "--out", "{tmp}/site", "--db", "{empty}"], 1, "nothing to report"),
        (["report", "--out", "{tmp}/site", "--source", "arxiv"], 2, "unknown source"),
        (["report"], 2, "Missing option '--out'"),
        (["report", "--out", "{tmp}/site", "--gpu", "A100"], 2, "could mean"),
        (["report", "--out", "{tmp}/site", "--gpu", "B300"], 2, "--gpu"),
    ],
)
def test_bad_report_options(invoke, tmp_path, args, code, needle):
    (tmp_path / "file.txt").write_text("not a folder")
    open_for_writing(tmp_path / "empty.sqlite").close()
    fill = dict(tmp=tmp_path, file=tmp_path / "file.txt", empty=tmp_path / "empty.sqlite")
    result = invoke(*[a.format(**fill) for a in args])
    assert result.exit_code == code, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert not (tmp_path / "site").exists()


def open_page(browser, path: Path):
    """Open a page from disk at a laptop's size; wait for its charts. Returns (page, console problems)."""
    page = browser.new_page(viewport={"width": 1366, "height": 800})
    problems = []
    page.on(
        "console",
        lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(path.as_uri())
    return page, problems


def marks_per_chart(page, selector: str) -> dict[str, int]:
    return page.evaluate(
        f"Object.fromEntries(Array.from(document.querySelectorAll({selector!r}))"
        f".map(c => [c.id, c.querySelectorAll({DATA_MARKS!r}).length]))"
    )


@pytest.mark.slow
def test_report_in_a_browser(browser, site, tmp_path):
    page, problems = open_page(browser, site / "index.html")
    page.wait_for_selector("body[data-charts]", timeout=30_000)
    assert page.evaluate("document.body.dataset.charts") == "ready"
    drawn = marks_per_chart(page, ".chart")
    assert len(drawn) == 11 and all(n > 0 for n in drawn.values()), drawn
    assert drawn["chart-flowchart"] == 16  # a cell per family × metric
    assert drawn["chart-decoder-time"] == 5  # 2 ranked points, 3 diverged CGD runs greyed
    domains = drawn_domains(page)
    check_axes(domains)
    (lo, hi), _ = domains["chart-vlm-time"]  # the paper's 66.310 and 66.335: 0.04 % apart, not the whole axis
    assert hi - lo >= 0.1 * 66.3 and lo < 66.31 < 66.34 < hi
    assert domains["chart-vlm-utilization"][0][1] <= 100  # the paper's 97.6 %
    check_keys(page)
    shot = Image.open(io.BytesIO(page.screenshot(path=str(tmp_path / "report.png"))))
    assert shot.size == (1366, 800)
    assert len(shot.convert("L").getcolors(1 << 16)) > 50, "the screenshot is blank"
    assert problems == []
    page.close()


@pytest.mark.slow
def test_frontier_html_in_a_browser(browser, invoke, tmp_path):
    path = tmp_path / "frontier.html"
    assert invoke("frontier", "--arch", "vision", "--source", "measured", "--html", path).exit_code == 0
    page, problems = open_page(browser, path)
    page.wait_for_selector("#vis svg g.role-mark.mark-symbol path", timeout=30_000)
    # every configuration of ViT's reference grid: the paper's 21, the menu's 5 (8-bit AdamW since issue 22),
    # accumulation at equal samples 7
    assert marks_per_chart(page, "#vis") == {"vis": 33}
    assert re.search(r"lower is better", page.inner_text("#vis")) or page.locator("#vis text").count() > 0
    assert problems == []
    page.close()


def test_rows_from_different_kinds_of_evidence_are_badged_and_bannered():
    from advisor.kb.queries.groups import USER_ID_OFFSET, Group
    from advisor.render.site import evidence_badge, mixed_evidence

    paper = Group("paper:2608.08961", "A100", "paper", "llama", "decoder", 5, 1, id=2)
    measured = Group("measured", "CPU", "small", "vit", "vision", 21, 3, id=9)
    yours = Group("measured", "laptop", "custom", "x", "encoder", 4, 1, id=USER_ID_OFFSET + 1)
    badges = {
        "decoder": evidence_badge(paper),
        "vision": evidence_badge(measured),
        "encoder": evidence_badge(yours),
    }
    assert badges == {"decoder": "paper", "vision": "reference measurement", "encoder": "your runs"}
    banner = mixed_evidence(badges)
    assert "paper: decoder" in banner and "your runs: encoder" in banner
    assert mixed_evidence({"decoder": "paper", "vision": "paper"}) is None


def drawn_domains(page) -> dict[str, tuple[list[float], list[float]]]:
    """Each frontier chart's x and y domains as Vega drew them (the page keeps its views in window.views)."""
    return page.evaluate(
        "Object.fromEntries(Object.entries(window.views).filter(([id]) => id !== 'chart-flowchart')"
        ".map(([id, v]) => [id, [v.scale('x').domain(), v.scale('y').domain()]]))"
    )


def check_axes(domains: dict) -> None:
    """No axis narrower than least_span (a practically equal difference never fills it), and a share in %
    never past 100."""
    rules = load_rules()
    assert domains, "no frontier drawn"
    for chart, axes in domains.items():
        x = chart.removeprefix("chart-").rsplit("-", 1)[1]
        for metric, (lo, hi) in zip((rules.metric(x), rules.metric("loss")), axes, strict=True):
            if lo > 0:  # the least span is of the values, which lie above lo
                assert hi - lo >= least_span(metric, rules, lo) * (1 - 1e-9), (chart, metric.name, lo, hi)
            if metric.unit == "%":
                assert 0 <= lo < hi <= 100, (chart, lo, hi)


def check_keys(page) -> None:
    """Every point of every frontier chart named beside it, or lettered and its letter keyed in the legend."""
    for chart in page.locator(".figure .chart").all():
        spec = json.loads(page.locator(f"#{chart.get_attribute('data-spec')}").text_content())
        rows = spec["data"]["values"]
        labels = set(chart.locator("g.role-legend-label text").all_text_contents())
        texts = chart.locator("g.role-mark text").all_text_contents()
        for r in rows:
            assert r["text"] in texts, (chart.get_attribute("id"), r["config"])
            assert r["text"] == r["config"] or r["entry"] in labels, (chart.get_attribute("id"), r["entry"])


@pytest.mark.slow
def test_a_sent_report_in_a_browser(browser, sent):
    """The report a user sends, as its reader sees it: no path of the sender's, the evidence of each family
    badged and the banner saying they differ, advisor fit's answer per accelerator, axes that do not stretch
    a 0.04 % difference nor run past 100 %, every point named or keyed."""
    page, problems = open_page(browser, sent["out"] / "index.html")
    page.wait_for_selector("body[data-charts]", timeout=30_000)
    assert page.evaluate("document.body.dataset.charts") == "ready"
    seen = page.inner_text("body") + page.content()
    assert not [str(p) for p in sent["paths"] if str(p) in seen]
    banner = page.inner_text(".banner")
    assert "your runs: vision" in banner and "reference measurement: encoder, decoder, vlm" in banner
    badges = page.evaluate(
        "Object.fromEntries(Array.from(document.querySelectorAll('main > section > h2 .badge'))"
        ".map(b => [b.closest('section').id, b.textContent]))"
    )
    assert badges == {
        "vision": "your runs",
        "encoder": "reference measurement",
        "decoder": "reference measurement",
        "vlm": "reference measurement",
    }
    fit = page.locator("#fit tr[data-fits]")
    assert fit.count() == len(FIT_GPUS) and page.locator("#fit tr[data-fits='yes']").count() == len(FIT_GPUS)
    assert "backward0" not in seen and "optimizer_step" not in page.inner_text("body")
    domains = drawn_domains(page)
    check_axes(domains)
    (lo, hi), _ = domains["chart-vision-time"]  # the user's times: 10.001 and 10.005 s, 0.04 % apart
    assert hi - lo >= 1.0 and lo <= 10.001 < 10.005 <= hi
    assert domains["chart-vision-utilization"][0][1] == 100  # adam's 99.6 %, its interval past 100: capped
    check_keys(page)
    assert problems == []
    page.close()


@pytest.mark.parametrize(
    "stored, said",
    [
        (None, "not stated"),
        ('{"torch": "2.13.0", "platform": "linux"}', "torch 2.13.0"),
        ("{not json", "unreadable (not JSON)"),
        ("[1, 2]", "unreadable (not a JSON object)"),
        ("[" * 5000 + "]" * 5000, "unreadable (not JSON)"),
    ],
)
def test_a_runs_software_column_in_words_whatever_it_holds(stored, said):
    """`advisor report --db` on a KB whose runs.software another tool wrote: the page says so and goes on."""
    from advisor.render.site import software_of

    assert software_of(stored) == said
