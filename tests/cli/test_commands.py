"""frontier, flowchart, help and README coverage of every command, and the answer side's import cost."""

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from advisor.cli import cli

REPO = Path(__file__).resolve().parents[2]


def all_commands(group=cli, prefix=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        path = (*prefix, name)
        yield path, cmd
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, path)


def test_every_command_has_help_with_an_example_and_is_documented(invoke):
    """Each command in the reference (docs/cli.md); each top-level one in the README too."""
    readme, reference = (REPO / "README.md").read_text(), (REPO / "docs" / "cli.md").read_text()
    for path, cmd in all_commands():
        result = invoke(*path, "--help")
        assert result.exit_code == 0
        assert cmd.help and len(cmd.help) > 40, f"{' '.join(path)} lacks a docstring"
        if not isinstance(cmd, click.Group):
            assert "advisor " + " ".join(path) in cmd.help, f"{' '.join(path)}: help has no example"
        assert f"advisor {' '.join(path)}" in reference, (
            f"docs/cli.md does not document `advisor {' '.join(path)}`"
        )
        if len(path) == 1:
            assert f"advisor {path[0]}" in readme, f"README does not name `advisor {path[0]}`"


def test_frontier_json_and_plot(invoke):
    out = json.loads(invoke("frontier", "--arch", "vision", "--json").output)
    on = {(p["optimizer"], p["strategy"]) for p in out["points"] if p["on_frontier"]}
    assert on == {("sgd", "accumulation"), ("sgd", "checkpointing"), ("adagrad", "standard")}
    assert out["x"]["metric"] == "time" and out["y"]["metric"] == "loss"
    text = invoke("frontier", "--arch", "vision").output
    assert "A* = point A is on the Pareto frontier" in text and "adagrad" in text


def test_frontier_leaves_out_diverged(invoke):
    out = json.loads(invoke("frontier", "--arch", "decoder", "--json").output)
    assert not any(p["optimizer"] == "cgd" for p in out["points"])
    assert any(s.startswith("cgd + standard: diverged") for s in out["left_out"])
    out = json.loads(
        invoke("frontier", "--arch", "decoder", "--x", "utilization", "--y", "loss", "--json").output
    )
    assert out["x"]["measure"] == "gpu_util"


def test_flowchart_paths_and_counts(invoke):
    out = json.loads(invoke("flowchart", "--source", "paper:2608.08961", "--json").output)
    assert len(out["paths"]) == 16
    keys = {"family", "metric", "optimizer", "strategy", "value", "tied", "separated_by", "flag"}
    assert all(keys <= set(p) for p in out["paths"])
    by = {(p["family"], p["metric"]): (p["optimizer"], p["strategy"]) for p in out["paths"]}
    # The paper's Figure 1: Adadelta wins loss on ModernBERT and Llama, Adagrad on ViT, Adam on NanoVLM,
    # SGD is the fastest on every model, CGD is on no best path.
    assert by[("encoder", "loss")][0] == by[("decoder", "loss")][0] == "adadelta"
    assert by[("vision", "loss")][0] == "adagrad" and by[("vlm", "loss")][0] == "adam"
    assert all(by[(f, "time")][0] == "sgd" for f in ("vision", "encoder", "decoder", "vlm"))
    assert "cgd" not in out["summary"]["optimizers"]
    # single runs: no test separates a path; the tie tolerance ties ViT's time (31.74 vs 31.77 s)
    vit_time = next(p for p in out["paths"] if (p["family"], p["metric"]) == ("vision", "time"))
    assert vit_time["tied"] and vit_time["separated_by"]["note"] == "no test: one run per configuration"
    assert out["summary"]["tied"] == 2 and out["summary"]["optimizers_tied"] == {"sgd": 1, "adam": 1}
    assert by[("vision", "memory")] == (None, None)  # the paper states ViT RAM only as a range
    text = invoke("flowchart", "--source", "paper:2608.08961").output
    flat = " ".join(text.split())
    assert "Recommendation flowchart" in flat and "Optimizers on best paths" in flat
    assert "2 of them tied (0 equivalent, 2 undecided)" in flat  # single runs: never equivalent


