"""The data a grid trains on (`--data`), resolved once per `advisor measure`, in its own process, before
the grid starts; then every cell reads local files only.

- `generated`: the default, offline and deterministic corpus of `advisor.measuring.data.corpus`.
- `mmimdb`: the paper's MM-IMDb, pinned to the commit the paper cites, through the Hugging Face cache.
- a Hugging Face dataset id (`owner/name`, or `owner/name@revision`), pinned to the commit it resolves to.
- a local path: a JSONL, JSON, CSV, Parquet or text file, a folder of them, a folder written by
  `save_to_disk`, or an image folder (class subfolders, or a metadata.jsonl with captions).

Hub data is downloaded here, once, its size stated before it starts. Whether the hub can be reached is
asked once, with one short request (about a second, no retries); when it cannot, the data comes from the
local cache if it is there, else the command stops or falls back to the generated corpus, as the user
chose, in one line, and every run records it. Each run records what it trained on: the data's identity (a
revision or a content hash) is part of its evidence group, so runs on different data are never ranked
together.
"""

from __future__ import annotations

import errno
import hashlib
import io
import itertools
import os
import re
import stat
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advisor.errors import Error
from advisor.measuring.data.corpus import encoded
from advisor.measuring.data.folder import DataError, files_read, is_saved
from advisor.measuring.model.builder import sized_reference, sized_user_config
from advisor.measuring.model.families import family_of
from advisor.measuring.model.families.base import ROLE_COLUMNS, Sizes
from advisor.measuring.recipe.config import GridCell
from advisor.rules import Rules

GENERATED, MMIMDB = "generated", "mmimdb"
MMIMDB_REPO = "pranavmr/MM-IMDb"
MMIMDB_REVISION = "ad5b99488129e67641e4044e4a3c947af61a3c5b"  # the commit the paper cites (its ref. 21)
PROBE_TIMEOUT_S = 1.0  # one request; DNS included (a machine without network may take 20 s to say so)
DEFAULT_ENDPOINT = "https://huggingface.co"
SPLIT_SEED = 20_260_805  # the fixed order that splits a dataset into held-out and training rows
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class HubUnreachable(Error):
    """The Hugging Face hub cannot give the data asked for: the machine's network, not the user's argument."""


@dataclass(frozen=True)
class DataChoice:
    """What --data resolved to: what the cells read, and the identity runs record and are grouped by."""

    data: str  # as asked: generated, mmimdb, owner/name[@revision], or the absolute path
    path: str | None  # the local file or folder the cells read (None: the generated corpus)
    identity: str  # 'generated', 'pranavmr/MM-IMDb@ad5b994', 'corpus.jsonl sha256:1a2b3c4d5e6f'
    # what happened on the way (a fallback, the cache used offline): the same words every time, since the
    # cell key hashes it (the reason, which varies, is said once on the terminal)
    note: str | None = None

    def config_fields(self) -> dict:
        """The RunConfig fields that carry this choice into every cell. The generated corpus leaves data_id at
        its default (None), so that its cells keep the keys they had before --data: a re-run skips them."""
        identity = None if self.identity == GENERATED else self.identity
        return dict(data=self.data, data_path=self.path, data_id=identity, data_note=self.note)


def resolve(spec: str, fallback: bool = False, say: Callable[[str], None] = lambda line: None) -> DataChoice:
    """The data --data names, ready for the cells: hub data downloaded (or found in the cache), a local
    path checked and hashed. Raises DataError with a sentence to act on."""
    spec = (spec or GENERATED).strip()
    if spec == GENERATED:
        return DataChoice(GENERATED, None, GENERATED)
    if spec == MMIMDB:
        return _from_hub(MMIMDB_REPO, MMIMDB_REVISION, spec, fallback, say)
    path = Path(spec).expanduser()
    _refuse_special(path)
    if path.exists():
        return _local(path)
    if HUB_ID.match(spec) and path.suffix.lower() not in FILE_BUILDERS:
        repo, _, revision = spec.partition("@")
        return _from_hub(repo, revision or None, spec, fallback, say)
    raise DataError(
        f"no file or folder at {spec}, and it is not a Hugging Face dataset id (owner/name): pass "
        "generated, mmimdb, a dataset id, or the path of a JSONL, CSV, Parquet file or a dataset folder."
    )


# --- the hub --------------------------------------------------------------------------------------------


