"""A local dataset folder as `datasets` reads it, checked to read nothing from outside it.

`load_dataset` on a folder reads its dataset card (README.md's YAML header, and a .huggingface.yaml over
it) with the libraries' own readers, and each config's `data_files` and `data_dir` name what it loads; a
`save_to_disk` folder names its splits and Arrow files in JSON. Every one of those paths is read here as
the library reads it, refused when it leads outside the folder (absolute, a URL, up and out, or through a
symbolic link), and the files it reads are returned, so that the data's identity hashes all of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from advisor.errors import InputError

CARD, CARD_YAML = "README.md", ".huggingface.yaml"  # datasets.config.REPOCARD_FILENAME, REPOYAML_FILENAME
SAVED_DICT, SAVED_INFO, SAVED_STATE = "dataset_dict.json", "dataset_info.json", "state.json"


class DataError(InputError):
    """A --data that cannot be used, with a sentence saying what to do (exit code 2); `field`: the request's
    field to fix (the data itself, unless the model cannot take it)."""

    def __init__(self, message: str, field: str = "data"):
        super().__init__(message, field)


def is_saved(folder: Path) -> bool:
    """Whether a folder was written by `save_to_disk` (read by load_from_disk, not by load_dataset)."""
    return (folder / SAVED_INFO).is_file() or (folder / SAVED_DICT).is_file()


def files_read(folder: Path) -> set[Path]:
    """The files `datasets` reads from a resolved folder by what it names (its card, the card's data files,
    hidden ones included; a save_to_disk folder's JSON and Arrow files), each checked to lie inside the
    folder: DataError naming the path field that leads out."""
    read = _saved_files(folder) if is_saved(folder) else _card_files(folder)
    for path in sorted(read):
        if not path.resolve().is_relative_to(folder):
            raise DataError(
                f"{folder.name}/{path.relative_to(folder)} links to a file outside the folder: copy the data in, so "
                "that what the runs train on is what they record."
            )
    return read


# --- a dataset card ----------------------------------------------------------------------------------------


def _card_files(folder: Path) -> set[Path]:
    """The card's files and every file its configs make load_dataset read, each inside the folder."""
    source, configs = card_configs(folder)
    read = {p for p in (folder / CARD, folder / CARD_YAML) if p.is_file()}
    for name, params in configs.items():
        read |= _config_files(folder, f"{folder.name}/{source}'s config {name!r}", params)
    return read


def card_configs(folder: Path) -> tuple[str, dict[str, dict]]:
    """(the file that names them, {config name: its params}): the card's configs exactly as load_dataset reads a
    local folder's (datasets' LocalDatasetModuleFactory.get_module): README.md through huggingface_hub's
    DatasetCard (which skips a BOM and blank space before `---`), .huggingface.yaml's keys over it, then
    datasets' MetadataConfigs. DataError where the library would fail on them."""
    import yaml
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    readme, standalone = folder / CARD, _card_yaml(folder)
    source = CARD
    try:
        data = _card_data(readme) if readme.is_file() else DatasetCardData()
        if standalone is not None:
            source = CARD_YAML
            extra = yaml.safe_load(standalone.read_text(encoding="utf-8"))
            if extra:
                data = DatasetCardData(**{**data.to_dict(), **extra})
            source = CARD_YAML if isinstance(extra, dict) and "configs" in extra else CARD
        return source, MetadataConfigs.from_dataset_card_data(data)
    except Exception as e:  # noqa: BLE001  the libraries' errors on a card: YAML, encoding, configs, features
        raise DataError(
            f"{folder.name}/{source} is not a dataset card datasets can read ({type(e).__name__}: {_first_line(e)}): "
            "fix its YAML header (configs: a list, each with a config_name and data_files), or remove it."
        ) from e


def _card_data(readme: Path):
    """README.md's card data through huggingface_hub's DatasetCard.load, without its warning that a README has
    no YAML header (load_dataset gives it once more when it reads the folder)."""
    import logging

    from huggingface_hub import DatasetCard

    logger = logging.getLogger("huggingface_hub.repocard")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return DatasetCard.load(readme).data
    finally:
        logger.setLevel(level)


def _card_yaml(folder: Path) -> Path | None:
    """The folder's .huggingface.yaml when there is one, a regular file inside the folder; DataError for any
    other kind of file there (a pipe would hang load_dataset, a link would read from elsewhere)."""
    path = folder / CARD_YAML
    if not os.path.lexists(path):
        return None
    if not path.is_file() or not path.resolve().is_relative_to(folder):
        raise DataError(
            f"{folder.name}/{CARD_YAML} is not a regular file inside the folder (a link, a pipe, a folder): make it "
            "one, or remove it."
        )
    return path


def _config_files(folder: Path, where: str, params: dict) -> set[Path]:
    """The files one config makes load_dataset read, its data_dir and data_files refused when they lead out:
    its data_files resolved from data_dir (the builder) and from the folder (the format's inference), or the
    library's default patterns within data_dir."""
    from datasets.data_files import get_data_patterns, sanitize_patterns

    data_dir = params.get("data_dir")
    bases = [folder]
    if data_dir is not None:
        bases = [_inside(folder, where, "data_dir", data_dir, folder), folder]
    data_files = params.get("data_files")
    try:
        patterns = (
            sanitize_patterns(data_files) if data_files is not None else get_data_patterns(str(bases[0]))
        )
    except FileNotFoundError:
        return set()  # no data there: load_dataset says so
    except ValueError as e:
        raise DataError(f"{where} has data_files datasets cannot read ({_first_line(e)}).") from e
    read = set()
    for pattern in (p for split in patterns.values() for p in split):
        for base in bases if data_files is not None else bases[:1]:
            _inside(folder, where, "data_files", pattern, base)
            read |= _matches(folder, where, pattern, base)
    return read


def _inside(folder: Path, where: str, field: str, value, base: Path) -> Path:
    """`base / value` when that lies inside the folder, read as datasets reads a path field (relative unless
    it has a scheme or is absolute; `::` chains filesystems) with symbolic links followed; else DataError."""
    from datasets.utils.file_utils import is_relative_path

    if not isinstance(value, str):
        raise DataError(f"{where} has {value!r} for its {field}, not a path: name files inside the folder.")
    joined = Path(os.path.normpath(base / value))
    if not is_relative_path(value) or "::" in value or not joined.is_relative_to(folder):
        how = "outside the folder"
    elif not _glob_free(joined).resolve().is_relative_to(folder):
        how = "which links outside the folder"
    else:
        return joined
    raise DataError(
        f"{where} points its {field} at {value[:80]!r}, {how}: name files inside it (relative paths, no links "
        "out), so that what the runs train on is what they record."
    )


def _glob_free(path: Path) -> Path:
    """The part of a path before its first glob character: the folder a pattern's matches lie under."""
    parts = list(path.parts)
    cut = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    return Path(*parts[:cut])


def _matches(folder: Path, where: str, pattern: str, base: Path) -> set[Path]:
    """The files a data_files pattern resolves to (datasets' own resolve_pattern, hidden files it names
    included), each refused when it is a link to a file outside the folder."""
    from datasets.data_files import resolve_pattern

    try:
        matched = resolve_pattern(pattern, str(base))
    except FileNotFoundError:
        return set()  # matches nothing: load_dataset says so
    read = {Path(os.path.normpath(m)) for m in matched}
    for path in read:
        if not path.resolve().is_relative_to(folder):
            raise DataError(
                f"{where} points its data_files at {pattern[:80]!r}, which reads "
                f"{path.relative_to(folder)}, a link outside the folder: copy the data in, so that what the runs "
                "train on is what they record."
            )
    return read


# --- a save_to_disk folder ---------------------------------------------------------------------------------


def _saved_files(folder: Path) -> set[Path]:
    """What load_from_disk reads from a save_to_disk folder (datasets.load_from_disk's own order: a Dataset's
    state.json and dataset_info.json, else a DatasetDict's dataset_dict.json and each split's folder), each
    split and Arrow file refused when it leads outside the folder."""
    if (folder / SAVED_INFO).is_file() and (folder / SAVED_STATE).is_file():
        return _saved_split(folder, folder)
    splits = _json(folder, folder / SAVED_DICT, "splits")
    read = {folder / SAVED_DICT}
    for split in splits if isinstance(splits, list | dict | str) else []:  # load_from_disk iterates it
        read |= _saved_split(folder, _inside(folder, f"{folder.name}/{SAVED_DICT}", "splits", split, folder))
    return read


def _saved_split(folder: Path, split: Path) -> set[Path]:
    """A saved split's state.json and dataset_info.json, and the Arrow files its state names."""
    where = f"{folder.name}/{(split / SAVED_STATE).relative_to(folder)}"
    entries = _json(folder, split / SAVED_STATE, "_data_files")
    read = {split / SAVED_STATE, split / SAVED_INFO}
    for entry in entries if isinstance(entries, list) else []:
        name = entry.get("filename") if isinstance(entry, dict) else entry
        read.add(_inside(folder, where, "_data_files", name, split))
    return read


def _json(folder: Path, path: Path, key: str):
    """A key of a save_to_disk JSON file, as load_from_disk reads it; DataError when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))[key]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(
            f"cannot read {path.relative_to(folder)} of {folder.name} ({type(e).__name__}: {_first_line(e)}): a "
            "save_to_disk folder must hold it as datasets wrote it; save the dataset again."
        ) from e


def _first_line(e: BaseException) -> str:
    """An exception's first non-empty line, cut short, for a sentence."""
    return (str(e).strip().splitlines() or [""])[0][:200]
