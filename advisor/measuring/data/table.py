"""A resolved --data read through `datasets` (`advisor.measuring.data.source` resolved it): its rows, the
columns that play each role a family reads, labels as class indices, and the fixed split into a test set, a
validation set and the training pool; the view of it one cell reads."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from advisor.measuring.data.corpus import encoded
from advisor.measuring.data.folder import DataError, is_saved
from advisor.measuring.data.source import FILE_BUILDERS, _data_files

SPLIT_SEED = 20_260_805  # the fixed order that splits a dataset into held-out and training rows

# The columns a family reads, by role, and the names a dataset may give them (first match wins).
ROLE_COLUMNS = {
    "text": ("text", "plot", "content", "sentence", "document", "body", "review", "overview", "caption"),
    "image": ("image", "img", "poster", "picture", "photo"),
    "label": ("label", "labels", "genre", "genres", "class", "category", "target"),
    "caption": ("caption", "captions", "text", "description", "plot", "overview"),
}


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
