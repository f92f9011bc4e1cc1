"""What the report and the kb commands read of a KB: a group's provenance and statuses, the counts `advisor
kb stats` shows, the runs `advisor kb runs` lists, and every run and validation as `advisor kb export` writes
them (the format `advisor kb import` reads back)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from advisor.kb.queries.groups import Group, evidence_groups, group_row_id, json_value, run_filter


def group_span(conn: sqlite3.Connection, group: Group) -> dict:
    """What a group's runs ran on and when: a device, the most host and accelerator memory, the first start,
    the last finish and a software column (as stored): the provenance a report shows."""
    row = conn.execute(
        "SELECT min(device), max(host_memory_gb), max(accelerator_memory_gb), min(started_at), "
        "max(finished_at), min(software) FROM runs WHERE grp = ?",
        [group_row_id(conn, group)],
    ).fetchone()
    keys = ("device", "host_memory_gb", "accelerator_memory_gb", "started_at", "finished_at", "software")
    return dict(zip(keys, row, strict=True))


def group_statuses(conn: sqlite3.Connection, group: Group) -> list[tuple[str, int]]:
    """(status, runs) of a group's runs, the most frequent first: how they ended, as a report counts them."""
    rows = conn.execute(
        "SELECT status, count(*) FROM runs WHERE grp = ? GROUP BY status ORDER BY count(*) DESC",
        [group_row_id(conn, group)],
    )
    return [(status, n) for status, n in rows]


def stats(conn: sqlite3.Connection) -> dict:
    """Counts a user checks first: runs by source and status, groups, metrics, schema."""
    by_source = [
        dict(source=r[0], runs=r[1])
        for r in conn.execute("SELECT source, count(*) FROM runs GROUP BY source ORDER BY source")
    ]
    by_status = {r[0]: r[1] for r in conn.execute("SELECT status, count(*) FROM runs GROUP BY status")}
    for _ in _abandoned(conn):  # shown as what they are: crashed (the next writer marks them)
        by_status["running"] -= 1
        by_status["crashed"] = by_status.get("crashed", 0) + 1
    by_status = {k: v for k, v in by_status.items() if v}
    by_metric = {
        r[0]: r[1] for r in conn.execute("SELECT name, count(*) FROM metrics GROUP BY name ORDER BY name")
    }
    schema = [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY rowid")]
    return {
        "runs": conn.execute("SELECT count(*) FROM runs").fetchone()[0],
        "metrics": conn.execute("SELECT count(*) FROM metrics").fetchone()[0],
        "epochs": conn.execute("SELECT count(*) FROM epochs").fetchone()[0],
        "by_source": by_source,
        "by_status": by_status,
        "by_metric": by_metric,
        "groups": [g.as_dict() for g in evidence_groups(conn)],
        "schema": schema,
    }


RUN_COLUMNS = (
    "id",
    "source",
    "model",
    "family",
    "optimizer",
    "strategy",
    "preset",
    "seed",
    "hardware",
    "device",
    "status",
    "error",
    "started_at",
    "finished_at",
)


def list_runs(
    conn: sqlite3.Connection,
    family: str | None = None,
    source: str | None = None,
    status: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Runs with their provenance and status; a `running` run whose owner is gone is shown crashed, with
    why (readers never write: the next writer marks it)."""
    live = status in ("running", "crashed")  # filtered after the owners are looked at
    where, params = run_filter(family=family, source=source, status=None if live else status)
    if live:
        where.append("status IN ('running', 'crashed')")
    sql = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
    sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
    if limit and not live:
        sql += f" LIMIT {int(limit)}"
    rows = [dict(zip(RUN_COLUMNS, r, strict=True)) for r in conn.execute(sql, params)]
    gone = dict(_abandoned(conn))
    for row in rows:
        if row["id"] in gone:
            row.update(status="crashed", error=gone[row["id"]])
    rows = [r for r in rows if r["status"] == status] if live else rows
    return rows[:limit] if limit else rows


def _abandoned(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    """(id, why) of the runs still marked `running` whose owner is gone: readers show them crashed."""
    from advisor.kb import lease  # a writer's module (sockets, the store): off the answer path

    rows = conn.execute("SELECT id, owner, lease_until, started_at FROM runs WHERE status = 'running'")
    return [
        (i, why)
        for i, owner, lease_until, started in rows
        if (why := lease.abandoned(owner, lease_until, started))
    ]


def export_runs(conn: sqlite3.Connection, source: str | None = None) -> list[dict]:
    """Every run with all its provenance, metrics and epochs: the format `advisor kb import` reads back."""
    return [run for batch in iter_runs(conn, source) for run in batch]


def iter_runs(conn: sqlite3.Connection, source: str | None = None, batch: int = 500) -> Iterator[list[dict]]:
    """Every run as `export_runs` gives it, `batch` runs at a time from one cursor: a KB of any size is read
    in bounded memory (`kb merge` streams its sources through this). JSON that does not parse is left as
    its text, for the rules to refuse (advisor.kb.admission)."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    epoch_cols = [r[1] for r in conn.execute("PRAGMA table_info(epochs)")]
    where, params = run_filter(source=source)
    cursor = conn.execute(
        "SELECT * FROM runs" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id", params
    )
    while rows := cursor.fetchmany(batch):
        runs = {row[0]: _exported(dict(zip(cols, row, strict=True))) for row in rows}
        marks = ", ".join("?" * len(runs))
        for run_id, *figure in conn.execute(
            f"SELECT run_id, name, value, unit, certainty, note FROM metrics WHERE run_id IN ({marks}) "
            "ORDER BY run_id, name",
            list(runs),
        ):
            runs[run_id]["metrics"].append(
                dict(zip(("name", "value", "unit", "certainty", "note"), figure, strict=True))
            )
        for e in conn.execute(
            f"SELECT * FROM epochs WHERE run_id IN ({marks}) ORDER BY run_id, epoch", list(runs)
        ):
            row = dict(zip(epoch_cols, e, strict=True))
            runs[row.pop("run_id")]["epochs"].append(row)
        yield list(runs.values())


def _exported(run: dict) -> dict:
    """A runs row as an export holds it: no local numbering (the importing KB gives the run its group), JSON
    columns parsed."""
    run.pop("id")
    run.pop("grp")
    for key in ("software", "config"):
        run[key] = _parsed(run[key])
    return {**run, "metrics": [], "epochs": []}


def _parsed(text):
    """A JSON column's object, or the text itself where it is not JSON (the rules then say so)."""
    try:
        return json_value(text)
    except ValueError:
        return text


def export_validations(conn: sqlite3.Connection) -> list[dict]:
    """Every validation, as `advisor kb import` reads them back."""
    cols = [r[1] for r in conn.execute("PRAGMA table_info(validations)")]
    rows = conn.execute("SELECT * FROM validations ORDER BY id").fetchall()
    out = []
    for row in rows:
        v = {k: val for k, val in zip(cols, row, strict=True) if k != "id"}
        v["software"] = _parsed(v["software"])
        out.append(v)
    return out
