"""The whole grid's data and sizes, checked before any cell starts (`advisor measure`): what the cells will
read of each --data table (advisor.measuring.data), against the model of each cell, built to its sizes
(advisor.measuring.model). Here, over both, since data/ reads no model."""

from __future__ import annotations

from advisor.measuring.data.folder import DataError
from advisor.measuring.data.table import check_rows, family_rows, open_table, role_columns
from advisor.measuring.data.values import check_classes, check_values, rows_read
from advisor.measuring.model.builder import sized_reference, sized_user_config
from advisor.measuring.model.families import family_of
from advisor.measuring.model.families.base import Sizes
from advisor.measuring.recipe.config import GridCell
from advisor.rules import Rules


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
        said = {"--seq-len": "seq_len", "--image-size": "image_size", "tokenizer": "models"}
        field = next((field for words, field in said.items() if words in str(e)), "data")
        raise DataError(f"{cfg.model}: {e}.", field=field) from e
