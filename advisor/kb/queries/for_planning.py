"""What planning reads of a KB: the past runs a plan prices from (advisor.measuring.planning.history), and
the evidence groups of the runs a measurement just wrote."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from advisor.kb.open import connect_kb_readonly

PAST_RUNS_SQL = """
SELECT r.cell_key, r.source, r.config, r.optimizer, r.strategy, r.data,
       (julianday(r.finished_at) - julianday(r.started_at)) * 86400,
       (SELECT sum(e.wall_s) FROM epochs e WHERE e.run_id = r.id),
       (SELECT sum(e.steps) FROM epochs e WHERE e.run_id = r.id),
       (SELECT count(*) FROM epochs e WHERE e.run_id = r.id AND e.wall_s IS NULL),
       (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.name = 'peak_rss_gb'),
       (SELECT m.value FROM metrics m WHERE m.run_id = r.id AND m.name = 'achieved_gflops')
FROM runs r
WHERE r.status = 'ok' AND r.source IN ('measured', 'measured:tuning') AND r.hardware IN ({})
  AND r.model IN ({})
"""


def past_runs(conn: sqlite3.Connection, accepts: Callable[[str], bool], models: set[str]) -> list[tuple]:
    """(cell key, source, config, optimizer, strategy, data, wall s, trained s, updates, untimed epochs, peak
    RSS GB, GFLOP/s) of the ok measured runs of `models` on each hardware `accepts`: what a plan prices from."""
    hardware = [h for (h,) in conn.execute("SELECT DISTINCT hardware FROM runs") if accepts(h)]
    if not hardware:
        return []
    marks = (",".join("?" * len(hardware)), ",".join("?" * len(models)))
    return conn.execute(PAST_RUNS_SQL.format(*marks), [*hardware, *models]).fetchall()


def run_groups(path: Path, run_ids: list[int]) -> list[int]:
    """The evidence groups (their row ids in that KB) of runs just written there, in the runs' order."""
    ids = [i for i in run_ids if isinstance(i, int)]
    if not ids:
        return []
    conn = connect_kb_readonly(path)
    try:
        found = dict(
            conn.execute(
                f"SELECT id, grp FROM runs WHERE id IN ({', '.join('?' * len(ids))})", ids
            ).fetchall()
        )
    finally:
        conn.close()
    return list(dict.fromkeys(found[i] for i in ids if found.get(i) is not None))
