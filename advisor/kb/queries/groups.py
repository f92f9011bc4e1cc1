"""What several readers of a KB share: its evidence groups (read from the summaries), a group's id as a
person types it across the shipped KB and the user's read beside it, the filters on runs, and the one parse
of a stored JSON column."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field

SOURCE_KINDS = ("paper", "measured")


def source_kind(source: str) -> str:
    """'paper' for any paper:<arxiv id> source, else the source itself ('measured', 'import:...')."""
    return "paper" if source.startswith("paper:") else source


@dataclass(frozen=True)
class Group:
    """One evidence group: runs that may be ranked against each other (same source, hardware, scale, model,
    protocol: how they were measured, and data: what they trained on)."""

    source: str
    hardware: str
    preset: str
    model: str
    family: str
    n_runs: int
    n_seeds: int
    n_params: int | None = None  # the evidence model's size, where the runs state it
    protocol: str = (
        "paper"  # 'fair' (held-out loss, tuned rates), 'paper' (training loss, fixed epochs) or 'trainer'
    )
    data: str = ""  # 'generated', 'pranavmr/MM-IMDb@ad5b994', 'corpus.jsonl sha256:…'; '' not stated
    id: int | None = field(default=None, compare=False)  # the KB's groups.id (local to one KB)
    config_hash: str | None = field(default=None, compare=False)  # a user's model's config.json, hashed

    @property
    def kind(self) -> str:
        return source_kind(self.source)

    @property
    def label(self) -> str:
        seeds = f"{self.n_seeds} seeds" if self.n_seeds > 1 else "1 run per configuration"
        origin = f"paper {self.source.removeprefix('paper:')}" if self.kind == "paper" else self.source
        protocol = {"fair": ", fair protocol", "trainer": ", a Trainer run"}.get(self.protocol, "")
        yours = "your KB: " if self.own else ""
        return (
            f"{yours}{origin}, {self.model}, {self.hardware}, preset {self.preset}{protocol}, "
            f"{data_label(self.data)}, {seeds}"
        )

    @property
    def own(self) -> bool:
        """A group of the user's own KB, read beside the shipped one."""
        return is_users(self.id)

    @property
    def ref(self) -> str:
        """The group's id as a person types it (`--group`): '11' in the shipped KB (or a KB read alone),
        'u3' in the user's, read beside it."""
        return group_ref(self.id)

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "hardware": self.hardware,
            "preset": self.preset,
            "model": self.model,
            "family": self.family,
            "protocol": self.protocol,
            "data": self.data,
            "runs": self.n_runs,
            "seeds": self.n_seeds,
            "parameters": self.n_params,
            "label": self.label,
            "yours": self.own,
            "id": self.ref,
        }


def data_label(data: str) -> str:
    """The data of a group as an answer names it."""
    if data == "generated":
        return "generated data"
    return f"data {data}" if data else "data not stated"


# The user's KB read beside the shipped one: its row ids are shifted by this much, so that no id of one
# equals an id of the other and every reference (a run's metrics, a group's summaries) stays within its KB.
USER_ID_OFFSET = 1 << 40


def group_ref(row_id: int | None) -> str | None:
    """A group's row id as a person types it: '11', or 'u3' for the user's KB read beside the shipped one."""
    if row_id is None:
        return None
    return f"u{row_id - USER_ID_OFFSET}" if is_users(row_id) else str(row_id)


def group_id_of(ref: str) -> int | None:
    """The row id a typed group id names ('11', 'u3'; see Group.ref), or None when it names none."""
    text = ref.strip().lower()
    own = text.startswith("u")
    digits = text[1:] if own else text
    if not digits.isdigit() or int(digits) < 1:
        return None
    return int(digits) + (USER_ID_OFFSET if own else 0)


def is_users(group_or_run_id: int | None) -> bool:
    """Whether a row read through `read_together` comes from the user's KB."""
    return group_or_run_id is not None and group_or_run_id >= USER_ID_OFFSET


def run_filter(source: str | None = None, **equal) -> tuple[list[str], list]:
    """WHERE terms for runs: `source` is a kind ('paper' means any paper:<id>) or an exact source."""
    where, params = [], []
    if source == "paper":
        where.append("source LIKE 'paper:%'")
    elif source:
        where.append("source = ?")
        params.append(source)
    for column, value in equal.items():
        if value:
            where.append(f"{column} = ?")
            params.append(value)
    return where, params


def evidence_groups(
    conn: sqlite3.Connection, family: str | None = None, source: str | None = None, model: str | None = None
) -> list[Group]:
    """Every evidence group, optionally of one family, source kind (or exact source) and model: read from
    the summaries (advisor/kb/summaries.py), never from the runs."""
    where, params = run_filter(family=family, source=source, model=model)
    where = [w.replace("source", "g.source", 1) if w.startswith("source") else f"g.{w}" for w in where]
    sql = (
        "SELECT g.source, g.hardware, g.preset, g.model, g.family, sum(c.n), max(c.n), g.n_params, g.protocol, "
        "g.data, g.id, g.config_hash FROM groups g JOIN (SELECT grp, optimizer, strategy, sum(n) AS n FROM cell_status "
        "GROUP BY grp, optimizer, strategy) c ON c.grp = g.id "
        + ("WHERE " + " AND ".join(where) if where else "")
        + " GROUP BY g.id ORDER BY g.family, g.source, g.hardware, g.preset, g.model, g.protocol, g.data"
    )
    return [Group(*r) for r in conn.execute(sql, params)]


def group_row_id(conn: sqlite3.Connection, group: Group) -> int | None:
    if group.id is not None:
        return group.id
    row = conn.execute(
        "SELECT id FROM groups WHERE source = ? AND hardware = ? AND preset = ? AND model = ? AND family = ? "
        "AND protocol = ? AND data = ?",
        [group.source, group.hardware, group.preset, group.model, group.family, group.protocol, group.data],
    ).fetchone()
    return row[0] if row else None


def sources(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT DISTINCT source FROM runs ORDER BY source")]


FIT_CHECK = (
    "fit_%"  # validations of advisor fit's predictions (bench/fit_accuracy.py), not advisor validate's
)
SPEED_RATE = "speed_%"  # `advisor calibrate`'s rates (advisor/measuring/device_speed.py), not checks


def json_value(text: str | None) -> object:
    """A JSON column's value ({} where it is NULL), or ValueError however it is not JSON (nested too deeply
    included): the one parse of a stored JSON column, for every reader."""
    if text is None:
        return {}
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {e}") from e
