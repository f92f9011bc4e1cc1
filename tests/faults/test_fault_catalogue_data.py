"""The fault catalogue of `measure --data`: hostile files, folders and special files. Each is refused before
any cell starts, with exit code 2 and one sentence naming --data and the file, no traceback, no hang, and
nothing written to any KB. A case that passed the check would train a tiny model (`--epochs 1`), and the KB
would hold its run."""

import io
import json
import os
import sqlite3
import struct
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets")
Image = pytest.importorskip("PIL.Image")

TIMEOUT_S = 120  # the command in-process; one that reads /dev/zero or waits on a pipe never returns
TINY = ("--preset", "tiny", "--epochs", "1", "--optimizer", "sgd", "--strategy", "standard")


def png(seed: int = 0, size: int = 24) -> bytes:
    """A small valid PNG of noise."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype="uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def jpeg(seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype="uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def bomb_png(side: int = 100_000) -> bytes:
    """A 60-byte PNG whose header claims side × side pixels (10 gigapixels): a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


def image_folder(root: Path, bad: bytes | None = None, suffix: str = ".png", classes=("cat", "dog")) -> Path:
    """Ten good images per class subfolder, and one bad file (bytes) among the first class's."""
    good = jpeg if suffix == ".jpg" else png
    for k, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(10):
            (root / name / f"{i}{suffix}").write_bytes(good(100 * k + i))
    if bad is not None:
        (root / classes[0] / f"bad{suffix}").write_bytes(bad)
    return root


def jsonl(path: Path, values) -> Path:
    path.write_text("".join(json.dumps({"text": v}) + "\n" for v in values))
    return path


def symlink_loop(tmp: Path) -> Path:
    os.symlink(tmp / "b.jsonl", tmp / "a.jsonl")
    os.symlink(tmp / "a.jsonl", tmp / "b.jsonl")
    return tmp / "a.jsonl"


def fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "corpus.jsonl")  # nothing ever writes it: reading it would wait for ever
    return tmp / "corpus.jsonl"


def labelled_metadata(tmp: Path) -> Path:
    """An image folder whose metadata.jsonl gives each image a label; one label has a fraction."""
    folder = tmp / "scored"
    folder.mkdir()
    rows = []
    for i in range(20):
        (folder / f"{i}.png").write_bytes(png(i))
        rows.append({"file_name": f"{i}.png", "label": 0.5 if i == 7 else i % 2})
    (folder / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def empty_folder(tmp: Path) -> Path:
    (tmp / "nothing").mkdir()
    return tmp / "nothing"


def write(name: str, content: bytes):
    """A builder of a file of that name and content."""

    def build(tmp: Path) -> Path:
        (tmp / name).write_bytes(content)
        return tmp / name

    return build


GOOD_ROWS = [f"Document {i}: the cat sat on the mat." for i in range(30)]


def rows(path: Path, n: int, words: str = "row") -> Path:
    """A JSONL file of n texts."""
    path.write_text("".join(json.dumps({"text": f"{words} {i}"}) + "\n" for i in range(n)))
    return path


def card_folder(root: Path, data_files: str, before: bytes = b"", field: str = "data_files") -> Path:
    """A text folder whose dataset card points its data_files (or `field`) at `data_files`, the card's first
    bytes `before` its `---` (the corpus beside it kept); outside it, outside.jsonl and secret/ of 200 rows."""
    outside = rows(root / "outside.jsonl", 200, "secret row")
    (root / "secret").mkdir()
    rows(root / "secret" / "rows.jsonl", 200, "secret row")
    folder = root / "corpus"
    folder.mkdir()
    rows(folder / "train.jsonl", 40)
    pattern = data_files.format(outside=outside)
    card = f"---\nconfigs:\n- config_name: default\n  {field}: {pattern}\n---\n"
    (folder / "README.md").write_bytes(before + card.encode())
    return folder


def card_yaml_folder(root: Path) -> Path:
    """A text folder whose .huggingface.yaml (the card's YAML beside README.md) reads up and out."""
    folder = card_folder(root, "train.jsonl")
    (folder / ".huggingface.yaml").write_text(
        "configs:\n- config_name: default\n  data_files: ../outside.jsonl\n"
    )
    return folder


def linked_dir_folder(root: Path, card: str) -> Path:
    """A text folder holding `sub`, a link to the folder secret/ beside it, that its card reads through."""
    folder = card_folder(root, card.partition(": ")[2], field=card.partition(": ")[0])
    (folder / "sub").symlink_to(root / "secret", target_is_directory=True)
    return folder


def saved_folder(root: Path) -> Path:
    """A save_to_disk folder whose state.json names an Arrow file of another saved dataset beside it."""
    import datasets

    datasets.Dataset.from_dict({"text": [f"secret row {i}" for i in range(200)]}).save_to_disk(
        root / "secret"
    )
    datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(40)]}).save_to_disk(root / "corpus")
    state = json.loads((root / "corpus" / "state.json").read_text())
    state["_data_files"] = [{"filename": "../secret/data-00000-of-00001.arrow"}]
    (root / "corpus" / "state.json").write_text(json.dumps(state))
    return root / "corpus"


