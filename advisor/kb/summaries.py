"""The summaries answers read instead of every figure: evidence groups, runs per configuration and status,
each measure's sums over a configuration's ok runs, per-seed sums and the sums of seed-paired differences
that paired tests need (schema migration 0008).

Maintained inside the write transaction of every write (advisor/kb/store.py calls `add` after a run is
written and `remove` before one changes), in set-based SQL, so that a bulk import of 20,000 runs
summarises them in one pass. `rebuild` recomputes everything from the runs: the migration's backfill, and
the oracle the tests hold the maintained tables to.

Written by hand: sqlite-utils has no incremental aggregates, and SQL triggers would summarise a bulk
import row by row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

GROUP_COLUMNS = ("source", "hardware", "preset", "model", "family", "protocol", "data")
GROUP_KEY = frozenset(GROUP_COLUMNS)  # run columns that decide its group
PAPER_DATA = "pranavmr/MM-IMDb@ad5b994"  # what the paper trained on: MM-IMDb at the commit it cites
# The data of a run that does not say (written before migration 0009, or imported from such a file): the
# paper's, or what a measured run's config recorded (`config.data.train`), else '' (not stated).
_RECORDED = "coalesce(json_extract(config, '$.data.train'), json_extract(config, '$.data'))"  # dict or str
DATA_OF_UNSTATED = f"""CASE
    WHEN source LIKE 'paper:%' THEN '{PAPER_DATA}'
    WHEN NOT json_valid(config) THEN ''
    WHEN {_RECORDED} LIKE 'generated%' THEN 'generated'
    WHEN {_RECORDED} LIKE 'pranavmr/MM-IMDb%' THEN 'pranavmr/MM-IMDb (unpinned)'
    ELSE '' END"""
# a user's model's config.json hash as measure records it (a text of 64 hex digits, else nothing)
_HASH = "json_extract(r.config, '$.model_config_hash')"
CONFIG_HASH = (  # the cheap test first: most runs (every reference model's) record none
    f"(CASE WHEN instr(r.config, '\"model_config_hash\"') AND json_valid(r.config) AND typeof({_HASH}) = 'text' "
    f"AND length({_HASH}) = 64 AND {_HASH} NOT GLOB '*[^0-9a-f]*' THEN {_HASH} END)"
)
SCALES = ("host_memory_gb", "accelerator_memory_gb")  # runs columns a measure may be scaled by (metrics.toml)
TABLES = ("cell_status", "cell_stats", "seed_stats", "pair_stats")

_TOUCHED = "FROM runs r JOIN temp.touched t ON r.id = t.id"


def add(conn: sqlite3.Connection, runs: Iterable[int] | str, params: Iterable = ()) -> None:
    """Add the runs (ids, or a `SELECT id ...` with params) to the summaries; gives them their group."""
    _apply(conn, runs, params, +1)


def remove(conn: sqlite3.Connection, runs: Iterable[int] | str, params: Iterable = ()) -> None:
    """Take the runs out of the summaries, before they change (status, settings, provenance)."""
    _apply(conn, runs, params, -1)


def rebuild(conn: sqlite3.Connection) -> None:
    """Every summary recomputed from the runs (groups renumbered)."""
    if "data" not in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}:
        return  # a KB migrating through 0008: migration 0009 adds the runs' data, then rebuilds
    conn.execute("UPDATE runs SET grp = NULL")
    for table in (*TABLES, "groups"):
        conn.execute(f"DELETE FROM {table}")
    add(conn, "SELECT id FROM runs")


def _apply(conn: sqlite3.Connection, runs, params, sign: int) -> None:
    conn.execute("DROP TABLE IF EXISTS temp.touched")
    conn.execute("CREATE TEMP TABLE touched (id INTEGER PRIMARY KEY)")
    try:
        if isinstance(runs, str):
            conn.execute(f"INSERT OR IGNORE INTO temp.touched {runs}", list(params))
        else:
            conn.executemany("INSERT OR IGNORE INTO temp.touched VALUES (?)", [(i,) for i in runs])
        if sign > 0:
            _assign_groups(conn)
        _status(conn, sign)
        _stats(conn, sign)
        _seeds_and_pairs(conn, sign)
    finally:
        conn.execute("DROP TABLE IF EXISTS temp.touched")


def _assign_groups(conn: sqlite3.Connection) -> None:
    conn.execute(
        f"UPDATE runs SET data = {DATA_OF_UNSTATED} WHERE data IS NULL AND id IN (SELECT id FROM temp.touched)"
    )
    cols = ", ".join(GROUP_COLUMNS)
    conn.execute(
        f"INSERT OR IGNORE INTO groups ({cols}) SELECT DISTINCT {', '.join('r.' + c for c in GROUP_COLUMNS)} "
        f"{_TOUCHED} WHERE r.grp IS NULL"
    )
    same = " AND ".join(f"g.{c} = runs.{c}" for c in GROUP_COLUMNS)
    conn.execute(
        f"UPDATE runs SET grp = (SELECT g.id FROM groups g WHERE {same}) "
        "WHERE grp IS NULL AND id IN (SELECT id FROM temp.touched)"
    )
    if "config_hash" in {r[1] for r in conn.execute("PRAGMA table_info(groups)")}:  # from migration 0011 on
        conn.execute(  # the model's config hash, as a run of the group records it (the first that does)
            f"UPDATE groups SET config_hash = (SELECT {CONFIG_HASH} {_TOUCHED} WHERE r.grp = groups.id AND "
            f"{CONFIG_HASH} IS NOT NULL LIMIT 1) WHERE config_hash IS NULL AND id IN (SELECT DISTINCT r.grp {_TOUCHED})"
        )
    conn.execute(  # the model's size: the largest a run states (sizes only grow: set once per build)
        "UPDATE groups SET n_params = nullif(max(coalesce(n_params, 0), coalesce("
        f"(SELECT max(r.n_params) {_TOUCHED} WHERE r.grp = groups.id), 0)), 0) "
        f"WHERE id IN (SELECT DISTINCT r.grp {_TOUCHED})"
    )


def _status(conn: sqlite3.Connection, sign: int) -> None:
    conn.execute(
        "INSERT INTO cell_status (grp, optimizer, strategy, settings, status, n) "
        f"SELECT r.grp, r.optimizer, r.strategy, coalesce(r.settings, ''), r.status, ? * count(*) {_TOUCHED} "
        "WHERE true GROUP BY 1, 2, 3, 4, 5 ON CONFLICT DO UPDATE SET n = n + excluded.n",
        [sign],
    )
    if sign < 0:
        conn.execute("DELETE FROM cell_status WHERE n = 0")


def _stats(conn: sqlite3.Connection, sign: int) -> None:
    scaled = " ".join(f"WHEN '{s}' THEN m.value * r.{s}" for s in SCALES)
    scales = " UNION ALL ".join(f"SELECT '{s}'" for s in SCALES)
    conn.execute(
        "INSERT INTO cell_stats (grp, optimizer, strategy, measure, scale, n, total, total_sq, first_value, "
        "first_unit) SELECT grp, optimizer, strategy, name, scale, ? * count(*), ? * sum(v), ? * sum(v * v), "
        "min(value), min(unit) FROM ("
        f"  SELECT r.grp, r.optimizer, r.strategy, m.name, m.value, m.unit, s.scale, "
        f"  CASE s.scale WHEN '' THEN m.value {scaled} END AS v "
        f"  {_TOUCHED} JOIN metrics m ON m.run_id = r.id JOIN (SELECT '' AS scale UNION ALL {scales}) s "
        "  WHERE r.status = 'ok'"
        ") WHERE v IS NOT NULL GROUP BY 1, 2, 3, 4, 5 "
        "ON CONFLICT DO UPDATE SET n = n + excluded.n, total = total + excluded.total, "
        "total_sq = total_sq + excluded.total_sq, first_value = min(first_value, excluded.first_value), "
        "first_unit = min(first_unit, excluded.first_unit)",
        [sign, sign, sign],
    )
    if sign < 0:
        conn.execute("DELETE FROM cell_stats WHERE n = 0")
        # the stated figure is read where one run is left: take it from that run (`first_value` of a
        # removed run would otherwise linger)
        one = (
            "FROM runs r JOIN metrics m ON m.run_id = r.id WHERE r.grp = cell_stats.grp AND r.optimizer = "
            "cell_stats.optimizer AND r.strategy = cell_stats.strategy AND r.status = 'ok' AND m.name = "
            "cell_stats.measure AND r.id NOT IN (SELECT id FROM temp.touched) AND (cell_stats.scale = '' "
            + "".join(f"OR (cell_stats.scale = '{c}' AND r.{c} IS NOT NULL) " for c in SCALES)
            + ")"
        )
        conn.execute(
            f"UPDATE cell_stats SET first_value = (SELECT min(m.value) {one}), first_unit = (SELECT min(m.unit) "
            f"{one}) WHERE n = 1 AND (grp, optimizer, strategy) IN (SELECT r.grp, r.optimizer, r.strategy "
            f"{_TOUCHED})"
        )


def _seeds_and_pairs(conn: sqlite3.Connection, sign: int) -> None:
    """Per-seed sums, and the paired differences of every two configurations at a seed both have. Pairs
    that involve a changed (configuration, seed) are taken out with the old seed means, the seed sums
    updated, then put back with the new ones."""
    conn.execute("DROP TABLE IF EXISTS temp.delta")
    conn.execute(
        "CREATE TEMP TABLE delta (grp, measure, seed, optimizer, strategy, n, total, "
        "PRIMARY KEY (grp, measure, seed, optimizer, strategy)) WITHOUT ROWID"
    )
    try:
        conn.execute(
            "INSERT INTO temp.delta SELECT r.grp, m.name, r.seed, r.optimizer, r.strategy, ? * count(*), "
            f"? * sum(m.value) {_TOUCHED} JOIN metrics m ON m.run_id = r.id "
            "WHERE r.status = 'ok' AND r.seed IS NOT NULL GROUP BY 1, 2, 3, 4, 5",
            [sign, sign],
        )
        if conn.execute("SELECT 1 FROM temp.delta LIMIT 1").fetchone() is None:
            return
        _pairs(conn, -1)
        conn.execute(
            "INSERT INTO seed_stats (grp, measure, seed, optimizer, strategy, n, total) "
            "SELECT * FROM temp.delta WHERE true "
            "ON CONFLICT DO UPDATE SET n = n + excluded.n, total = total + excluded.total"
        )
        if sign < 0:
            conn.execute(
                "DELETE FROM seed_stats WHERE n = 0 AND (grp, measure, seed, optimizer, strategy) IN "
                "(SELECT grp, measure, seed, optimizer, strategy FROM temp.delta)"
            )
        _pairs(conn, +1)
        if sign < 0:
            conn.execute("DELETE FROM pair_stats WHERE n = 0")
    finally:
        conn.execute("DROP TABLE IF EXISTS temp.delta")


def _pairs(conn: sqlite3.Connection, sign: int) -> None:
    """Add (sign +1) or take out (-1) the seed-paired differences of every pair with a changed member."""
    changed = (
        "EXISTS (SELECT 1 FROM temp.delta d WHERE d.grp = k.grp AND d.measure = k.measure AND d.seed = k.seed "
        "AND ((d.optimizer = a.optimizer AND d.strategy = a.strategy) "
        "OR (d.optimizer = b.optimizer AND d.strategy = b.strategy)))"
    )
    conn.execute(
        "INSERT INTO pair_stats (grp, measure, a_optimizer, a_strategy, b_optimizer, b_strategy, n, sum_d, "
        "sum_dd) SELECT grp, measure, ao, ast, bo, bst, ? * count(*), ? * sum(d), ? * sum(d * d) FROM ("
        "  SELECT k.grp, k.measure, a.optimizer AS ao, a.strategy AS ast, b.optimizer AS bo, "
        "  b.strategy AS bst, a.total / a.n - b.total / b.n AS d "
        "  FROM (SELECT DISTINCT grp, measure, seed FROM temp.delta) k "
        "  JOIN seed_stats a ON a.grp = k.grp AND a.measure = k.measure AND a.seed = k.seed "
        "  JOIN seed_stats b ON b.grp = k.grp AND b.measure = k.measure AND b.seed = k.seed "
        "  AND (a.optimizer, a.strategy) < (b.optimizer, b.strategy) "
        f"  WHERE a.n > 0 AND b.n > 0 AND {changed}"
        ") WHERE true GROUP BY 1, 2, 3, 4, 5, 6 "
        "ON CONFLICT DO UPDATE SET n = n + excluded.n, sum_d = sum_d + excluded.sum_d, "
        "sum_dd = sum_dd + excluded.sum_dd",
        [sign, sign, sign],
    )
