"""The values of a --data table, checked before any cell reads them: text that is text, labels that are
classes, images that decode (a sample of the rows the cells read), each refusal a sentence naming the
example and the file."""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

import numpy as np

from advisor.measuring.data.folder import DataError
from advisor.measuring.data.table import Table, _first_line, split_rows

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
