"""bench/cross_host.py: the same cell, seed and rate measured on two hosts, paired; and its refusal."""

import importlib.util
import sys
from pathlib import Path

import pytest

from advisor.kb.open import open_for_writing
from advisor.kb.store import write_runs
from tests.conftest import measured_run

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the script imports bench/machine.py, as it does run from its folder
spec = importlib.util.spec_from_file_location("cross_host", BENCH / "cross_host.py")
cross_host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cross_host)


def run(hardware: str, optimizer: str, seed: int, lr: float, loss: float) -> dict:
    return measured_run(
        optimizer=optimizer,
        seed=seed,
        hardware=hardware,
        config={"lr": lr},
        metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
    )


def kb(path: Path, runs: list[dict]) -> Path:
    conn = open_for_writing(path)
    write_runs(conn, runs)
    conn.close()
    return path


def test_runs_of_the_same_cell_seed_and_rate_on_two_hosts_are_paired(tmp_path):
    a = kb(tmp_path / "a.sqlite", [run("CPU: A", "adam", 0, 1e-3, 2.0), run("CPU: A", "sgd", 0, 0.1, 3.0)])
    b = kb(
        tmp_path / "b.sqlite",
        [
            run("CPU: B", "adam", 0, 1e-3, 2.2),  # its twin: 10 % apart
            run("CPU: B", "sgd", 0, 0.01, 3.0),  # another rate: not the same run
            run("CPU: B", "adam", 1, 1e-3, 2.0),  # another seed
        ],
    )
    (pair,) = cross_host.pairs(a, b)
    assert (pair["optimizer"], pair["seed"], pair["hosts"]) == ("adam", 0, ["CPU: A", "CPU: B"])
    assert pair["relative"] == pytest.approx(0.1)
    summary = cross_host.summary([pair])
    assert summary["pairs"] == 1 and summary["within"] == {"1e-06": 0, "0.0001": 0, "0.01": 0}
    assert cross_host.pairs(a, kb(tmp_path / "same.sqlite", [run("CPU: A", "adam", 0, 1e-3, 2.0)])) == []


def test_a_kb_that_is_not_there_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cross_host.py", str(tmp_path / "none.sqlite"), str(tmp_path / "x")])
    with pytest.raises(SystemExit) as ended:
        cross_host.main()
    assert "is not a file; pass two KBs" in str(ended.value.code)
