"""`--data`: the user's own data (JSONL, image folders, a model's tokenizer), the paper's MM-IMDb through the
hub's code path on a local fixture, bad data refused with a sentence, and no stall when the hub is away."""

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from advisor.measuring.data.folder import DataError
from advisor.measuring.data.source import MMIMDB_REPO, MMIMDB_REVISION, resolve, unreachable
from advisor.measuring.data.table import Table, class_indices, family_rows, open_table, split_rows
from advisor.measuring.data.values import SAMPLE_IMAGES, check_images, check_labels, check_text, rows_read
from advisor.measuring.model.families import family
from advisor.measuring.model.families.base import Sizes
from advisor.measuring.recipe.config import RunConfig

from ...conftest import RULES, one_cell, ref

TINY = (
    "--preset",
    "tiny",
    "--epochs",
    "1",
    "--steps-per-epoch",
    "2",
    "--optimizer",
    "sgd",
    "--strategy",
    "standard",
)


def write_corpus(path: Path, n: int = 40) -> Path:
    """A JSONL text corpus of documents of varied length."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps({"id": i, "text": f"Document {i}: the cat sat on the mat. " * (1 + i % 3)}) + "\n"
            )
    return path


def write_images(folder: Path, classes=("cat", "dog"), per_class: int = 10) -> Path:
    """An image folder: one subfolder per class, small PNGs of the class's colour."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(classes):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(60 + 120 * k, 30, (20, 24, 3)), 0, 255).astype("uint8")
            Image.fromarray(pixels).save(folder / name / f"{i}.png")
    return folder


def write_mmimdb_snapshot(cache: Path, n: int = 30) -> Path:
    """MM-IMDb as the hub serves it, in the Hugging Face cache at the pinned commit: a parquet shard of
    posters, plots and genre lists (columns image, text, genres)."""
    import datasets
    from PIL import Image

    rng = np.random.default_rng(1)
    genres = [["Drama"], ["Comedy", "Romance"], ["Horror", "Thriller"]]
    rows = {
        "image": [Image.fromarray((rng.random((30, 20, 3)) * 255).astype("uint8")) for _ in range(n)],
        "text": [f"A plot about movie {i}, in which things happen." for i in range(n)],
        "genres": [genres[i % 3] for i in range(n)],
    }
    features = datasets.Features(
        image=datasets.Image(),
        text=datasets.Value("string"),
        genres=datasets.Sequence(datasets.Value("string")),
    )
    snapshot = cache / "datasets--pranavmr--MM-IMDb" / "snapshots" / MMIMDB_REVISION
    (snapshot / "data").mkdir(parents=True)
    datasets.Dataset.from_dict(rows, features=features).to_parquet(
        snapshot / "data" / "train-00000-of-00001.parquet"
    )
    return snapshot


