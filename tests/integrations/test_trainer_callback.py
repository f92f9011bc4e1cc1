"""AdvisorCallback: a real transformers Trainer run (tiny models of two families, CPU, no mock) recorded as
evidence, and answered from with `recommend --source trainer`; each log written as it comes; a run whose
train() raises (the script catching it or not) ended failed or oom at once, never left running; a killed
one keeps its logs; the main process prints one line saying what it recorded, where, and the command that
shows it."""

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from advisor.integrations.transformers import AdvisorCallback  # noqa: E402
from advisor.measuring.model.builder import build_model  # noqa: E402

from ..conftest import RULES, ref  # noqa: E402
from ..processes import query, runs, wait_for  # noqa: E402


class Texts(torch.utils.data.Dataset):
    """Causal LM examples of 16 tokens: a repeated pattern a tiny Llama learns in a few steps."""

    def __init__(self, n=32, vocab=64):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(3, vocab, (4,), generator=g).repeat(4) for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class Images(torch.utils.data.Dataset):
    def __init__(self, n=32, size=32):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, size, size, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def train(model, data, db, tmp_path, trainer=None, **args):
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        **{"num_train_epochs": 2, **args},
    )
    trainer = (trainer or transformers.Trainer)(
        model=model, args=targs, train_dataset=data, eval_dataset=data, callbacks=[AdvisorCallback(db=db)]
    )
    trainer.train()
    trainer.evaluate()
    return trainer


def recorded(text: str) -> list[str]:
    """The lines AdvisorCallback printed (the Trainer's progress bar may share a terminal line with one)."""
    return re.findall(r"advisor: recorded [^\r\n]*", text)


def printed(capsys, timeout: float = 15) -> list[str]:
    """The recorded lines, once there is one: the watcher ends the run in the KB first, then prints its line."""
    err, deadline = "", time.monotonic() + timeout
    while not recorded(err) and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capsys.readouterr().err
    return recorded(err)


def command(line: str) -> list[str]:
    """The advisor command a recorded line names, as arguments of the command line (without `advisor`)."""
    return shlex.split(line.split("; see: ")[1])[1:]


def test_trainer_runs_of_two_families_become_evidence(tmp_path, invoke):
    db = tmp_path / "mine.sqlite"
    llama = build_model(ref("llama"), "tiny", RULES).model
    train(llama, Texts(), db, tmp_path, optim="adamw_torch")
    train(
        build_model(ref("llama"), "tiny", RULES).model, Texts(), db, tmp_path, optim="sgd", learning_rate=0.1
    )
    vit = build_model(ref("vit"), "tiny", RULES)
    size = vit.model.config.image_size
    train(vit.model, Images(size=size), db, tmp_path, gradient_accumulation_steps=2)
    stored = runs(db)
    assert [(r["family"], r["optimizer"], r["strategy"], r["status"]) for r in stored] == [
        ("decoder", "adamw", "standard", "ok"),
        ("decoder", "sgd", "standard", "ok"),
        ("vision", "adamw", "accumulation", "ok"),
    ]
    first = stored[0]
    config = json.loads(first["config"])
    assert first["source"] == "trainer" and first["n_params"] > 0 and first["hardware"].startswith("CPU")
    assert config["seq_len"] == 16 and config["batch_size"] == 8 and config["dtype"] == "fp32"
    # its own identity, never the reference model's name: the same config is the same model, another is not
    assert first["model"].startswith("llama config ") and first["model"] == stored[1]["model"]
    assert stored[2]["model"].startswith("vit config ") and first["protocol"] == "trainer"
    assert first["data"] == "Texts of 32 samples (not fingerprinted)"
    conn = sqlite3.connect(db)
    figures = dict(conn.execute("SELECT name, value FROM metrics WHERE run_id = ?", [first["id"]]).fetchall())
    logs = conn.execute(
        "SELECT epoch, steps, loss FROM epochs WHERE run_id = ? ORDER BY epoch", [first["id"]]
    )
    logs = logs.fetchall()
    conn.close()
    assert {"loss", "loss_final", "total_time", "peak_rss_gb", "samples_per_s", "epoch_time"} <= set(figures)
    assert figures["peak_rss_gb"] > 0
    # every log a row (logging_steps=1: 2 epochs of 4 steps), the run's figures are theirs
    assert [(e, s) for e, s, _ in logs] == [(i, i + 1) for i in range(8)]
    assert (
        figures["loss"] == pytest.approx(sum(x for *_, x in logs) / 8)
        and figures["loss_final"] == logs[-1][2]
    )
    out = json.loads(
        invoke(
            "recommend",
            "--arch",
            "decoder",
            "--source",
            "trainer",
            "--optimize",
            "loss",
            "--db",
            db,
            "--json",
        ).output
    )
    assert out["evidence"]["source"] == "trainer"
    assert {out["recommendation"]["optimizer"], *(a["optimizer"] for a in out["alternatives"])} == {
        "adamw",
        "sgd",
    }


