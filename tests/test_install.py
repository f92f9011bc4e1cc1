"""A non-editable install (a wheel) finds the shipped KB, rules and models, from any working directory, and
builds without a setuptools warning."""

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


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
        "import advisor.kb.open as k; print('KB', k.shipped_kb_path())"
    )
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "XDG_DATA_HOME": str(tmp_path / "data")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert '"optimizer": "adam"' in out.stdout
    assert f"KB {target}" in out.stdout, "the wheel must use its own copy of the KB, not the repository's"


def _venv_with_the_wheel(tmp_path: Path) -> Path:
    """A fresh venv holding advisor from its wheel (built with every setuptools warning an error); its
    third-party libraries borrowed from this environment (a .pth line), so the test needs no network."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, REPO],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    assert "warning" not in (built.stdout + built.stderr).lower(), built.stdout + built.stderr
    (wheel,) = wheels.glob("advisor-*.whl")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run(
        [venv / "bin" / "pip", "install", "-q", "--no-deps", wheel], check=True, capture_output=True
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # after the wheel's own
    return venv


@pytest.mark.slow
def test_the_readme_first_commands_run_from_a_wheel_in_a_fresh_venv(tmp_path):
    venv = _venv_with_the_wheel(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "measure").mkdir(parents=True)  # a folder that would shadow a generic top-level name
    (elsewhere / "measure" / "__init__.py").write_text("raise ImportError('the wrong measure')\n")
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }

    def run(*args: str) -> str:
        out = subprocess.run(args, cwd=elsewhere, env=env, capture_output=True, text=True)
        assert out.returncode == 0, f"{args}\n{out.stdout}\n{out.stderr}"
        return out.stdout

    first = run("advisor", "fit", "--model", "llama-3.1-8b", "--gpu", "RTX4090")
    assert "24 GiB" in first and "The pick" in first and len(first.splitlines()) <= 20, first
    assert "Llama-3.1-70B" in run("advisor", "fit", "--list-models")
    assert "SFTConfig(" in run(  # a causal LM's default step: TRL's SFT (trl installed, as here)
        "advisor", "fit", "--model", "llama-3.1-8b", "--gpu", "RTX4090", "--code"
    )
    assert "encoder: optimize loss" in run("advisor", "recommend", "--arch", "encoder", "--optimize", "loss")
    where = run(
        "python",
        "-P",  # the site's modules only: not the folder we run from
        "-c",
        "import advisor.measuring, importlib.util as u; print(advisor.measuring.__file__, "
        "u.find_spec('measure'))",
    )
    assert where.startswith(str(venv)) and where.split()[1] == "None", "no top-level `measure` is installed"
    for block in re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        assert run("python", "-c", block).strip()