def linked_folder(root: Path) -> Path:
    folder = root / "corpus"
    folder.mkdir()
    (root / "elsewhere.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(40)))
    (folder / "train.jsonl").symlink_to(root / "elsewhere.jsonl")
    return folder


CASES = {
    # name: (model, builder(tmp) -> the --data path, words the sentence must hold)
    "a card reading an absolute path": (
        "llama",
        lambda t: card_folder(t, "{outside}"),
        "points its data_files at",
    ),
    "a card reading up and out": (
        "llama",
        lambda t: card_folder(t, "../outside.jsonl"),
        "outside the folder",
    ),
    "a card reading a URL": (
        "llama",
        lambda t: card_folder(t, "https://example.com/data.jsonl"),
        "outside the folder",
    ),
    "a card reading a split outside": (
        "llama",
        lambda t: card_folder(t, "\n  - split: train\n    path: ../outside.jsonl"),
        "outside the folder",
    ),
    # issue 48: a card datasets reads though ours did not, a data_dir, and the other path fields datasets honours
    "a card after a blank line": (
        "llama",
        lambda t: card_folder(t, "../outside.jsonl", before=b"\n"),
        "corpus/README.md's config 'default' points its data_files at '../outside.jsonl', outside the folder",
    ),
    "a card after a space": (
        "llama",
        lambda t: card_folder(t, "../outside.jsonl", before=b" "),
        "corpus/README.md's config 'default' points its data_files at '../outside.jsonl', outside the folder",
    ),
    "a card after a BOM": (
        "llama",
        lambda t: card_folder(t, "../outside.jsonl", before=b"\xef\xbb\xbf"),
        "corpus/README.md's config 'default' points its data_files at '../outside.jsonl', outside the folder",
    ),
    "a card's data_dir up and out": (
        "llama",
        lambda t: card_folder(t, "../secret", field="data_dir"),
        "corpus/README.md's config 'default' points its data_dir at '../secret', outside the folder",
    ),
    "a card's data_dir through a link": (
        "llama",
        lambda t: linked_dir_folder(t, "data_dir: sub"),
        "points its data_dir at 'sub', which links outside the folder",
    ),
    "a card's data_files through a linked folder": (
        "llama",
        lambda t: linked_dir_folder(t, "data_files: sub/*.jsonl"),
        "points its data_files at 'sub/*.jsonl', which links outside the folder",
    ),
    "a .huggingface.yaml reading up and out": (
        "llama",
        card_yaml_folder,
        "corpus/.huggingface.yaml's config 'default' points its data_files at '../outside.jsonl'",
    ),
    "a save_to_disk state reading up and out": (
        "llama",
        saved_folder,
        "corpus/state.json points its _data_files at '../secret/data-00000-of-00001.arrow', outside the folder",
    ),
    "a card datasets cannot read": (
        "llama",
        lambda t: card_folder(t, "\n    train: ../outside.jsonl"),
        "corpus/README.md is not a dataset card datasets can read (ValueError: Expected data_files in YAML",
    ),
    "a file linked from outside": ("llama", linked_folder, "links to a file outside the folder"),
    "not an image": (
        "vit",
        lambda t: image_folder(t / "pics", b"<html>not an image</html>"),
        "pics/cat/bad.png is not an image Pillow can read",
    ),
    "truncated PNG": (
        "vit",
        lambda t: image_folder(t / "pics", png(size=64)[:200]),
        "cannot decode the image pics/cat/bad.png (OSError: Truncated File Read)",
    ),
    "truncated JPEG": (
        "vit",
        lambda t: image_folder(t / "pics", jpeg()[:300], suffix=".jpg"),
        "cannot decode the image pics/cat/bad.jpg",
    ),
    "decompression bomb": (
        "vit",
        lambda t: image_folder(t / "pics", bomb_png()),
        "claims 10,000,000,000 pixels",
    ),
    "zero-byte image": (
        "vit",
        lambda t: image_folder(t / "pics", b""),
        "the image pics/cat/bad.png is empty (0 bytes)",
    ),
    "image folder of one class": (
        "vit",
        lambda t: image_folder(t / "pics", classes=("cat",)),
        "pics has images and no labels: an image folder's labels are its class subfolders",
    ),
    "label with a fraction": (
        "vit",
        labelled_metadata,
        "example 8 of scored has the label 0.5, a float, which is no class",
    ),
    "mixed types in the text column": (
        "llama",
        lambda t: jsonl(t / "mixed.jsonl", GOOD_ROWS[:20] + [1, None, [1, 2], 2.5] * 3),
        "mixed.jsonl's text column holds values of several types, not text (example 21: 1, an int)",
    ),
    "numbers for text": ("llama", lambda t: jsonl(t / "n.jsonl", list(range(30))), "n.jsonl's text column"),
    "empty file": ("llama", write("corpus.jsonl", b""), "corpus.jsonl is empty"),
    "empty folder": ("llama", empty_folder, "nothing holds no files"),
    "/dev/zero": (
        "llama",
        lambda t: Path("/dev/zero"),
        "/dev/zero is a character device, not a regular file",
    ),
    "a FIFO": ("llama", fifo, "corpus.jsonl is a named pipe (FIFO)"),
    "a symlink loop": ("llama", symlink_loop, "a.jsonl is a loop of symbolic links"),
    "a dangling symlink": (
        "llama",
        lambda t: (os.symlink(t / "gone.jsonl", t / "link.jsonl"), t / "link.jsonl")[1],
        "link.jsonl is a link to",
    ),
    "binary garbage as .txt": (
        "llama",
        write("corpus.txt", np.random.default_rng(0).integers(0, 256, 100_000, dtype="uint8").tobytes()),
        "cannot read corpus.txt as a dataset (UnicodeDecodeError",
    ),
    "Latin-1 text": (
        "llama",
        write("corpus.txt", "Un café très élégant à Paris.\n".encode("latin-1") * 40),
        "cannot read corpus.txt as a dataset (UnicodeDecodeError",
    ),
    "Latin-1 JSONL": (
        "llama",
        write("corpus.jsonl", '{"text": "Un café à Paris"}\n'.encode("latin-1") * 40),
        "example 1 of corpus.jsonl is not UTF-8 text",
    ),
    "CSV with a missing text": (
        "llama",
        write("rows.csv", ("text,label\n" + "".join(f"row {i},1\n" for i in range(19)) + ",0\n").encode()),
        "example 20 of rows.csv has no text",
    ),
    "CSV of image paths": (
        "vit",
        write("images.csv", ("image,label\n" + "".join(f"img{i}.png,{i % 2}\n" for i in range(30))).encode()),
        "images.csv's image column holds text, not images",
    ),
    "JSONL with an invalid line": (
        "llama",
        write("corpus.jsonl", b'{"text": "a row"}\n' * 20 + b"not json at all\n" + b'{"text": "x"}\n' * 20),
        "cannot read corpus.jsonl as a dataset",
    ),
    "a huge line": ("llama", write("huge.txt", b"word " * 3_000_000), "huge.txt has 1 examples, too few"),
}


def in_time(invoke, *args):
    """invoke(*args) in a thread given TIMEOUT_S: a command that hangs fails the test instead of the suite."""
    out: dict = {}
    worker = threading.Thread(target=lambda: out.setdefault("result", invoke(*args)), daemon=True)
    worker.start()
    worker.join(TIMEOUT_S)
    assert not worker.is_alive(), f"measure {' '.join(map(str, args))} did not end within {TIMEOUT_S} s"
    return out["result"]


def digest(path: Path) -> bytes:
    return path.read_bytes() if path.is_file() else b""


@pytest.mark.parametrize("case", CASES)
def test_hostile_data_is_refused_before_any_cell(invoke, tmp_path, kb_path, case):
    model, build, words = CASES[case]
    (tmp_path / "data").mkdir()
    data, db, before = build(tmp_path / "data"), tmp_path / "mine.sqlite", digest(kb_path)
    result = in_time(invoke, "measure", "--model", model, *TINY, "--data", data, "--db", db)
    said = result.output.strip().splitlines()[-1]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert said.startswith("Error: Invalid value for '--data': ") and said.endswith("."), said
    assert words in said, said
    assert not db.exists() or sqlite3.connect(db).execute("SELECT count(*) FROM runs").fetchone() == (0,)
    assert digest(kb_path) == before


def test_the_catalogue_holds_sixteen_kinds_of_hostile_data():
    assert len(CASES) >= 16


def test_the_identity_changes_with_every_file_a_card_reads(tmp_path):
    """Issue 48: the data's identity hashes what datasets reads by name, hidden files too (a .huggingface.yaml,
    a hidden data file the card names), so that a change to any of them is a different dataset."""
    from advisor.measuring.data.source import resolve

    folder = card_folder(tmp_path, "\n  - train.jsonl\n  - .extra/rows.jsonl")
    (folder / ".extra").mkdir()
    rows(folder / ".extra" / "rows.jsonl", 40, "extra row")
    seen = [resolve(str(folder)).identity]
    rows(folder / ".extra" / "rows.jsonl", 40, "changed row")
    seen.append(resolve(str(folder)).identity)
    (folder / ".huggingface.yaml").write_text("pretty_name: corpus\n")
    seen.append(resolve(str(folder)).identity)
    assert len(set(seen)) == 3, seen


def test_a_folder_that_reads_no_hidden_file_keeps_its_identity(tmp_path):
    """Runs already measured on a folder keep their data identity (a re-run skips them): its files' relative
    paths and bytes, in name order, as before."""
    import hashlib

    from advisor.measuring.data.source import resolve

    folder = card_folder(tmp_path, "train.jsonl")
    digest = hashlib.sha256()
    for name in ("README.md", "train.jsonl"):
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    assert resolve(str(folder)).identity == f"corpus sha256:{digest.hexdigest()[:12]}"