class Raise(transformers.TrainerCallback):
    """Raises a new `kind(message)` at the end of step `at` (after the logs of the steps before it), once:
    nothing but the raise holds the exception."""

    def __init__(self, kind: type, message: str, at: int = 2):
        self.kind, self.message, self.at, self.raised = kind, message, at, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.at and not self.raised:
            self.raised = True
            raise self.kind(self.message)


def trainer_of(db, tmp_path, *callbacks, **args):
    """A Trainer of a tiny Llama that logs every step, with AdvisorCallback first, then `callbacks`."""
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        **{"max_steps": 4, **args},
    )
    model = build_model(ref("llama"), "tiny", RULES).model
    return transformers.Trainer(
        model=model, args=targs, train_dataset=Texts(), callbacks=[AdvisorCallback(db=db), *callbacks]
    )


def ended(db, timeout: float = 15) -> dict:
    """The KB's one run, once it is no longer running (the callback's watcher ends it within half a second)."""
    wait_for(db, "SELECT count(*) FROM runs WHERE status != 'running'", timeout)
    (run,) = runs(db)
    return run


def test_a_run_whose_exception_the_script_catches_ends_at_once_with_its_sentence(tmp_path, capsys, invoke):
    """No on_train_end comes, and the Trainer lives on: the run still ends (oom, the exception's sentence)
    while the script holds the exception, and the log before it is kept."""
    db = tmp_path / "mine.sqlite"
    trainer = trainer_of(db, tmp_path, Raise(RuntimeError, "CUDA out of memory. Tried to allocate 2.00 GiB"))
    with pytest.raises(RuntimeError) as caught:
        trainer.train()
    run = ended(db)
    assert caught.value is not None and trainer is not None  # both alive: nothing was collected
    assert (
        run["status"] == "oom"
        and run["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    assert query(db, "SELECT epoch, steps FROM epochs WHERE run_id = ?", run["id"]) == [(0, 1)]
    (line,) = printed(capsys)
    assert line == (  # the KB named (--db), its group as read alone
        f"advisor: recorded run {run['id']} (oom: {run['model']} · adamw · standard · training loss "
        f"{query(db, 'SELECT loss FROM epochs')[0][0]:.4g}) in {db}, group 1; "
        f"see: advisor kb runs --source trainer --status oom --db {db}"
    )
    listed = json.loads(invoke(*command(line), "--json").output)
    assert [(r["id"], r["status"]) for r in listed] == [(run["id"], "oom")]
    lease = run["lease_until"]
    time.sleep(1)
    assert runs(db)[0]["lease_until"] == lease  # let go: no heartbeat renews an ended run


def test_a_run_whose_exception_the_script_drops_is_failed(tmp_path):
    """The exception is gone when the watcher looks: the run is failed, saying so honestly."""
    db = tmp_path / "mine.sqlite"
    trainer = trainer_of(db, tmp_path, Raise(ValueError, "a bad batch"))
    try:
        trainer.train()
    except ValueError:
        pass
    run = ended(db)
    assert run["status"] == "failed"
    # which one depends on whether the watcher looked while the except clause held the exception
    assert run["error"] in (
        "training ended without on_train_end (an exception the script caught?)",
        "ValueError: a bad batch",
    )


def test_each_log_is_in_the_kb_as_it_comes(tmp_path):
    """A callback after AdvisorCallback finds each log already in the KB, while the run is running."""
    db = tmp_path / "mine.sqlite"
    seen = []

    class Peek(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in (logs or {}):
                seen.append(
                    query(
                        db,
                        "SELECT r.status, count(e.epoch), max(e.steps) FROM runs r JOIN epochs e ON e.run_id = r.id",
                    )[0]
                )

    trainer_of(db, tmp_path, Peek()).train()
    assert seen == [("running", n, n) for n in (1, 2, 3, 4)]
    assert runs(db)[0]["status"] == "ok"


def test_a_trainer_that_starts_over_after_running_out_of_memory_records_both_attempts(tmp_path):
    """auto_find_batch_size: accelerate catches the out-of-memory error and calls the training loop again at
    a smaller batch, without on_train_end; the first attempt is oom, the second its own run."""
    db = tmp_path / "mine.sqlite"
    oom = Raise(RuntimeError, "CUDA out of memory. Tried to allocate 2.00 GiB")
    trainer_of(db, tmp_path, oom, auto_find_batch_size=True).train()
    first, second = runs(db)
    assert (first["status"], second["status"]) == ("oom", "ok")
    assert "auto_find_batch_size" in first["error"] and json.loads(second["config"])["batch_size"] == 8


SCRIPT = """
import sys, time, torch, transformers
from advisor.integrations.transformers import AdvisorCallback
from advisor.measuring.model.builder import build_model
from advisor.model_ref import resolve_model
from advisor.rules import load_rules

class Texts(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        row = torch.arange(4).repeat(4) + i % 7
        return {"input_ids": row, "labels": row}

class Stop(transformers.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == 3:
            if sys.argv[2] == "raise":
                raise ValueError("the data ran dry")
            time.sleep(600)  # a hung step, until the test kills it

rules = load_rules()
model = build_model(resolve_model("llama", rules), "tiny", rules).model
args = transformers.TrainingArguments(output_dir=sys.argv[3], per_device_train_batch_size=8, logging_steps=1,
                                      report_to=[], save_strategy="no", use_cpu=True, max_steps=8)
trainer = transformers.Trainer(model=model, args=args, train_dataset=Texts(),
                               callbacks=[AdvisorCallback(db=sys.argv[1]), Stop()])
trainer.train()
"""


def script(tmp_path, db, how: str) -> subprocess.Popen:
    """SCRIPT in a Python process of its own: a user's training script."""
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    argv = [sys.executable, str(path), str(db), how, str(tmp_path / "out")]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_an_uncaught_exception_fails_the_run_with_its_sentence(tmp_path):
    db = tmp_path / "mine.sqlite"
    proc = script(tmp_path, db, "raise")
    _, err = proc.communicate(timeout=300)
    (run,) = runs(db)
    assert proc.returncode == 1 and "ValueError: the data ran dry" in err
    assert (run["status"], run["error"]) == ("failed", "ValueError: the data ran dry")
    assert [s for (s,) in query(db, "SELECT steps FROM epochs ORDER BY epoch")] == [1, 2, 3]
    assert recorded(err) and "(failed: " in recorded(err)[0]


@pytest.mark.slow
def test_a_killed_run_keeps_its_logs_and_the_next_writer_ends_it(tmp_path):
    from advisor.kb import lease
    from advisor.kb.open import writing
    from advisor.measuring.machine.hardware import pid_alive

    db = tmp_path / "mine.sqlite"
    proc = script(tmp_path, db, "hang")
    try:
        wait_for(db, "SELECT count(*) >= 3 FROM epochs", timeout=300)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    assert [s for (s,) in query(db, "SELECT steps FROM epochs ORDER BY epoch")] == [1, 2, 3]
    with writing(db) as conn:  # the next writer: this host, a dead pid
        assert lease.mark_crashed(conn, pid_alive) == 1
    (run,) = runs(db)
    assert run["status"] == "crashed" and "ended before the run did" in run["error"]
    assert len(query(db, "SELECT loss FROM epochs WHERE loss IS NOT NULL")) == 3


def test_a_finished_run_prints_what_it_recorded_where_and_the_command_that_shows_it(
    tmp_path, monkeypatch, capsys, invoke
):
    """The user's own KB (no --db): ~ for the home folder, the group as `kb stats` names it beside the shipped
    KB (u1), and a command that ranks that very group; stderr, as the Trainer's progress bar and messages."""
    monkeypatch.delenv("ADVISOR_DB")
    monkeypatch.setenv("HOME", str(tmp_path))  # the user data folder ($XDG_DATA_HOME) is under it
    model = build_model(ref("llama"), "tiny", RULES).model
    train(model, Texts(), None, tmp_path, num_train_epochs=1, eval_strategy="epoch")
    out = capsys.readouterr()
    ((run,), (line,)) = runs(tmp_path / "xdg-data/advisor/kb.sqlite"), recorded(out.err)
    assert recorded(out.out) == []
    assert re.fullmatch(
        rf"advisor: recorded run 1 \(ok: {run['model']} · adamw · standard · eval loss \d\.\d+\) in "
        r"~/xdg-data/advisor/kb.sqlite, group u1; see: advisor recommend --arch decoder --group u1",
        line,
    ), line
    answer = json.loads(invoke(*command(line), "--json").output)
    assert answer["evidence"]["id"] == "u1" and answer["evidence"]["model"] == run["model"]
    assert answer["recommendation"]["optimizer"] == "adamw"


def test_only_the_main_process_prints(tmp_path, capsys):
    """A process that is not rank 0 records its run and prints nothing (the Trainer asks the same question)."""

    class OtherRank(transformers.Trainer):
        def is_world_process_zero(self):
            return False

    db = tmp_path / "mine.sqlite"
    train(build_model(ref("llama"), "tiny", RULES).model, Texts(), db, tmp_path, OtherRank, max_steps=1)
    assert [r["status"] for r in runs(db)] == ["ok"]
    assert recorded(capsys.readouterr().err) == []


def test_activation_checkpointing_is_the_checkpointing_strategy(tmp_path):
    """transformers 5's activation_checkpointing (gradient_checkpointing is its deprecated alias), no warning."""
    from advisor.integrations.transformers import strategy_of

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path),
            activation_checkpointing=True,
            gradient_accumulation_steps=2,
            use_cpu=True,
        )
        assert strategy_of(args) == "checkpointing+accumulation"


def test_a_hugging_face_dataset_is_named_by_its_fingerprint_and_a_config_by_its_hash():
    from advisor.integrations.transformers import data_identity, model_identity

    datasets = pytest.importorskip("datasets")
    data = datasets.Dataset.from_dict({"text": ["a", "b"]})
    assert data_identity(data) == f"dataset fingerprint:{data._fingerprint[:16]}"
    assert data_identity(data.map(lambda r: {"text": r["text"] * 2})) != data_identity(data)
    assert data_identity(iter([])) == "list_iterator (not fingerprinted)" and data_identity(None) == ""
    small, other = transformers.LlamaConfig(hidden_size=64), transformers.LlamaConfig(hidden_size=128)
    assert model_identity(None, small) != model_identity(None, other)
    assert model_identity(None, small).startswith("llama config ")
    assert model_identity("my-llama", small) == "my-llama"


def test_the_command_names_a_kb_read_alone_as_a_shell_takes_it(tmp_path, monkeypatch):
    """--db with ~ for the home folder, quoted where a shell needs it (bash reads it back as the path); a run
    that is not ok, or of a family the rules lack, is found in the KB's list of runs."""
    import subprocess

    from advisor.integrations.transformers import command_for, shell_path

    monkeypatch.setenv("HOME", str(tmp_path))
    db = tmp_path / "my runs" / "kb.sqlite"
    assert shell_path(db) == "~/'my runs/kb.sqlite'"
    assert subprocess.run(
        ["bash", "-c", f"printf %s {shell_path(db)}"], capture_output=True, text=True
    ).stdout == (str(db))
    assert (
        command_for("decoder", "3", "ok", db)
        == f"advisor recommend --arch decoder --group 3 --db {shell_path(db)}"
    )
    assert command_for("unknown", "u3", "ok", None) == "advisor kb runs --source trainer --status ok"
    assert (
        command_for("decoder", "u3", "crashed", None) == "advisor kb runs --source trainer --status crashed"
    )


@pytest.mark.parametrize("case", ["a read-only place", "the shipped KB", "not a KB", "a folder"])
def test_a_kb_that_cannot_take_the_run_never_stops_training(tmp_path, capsys, case):
    """The callback warns once, in words that fit a script, and the Trainer's job finishes. (/proc is read-only
    even to root, as these tests may run.)"""
    from advisor.places import shipped_kb_path

    db = {
        "a read-only place": Path("/proc/advisor-test/mine.sqlite"),
        "the shipped KB": shipped_kb_path(),
        "not a KB": tmp_path / "notes.sqlite",
        "a folder": tmp_path,
    }[case]
    if case == "not a KB":
        db.write_text("id,loss\n1,0.5\n")
    before = db.read_bytes() if db.is_file() else None
    out = trainer_of(db, tmp_path).train()  # finishes: never raises
    assert out.global_step > 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("advisor:")]
    assert len(said) == 1 and "this run is not recorded" in said[0] and "Training goes on" in said[0], err
    assert "Traceback" not in err and "--db" not in said[0]
    assert before is None or db.read_bytes() == before
