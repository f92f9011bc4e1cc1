"""bench/lora_targets.py: the pilot's targets for LoRA against full fine-tuning, and its refusals."""

import importlib.util
import sqlite3
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "bench" / "lora_targets.py"
spec = importlib.util.spec_from_file_location("lora_targets", SCRIPT)
lora_targets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lora_targets)


def pilot(path: Path, runs: list[tuple[str, str, list[float]]]) -> Path:
    """A KB with the columns the script reads: (model, status, held-out loss per epoch, from epoch 0) per run."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, model TEXT, status TEXT, source TEXT)")
    conn.execute("CREATE TABLE epochs (run_id INTEGER, epoch INTEGER, eval_loss REAL)")
    for i, (model, status, losses) in enumerate(runs):
        conn.execute("INSERT INTO runs VALUES (?, ?, ?, 'measured')", (i, model, status))
        conn.executemany("INSERT INTO epochs VALUES (?, ?, ?)", [(i, e, v) for e, v in enumerate(losses)])
    conn.commit()
    conn.close()
    return path


def test_each_base_gets_the_mean_of_its_runs_after_the_middle_epoch(tmp_path, capsys):
    db = pilot(
        tmp_path / "p.sqlite",
        [
            ("vit-small-pretrained", "ok", [3.0, 2.5, 2.0, 1.5]),  # full: 2.5 after epoch 2 of 4
            ("vit-small-pretrained", "ok", [3.0, 2.7, 2.4, 2.2]),  # LoRA: 2.7
            ("vit-small-pretrained", "diverged", [9.0, 9.0, 9.0, 9.0]),  # not a run that trained
            ("/abs/path/llama-small-pretrained", "ok", [4.0, 3.333, 3.0, 2.9]),
            ("vit", "ok", [1.0, 1.0, 1.0, 1.0]),  # not a base
        ],
    )
    assert lora_targets.main([str(db)]) == 0
    assert capsys.readouterr().out.splitlines() == ["TARGET_llama=3.33", "TARGET_vit=2.6"]


@pytest.mark.parametrize("kind", ["missing", "not a KB", "no base"])
def test_a_pilot_kb_that_cannot_give_targets_is_refused_with_what_to_do(kind, tmp_path, capsys):
    db = tmp_path / "p.sqlite"
    if kind == "not a KB":
        db.write_text("hello")
    elif kind == "no base":
        pilot(db, [("vit", "ok", [1.0, 1.0])])
    assert lora_targets.main([str(db)]) == 1
    err = capsys.readouterr().err
    says = {
        "missing": "run `make reference-lora-pilot` first",
        "not a KB": "is not a KB",
        "no base": "no ok run",
    }
    assert says[kind] in err and "Traceback" not in err