def test_answer_side_imports_no_heavy_library():
    """`advisor recommend` in a fresh interpreter imports neither torch, transformers, datasets nor pandas."""
    code = (
        "import sys, runpy; sys.argv = ['advisor', 'recommend', '--arch', 'encoder', '--optimize', 'memory'];"
        "from advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert e.code in (0, None), e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'datasets', 'pandas', 'sqlite_utils'))\n"
        "print('HEAVY', heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "adam + standard" in out
    assert re.search(r"HEAVY \[\]", out), out.splitlines()[-1]


@pytest.mark.parametrize(
    "cmd",
    [
        ["recommend", "--arch", "vit", "--source", "measured", "--json"],  # paired tests, TOST, seeds needed
        ["recommend", "--arch", "decoder", "--optimize", "loss", "--verbose"],  # other evidence compared
        ["frontier", "--arch", "vit", "--source", "measured"],
        ["flowchart", "--source", "measured"],
    ],
)
def test_tested_answers_load_no_numpy_or_scipy(cmd):
    """Answers with tests compute Student's t in the standard library (advisor/answers/stats.py): no numpy,
    no scipy on the answer path, whatever the evidence."""
    code = (
        f"import sys; sys.argv = ['advisor', *{cmd!r}]\n"
        "from advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert e.code in (0, None), e.code\n"
        "print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'scipy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out[-300:]
    if "--json" in cmd:
        assert '"kind": "paired t"' in out


@pytest.mark.parametrize("cmd", [["flowchart"], ["frontier", "--arch", "vit"], ["kb", "stats"]])
def test_other_read_commands_stay_light(cmd):
    code = (
        f"import sys; sys.argv = ['advisor', *{cmd!r}]\nfrom advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit:\n pass\n"
        "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'datasets', 'pandas')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "HEAVY []" in out


def test_a_command_loads_only_its_own_module():
    """advisor's commands load lazily: `recommend` does not import the modules of fit, measure or report."""
    code = (
        "import sys\n"
        "from advisor.cli import cli\n"
        "cli.main(['recommend', '--arch', 'vit', '--json'], standalone_mode=False)\n"
        "print(sorted(m for m in sys.modules if m.startswith('advisor.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert (
        out.strip().splitlines()[-1]
        == "['advisor.cli.answering', 'advisor.cli.params', 'advisor.cli.reporting']"
    )


# Modules the short answer does without: the rules a KB's rows are checked against (a user KB's check is
# remembered), a writer's (the store, leases and their sockets), other commands' answers (claims, transfer),
# and what the data folder's cache spares it (the rules' TOML parser, OpenSSL's hashes, importlib.metadata).
NOT_ANSWERING = ("advisor.kb.admission", "advisor.kb.store", "advisor.kb.lease", "socket")
NOT_ANSWERING += ("advisor.answers.claims", "advisor.answers.transfer")
NOT_ANSWERING += ("tomllib", "hashlib", "secrets", "importlib.metadata")
NOT_ANSWERING += ("platformdirs",) if sys.platform == "linux" else ()  # Linux's data folder: places.user_dir


@pytest.mark.parametrize(
    "extra, unused",
    [((), NOT_ANSWERING), (("--json",), (*NOT_ANSWERING, "rich", "advisor.render.views"))],
)
def test_the_short_answer_loads_only_what_it_uses(monkeypatch, extra, unused):
    """--json prints no table: neither the views nor rich are loaded."""
    monkeypatch.delenv("ADVISOR_DB")  # the shipped KB, and no user KB in the test's data folder
    argv = ["advisor", "recommend", "--arch", "encoder", "--optimize", "memory", *extra]
    code = (
        f"import sys; sys.argv = {argv!r}\n"
        "from advisor.cli import cli\n"
        "try:\n cli()\nexcept SystemExit as e:\n assert e.code in (0, None), e.code\n"
        f"print('LOADED', sorted(set(sys.modules) & {set(unused)!r}))"
    )
    for _ in range(2):  # the first answer fills the data folder's cache, the second reads it
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out[-300:]


def test_the_short_answer_ranks_no_other_group_it_would_not_show(rules):
    """Other groups' picks (`disagreements`) are shown by --verbose and --json alone: the short answer,
    which skips ranking them, reads the same."""
    from rich.console import Console

    from advisor import api
    from advisor.render.views import answer_view

    def shown(answer) -> str:
        out = Console(file=io.StringIO(), width=100, color_system=None)
        out.print(answer_view(answer, rules, verbose=False))
        return out.file.getvalue()

    compared = api.recommend("decoder", "loss")
    assert compared.disagreements  # the case: other evidence picks differently
    skipped = api.recommend("decoder", "loss", compare_groups=False)
    assert skipped.disagreements == [] and shown(skipped) == shown(compared)