def endpoint() -> str:
    """The hub's address as huggingface_hub reads it ($HF_ENDPOINT), read now, not at import."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_by_env() -> bool:
    """Whether the user told the Hugging Face libraries to stay offline."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def unreachable(timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be reached, or None when it answers one request within `timeout` seconds. Any
    HTTP answer counts; the request runs in a thread so that a DNS lookup that hangs cannot hold us."""
    if offline_by_env():
        return "HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set"
    outcome: dict[str, str | None] = {}

    def ask() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint(), method="HEAD"), timeout=timeout).close()
            outcome["why"] = None
        except urllib.error.HTTPError:
            outcome["why"] = None  # it answered
        except Exception as e:  # noqa: BLE001  no route, no DNS, refused, TLS: unreachable all the same
            outcome["why"] = f"{endpoint()}: {getattr(e, 'reason', e)}"

    probe = threading.Thread(target=ask, name="advisor-hub-probe", daemon=True)
    probe.start()
    probe.join(timeout)
    return outcome.get("why", f"{endpoint()} did not answer within {timeout:g} s")


def _from_hub(repo: str, revision: str | None, asked: str, fallback: bool, say) -> DataChoice:
    """A hub dataset as a local snapshot: downloaded at a pinned commit when the hub answers, else from the
    local cache, else the generated corpus (fallback) or a DataError."""
    why = unreachable()
    if why is None:
        folder = _download(repo, revision, asked, say)
        return DataChoice(asked, folder, f"{repo}@{Path(folder).name[:7]}")
    folder = _cached(repo, revision or "main")
    if folder is not None:
        say(f"The Hugging Face hub cannot be reached ({why}): {repo} from the local cache.")
        return DataChoice(
            asked, folder, f"{repo}@{Path(folder).name[:7]}", "hub unreachable: the local cache's copy"
        )
    if not fallback:
        raise HubUnreachable(
            f"the Hugging Face hub cannot be reached ({why}) and {repo} is not in the local cache: connect, "
            "pass --fallback to measure on generated data instead, or --data with a local copy."
        )
    say(f"The Hugging Face hub cannot be reached ({why}): measuring on generated data instead (recorded).")
    return DataChoice(
        GENERATED, None, GENERATED, f"asked for {asked}; hub unreachable: generated data instead"
    )


def _download(repo: str, revision: str | None, asked: str, say) -> str:
    """The dataset's snapshot at its pinned commit, its size said before any download starts."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        info = HfApi(endpoint=endpoint()).dataset_info(repo, revision=revision, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise DataError(
            f"the hub has no dataset {repo}" + (f" at revision {revision}" if revision else "") + " that you "
            "can read (a private or gated one needs `hf auth login`): check the id."
        ) from e
    except HfHubHTTPError as e:
        raise HubUnreachable(f"the hub refused {repo}: {e}") from e
    cached = _cached(repo, info.sha)
    size = sum(s.size or 0 for s in info.siblings or [])
    where = (
        "in the local cache"
        if cached
        else f"{size / 1e9:.2f} GB to download once into the Hugging Face cache"
    )
    say(f"{asked}: {repo} at commit {info.sha[:7]}, {where}.")
    return cached or snapshot_download(repo, repo_type="dataset", revision=info.sha, endpoint=endpoint())


def _cached(repo: str, revision: str) -> str | None:
    """The dataset's snapshot in the local Hugging Face cache at that revision, or None; never the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None


# --- local files ----------------------------------------------------------------------------------------

SPECIAL_FILES = {
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a named pipe (FIFO)",
    stat.S_ISSOCK: "a socket",
}


def _refuse_special(path: Path) -> None:
    """Refuse a path that is there but is no regular file or folder (a device such as /dev/zero, a pipe, a
    socket), or a symbolic link that leads nowhere: reading one would never end, or fail deep inside."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        if path.is_symlink():
            where = "a loop of symbolic links" if e.errno == errno.ELOOP else f"a link to {os.readlink(path)}"
            raise DataError(
                f"{path} is {where}, which leads to no file: pass the data file or folder itself."
            ) from e
        return  # not there: resolve says what it takes
    kind = next((what for test, what in SPECIAL_FILES.items() if test(mode)), None)
    if kind is not None:
        raise DataError(
            f"{path} is {kind}, not a regular file or folder: pass a data file or a folder of them."
        )