def runs(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT model, status, data, config FROM runs ORDER BY id").fetchall()
    conn.close()
    return [(m, s, d, json.loads(c)) for m, s, d, c in rows]


# --- the user's own data, through the grid ---------------------------------------------------------------


@pytest.mark.slow
def test_a_jsonl_corpus_and_an_image_folder_train_through_the_grid_as_their_own_evidence(invoke, tmp_path):
    corpus, images, db = (
        write_corpus(tmp_path / "corpus.jsonl"),
        write_images(tmp_path / "pics"),
        tmp_path / "m.sqlite",
    )
    for model, data in (("llama", corpus), ("llama", "generated"), ("vit", images)):
        out = invoke("measure", "--model", model, *TINY, "--data", data, "--db", db)
        assert out.exit_code == 0, out.output
    (llama, generated, vit) = runs(db)
    assert llama[1] == vit[1] == generated[1] == "ok"
    assert llama[2].startswith("corpus.jsonl sha256:") and generated[2] == "generated"
    assert vit[2].startswith("pics sha256:")
    recorded = llama[3]["data"]
    assert (
        recorded["source"] == llama[2]
        and recorded["split"] == "train"
        and recorded["tokenizer"] == "byte-level"
    )
    assert recorded["examples"] == {"total": 40, "test": 8, "validation": 8, "train": 24}
    assert vit[3]["data"]["examples"]["total"] == 20
    answer = json.loads(invoke("recommend", "--arch", "decoder", "--db", db, "--json").output)
    assert answer["evidence"]["data"] == llama[2]  # the user's data over the generated corpus
    assert f"data {llama[2]}" in answer["evidence"]["label"]
    others = {g["data"] for g in answer["other_evidence"]}
    assert (
        "generated" in others
    )  # the same model and preset on other data: another group, never ranked with it


def test_a_captioned_image_folder_trains_the_vlm_and_the_text_families_read_its_captions(tmp_path):
    from PIL import Image

    from advisor.measuring.grid.runner import train_cell

    folder = tmp_path / "captioned"
    folder.mkdir()
    with open(folder / "metadata.jsonl", "w") as f:
        for i in range(15):
            Image.fromarray(np.full((16, 16, 3), 10 * i, dtype="uint8")).save(folder / f"{i}.png")
            f.write(json.dumps({"file_name": f"{i}.png", "caption": f"a grey square of shade {i}"}) + "\n")
    choice = resolve(str(folder))
    for model in ("nanovlm", "modernbert"):
        cfg = cell(model, choice, batch_size=2).resolved()
        out = train_cell(one_cell(replace(cfg, device="cpu")), RULES)
        assert out.status in ("ok", "untrained"), out.error


def cell(model: str, choice, **fields) -> RunConfig:
    """A tiny fair-protocol cell of one model on the chosen data."""
    base = RunConfig(model=model, preset="tiny", epochs=1, steps_per_epoch=2, optimizer="sgd", **fields)
    return replace(base, **choice.config_fields())


# --- the paper's MM-IMDb, through the hub's code path ----------------------------------------------------


def test_mmimdb_is_pinned_and_read_from_the_cache_through_the_path_a_download_takes(tmp_path, monkeypatch):
    import huggingface_hub.constants

    from advisor.measuring.grid.runner import train_cell

    snapshot = write_mmimdb_snapshot(tmp_path / "hub")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    said = []
    choice = resolve("mmimdb", say=said.append)  # offline (the tests' HF_HUB_OFFLINE): the cache
    assert choice.path == str(snapshot) and choice.identity == f"{MMIMDB_REPO}@{MMIMDB_REVISION[:7]}"
    assert choice.note and len(said) == 1 and "local cache" in said[0]
    table = open_table(choice.path)
    assert table.columns == ["image", "text", "genres"]
    rows, classes = family_rows(table, family("vision", RULES))
    assert classes == 3 and set(rows["label"]) == {0, 1, 2}  # Comedy, Drama, Horror: each list's first
    text, _ = family_rows(table, family("vlm", RULES))
    assert text.column_names == ["image", "caption"]  # MM-IMDb's image-text pairs: poster and plot
    out = train_cell(one_cell(replace(cell("vit", choice, batch_size=2).resolved(), device="cpu")), RULES)
    assert out.status in ("ok", "untrained"), out.error


# --- tokenizers and sizes like the user's -----------------------------------------------------------------


def tiny_llama_with_tokenizer(folder: Path, texts: list[str]) -> Path:
    """A 2-layer Llama folder that carries its own word-level tokenizer (no weights: random init)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "<s>", "</s>"]
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    config.save_pretrained(folder)
    return folder


def test_a_model_that_carries_a_tokenizer_trains_with_it(tmp_path):
    from advisor.measuring.grid.runner import train_cell

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    model = tiny_llama_with_tokenizer(tmp_path / "my-llama", texts)
    choice = resolve(str(corpus))
    records = []
    cfg = replace(cell(str(model), choice, batch_size=2, seq_len=16).resolved(), device="cpu")
    out = train_cell(one_cell(cfg), RULES, on_built=records.append)
    assert out.status in ("ok", "untrained"), out.error
    assert records[0]["data"]["tokenizer"] == "my-llama"


def test_seq_len_and_image_size_build_reference_models_to_them_and_refuse_what_a_model_cannot_take(tmp_path):
    from advisor.measuring.model.builder import sized_reference, sized_user_config

    config, shape = sized_reference(
        family("vision", RULES), "tiny", Sizes(image_size=48, num_labels=5), RULES
    )
    assert (config.image_size, config.num_labels, shape.image_size, shape.num_labels) == (48, 5, 48, 5)
    config, shape = sized_reference(family("decoder", RULES), "tiny", Sizes(seq_len=300), RULES)
    assert shape.seq_len == 300 and config.max_position_embeddings >= 300
    _, shape = sized_reference(family("vlm", RULES), "tiny", Sizes(image_size=64, seq_len=20), RULES)
    assert (shape.image_size, shape.image_tokens, shape.seq_len) == (64, 16, 20)
    with pytest.raises(ValueError, match="not a multiple of the model's patch size"):
        sized_reference(family("vision", RULES), "tiny", Sizes(image_size=30), RULES)
    model = tiny_llama_with_tokenizer(tmp_path / "m", ["a b c"])
    with pytest.raises(ValueError, match="--seq-len 100 is longer than this model takes"):
        sized_user_config(ref(model), Sizes(seq_len=100), RULES)


def test_labels_become_class_indices_whatever_their_form():
    import datasets

    cases = {
        "names": (["b", "a", "b"], [1, 0, 1], 2),
        "lists": ([["x", "y"], ["z"], ["x"]], [0, 1, 0], 2),
        "ints": ([3, 0, 1], [3, 0, 1], 4),
    }
    for values, indices, classes in cases.values():
        rows = datasets.Dataset.from_dict({"label": values})
        assert class_indices(rows, "label") == (indices, classes)
    labelled = datasets.Dataset.from_dict(
        {"label": [1, 0]}, features=datasets.Features(label=datasets.ClassLabel(names=["a", "b", "c"]))
    )
    assert class_indices(labelled, "label") == ([1, 0], 3)


def test_the_split_is_fixed_disjoint_and_ignores_the_files_order():
    parts = split_rows(50, 16)
    assert [len(parts[k]) for k in ("test", "validation", "train")] == [10, 10, 30]
    assert len(set(np.concatenate(list(parts.values())))) == 50
    assert not np.array_equal(parts["test"], np.arange(10))  # an image folder's first rows are one class
    assert all(np.array_equal(parts[k], split_rows(50, 16)[k]) for k in parts)


# --- bad data: a sentence and an exit code, before any cell ------------------------------------------------


def bad_inputs(tmp_path: Path) -> dict:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "notes.xml").write_text("<a/>")
    (tmp_path / "nothing").mkdir()
    write_corpus(tmp_path / "few.jsonl", n=4)
    (tmp_path / "words.jsonl").write_text(
        (json.dumps({"words": "text under a name we do not know"}) + "\n") * 10
    )
    (tmp_path / "broken.jsonl").write_text('{"text": "a row"}\n{"text": broken\n' + '{"text": "x"}\n' * 20)
    mixed = write_images(tmp_path / "mixed")
    write_corpus(mixed / "notes.jsonl")
    return {
        "a path that is not there": (
            ["--model", "llama", "--data", tmp_path / "missing.jsonl"],
            2,
            "no file or folder",
        ),
        "an unknown format": (
            ["--model", "llama", "--data", tmp_path / "notes.xml"],
            2,
            ".xml is not a format",
        ),
        "an empty file": (
            ["--model", "llama", "--data", tmp_path / "empty.jsonl"],
            2,
            "empty.jsonl is empty",
        ),
        "an empty folder": (["--model", "llama", "--data", tmp_path / "nothing"], 2, "holds no files"),
        "too few examples": (
            ["--model", "llama", "--data", tmp_path / "few.jsonl"],
            2,
            "has 4 examples, too few",
        ),
        "a missing column": (
            ["--model", "vit", "--data", write_corpus(tmp_path / "texts.jsonl")],
            2,
            "texts.jsonl has columns id, text; the vision family (image classification) needs image and label",
        ),
        "a text column under another name": (
            ["--model", "llama", "--data", tmp_path / "words.jsonl"],
            2,
            "words.jsonl has columns words; the decoder family (causal language modelling) needs text columns",
        ),
        "a malformed row": (
            ["--model", "llama", "--data", tmp_path / "broken.jsonl"],
            2,
            "cannot read broken.jsonl as a dataset (ValueError: Trailing data",
        ),
        "a folder of several kinds of data": (
            ["--model", "vit", "--data", mixed],
            2,
            "mixes images, json files: only one kind would be read",
        ),
        "an unreachable hub id without --fallback": (
            ["--model", "llama", "--data", "someone/a-dataset"],
            1,
            "the Hugging Face hub cannot be reached",
        ),
        "an image size the patches do not tile": (
            ["--model", "vit", "--image-size", "30"],
            2,
            "patch size (8 px)",
        ),
    }


def test_bad_data_is_refused_with_a_sentence_before_any_cell(invoke, tmp_path):
    db = tmp_path / "bad.sqlite"
    for case, (args, code, sentence) in bad_inputs(tmp_path).items():
        out = invoke("measure", *args, "--preset", "tiny", "--db", db)
        assert out.exit_code == code, (case, out.output)
        assert sentence in " ".join(out.output.split()), (case, out.output)
        assert "Traceback" not in out.output
    assert not db.exists() or runs(db) == []


def test_measure_help_teaches_the_data_options(invoke):
    text = " ".join(invoke("measure", "--help").output.split())
    for words in (
        "--data DATA",
        "mmimdb",
        "save_to_disk",
        "image folder",
        "--fallback",
        "--seq-len",
        "--image-size PX",
    ):
        assert words in text


# --- the hub, asked once and briefly ------------------------------------------------------------------------


class SilentServer:
    """A TCP server that accepts connections and never answers: a hub behind a black hole. Counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections, self.held = 0, []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.held.append(conn)


def test_the_probe_gives_up_within_its_timeout_on_a_hub_that_never_answers(monkeypatch):
    server = SilentServer()
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    start = time.perf_counter()
    why = unreachable(timeout=0.5)
    assert time.perf_counter() - start < 2.0 and why is not None and server.url in why
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    assert unreachable(timeout=0.5) is not None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE" in unreachable()


@pytest.mark.slow
def test_with_the_hub_unreachable_and_no_offline_variables_measure_asks_once_and_starts_at_once(tmp_path):
    """The issue's stall: 23 s of retries before the first step. Now: one request, one line, then training
    on generated data (--fallback), recorded with the run; no cell touches the network."""
    server = SilentServer()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env |= {"HF_ENDPOINT": server.url, "ADVISOR_DB": str(tmp_path / "net.sqlite")}
    cmd = [
        sys.executable,
        "-m",
        "advisor",
        "measure",
        "--model",
        "llama",
        *TINY,
        "--data",
        "mmimdb",
        "--fallback",
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    said, first_epoch = None, None
    for line in proc.stderr:
        if said is None and "cannot be reached" in line:
            said = time.perf_counter() - start
        if first_epoch is None and "epoch 1/1" in line:
            first_epoch = time.perf_counter() - start
    assert proc.wait() == 0
    assert said is not None and first_epoch is not None
    assert server.connections == 1  # one probe; no retries, no cell asking again
    assert first_epoch - said < 30  # was 23 s of retries before a cell's first step (loose: shared machines)
    ((_, status, data, config),) = runs(tmp_path / "net.sqlite")
    assert data == "generated" and "hub unreachable" in config["data"]["note"] and config["data_note"]


def test_generated_data_keeps_the_cell_keys_of_runs_measured_before_data_existed():
    from dataclasses import replace

    from advisor.kb.identity import cell_key
    from advisor.measuring.recipe.config import RunConfig

    before = RunConfig(preset="tiny").resolved()
    after = replace(before, **resolve("generated").config_fields())
    assert cell_key(after.as_dict()) == cell_key(before.as_dict())


def test_the_same_data_at_another_path_or_after_a_fallback_is_the_same_cell(tmp_path):
    from dataclasses import replace

    from advisor.measuring.data.source import DataChoice
    from advisor.measuring.recipe.config import RunConfig

    first, second = tmp_path / "a" / "corpus.jsonl", tmp_path / "b" / "corpus.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        write_corpus(path)
    base = RunConfig(model="llama", preset="tiny").resolved()
    here, there = (replace(base, **resolve(str(p)).config_fields()) for p in (first, second))
    assert here.data_path != there.data_path and here.cell_key() == there.cell_key()
    fallback = DataChoice(
        "generated", None, "generated", "asked for mmimdb; hub unreachable: generated data instead"
    )
    assert replace(base, **fallback.config_fields()).cell_key() == base.cell_key()
    other = tmp_path / "c" / "corpus.jsonl"
    other.parent.mkdir()
    write_corpus(other, n=41)
    assert replace(base, **resolve(str(other)).config_fields()).cell_key() != here.cell_key()


# --- values checked before the grid: what the cells would fail on, refused; every form they read, passed ----


def table_of(**columns) -> Table:
    import datasets

    return Table(datasets.Dataset.from_dict(columns), "train", "t.jsonl")


def test_every_label_form_the_cells_read_passes_and_the_others_are_refused_with_their_example():
    for labels in (["b", "a"] * 5, [0, 3] * 5, [["x"], ["y", "z"]] * 5, [0.0, 1.0] * 5, [True, False] * 5):
        check_labels(table_of(label=labels), "label", list(range(10)))
    refused = {
        "negative": ([1, -1], "example 2 of t.jsonl has the label -1, an int, which is no class"),
        "a fraction": ([1.0, 0.5], "example 2 of t.jsonl has the label 0.5, a float"),
        "null": ([1, None], "example 2 of t.jsonl has no label"),
        "an empty list": ([["x"], []], "example 2 of t.jsonl has the label [], a list"),
        "records": ([{"a": 1}, {"a": 2}], "t.jsonl's label column holds records"),
    }
    for case, (labels, sentence) in refused.items():
        with pytest.raises(DataError, match=re.escape(sentence)):
            check_labels(table_of(label=labels), "label", [0, 1])
            pytest.fail(case)
    # a sample: the rows the cells read; one they never read cannot fail a cell
    check_labels(table_of(label=[1, None]), "label", [0])
    check_text(table_of(text=["a text", None]), "text", [0])
    with pytest.raises(DataError, match="example 2 of t.jsonl has no text"):
        check_text(table_of(text=["a text", None]), "text", [0, 1])


def test_the_images_decoded_are_those_the_cells_read_at_most_a_sample(tmp_path):
    import datasets

    parts = split_rows(50, 16)
    read = rows_read(50, 16, 8)
    assert set(read) == {int(i) for i in [*parts["test"], *parts["validation"], *parts["train"][:8]]}
    assert len(rows_read(100_000, 256, 10_000)) == SAMPLE_IMAGES
    folder = write_images(tmp_path / "pics")
    (folder / "cat" / "0.png").write_bytes(b"not an image")
    table = open_table(str(folder))
    paths = table.rows.cast_column("image", datasets.Image(decode=False))["image"]
    bad = next(i for i, image in enumerate(paths) if image["path"].endswith("cat/0.png"))
    check_images(table, "image", [i for i in range(20) if i != bad])  # a sample that misses it
    with pytest.raises(DataError, match="pics/cat/0.png is not an image Pillow can read"):
        check_images(table, "image", [bad])
