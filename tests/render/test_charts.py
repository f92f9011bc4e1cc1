"""Pictures: `frontier --html/--png` and `flowchart --html` write files a browser or a paper can use; bad
paths and empty KBs end in a sentence; answering never loads the plotting library."""

import hashlib
import html
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest
import vl_convert
from PIL import Image

from advisor.kb.open import open_for_writing
from advisor.places import user_dir
from advisor.render import charts
from advisor.render.chart_layout import least_span

PLOTTING = ("altair", "vl_convert", "jinja2", "narwhals", "jsonschema")


def embedded_spec(page: str) -> dict:
    """The Vega-Lite spec a self-contained page embeds (a JSON block: `<script type="application/json" id="spec">`)."""
    found = re.search(r'<script type="application/json" id="spec">(.*?)</script>', page, flags=re.S)
    return json.loads(found.group(1))


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
    assert all(r["note"].startswith("diverged, in its source's own words") for r in excluded)  # on hover


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
    result = invoke("flowchart", "--source", "paper:2608.08961", "--html", page_path)
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
        (
            [
                "frontier",
                "--arch",
                "vit",
                "--x",
                "memory",
                "--source",
                "paper:2608.08961",
                "--png",
                "{tmp}/f.png",
            ],
            1,
            "nothing to plot",
        ),
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


def svg_texts(spec: dict) -> list[str]:
    """Every text the chart draws, rendered as its PNG is (vl-convert, no browser), as SVG."""
    svg = vl_convert.vegalite_to_svg(spec, vl_version=charts.VL_VERSION)
    return [html.unescape(t) for t in re.findall(r"<(?:text|tspan)[^>]*>([^<]+)</(?:text|tspan)>", svg)]


def test_every_point_of_a_png_is_named_or_keyed(invoke, tmp_path):
    """The frontier's points named beside them; every other one (within noise, dominated, excluded) lettered
    as `advisor frontier`'s table letters it, and the letter keyed to its configuration in the legend."""
    page_path = tmp_path / "f.html"
    env = {"COLUMNS": "200"}  # the table's names whole
    out = invoke("frontier", "--arch", "decoder", "--html", page_path, env=env).output
    spec = embedded_spec(page_path.read_text())
    rows = chart_rows(spec)
    letters = {
        m[0]: f"{m[1]} + {m[2]}" for m in re.findall(r"^([A-Za-z0-9]) +│ (\S+) +│ (\S+)", out, flags=re.M)
    }
    ranked = [r for r in rows if r["status"] != "excluded"]
    assert {r["key"]: r["config"] for r in ranked} == letters
    drawn = svg_texts(spec)
    statuses = {r["status"] for r in rows}
    assert {"on the frontier", "dominated", "excluded"} <= statuses
    for r in rows:
        if r["status"] == "on the frontier":
            assert r["text"] == r["config"] and r["config"] in drawn
        else:
            assert r["text"] == r["key"] and r["key"] in drawn and r["entry"] in drawn, r
    assert sum(1 for r in rows if r["entry"]) == len(rows) - sum(
        r["status"] == "on the frontier" for r in rows
    )


def test_a_dense_png_keeps_its_size_and_keys_every_point(invoke, tmp_path):
    """ViT's reference grid: 33 configurations, most of them off the frontier, keyed in a picture of the size
    --help states."""
    page_path, png = tmp_path / "f.html", tmp_path / "f.png"
    assert (
        invoke(
            "frontier", "--arch", "vision", "--source", "measured", "--html", page_path, "--png", png
        ).exit_code
        == 0
    )
    assert Image.open(png).size == tuple(n * charts.PNG_SCALE for n in charts.FRONTIER_SIZE)
    spec = embedded_spec(page_path.read_text())
    drawn = svg_texts(spec)
    keyed = [r["entry"] for r in chart_rows(spec) if r["entry"]]
    assert len(keyed) > 20 and all(e in drawn for e in keyed)
    assert "std = standard; ckpt = checkpointing" in " ".join(drawn)  # the key says its short names


@pytest.mark.parametrize(
    "args,axis,least,ceiling",
    [
        # the paper's NanoVLM times, 66.310 and 66.335: 0.04 % apart, under the tie tolerance
        (("--arch", "vlm"), "x", 2 * 0.05 * 66.3, None),
        (("--arch", "vlm", "--x", "utilization"), "x", 0, 100),  # 97.6 %: the axis stops at 100
        (("--arch", "encoder", "--x", "utilization"), "x", 0, 100),
    ],
)
def test_axes_never_stretch_a_tie_nor_run_past_100_percent(invoke, tmp_path, args, axis, least, ceiling):
    page_path = tmp_path / "f.html"
    assert invoke("frontier", *args, "--html", page_path).exit_code == 0
    spec = embedded_spec(page_path.read_text())
    lo, hi = next(
        layer["encoding"][axis]["scale"]["domain"]
        for layer in spec["layer"]
        if layer["mark"]["type"] == "point"
    )
    assert hi - lo >= least
    assert ceiling is None or hi <= ceiling
    assert all(lo <= r[axis] <= hi for r in chart_rows(spec))  # every point on the scale


def test_the_least_span_is_twice_the_equivalence_margin(rules):
    time, loss = rules.metric("time"), rules.metric("loss")
    assert least_span(time, rules, 66.3) == pytest.approx(2 * 0.05 * 66.3)
    assert least_span(loss, rules, 2.0) == pytest.approx(2 * 0.01 * 2.0)
    assert least_span(loss, rules, 0.0) == 0


@pytest.fixture(scope="module")
def fresh_bundle() -> str:
    """vl-convert's bundle as it makes it, once for the module (a second to make)."""
    return vl_convert.javascript_bundle(vl_version=charts.VL_VERSION)