def _local(path: Path) -> DataChoice:
    """A local file or folder: checked to be a format we read, and named by its content's hash."""
    path = path.resolve()
    if path.is_file() and path.suffix.lower() not in FILE_BUILDERS:
        raise DataError(
            f"cannot read {path.name}: {path.suffix or 'no extension'} is not a format measure reads. Use JSONL, "
            "JSON, CSV, Parquet or text files, a save_to_disk folder, or an image folder."
        )
    named = set()
    if path.is_dir():
        _one_kind(path)
        named = _inside(path)
    try:
        digest = content_hash(path, named)
    except OSError as e:  # unreadable: permissions, a file removed meanwhile
        raise DataError(
            f"cannot read {e.filename or path} ({e.strerror or e}): check the path and its permissions."
        ) from e
    return DataChoice(str(path), str(path), f"{path.name} sha256:{digest[:12]}")


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
METADATA = {"metadata.jsonl", "metadata.csv", "metadata.parquet"}  # an image folder's captions or labels


def _one_kind(folder: Path) -> None:
    """Refuse a folder of several kinds of data (JSONL beside CSV, files beside images): datasets would read
    one kind and silently leave out the others."""
    kinds = set()
    for f in _data_files(folder):
        suffix = f.suffix.lower()
        if f.name not in METADATA and (suffix in IMAGE_SUFFIXES or suffix in FILE_BUILDERS):
            kinds.add("images" if suffix in IMAGE_SUFFIXES else FILE_BUILDERS[suffix])
    if len(kinds) > 1:
        raise DataError(
            f"{folder.name} mixes {', '.join(sorted(kinds))} files: only one kind would be read. Put one kind "
            "in a folder (an image folder may add a metadata.jsonl), or pass one file."
        )


def _inside(folder: Path) -> set[Path]:
    """Refuse a folder that reads data from outside it: a file linked from elsewhere, or a path its dataset
    card (or a save_to_disk folder's JSON) names that leads out (`advisor.measuring.data.folder`). Returns the
    files datasets reads by name, hidden ones included: the run's identity hashes them with the folder's own."""
    for f in _data_files(folder):
        if not f.resolve().is_relative_to(folder):
            raise DataError(
                f"{folder.name}/{f.relative_to(folder)} links to a file outside the folder: copy the data in, so "
                "that what the runs train on is what they record."
            )
    return files_read(folder)


def content_hash(path: Path, named: set[Path] = frozenset()) -> str:
    """sha256 of a file's bytes, or of a folder's files and those read by name (`named`: a card, hidden files it
    names), relative paths and bytes in name order. A folder without hidden files read keeps its old hash."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted({*_data_files(path), *named})
    for f in files:
        if path.is_dir():
            digest.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _data_files(folder: Path) -> list[Path]:
    """A folder's files, hidden ones (a .cache, .git) left out."""
    return [
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(s.startswith(".") for s in p.relative_to(folder).parts)
    ]


@dataclass
class Table:
    """A dataset read from local files: its rows, the split they came from, and the columns it has."""

    rows: object  # a datasets.Dataset
    split: str
    name: str  # the file or folder, for messages

    @property
    def columns(self) -> list[str]:
        return list(self.rows.column_names)


def open_table(path: str) -> Table:
    """The dataset at a local path (a hub snapshot too) through `datasets`: load_from_disk for a
    save_to_disk folder, the file's builder for a file, and datasets' own inference for a folder (parquet,
    JSON, CSV, text, imagefolder). Its train split, or its first."""
    import datasets

    datasets.disable_progress_bars()
    where = Path(path)
    if where.is_file() and where.stat().st_size == 0:
        raise DataError(f"{where.name} is empty: pass a file with your examples, one per row.")
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # a malformed file is said once: our sentence
    try:
        loaded = _load(where)
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001  datasets' own errors: mixed formats, malformed rows
        cause = _root(e)  # datasets wraps a malformed row's error in a generic one
        raise DataError(
            f"cannot read {where.name} as a dataset ({type(cause).__name__}: {_first_line(cause)}): check that it is "
            "valid JSONL, CSV, Parquet or text, one example per row (an image folder: images in class "
            "subfolders, or a metadata.jsonl naming each file_name)."
        ) from e
    finally:
        datasets.logging.set_verbosity(verbosity)
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        return Table(loaded[split], split, where.name)
    return Table(loaded, "train", where.name)


