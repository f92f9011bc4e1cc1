"""Reading evidence files: the paper's figures (CSV + setup.toml) and exported runs (JSON), parsed and
checked into run dicts. A file with one bad row is refused whole; writing is `advisor.kb.store`'s job.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import admission
from advisor.kb.identity import cell_key
from advisor.kb.schema import columns
from advisor.kb.store import normalized
from advisor.rules import Rules

FIGURE_COLUMNS = ("model", "optimizer", "strategy", "metric", "value", "unit")
MAX_REPORTED_ERRORS = 10


class ImportRowsError(KBError):
    """An import file with bad rows; nothing was written."""


def read_figures(path: Path, setup: dict, rules: Rules) -> list[dict]:
    """Parse a figures CSV into run dicts (one per model × optimizer × strategy), or raise listing bad rows."""
    known_measures = set(rules.measures)
    errors, runs, seen = [], {}, set()
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in FIGURE_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ImportRowsError(f"{path}: missing columns {', '.join(missing)}; nothing was imported.")
            for lineno, row in enumerate(reader, start=2):
                problem = _figure_row_problem(row, setup, rules, known_measures, seen)
                if problem:
                    errors.append(f"line {lineno}: {problem}")
                    continue
                key = (row["model"], row["optimizer"], row["strategy"])
                run = runs.setdefault(key, _paper_run(setup, *key))
                run["metrics"].append(
                    dict(
                        name=row["metric"],
                        value=float(row["value"]),
                        unit=row["unit"],
                        certainty=row.get("certainty") or "stated",
                        note=row.get("where") or None,
                    )
                )
    except (UnicodeDecodeError, csv.Error) as e:
        raise ImportRowsError(f"{path} is not a readable CSV ({e}); nothing was imported.") from e
    _raise_if(errors, path)
    return list(runs.values())


def _figure_row_problem(row, setup, rules, known_measures, seen) -> str | None:
    if None in row or any(row.get(c) in (None, "") for c in FIGURE_COLUMNS):
        return "wrong number of fields or an empty required field"
    if row["model"] not in setup["models"]:
        return f"model {row['model']!r} is not described in the source's setup.toml"
    if row["optimizer"] not in rules.optimizers:
        return f"unknown optimizer {row['optimizer']!r} (known: {', '.join(rules.optimizers)})"
    if row["strategy"] not in rules.strategies:
        return f"unknown strategy {row['strategy']!r} (known: {', '.join(rules.strategies)})"
    if row["metric"] not in known_measures:
        return f"unknown metric {row['metric']!r} (known: {', '.join(sorted(known_measures))})"
    try:
        value = float(row["value"])
    except ValueError:
        return f"value {row['value']!r} is not a number"
    if not math.isfinite(value):
        return f"value {row['value']!r} is not finite"
    key = (row["model"], row["optimizer"], row["strategy"], row["metric"])
    if key in seen:
        return f"duplicate figure for {' / '.join(key)}"
    seen.add(key)
    return None


def _paper_run(setup: dict, model: str, optimizer: str, strategy: str) -> dict:
    hyper = dict(setup["models"][model])
    family = hyper.pop("family")
    n_params = hyper.pop("n_params", None)
    config = dict(model=model, optimizer=optimizer, strategy=strategy, preset=setup["preset"], **hyper)
    return dict(
        cell_key=cell_key({"source": setup["source"], **config}),
        source=setup["source"],
        model=model,
        family=family,
        optimizer=optimizer,
        strategy=strategy,
        preset=setup["preset"],
        protocol=setup.get("protocol", "paper"),  # fair: held-out loss at rates tuned per optimizer
        data=setup.get("data"),  # what the source trained on (None: unstated, the seed paper's MM-IMDb)
        seed=None,
        hardware=setup["hardware"],
        device=setup.get("device"),
        host_memory_gb=setup.get("host_memory_gb"),
        accelerator_memory_gb=setup.get("accelerator_memory_gb"),
        software={},
        config=config,
        pretrained=None,
        n_params=n_params,
        status="ok",
        error=None,
        started_at=None,
        finished_at=None,
        metrics=[],
        epochs=[],
    )


FILLED = {("runs", "cell_key")}  # required columns the store fills when an import leaves them out
MAX_REPORTED_NESTING = "nested too deeply to be an advisor export"


def read_export(path: Path, rules: Rules) -> tuple[list[dict], list[dict]]:
    """The runs and validations of an `advisor kb export --format json` file, every field checked against
    the schema (names, types, ranges); a file with one bad row is refused whole."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ImportRowsError(f"{path} is not UTF-8 text, so not an export; nothing was imported.") from e
    except json.JSONDecodeError as e:
        raise ImportRowsError(f"{path} is not valid JSON ({e}); nothing was imported.") from e
    except RecursionError as e:
        raise ImportRowsError(f"{path} is {MAX_REPORTED_NESTING}; nothing was imported.") from e
    if isinstance(data, dict):
        unknown = sorted(set(data) - {"runs", "validations"})
        if unknown:
            raise ImportRowsError(
                f"{path}: unknown keys {', '.join(map(repr, unknown))} (an export holds runs and validations); nothing was imported."
            )
    validations = data.get("validations", []) if isinstance(data, dict) else []
    if not isinstance(validations, list):
        raise ImportRowsError(f"{path}: 'validations' must be a list; nothing was imported.")
    errors = [
        f"validation {i}: {p}" for i, v in enumerate(validations) if (p := _row_problem(v, "validations"))
    ]
    _raise_if(errors, path)
    return _runs_of(data, path, rules), validations


