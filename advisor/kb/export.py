"""The export formats of `advisor kb export`: JSON (every run with provenance, metrics and epochs: what
`advisor kb import` reads back) and CSV (one row per run-level figure, the paper's figures.csv columns
plus provenance)."""

from __future__ import annotations

import csv
import io
import json

from advisor.kb.queries.for_report import RUN_COLUMNS

# Provenance columns a CSV row repeats for each of its run's figures, then the figure's own columns.
CSV_RUN_COLUMNS = tuple(
    c for c in RUN_COLUMNS if c not in ("id", "device", "error", "started_at", "finished_at")
)
CSV_FIGURE_COLUMNS = ("metric", "value", "unit", "certainty", "note")


def runs_json(runs: list[dict], validations: list[dict] = ()) -> str:
    return (
        json.dumps({"runs": runs, "validations": list(validations)}, indent=1, sort_keys=True, default=str)
        + "\n"
    )


def runs_csv(runs: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_RUN_COLUMNS + CSV_FIGURE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for run in runs:
        for m in run["metrics"]:
            figure = dict(
                zip(
                    CSV_FIGURE_COLUMNS,
                    (m["name"], m["value"], m["unit"], m["certainty"], m["note"]),
                    strict=True,
                )
            )
            writer.writerow({**{c: run.get(c) for c in CSV_RUN_COLUMNS}, **figure})
    return buf.getvalue()
