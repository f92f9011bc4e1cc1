"""AdvisorCallback: a real transformers Trainer run (tiny models of two families, CPU, no mock) recorded as
evidence, and answered from with `recommend --source trainer`; a run that raises is crashed, not lost; the
main process prints one line saying what it recorded, where, and the command that shows it."""

import json
import re
import shlex
import sqlite3
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from advisor.integrations.transformers import AdvisorCallback  # noqa: E402
from advisor.measuring.models import build_model  # noqa: E402

from ..conftest import RULES, ref  # noqa: E402
from .processes import runs  # noqa: E402


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
    epochs = conn.execute("SELECT count(*) FROM epochs WHERE run_id = ?", [first["id"]]).fetchone()[0]
    conn.close()
    assert {"loss", "loss_final", "total_time", "peak_rss_gb", "samples_per_s", "epoch_time"} <= set(figures)
    assert epochs == 2 and figures["peak_rss_gb"] > 0
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


def test_a_run_that_raises_is_recorded_crashed(tmp_path, capsys, invoke):
    db = tmp_path / "mine.sqlite"
    callback = AdvisorCallback(db=db)

    class Boom(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        max_steps=3,
    )
    trainer = transformers.Trainer(
        model=build_model(ref("llama"), "tiny", RULES).model,
        args=targs,
        train_dataset=Texts(),
        callbacks=[callback, Boom()],
    )
    with pytest.raises(RuntimeError):
        trainer.train()
    assert runs(db)[0]["status"] == "running"  # until the interpreter exits (atexit) or a lease expires
    assert recorded(capsys.readouterr().err) == []
    callback.failure = RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    callback._end_unfinished()
    (run,) = runs(db)
    assert run["status"] == "oom" and "out of memory" in run["error"]
    (line,) = recorded(capsys.readouterr().err)
    assert line == (  # no loss logged before it raised; the KB named (--db), its group as read alone
        f"advisor: recorded run {run['id']} (oom: {run['model']} · adamw · standard) in {db}, group 1; "
        f"see: advisor kb runs --source trainer --status oom --db {db}"
    )
    listed = json.loads(invoke(*command(line), "--json").output)
    assert [(r["id"], r["status"]) for r in listed] == [(run["id"], "oom")]


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
