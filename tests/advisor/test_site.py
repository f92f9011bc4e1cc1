"""`advisor report --out DIR`: a static site of the shipped KB, checked as text and in headless Chromium
(Debian's, driven by playwright): no console error, every chart drawn with its points, not a blank page."""

import io
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from advisor.cli import cli
from advisor.kb.store import open_for_writing

REPO = Path(__file__).resolve().parents[2]
SHIPPED_KB = REPO / "kb" / "results.sqlite"
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
DATA_MARKS = "g.role-mark.mark-symbol path, g.role-mark.mark-rect path"  # Vega's SVG: points and cells


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


def _claims_json() -> str:
    result = CliRunner().invoke(cli, ["claims", "--json", "--db", str(SHIPPED_KB)])
    return json.dumps(json.loads(result.output)["claims"])


def test_report_shows_fit_predictions_when_present(invoke, kb_path, tmp_path):
    payload = {  # one traced step: two categories at the peak, affine in the batch; no stack of blocks
        "phases": {"backward": [[{"a": _bytes(2e9, 1e9), "b": _bytes(0, 5e8)}]]},
        "depth": {},
        "flops": [[0, 3e12]],
        "n_params": [5e8],
        "optimizer_traffic": [4e9],
        "attention": "sdpa",
    }
    with open_for_writing(kb_path) as conn:
        conn.execute(
            "INSERT INTO predictions (key, model, config_hash, optimizer, strategy, dtype, seq_len, device, "
            "software, payload, created_at) VALUES ('k', 'my-model', 'h', 'adamw', 'standard', 'bf16-mixed', "
            "2048, 'cuda', '{}', ?, '2026-01-01')",
            [json.dumps(payload)],
        )
    result = invoke("report", "--out", tmp_path / "site", "--source", "measured")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "site" / "index.html").read_text()
    assert '<section id="fit">' in page and "my-model" in page and "2048 tokens" in page
    assert "<b>3.50</b>" in page  # 2 GB parameters + 1.5 GB gradients at micro-batch 1
    assert "measured, vit, CPU" in page


def _bytes(parameters: float, gradients: float) -> dict:
    return dict(parameters=parameters, gradients=gradients, optimizer_state=0, activations=0, temporaries=0)


def test_report_into_a_used_folder_replaces_its_own_files_only(invoke, tmp_path):
    out = tmp_path / "site"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "index.html").write_text("STALE REPORT")
    assert invoke("report", "--out", out).exit_code == 0
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


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's), driven by playwright; skipped only where Chromium is not installed."""
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
    # every configuration of ViT's reference grid: the paper's 21, the menu's 4, accumulation at equal samples 7
    assert marks_per_chart(page, "#vis") == {"vis": 32}
    assert re.search(r"lower is better", page.inner_text("#vis")) or page.locator("#vis text").count() > 0
    assert problems == []
    page.close()


def test_rows_from_different_kinds_of_evidence_are_badged_and_bannered():
    from advisor.kb.reader import USER_ID_OFFSET, Group
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
