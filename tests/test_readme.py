"""Every command and Python example in the README runs, as a newcomer would type it, from the repository's
root (its paths are the checkout's), against a KB of the test's own."""

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest

from advisor.cli import cli

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands() -> list[str]:
    """The `advisor ...` lines of the README's bash blocks (setup lines such as `make` are not advisor's)."""
    lines = [line.split(" #")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("advisor ")]


def test_the_readme_shows_commands_and_stays_short():
    assert len(README.splitlines()) <= 200
    assert len(commands()) >= 6 and blocks("python")


@pytest.mark.slow
def test_every_readme_command_runs(runner, tmp_path, monkeypatch):
    """In order: what `measure` writes, `recommend --source measured` then reads; `report` writes into the
    working folder, here a copy's."""
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "tests").mkdir()
    shutil.copytree(REPO / "tests" / "fixtures", work / "tests" / "fixtures")
    monkeypatch.chdir(work)
    for line in commands():
        result = runner.invoke(cli, shlex.split(line)[1:], catch_exceptions=False)
        assert result.exit_code == 0, f"{line}\n{result.output}"


@pytest.mark.slow
def test_every_readme_python_example_runs(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    for block in blocks("python"):
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()
    assert os.environ["ADVISOR_DB"]  # the test's own KB: nothing of the user's was read or written