def _load(where: Path):
    import datasets

    if where.is_file():
        return datasets.load_dataset(FILE_BUILDERS[where.suffix.lower()], data_files=str(where))
    if is_saved(where):
        return datasets.load_from_disk(str(where))
    if not _data_files(where):
        raise DataError(f"the folder {where.name} holds no files: pass a folder with your data files.")
    return datasets.load_dataset(str(where))


def role_columns(table: Table, family) -> dict[str, str]:
    """The column that plays each role the family reads (text; image + label; image + caption), by the
    common names of ROLE_COLUMNS; DataError naming the columns found and the ones needed."""
    found, missing = {}, []
    for role in family.roles:
        column = next((c for c in ROLE_COLUMNS[role] if c in table.columns and c not in found.values()), None)
        if column is None:
            missing.append(role)
        else:
            found[role] = column
    if missing:
        needed = "; ".join(f"{role}: one of {', '.join(ROLE_COLUMNS[role])}" for role in missing)
        if missing == ["label"] and table.columns == [found["image"]]:  # datasets gives one class no label
            raise DataError(
                f"{table.name} has images and no labels: an image folder's labels are its class subfolders, and "
                "a classifier needs two at least; add a subfolder per class, or choose another --data."
            )
        raise DataError(
            f"{table.name} has columns {', '.join(table.columns) or '(none)'}; the {family.name} family "
            f"({family.task}) needs {' and '.join(family.roles)} columns ({needed}). Rename a column, or "
            "choose another --data."
        )
    return found


def family_rows(table: Table, family):
    """(rows, classes): the table's rows as the family's role columns, labels as class indices 0..k-1
    (classes: k, or None for a family without labels)."""
    columns = role_columns(table, family)
    rows = table.rows.select_columns(list(columns.values()))
    classes = None
    if "label" in columns:
        indices, classes = class_indices(rows, columns["label"])
        rows = rows.remove_columns(columns.pop("label")).add_column("label", indices)
    return rows.rename_columns({c: role for role, c in columns.items() if c != role}), classes


def class_indices(rows, column: str) -> tuple[list[int], int]:
    """A label column as class indices and their count: a ClassLabel's own, integers as they are, names
    (a list's first, for multi-label data such as MM-IMDb's genres) in sorted order."""
    feature = rows.features[column]
    if hasattr(feature, "names"):
        return list(rows[column]), len(feature.names)
    values = [v[0] if isinstance(v, list) and v else v for v in rows[column]]
    if all(isinstance(v, int | np.integer) for v in values):
        return [int(v) for v in values], max(values, default=0) + 1
    names = sorted({str(v) for v in values})
    index = {name: i for i, name in enumerate(names)}
    return [index[str(v)] for v in values], len(names)


# --- held-out and training rows ----------------------------------------------------------------------------


