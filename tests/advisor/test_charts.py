"""Pictures: `frontier --html/--png` and `flowchart --html` write files a browser or a paper can use; bad
paths and empty KBs end in a sentence; answering never loads the plotting library."""

import io
import json
import re
import subprocess
import sys

import pytest
from PIL import Image

from advisor.kb.store import open_for_writing

PLOTTING = ("altair", "vl_convert", "jinja2", "narwhals", "jsonschema")


def embedded_spec(page: str) -> dict:
    """The Vega-Lite spec a self-contained page embeds (Altair's template: `const spec = {...};`)."""
    return json.loads(re.search(r"(?:var|const|let) spec = (\{.*?\});\s*\n", page, flags=re.S).group(1))


def chart_rows(spec: dict) -> list[dict]:
    """The data rows the chart draws."""
    return spec["data"]["values"]


def test_frontier_png_decodes_at_its_size(invoke, tmp_path):
    png = tmp_path / "frontier.png"
    result = invoke("frontier", "--arch", "vision", "--source", "measured", "--png", png)
    assert result.exit_code == 0 and "1280 × 840 px PNG" in result.output
    image = Image.open(io.BytesIO(png.read_bytes()))
    image.load()  # decodes every pixel
    assert image.format == "PNG" and image.size == (1280, 840)
    assert len(image.convert("L").getcolors(1 << 16)) > 50, "a blank picture"


def test_help_states_the_png_size_charts_draw():
    from advisor.cli.answering import FRONTIER_PIXELS
    from advisor.render import charts

    width, height = (n * charts.PNG_SCALE for n in charts.FRONTIER_SIZE)
    assert FRONTIER_PIXELS == f"{width} × {height}"


def test_frontier_html_is_self_contained_and_draws_every_point(invoke, tmp_path):
    page_path = tmp_path / "frontier.html"
    result = invoke("frontier", "--arch", "decoder", "--html", page_path, "--json")
    assert result.exit_code == 0
    points = json.loads(result.stdout)["points"]
    page = page_path.read_text()
    assert "<script src" not in page and "vegaEmbed" in page  # the libraries inlined: opens offline
    rows = chart_rows(embedded_spec(page))
    drawn = {r["config"] for r in rows if r["status"] != "excluded"}
    assert drawn == {f"{p['optimizer']} + {p['strategy']}" for p in points}
    excluded = [r for r in rows if r["status"] == "excluded"]
    assert {r["config"] for r in excluded} == {"cgd + standard", "cgd + checkpointing", "cgd + accumulation"}
    assert all(r["note"].startswith("diverged: loss") for r in excluded)  # the reason, on hover


def test_frontier_chart_has_units_direction_intervals_and_ties(invoke, tmp_path):
    page_path = tmp_path / "f.html"
    invoke("frontier", "--arch", "vision", "--source", "measured", "--html", page_path)
    spec = embedded_spec(page_path.read_text())
    titles = json.dumps(spec)
    assert "wall time per epoch, s/epoch (lower is better)" in titles and "loss (lower is better)" in titles
    rows = chart_rows(spec)
    assert all(r["x_lo"] < r["x"] < r["x_hi"] for r in rows)  # three seeds: every point has its interval
    assert {"on the frontier", "within noise of the frontier"} <= {r["status"] for r in rows}
    assert any(layer["mark"]["type"] == "line" for layer in spec["layer"])  # the frontier's staircase


def test_flowchart_html(invoke, tmp_path):
    page_path = tmp_path / "flowchart.html"
    result = invoke("flowchart", "--html", page_path)
    assert result.exit_code == 0 and "Recommendation flowchart" in result.output
    rows = chart_rows(embedded_spec(page_path.read_text()))
    assert len(rows) == 16
    vit = {r["metric"]: r for r in rows if r["family"] == "vision"}
    assert vit["loss"]["pick"] == "adagrad + checkpointing" and vit["memory"]["optimizer"] == "no answer"


@pytest.mark.parametrize(
    "args,code,needle",
    [
        (["frontier", "--arch", "vit", "--png", "{tmp}"], 2, "is a directory"),
        (["frontier", "--arch", "vit", "--png", "{tmp}/f.jpg"], 2, "does not end in .png"),
        (["frontier", "--arch", "vit", "--html", "{tmp}/f.png"], 2, "does not end in .html or .htm"),
        (
            ["frontier", "--arch", "vit", "--png", "{tmp}/no/such/folder/f.png"],
            1,
            "No such file or directory",
        ),
        (["frontier", "--arch", "vit", "--html", "{tmp}/file.txt/f.html"], 1, "cannot use"),
        (["frontier", "--arch", "vit", "--x", "memory", "--png", "{tmp}/f.png"], 1, "nothing to plot"),
        (["frontier", "--arch", "vit", "--db", "{empty}", "--png", "{tmp}/f.png"], 1, "no runs"),
        (["flowchart", "--html", "{tmp}"], 2, "is a directory"),
        (["flowchart", "--html", "{tmp}/f.svg"], 2, "does not end in .html"),
        (["flowchart", "--db", "{empty}", "--html", "{tmp}/f.html"], 1, "nothing to draw"),
    ],
)
def test_bad_picture_options(invoke, tmp_path, args, code, needle):
    open_for_writing(tmp_path / "empty.sqlite").close()
    (tmp_path / "file.txt").write_text("not a folder")
    result = invoke(*[a.format(tmp=tmp_path, empty=tmp_path / "empty.sqlite") for a in args])
    assert result.exit_code == code, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert not list(tmp_path.glob("f.*")), "a picture was written anyway"


def test_missing_plots_extra_says_how_to_install(invoke, tmp_path, monkeypatch):
    import advisor.cli.reporting as reporting

    monkeypatch.setattr(reporting, "find_spec", lambda name: None if name == "vl_convert" else object())
    result = invoke("frontier", "--arch", "vit", "--png", tmp_path / "f.png")
    assert result.exit_code == 1
    assert "pip install 'advisor[plots]'" in result.output and "vl_convert" in result.output


@pytest.mark.parametrize(
    "cmd",
    [
        ["frontier", "--arch", "vit"],
        ["flowchart"],
        ["recommend", "--arch", "vit"],
        ["frontier", "--help"],
        ["report", "--help"],
    ],
)
def test_answers_never_load_the_plotting_library(cmd):
    code = (
        f"import sys; sys.argv = ['advisor', *{cmd!r}]\nfrom advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert e.code in (0, None), e.code\n"
        f"print('LOADED', sorted(m for m in sys.modules if m.split('.')[0] in {PLOTTING!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out.splitlines()[-1]
