"""A non-editable install (a wheel) finds the shipped KB and rules, from any working directory."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_finds_kb_and_rules(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, REPO],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("advisor-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, wheel],
        check=True,
        capture_output=True,
    )
    code = (
        "import sys; sys.argv = ['advisor', 'recommend', '--arch', 'encoder', '--optimize', 'memory', '--json']\n"
        "from advisor.cli import cli\ntry:\n cli()\nexcept SystemExit as e:\n assert not e.code, e.code\n"
        "import advisor.kb.reader as k; print('KB', k.shipped_kb_path())"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert '"optimizer": "adam"' in out.stdout
    assert f"KB {target}" in out.stdout, "the wheel must use its own copy of the KB, not the repository's"
