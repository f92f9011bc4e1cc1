"""`advisor measure` as a user meets it (issue 23): cells train from a folder that holds a copy of advisor,
library output goes into the runs' records instead of through the progress, the first seconds say what they
wait for, and a grid where every cell failed says each cause once and exits with code 1."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from advisor.measuring.grid.isolation import STARTING
from advisor.places import user_rules_dir

from ...processes import runs

# the installed script, as a user runs it: its sys.path has the script's folder, not the current one
ADVISOR = Path(sys.executable).with_name("advisor")

FAULTY_FAMILY = '''
"""A throw-away family for the tests: the decoder family, whose loss warns or fails as $FAULT says."""
import logging
import os
import warnings

from advisor.measuring.model.families import register
from advisor.measuring.model.families.decoder import Decoder

_warned = False


@register
class Faulty(Decoder):
    name = "faulty"
    task = "causal language modelling that warns or fails on purpose"

    def summed_loss(self, model, batch):
        global _warned
        fault = os.environ.get("FAULT")
        if fault == "raise":
            raise RuntimeError("the loss failed on purpose (a test)")
        if fault == "warn" and not _warned:
            _warned = True
            warnings.warn("a library's warning, from the cell (a test)", UserWarning)
            logging.getLogger("torch.faulty").warning("a library's log line, from the cell (a test)")
        return super().summed_loss(model, batch)
'''
CELL = ("--preset", "tiny", "--strategy", "standard", "--epochs", "1", "--steps-per-epoch", "4")
PAPER = (
    "--protocol",
    "paper",
)  # four updates of a tiny model: the fair protocol's "did not train" may say no


def faulty_family(tmp_path) -> dict:
    """The faulty family in the user's rules, its module on PYTHONPATH (not in the current folder): the
    environment for `advisor`."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "faulty_family.py").write_text(textwrap.dedent(FAULTY_FAMILY))
    user_rules_dir().mkdir(parents=True)
    (user_rules_dir() / "families.toml").write_text(
        'families.faulty = { module = "faulty_family", reference_model = "llama-faulty", inputs = ["text"] }\n'
    )
    return {"PYTHONPATH": str(modules)}


def measure(cwd: Path, *args, env: dict) -> tuple[int, str, str]:
    """`advisor measure ARGS` run as a user runs it, the installed script (not `python -m`, which puts the
    current folder on sys.path), from `cwd`, offline: (exit code, stdout, stderr)."""
    assert ADVISOR.exists(), f"no advisor script beside {sys.executable}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env}
    done = subprocess.run(
        [str(ADVISOR), "measure", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout, done.stderr


def stale_copy(folder: Path) -> Path:
    """A folder holding a copy of advisor that imports, and whose measuring part does not (a stale clone)."""
    (folder / "advisor" / "measuring").mkdir(parents=True)
    (folder / "advisor" / "__init__.py").write_text("")
    (folder / "advisor" / "measuring" / "__init__.py").write_text(
        'raise ImportError("a stale copy of advisor.measuring in the current folder")\n'
    )
    return folder


@pytest.mark.slow
def test_cells_train_from_a_folder_with_a_copy_of_advisor_and_keep_library_output_off_the_terminal(tmp_path):
    env = {**faulty_family(tmp_path), "FAULT": "warn"}
    folder = stale_copy(tmp_path / "work")
    db = tmp_path / "front.sqlite"
    args = ("--model", "vit", "--model", "llama-faulty", "--optimizer", "adam", *CELL, *PAPER, "--db", db)
    code, out, err = measure(folder, *args, env=env)

    assert code == 0, err
    assert "Traceback" not in err + out and "stale copy" not in err + out
    stored = {r["model"]: r for r in runs(db)}
    assert {m: r["status"] for m, r in stored.items()} == {"vit": "ok", "llama-faulty": "ok"}, err
    # what the libraries said went into the run's record, not through the progress
    for said in (
        "a library's warning, from the cell (a test)",
        "a library's log line, from the cell (a test)",
    ):
        assert said not in err + out
        assert said in json.loads(stored["llama-faulty"]["config"])["stderr"]
    lines = err.splitlines()
    assert lines[0] == "advisor measure: 2 cells"
    assert lines[1] == STARTING, "the first seconds say what they wait for, before any cell"
    assert "2 ok of 2 cells" in out and "Ask: advisor recommend --model vit" in out
    vit_group = next(r["grp"] for r in runs(db) if r["model"] == "vit")
    assert (
        f"Ask: advisor recommend --model vit --group {vit_group} --db {db}" in out
    )  # the group just measured


@pytest.mark.slow
def test_a_grid_where_every_cell_failed_says_the_cause_once_and_exits_1(tmp_path):
    env = {**faulty_family(tmp_path), "FAULT": "raise"}
    db = tmp_path / "failed.sqlite"
    args = ("--model", "llama-faulty", "--optimizer", "sgd", "--optimizer", "adam", *CELL, "--db", db)
    code, out, err = measure(tmp_path, *args, env=env)

    assert code == 1, (out, err)
    assert "Traceback" not in err + out
    cause = "2 cells failed: RuntimeError: the loss failed on purpose (a test)"
    assert out.splitlines().count(cause) == 1 and "RuntimeError" not in out.replace(cause, "")
    assert err.splitlines()[-1] == (
        "Error: no cell was measured (2 cells failed or crashed): fix the cause above, then run the same "
        f"command again; each run's traceback is kept with it in {db} (advisor kb export)."
    )
    assert "advisor recommend" not in out + err, "nothing was measured: nothing to ask about"
    stored = runs(db)
    assert [r["status"] for r in stored] == ["failed", "failed"]
    for run in stored:
        assert run["error"] == "RuntimeError: the loss failed on purpose (a test)"
        said = json.loads(run["config"])["stderr"]
        assert said.startswith("Traceback (most recent call last):") or "\nTraceback (most" in said
        assert "in summed_loss" in said and said.rstrip().endswith("the loss failed on purpose (a test)")

    code, out, err = measure(tmp_path, *args, "--json", env=env)
    assert code == 1 and json.loads(out)["results"][0]["status"] == "failed"
    assert err.splitlines()[-2] == cause and "Traceback" not in err