def _runs_of(data, path: Path, rules: Rules) -> list[dict]:
    runs = data.get("runs", []) if isinstance(data, dict) else data
    if not isinstance(runs, list):
        raise ImportRowsError(
            f"{path}: expected a list of runs (or an object with key 'runs'); nothing was imported."
        )
    errors = [f"run {i}: {p}" for i, run in enumerate(runs) if (p := _run_problem(run, rules))]
    _raise_if(errors, path)
    return runs


def _run_problem(run, rules) -> str | None:
    """What is wrong with one run of an export: its shape (fields, lists), then advisor's rules for every
    run that enters a KB (advisor.kb.admission, which the store applies again as it writes)."""
    problem = _row_problem(run, "runs", extra=("metrics", "epochs"))
    if problem:
        return problem
    for kind, key in (("metrics", "metric"), ("epochs", "epoch")):
        rows = run.get(kind, [])
        if not isinstance(rows, list):
            return f"{kind} must be a list"
        for i, row in enumerate(rows):
            problem = _row_problem(row, kind, skip=("run_id",))
            if problem:
                return f"{key} {i}: {problem}"
    return admission.run_problem(normalized(run), rules)


def _row_problem(row, table: str, extra=(), skip=()) -> str | None:
    """What is wrong with the shape of a row for `table`: not an object, a key that is no column (the
    allow-list is the schema itself: advisor/kb/schema.py columns), a required one missing."""
    if not isinstance(row, dict):
        return "not an object"
    cols = {k: v for k, v in columns(table).items() if k not in skip}
    unknown = [k for k in row if k not in cols and k not in extra and k not in ("id", *skip)]
    if unknown:
        return f"unknown field {unknown[0]!r}"
    missing = [
        k
        for k, (_, required) in cols.items()
        if required and row.get(k) in (None, "") and (table, k) not in FILLED
    ]
    if missing:
        return f"missing {', '.join(missing)}"
    if table == "validations":
        return admission.validation_problem(row)
    return None


def _raise_if(errors: list[str], path: Path) -> None:
    if errors:
        shown = "; ".join(errors[:MAX_REPORTED_ERRORS])
        more = f" (and {len(errors) - MAX_REPORTED_ERRORS} more)" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise ImportRowsError(f"{path}: {len(errors)} bad row(s), nothing was imported: {shown}{more}.")


def read_setup(path: Path) -> dict:
    """A figures CSV's setup.toml, or a sentence that says what is wrong with it."""
    try:
        setup = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ImportRowsError(f"{path} is not UTF-8 text, so not a setup.toml; nothing was imported.") from e
    except tomllib.TOMLDecodeError as e:
        raise ImportRowsError(f"{path} is not valid TOML ({e}); nothing was imported.") from e
    missing = [k for k in ("source", "hardware", "preset", "models") if k not in setup]
    if missing or not isinstance(setup.get("models"), dict):
        raise ImportRowsError(
            f"{path} lacks {', '.join(missing) or 'a [models.NAME] table'}; nothing was imported."
        )
    return setup


def read_file(path: Path, rules: Rules, setup_path: Path | None = None) -> tuple[list[dict], list[dict]]:
    """The runs and validations of a figures CSV (with its setup.toml: --setup, else the one beside it)
    or of an export (JSON)."""
    path = Path(path)
    if not path.exists():
        raise KBError(f"no file at {path}.")
    if path.suffix.lower() != ".csv":
        return read_export(path, rules)
    setup_path = Path(setup_path) if setup_path else path.with_name("setup.toml")
    if not setup_path.exists():
        raise KBError(
            f"a figures CSV needs its setup (hardware, hyperparameters): no {setup_path}. "
            "Pass --setup with a setup.toml like kb/inputs/paper-2608.08961/setup.toml."
        )
    return read_figures(path, read_setup(setup_path), rules), []