@pytest.fixture
def bundling(monkeypatch, fresh_bundle) -> list[str]:
    """vl-convert's bundling, counted: each call appends its vl_version (it returns the real bundle, made
    once above); the process's copy in memory cleared, so javascript_bundle starts as a new process does."""
    calls = []

    def bundle(vl_version):
        calls.append(vl_version)
        return fresh_bundle if vl_version == charts.VL_VERSION else vl_convert.javascript_bundle(vl_version)

    monkeypatch.setattr(vl_convert, "javascript_bundle", bundle)
    charts.javascript_bundle.cache_clear()
    yield calls
    charts.javascript_bundle.cache_clear()


def kept_name(bundle: str) -> str:
    """The name the bundle is kept under: what its bytes depend on, and their sha256."""
    digest = hashlib.sha256(bundle.encode("utf-8")).hexdigest()
    return f"vega-bundle-{version('vl-convert-python')}-{charts.VL_VERSION}-{digest}.js"


def test_the_bundle_is_made_once_then_read_from_the_data_folder(bundling, fresh_bundle):
    """The first process bundles and keeps the script in the user's data folder; the next reads it back and
    bundles nothing."""
    assert charts.javascript_bundle() == fresh_bundle and bundling == [charts.VL_VERSION]
    cache = user_dir() / "cache"
    assert [p.name for p in cache.iterdir()] == [kept_name(fresh_bundle)]
    charts.javascript_bundle.cache_clear()  # a new process
    assert charts.javascript_bundle() == fresh_bundle and len(bundling) == 1
    assert (cache / kept_name(fresh_bundle)).read_text() == fresh_bundle


@pytest.mark.parametrize(
    "spoil",
    [
        lambda b: b[: len(b) // 2],  # truncated: a disk that filled, a copy cut short
        lambda b: b.replace(b"vegaEmbed", b"vegaEmbeD", 1),  # edited, the same length
        lambda b: b"",
        lambda b: b[:100] + b"\xff\xfe" + b[102:],  # not UTF-8
    ],
    ids=["truncated", "edited", "empty", "not-utf8"],
)
def test_a_spoiled_kept_bundle_is_made_again_never_served(invoke, tmp_path, bundling, fresh_bundle, spoil):
    """A kept file whose bytes are not those its name's digest states is bundled again and replaced: the page
    gets vl-convert's script, not the file's."""
    cache = user_dir() / "cache"
    cache.mkdir(parents=True)
    kept, data = cache / kept_name(fresh_bundle), fresh_bundle.encode("utf-8")
    kept.write_bytes(spoil(data))
    assert invoke("frontier", "--arch", "decoder", "--html", tmp_path / "f.html").exit_code == 0
    assert len(bundling) == 1 and kept.read_bytes() == data  # made again, and kept in its place
    assert charts.inline_script(fresh_bundle + charts.DRAW) in (tmp_path / "f.html").read_text()


def test_a_bundle_kept_for_another_version_is_not_read(bundling, fresh_bundle):
    """A script kept under another vl-convert's name, however sound, is not this version's: bundled anew."""
    cache = user_dir() / "cache"
    cache.mkdir(parents=True)
    other = "alert(1)"
    digest = hashlib.sha256(other.encode()).hexdigest()
    (cache / f"vega-bundle-0.0.1-{charts.VL_VERSION}-{digest}.js").write_text(other)
    assert charts.javascript_bundle() == fresh_bundle and len(bundling) == 1


def _a_folder(kept: Path, bundle: str) -> Callable[[], bool]:
    """A folder where the file goes: it stays, the report goes on without keeping the script."""
    kept.mkdir()
    return kept.is_dir


def _a_pipe(kept: Path, bundle: str) -> Callable[[], bool]:
    """A pipe: opening it to read would wait for a writer; it is replaced by the script."""
    os.mkfifo(kept)
    return lambda: kept.is_file() and kept.read_text() == bundle


def _a_link_to_a_sound_copy(kept: Path, bundle: str) -> Callable[[], bool]:
    """A link to a file outside the cache holding the very bytes: never followed, replaced by the script, the
    file it named untouched."""
    outside = kept.parent.parent / "elsewhere.js"
    outside.write_text("x" + bundle)
    outside.with_name(kept.name).write_text(bundle)  # what the link names: sound, and still not read
    kept.symlink_to(outside.with_name(kept.name))
    return lambda: (
        not kept.is_symlink() and kept.read_text() == bundle and outside.read_text() == "x" + bundle
    )


def _a_file_for_the_folder(kept: Path, bundle: str) -> Callable[[], bool]:
    """cache/ is a file: nothing can be kept in it, and it stays as it was."""
    kept.parent.rmdir()
    kept.parent.write_text("not a folder")
    return lambda: kept.parent.read_text() == "not a folder"


@pytest.mark.parametrize("plant", [_a_folder, _a_pipe, _a_link_to_a_sound_copy, _a_file_for_the_folder])
def test_whatever_stands_in_the_cache_the_report_is_written(invoke, tmp_path, bundling, fresh_bundle, plant):
    """Bad input in the data folder is never served, followed or waited on, and never fails the report: the
    script is bundled again and the page's vega.js is vl-convert's."""
    kept = user_dir() / "cache" / kept_name(fresh_bundle)
    kept.parent.mkdir(parents=True)
    as_it_should_be = plant(kept, fresh_bundle)
    result = invoke("report", "--out", tmp_path / "site")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "site" / "vega.js").read_text() == fresh_bundle + charts.DRAW
    assert len(bundling) == 1 and as_it_should_be()
