"""A stored KB held to advisor.kb.admission's rules in SQL, without loading it: what the user's KB read
beside the shipped one is checked against as it is opened (advisor.kb.open.check_read), and what `advisor kb
check` reports (with `advisor calibrate`'s rates that break theirs)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from advisor.kb import admission
from advisor.kb.admission import (
    _TIMES,
    AMOUNT,
    CONFIG_HASH,
    MAX_REPORTED,
    Choice,
    Number,
    _listed,
    _quoted,
    _shown,
    bounds,
    epoch_rule,
    metric_rules,
    run_rules,
)
from advisor.kb.migrations import STATUSES
from advisor.kb.queries.groups import SPEED_RATE
from advisor.kb.schema import columns
from advisor.rules import Rules


def _checks(db: str, rules: Rules | None) -> list[tuple[str, str, dict[str, str], str]]:
    """(table, FROM clause, {column: SQL true when it breaks its rule}, how a row is named) per table."""
    runs = run_rules(rules)
    metric = metric_rules(rules)
    by_bounds: dict[Number, list[str]] = {}
    for name in (*metric["name"].known, *_TIMES):
        by_bounds.setdefault(bounds(name), []).append(name)
    value = "CASE " + " ".join(
        f"WHEN m.name IN ({_listed(names)}) THEN {b.broken('m.value')}" for b, names in by_bounds.items()
    )
    value += f" ELSE {AMOUNT.broken('m.value')} END"
    epoch_cols = [c for c in columns("epochs") if c != "run_id"]
    group_cols = ("source", "hardware", "preset", "model", "family", "protocol", "data")
    cell = {"optimizer": runs["optimizer"], "strategy": runs["strategy"]}
    return [
        (
            "runs",
            f"{db}.runs r",
            {c: rule.broken(f"r.{c}") for c, rule in runs.items()},
            "r.uid",
        ),
        (
            "metrics",
            f"{db}.metrics m JOIN {db}.runs r ON r.id = m.run_id",
            {**{c: rule.broken(f"m.{c}") for c, rule in metric.items()}, "value": value},
            "r.uid || ' ' || m.name",
        ),
        (
            "epochs",
            f"{db}.epochs e",
            {c: epoch_rule(c).broken(f"e.{c}") for c in epoch_cols},
            "e.run_id || ' epoch ' || e.epoch",
        ),
        (
            "groups",
            f"{db}.groups g",
            {
                **{c: runs[c].broken(f"g.{c}") for c in group_cols},
                "n_params": runs["n_params"].broken("g.n_params"),
                "config_hash": CONFIG_HASH.broken("g.config_hash"),
            },
            "g.id",
        ),
        (
            "cell_status",
            f"{db}.cell_status c",
            {
                **{k: r.broken(f"c.{k}") for k, r in cell.items()},
                "status": Choice(STATUSES).broken("c.status"),
                "n": Number(0, 2**53, integer=True, required=True).broken("c.n"),
            },
            "c.grp",
        ),
        (
            "cell_stats",
            f"{db}.cell_stats c",
            {
                **{k: r.broken(f"c.{k}") for k, r in cell.items()},
                "n": Number(0, 2**53, integer=True, required=True).broken("c.n"),
                "total": _sums_broken("c.total", "c.n", "c.measure", by_bounds, "c.scale"),
                "total_sq": Number(0, 1e300, required=True).broken("c.total_sq"),
                "first_value": value.replace("m.value", "c.first_value").replace("m.name", "c.measure"),
            },
            "c.grp || ' ' || c.optimizer || ' ' || c.measure",
        ),
        (
            "seed_stats",
            f"{db}.seed_stats c",
            {
                "n": Number(0, 2**53, integer=True, required=True).broken("c.n"),
                "total": _sums_broken("c.total", "c.n", "c.measure", by_bounds),
            },
            "c.grp || ' ' || c.measure",
        ),
        (
            "pair_stats",
            f"{db}.pair_stats c",
            {
                "n": Number(0, 2**53, integer=True, required=True).broken("c.n"),
                "sum_d": Number(-1e300, 1e300, required=True).broken("c.sum_d"),
                "sum_dd": Number(0, 1e300, required=True).broken("c.sum_dd"),
            },
            "c.grp || ' ' || c.measure",
        ),
    ]


def _sums_broken(
    total: str, n: str, measure: str, by_bounds: dict[Number, list[str]], scale: str = "''"
) -> str:
    """A summed figure that cannot be n figures within their measure's bounds (a forged mean); a figure
    scaled by a runs column (host_ram % x host memory) by at most that column's bound, 1e6 GB."""
    k = f"(CASE WHEN {scale} = '' THEN 1 ELSE 1e6 END)"
    cases = " ".join(
        f"WHEN {measure} IN ({_listed(names)}) THEN "
        f"({total} < {n} * {k} * {b.lo!r} OR {total} > {n} * {k} * {b.hi!r})"
        for b, names in by_bounds.items()
    )
    return (
        f"(typeof({total}) NOT IN ('integer', 'real') OR CASE {cases} "
        f"ELSE ({total} < 0 OR {total} > {n} * {k} * {AMOUNT.hi!r}) END)"
    )


SUMMARIES = ("groups", "cell_status", "cell_stats", "seed_stats", "pair_stats")  # what answers compute from


def stored_problems(
    conn: sqlite3.Connection,
    db: str = "main",
    rules: Rules | None = None,
    tables: Iterable[str] | None = None,
) -> list[str]:
    """The rows of a stored KB (schema `db` of conn; `tables`, else all) that break a rule, as phrases (at
    most MAX_REPORTED), found by SQLite in one pass per table: what a KB read beside the shipped one is
    checked against (and, for the summaries answers are computed from, one read alone)."""
    out: list[str] = []
    for table, source, broken, label in _checks(db, rules):
        if tables is not None and table not in tables:
            continue
        which = " ".join(f"WHEN {sql} THEN {_quoted(col)}" for col, sql in broken.items())
        value = " ".join(f"WHEN {sql} THEN {_column(col, source)}" for col, sql in broken.items())
        rows = conn.execute(
            f"SELECT {label}, CASE {which} END AS col, CASE {value} END FROM {source} WHERE col IS NOT NULL "
            "LIMIT ?",
            [MAX_REPORTED - len(out)],
        ).fetchall()
        out += [f"{table} {ident}: {col} = {_shown(v)} breaks its rule" for ident, col, v in rows]
        if len(out) >= MAX_REPORTED:
            break
    return out


def _column(col: str, source: str) -> str:
    """The column a check reads, qualified by the alias its FROM gives the checked table."""
    alias = source.split(".", 1)[1].split()[1]
    return f"{alias}.{col}"


def speed_problems(conn: sqlite3.Connection, limit: int) -> list[str]:
    """`advisor calibrate`'s rows whose figure breaks its rule (speed_rate_problem), as check_kb says a
    broken row (at most `limit`)."""
    out = []
    rows = conn.execute("SELECT id, name, value FROM validations WHERE name LIKE ? ORDER BY id", [SPEED_RATE])
    for row_id, name, value in rows:
        if len(out) >= limit:
            break
        if problem := admission.speed_rate_problem(name, value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            out.append(f"validations {row_id} {name}: value = {shown} breaks its rule ({problem})")
    return out