def heldout_size(n_rows: int, wanted: int) -> int:
    """Examples per held-out set: the preset's, at most a fifth of the data each."""
    return min(wanted, n_rows // 5)


def split_rows(n_rows: int, wanted_heldout: int) -> dict[str, np.ndarray]:
    """Row indices of the test set, the validation set and the training pool: a fixed shuffle (the same for
    every run, seed and configuration, and independent of the file's order: an image folder is sorted by
    class), then test, validation, the rest. The three are disjoint."""
    order = np.random.default_rng(SPLIT_SEED).permutation(n_rows)
    e = heldout_size(n_rows, wanted_heldout)
    return {"test": order[:e], "validation": order[e : 2 * e], "train": order[2 * e :]}


def usable(n_rows: int, wanted_heldout: int, batch_size: int) -> bool:
    """Whether n_rows leave two held-out sets and a training batch."""
    return (
        heldout_size(n_rows, wanted_heldout) > 0
        and n_rows - 2 * heldout_size(n_rows, wanted_heldout) >= batch_size
    )


def check_rows(name: str, n_rows: int, wanted_heldout: int, batch_size: int) -> None:
    """Refuse a dataset too small to hold out examples and still train on a batch."""
    if n_rows == 0:
        raise DataError(f"{name} holds no examples: pass a dataset with some.")
    if not usable(n_rows, wanted_heldout, batch_size):
        least = next(n for n in itertools.count(5) if usable(n, wanted_heldout, batch_size))
        raise DataError(
            f"{name} has {n_rows} examples, too few to hold out two test sets and train on a batch of "
            f"{batch_size}: add examples (at least {least}), or lower --batch-size."
        )


@dataclass
class DataView:
    """A dataset as one cell reads it: the family's role columns, its classes, and its fixed split into a
    test set, a validation set and the training pool."""

    rows: object  # a datasets.Dataset of role columns
    classes: int | None
    split: str  # the dataset's split the rows came from ('train')
    parts: dict[str, np.ndarray]

    def training(self, family, shape, n: int, seed: int):
        """The first n examples of the training pool, encoded, shuffled by the seed."""
        rows = self.rows.select(self.parts["train"][:n])
        return encoded(rows, family, shape).shuffle(seed=seed)

    def heldout(self, family, shape, split: str):
        """The test or validation set, encoded, in its fixed order."""
        return encoded(self.rows.select(self.parts[split]), family, shape)

    def counts(self, n_train: int) -> dict[str, int]:
        """How many examples each part holds, as a run records them."""
        return {
            "total": len(self.rows),
            "train": min(n_train, len(self.parts["train"])),
            "test": len(self.parts["test"]),
            "validation": len(self.parts["validation"]),
        }


def open_view(path: str, family, wanted_heldout: int) -> DataView:
    """The dataset at a resolved local path as the family reads it, split for held-out evaluation."""
    table = open_table(path)
    rows, classes = family_rows(table, family)
    return DataView(rows, classes, table.split, split_rows(len(rows), wanted_heldout))


def _root(e: BaseException) -> BaseException:
    """The innermost cause of an exception chain."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


# --- the whole grid, checked before any cell starts ----------------------------------------------------


def check_cells(cells: list[GridCell], rules: Rules) -> None:
    """Refuse (DataError), before any cell starts, data or sizes that a model of the grid cannot train on:
    a missing column, values of the wrong type, images that do not decode, too few examples or classes, a
    sequence or image size the model cannot take."""
    tables, widest, decoded = {}, {}, set()
    for cell in cells:  # the configurations that read differently, each with the most examples it trains on
        cfg = cell.resolved
        key = (cfg.model, cfg.preset, cfg.batch_size, cfg.eval_examples, cfg.seq_len, cfg.image_size)
        if key not in widest or cfg.train_examples > widest[key][1].train_examples:
            widest[key] = (cell.model, cfg)
    for model, cfg in widest.values():
        fam = family_of(model, rules)
        classes = None
        if cfg.data_path is not None:
            if cfg.data_path not in tables:  # read once for the whole grid
                tables[cfg.data_path] = open_table(cfg.data_path)
            table = tables[cfg.data_path]
            read = rows_read(len(table.rows), cfg.eval_examples, cfg.train_examples)
            check_values(table, role_columns(table, fam), read, decoded)
            rows, classes = family_rows(table, fam)
            check_rows(table.name, len(rows), cfg.eval_examples, cfg.batch_size)
            check_classes(table.name, classes)
        if cfg.data_path is not None or cfg.seq_len or cfg.image_size:  # else: the preset as it is
            check_sizes(GridCell(cfg, model), fam, classes, rules)


def check_sizes(cell: GridCell, fam, classes: int | None, rules: Rules) -> None:
    """Whether the model can be built to --seq-len, --image-size and the data's classes (configs only)."""
    cfg = cell.config
    sizes = Sizes(seq_len=cfg.seq_len, image_size=cfg.image_size, num_labels=classes)
    try:
        if cell.model.reference:
            sized_reference(fam, cfg.preset, sizes, rules)
        else:
            sized_user_config(cell.model, sizes, rules)
    except ValueError as e:
        flag = next((f for f in ("--seq-len", "--image-size", "tokenizer") if f in str(e)), "--data")
        raise DataError(f"{cfg.model}: {e}.", param="--model" if flag == "tokenizer" else flag) from e


# --- the values, checked before any cell reads them ---------------------------------------------------------

SAMPLE_IMAGES = 256  # images decoded before the grid: every one the cells read, at most this many
TEXT_TYPES = ("string", "large_string")


def rows_read(n_rows: int, wanted_heldout: int, train_examples: int) -> list[int]:
    """The rows the cells read (both held-out sets and the training examples), at most SAMPLE_IMAGES of them
    spread evenly: the sample whose images are decoded before the grid."""
    parts = split_rows(n_rows, wanted_heldout)
    read = np.unique(np.concatenate([parts["test"], parts["validation"], parts["train"][:train_examples]]))
    if len(read) > SAMPLE_IMAGES:
        read = read[np.linspace(0, len(read) - 1, SAMPLE_IMAGES).astype(int)]
    return [int(i) for i in read]


def check_values(table: Table, columns: dict[str, str], read: list[int], decoded: set) -> None:
    """Refuse, with the example and the file, values the family cannot read: a column of the wrong type
    (its schema), and among the rows the cells read, text that is not text (null, bytes that are not UTF-8),
    labels that are no class, images that do not decode. A row no cell reads cannot fail one."""
    for role, column in columns.items():
        if role in ("text", "caption"):
            check_text(table, column, read)
        elif role == "label":
            check_labels(table, column, read)
        elif role == "image":
            check_images(table, column, [i for i in read if (table.name, column, i) not in decoded])
            decoded.update((table.name, column, i) for i in read)


def check_text(table: Table, column: str, read: list[int]) -> None:
    """A text column holds strings (its type: no number, list or mixture), and those the cells read are
    there and valid UTF-8 (a JSONL file in Latin-1 reads, then fails when a cell decodes it)."""
    feature = table.rows.features[column]
    if getattr(feature, "dtype", None) not in TEXT_TYPES:
        row, value = _first_not(
            table, column, range(min(len(table.rows), SCAN_ROWS)), lambda v: isinstance(v, str)
        )
        raise DataError(
            f"{table.name}'s {column} column holds {_kind(feature)}, not text"
            + (f" (example {row + 1}: {_shown(value)})" if row is not None else "")
            + ": make every value a string (a number or a list in quotes), or choose another --data."
        )
    values = _arrow(table, column, read)
    _refuse_nulls(table, values, read, "text")
    row = _first_not_utf8(values, read)
    if row is not None:
        raise DataError(
            f"example {row + 1} of {table.name} is not UTF-8 text (another encoding, such as Latin-1): save the "
            "file as UTF-8."
        )


def _first_not_utf8(values, read: list[int]) -> int | None:
    """The row of the first string whose bytes are not UTF-8 (pyarrow's JSON reader does not check them, and a
    cell would fail decoding it), or None; each chunk validated in C, a bad chunk's values looked at in turn."""
    import pyarrow as pa

    offset = 0
    for chunk in values.chunks:
        try:
            chunk.validate(full=True)
        except pa.ArrowInvalid:
            for i, raw in enumerate(chunk.cast(pa.large_binary()).to_pylist()):
                try:
                    raw is None or raw.decode("utf-8")
                except UnicodeDecodeError:
                    return read[offset + i]
        offset += len(chunk)
    return None


def _arrow(table: Table, column: str, read: list[int]):
    """The column's values at the rows read, as Arrow holds them (a ChunkedArray, in the order of `read`)."""
    return table.rows.select(read).with_format("arrow")[:].column(column)


def check_labels(table: Table, column: str, read: list[int]) -> None:
    """A label column holds classes (its type: names, integers or lists of them, no mixture), and each label
    the cells read is one: a name, a non-negative integer, or a list whose first is one (MM-IMDb's genres);
    no null (a CSV's empty cell), no fraction."""
    feature = table.rows.features[column]
    inner = getattr(feature, "feature", feature)  # a list's elements
    kind = str(getattr(inner, "dtype", ""))
    if not (
        hasattr(inner, "names") or kind in TEXT_TYPES or kind.startswith(("int", "uint", "bool", "float"))
    ):
        raise DataError(
            f"{table.name}'s {column} column holds {_kind(feature)}: a label must be a class name or an "
            "integer from 0; make every label one, or choose another --data."
        )
    _refuse_nulls(table, _arrow(table, column, read), read, "label")
    row, value = _first_not(table, column, read, _a_class)
    if row is not None:
        raise DataError(
            f"example {row + 1} of {table.name} has the label {_shown(value)}, which is no class: a label must be a "
            "class name or an integer from 0 (not negative, no fraction)."
        )


def _a_class(value) -> bool:
    value = value[0] if isinstance(value, list) and value else value
    if isinstance(value, float):
        return value.is_integer() and value >= 0
    if isinstance(value, int | np.integer):
        return value >= 0
    return isinstance(value, str)


def check_classes(name: str, classes: int | None) -> None:
    """Refuse labels of a single class: a classifier has nothing to tell apart, and its loss is zero."""
    if classes is not None and classes < 2:
        raise DataError(
            f"{name} has a single class: a classifier needs examples of two classes at least (an image "
            "folder: a second class subfolder)."
        )


def check_images(table: Table, column: str, read: list[int]) -> None:
    """The images of the rows the cells read decode as the cells will decode them, within the pixel limit
    that guards against decompression bombs: a header read (verify), then every pixel (load)."""
    import datasets

    feature = table.rows.features[column]
    if not isinstance(feature, datasets.Image):
        row, value = _first_not(
            table, column, range(min(len(table.rows), SCAN_ROWS)), lambda v: hasattr(v, "convert")
        )
        raise DataError(
            f"{table.name}'s {column} column holds {_kind(feature)}, not images"
            + (f" (example {row + 1}: {_shown(value)})" if row is not None else "")
            + ": pass an image folder, or a dataset whose image column holds images."
        )
    if not read:
        return
    raw = table.rows.select(read).cast_column(column, datasets.Image(decode=False))
    for row, value in zip(read, raw[column], strict=True):
        _check_image(value or {}, f"example {row + 1} of {table.name}")


def _check_image(value: dict, where: str) -> None:
    """One image (datasets' {bytes, path}) opened, verified and loaded; DataError naming its file or row."""
    from PIL import Image

    path = value.get("path")
    shown = _image_name(path) if path else where
    if value.get("bytes") is None and not (path and Path(path).is_file()):
        raise DataError(f"the image {shown} is not there: restore it or remove its row.")
    data = value.get("bytes")
    if data == b"" or (data is None and Path(path).stat().st_size == 0):
        raise DataError(f"the image {shown} is empty (0 bytes): replace it or remove it.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # over the limit: refused
            for step in ("verify", "load"):
                with Image.open(io.BytesIO(data) if data is not None else path) as img:
                    getattr(img, step)()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        pixels = re.search(r"\((\d+) pixels\)", str(e))
        size = f"{int(pixels.group(1)):,} pixels" if pixels else "too many pixels"
        raise DataError(
            f"the image {shown} claims {size}, over the limit of {Image.MAX_IMAGE_PIXELS:,} that guards against "
            "decompression bombs: shrink it or remove it."
        ) from e
    except Image.UnidentifiedImageError as e:
        raise DataError(f"{shown} is not an image Pillow can read: replace it or remove it.") from e
    except Exception as e:  # noqa: BLE001  PIL's errors: truncated, corrupt
        raise DataError(
            f"cannot decode the image {shown} ({type(e).__name__}: {_first_line(e)}): replace it or remove it."
        ) from e


def _image_name(path: str) -> str:
    """An image's file as a person finds it: its folder (the class) and its name."""
    return str(Path(*Path(path).parts[-3:]))


def _refuse_nulls(table: Table, values, read: list[int], what: str) -> None:
    """Refuse a null (a CSV's empty cell, a JSON null) among the values read of a column every example needs."""
    import pyarrow.compute as pc

    if values.null_count:
        row = read[pc.index(pc.is_null(values), True).as_py()]
        raise DataError(
            f"example {row + 1} of {table.name} has no {what} (an empty cell or a null): fill it in or remove "
            "the example."
        )


SCAN_ROWS = 10_000  # values looked at for an example of a column of the wrong type


def _first_not(table: Table, column: str, rows, ok) -> tuple[int | None, object]:
    """(row, value) of the first value among `rows` that `ok` refuses; (None, None) if none."""
    rows = list(rows)
    values = table.rows.select(rows).select_columns([column]).with_format(None)[column]
    return next(
        ((row, value) for row, value in zip(rows, values, strict=True) if not ok(value)), (None, None)
    )


def _kind(feature) -> str:
    """What a datasets feature holds, in words."""
    name = type(feature).__name__
    if name == "Json":
        return "values of several types"
    if hasattr(feature, "dtype"):
        kind = str(feature.dtype)
        words = {
            "string": "text",
            "int": "integers",
            "uint": "integers",
            "float": "numbers",
            "bool": "booleans",
        }
        return next((w for k, w in words.items() if kind.startswith(k) or kind == f"large_{k}"), kind)
    if name in ("List", "Sequence", "LargeList"):
        return "lists"
    if name == "Image":
        return "images"
    return f"{name} values" if name != "dict" else "records"


def _shown(value) -> str:
    """A value as a message quotes it: its repr, cut short, and its type."""
    text = repr(value)
    kind = type(value).__name__
    return f"{text[:40]}{'…' if len(text) > 40 else ''}, {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
