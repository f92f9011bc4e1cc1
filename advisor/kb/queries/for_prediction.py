"""What prediction reads of a KB: advisor fit's cached traces (advisor.prediction.cache), `advisor
calibrate`'s speed calibrations, the rates --tune-lr chose, the measured figures and fit's validations a
prediction is checked against."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter

from advisor.kb.queries.groups import FIT_CHECK, SPEED_RATE


def prediction_payloads(conn: sqlite3.Connection, keys: list[str]) -> dict[str, dict]:
    """key -> payload of the cached traces the KB holds among `keys`: a question answered without tracing."""
    marks = ",".join("?" * len(keys))
    rows = conn.execute(f"SELECT key, payload FROM predictions WHERE key IN ({marks})", keys)
    return {k: json.loads(p) for k, p in rows}


def predictions_held(conn: sqlite3.Connection, keys: list[str]) -> int:
    """How many of `keys` the KB holds a cached trace of: whether answering needs tracing (torch)."""
    marks = ",".join("?" * len(keys))
    (n,) = conn.execute(f"SELECT count(*) FROM predictions WHERE key IN ({marks})", keys).fetchone()
    return n


def traced_predictions(conn: sqlite3.Connection) -> list[tuple]:
    """(model, config hash, seq len, image size, device, family, optimizer, strategy, dtype, payload text) of
    every cached trace, by model and shape, oldest first: what a report answers advisor fit from."""
    return conn.execute(
        "SELECT model, config_hash, seq_len, image_size, device, family, optimizer, strategy, dtype, payload "
        "FROM predictions ORDER BY model, seq_len, image_size, device, created_at"
    ).fetchall()


def speed_calibrations(conn: sqlite3.Connection) -> dict[str, dict]:
    """`advisor calibrate`'s chosen calibration per hardware: {hardware: {rate name: value, 'at': when it was
    recorded (ISO, UTC), 'device': the device's name, 'spread': the worst rate's spread over its fastest
    rounds, 'rounds': the rounds run, 'agreed': whether they agreed within 'tolerance', 'tolerance',
    'calibrations': how many usable calibrations of this hardware the KB holds}}. A calibration is the rows
    of one hardware recorded at one time; one any of whose figures breaks its rule (speed_rate_problem: -1,
    0, Inf, NULL) is left out whole. The choice: the latest calibration whose rounds agreed; where none
    did, the latest (one that did not agree, or one recorded before calibrate compared rounds, whose
    spread, rounds and agreed are None)."""
    try:
        rows = conn.execute(
            "SELECT hardware, device, name, value, passed, tolerance, created_at FROM validations "
            "WHERE name LIKE ? ORDER BY hardware, created_at, id",
            [SPEED_RATE],
        ).fetchall()
    except sqlite3.DatabaseError:
        return {}
    if not rows:
        return {}  # no calibration: the rates' rules (admission, 6 ms of imports) are not loaded
    from advisor.kb import admission  # the rates' rules, on fit's path only where a KB holds calibrations

    found: dict[str, dict[str, dict]] = {}  # hardware -> created_at -> the calibration
    broken: set[tuple[str, str]] = set()
    for hardware, device, name, value, passed, tolerance, at in rows:
        if admission.speed_rate_problem(name, value):
            broken.add((hardware, at))
            continue
        c = found.setdefault(hardware, {}).setdefault(
            at,
            {"at": at, "device": device, "spread": None, "rounds": None, "agreed": None, "tolerance": None},
        )
        if name == "speed_spread":
            c.update(spread=value, agreed=bool(passed), tolerance=tolerance)
        elif name == "speed_rounds":
            c["rounds"] = int(value)
        else:
            c[name] = value
    out: dict[str, dict] = {}
    for hardware, by_time in found.items():
        usable = [c for at, c in by_time.items() if (hardware, at) not in broken]
        if not usable:
            continue
        agreed = [c for c in usable if c["agreed"]]
        chosen = max(agreed or usable, key=lambda c: c["at"])
        out[hardware] = {**chosen, "calibrations": len(usable)}
    return out


def tuned_rates(conn: sqlite3.Connection, model: str, preset: str, config_hash: str) -> dict:
    """{(optimizer, 'full' | 'lora', accumulating): (lr, runs, effective batch)} that --tune-lr chose for a
    model's measured runs (those that record the grid of rates they were chosen from): by its config's hash,
    or a reference model by name at its preset. The most frequent rate where runs differ."""
    try:
        rows = conn.execute(
            "SELECT r.optimizer, r.strategy, json_extract(r.config, '$.lr'), "
            "json_extract(r.config, '$.batch_size'), json_extract(r.config, '$.accumulation_steps') "
            "FROM runs r LEFT JOIN groups g ON g.id = r.grp WHERE r.source = 'measured' AND r.status = 'ok' "
            "AND json_extract(r.config, '$.lr_grid') IS NOT NULL "
            "AND (g.config_hash = ? OR (r.model = ? AND r.preset = ?))",
            [config_hash, model, preset],
        ).fetchall()
    except sqlite3.DatabaseError:  # a KB without groups' config hashes (not migrated): no tuned rate read
        return {}
    found: dict[tuple, Counter] = {}
    for optimizer, strategy, lr, batch, steps in rows:
        if not isinstance(lr, int | float) or not isinstance(batch, int) or lr <= 0:
            continue
        accumulating = strategy.endswith("accumulation")
        window = steps if accumulating and isinstance(steps, int) else 1
        key = (optimizer, "lora" if strategy == "lora" else "full", accumulating)
        found.setdefault(key, Counter())[(float(lr), batch * window)] += 1
    return {
        key: (rate, sum(counts.values()), batch)
        for key, counts in found.items()
        for (rate, batch), _ in counts.most_common(1)
    }


def measured_values(conn: sqlite3.Connection, measure: str) -> list[tuple[str, float]]:
    """(hardware, value) of one measure over every ok run: what a prediction calibrates against."""
    rows = conn.execute(
        "SELECT r.hardware, m.value FROM metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE m.name = ? AND r.status = 'ok'",
        [measure],
    )
    return [(hardware, value) for hardware, value in rows]


def fit_validations(conn: sqlite3.Connection) -> list[dict]:
    """advisor fit's predictions checked against real steps, per hardware: how many, how close."""
    rows = conn.execute(
        "SELECT hardware, count(*), sum(passed), max(abs(value)), group_concat(value) FROM validations "
        "WHERE name LIKE ? GROUP BY hardware ORDER BY hardware",
        [FIT_CHECK],
    ).fetchall()
    out = []
    for hardware, n, passed, worst, values in rows:
        errors = sorted(abs(float(v)) for v in values.split(","))
        out.append(
            dict(hardware=hardware, checks=n, passed=passed, median=errors[len(errors) // 2], worst=worst)
        )
    return out
