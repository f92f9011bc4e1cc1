"""The KBs a plan reads, and the figures of their past runs on the target hardware (advisor.measuring.planning.plan).

Every KB in sight is read, each alone and read-only: the one `advisor measure` writes (--db, $ADVISOR_DB,
else yours), yours, and the shipped one; a figure comes from the first that has it. From their `ok` runs:
a cell's mean wall time, claim to finish (the mean: the KB keeps whole seconds, whose rounding the mean
averages out); a model shape's median seconds per update of each optimizer × strategy, its mean start-up
(a run's wall time less its epochs' training time) of each strategy at each protocol and length, its median
peak RSS, and the median GFLOP/s achieved.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from advisor.errors import KBError
from advisor.kb.lease import cells_ended_here
from advisor.kb.open import open_for_reading
from advisor.kb.queries.for_planning import past_runs
from advisor.measuring.recipe.config import RunConfig
from advisor.places import exists, resolve_db_path, shipped_kb_path, user_kb_path


@dataclass(frozen=True)
class PastFigure:
    """A measured figure, the runs it is of (0: timed by this plan), and where it came from."""

    value: float
    runs: int
    kb: str  # a KB's label (KB.label), or how the plan priced it (plan.CALIBRATION, plan.ESTIMATE, fit)


# --- the KBs a plan reads -------------------------------------------------------------------------------


@dataclass
class KB:
    """One KB a plan reads: its label, its path, its read-only connection (None: absent, empty or not
    readable) and why it was not read, when it exists but could not be."""

    label: str
    path: Path
    conn: sqlite3.Connection | None = None
    problem: str | None = None

    def as_dict(self) -> dict:
        return {
            "kb": self.label,
            "path": str(self.path),
            "read": self.conn is not None,
            "problem": self.problem,
        }


def open_kbs(db) -> list[KB]:
    """Every KB in sight, the one measure writes first: --db or $ADVISOR_DB (else yours), yours, the
    shipped one; each once, each alone and read-only (advisor.kb.open.open_for_reading)."""
    if db or os.environ.get("ADVISOR_DB"):
        first = ("--db" if db else "$ADVISOR_DB", resolve_db_path(db))
    else:
        first = ("your KB", user_kb_path())
    out: list[KB] = []
    for label, path in (first, ("your KB", user_kb_path()), ("shipped KB", shipped_kb_path())):
        if not any(_same_file(Path(path), kb.path) for kb in out):
            out.append(_open(label, Path(path)))
    return out


def _open(label: str, path: Path) -> KB:
    try:
        absent = not exists(path) or (path.is_file() and path.stat().st_size == 0)  # measure creates it
    except OSError:
        absent = False
    if absent:
        return KB(label, path)
    try:
        return KB(label, path, open_for_reading(path))
    except KBError as e:
        return KB(label, path, problem=str(e))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and a.samefile(b))
    except OSError:
        return False


def cells_done(read, hardware: str) -> set[tuple[str, int]]:
    """(cell key, seed) of the cells that already ended (ok, oom, diverged, untrained) on `hardware` in the
    KB measure writes, and the tuning runs that trained on another (lease.PORTABLE): it would skip them."""
    if read is None:
        return set()
    return cells_ended_here(read, hardware)


# --- past runs ------------------------------------------------------------------------------------------

# What a step's cost depends on besides the optimizer and strategy, as a run's config states it; and what
# a run's start-up depends on besides its shape and strategy (how many evaluations, of how many examples).
SHAPE_FIELDS = (
    "model",
    "preset",
    "batch_size",
    "dtype",
    "accumulation_steps",
    "seq_len",
    "image_size",
    "device",
)
LENGTH_FIELDS = ("protocol", "epochs", "steps_per_epoch", "eval_examples")


def shape_of(cfg: RunConfig) -> tuple:
    """A planned cell's model shape: SHAPE_FIELDS, and whether it trains on the generated corpus."""
    return (*(getattr(cfg, f) for f in SHAPE_FIELDS), cfg.data == "generated")


def length_of(cfg: RunConfig) -> tuple:
    return tuple(getattr(cfg, f) for f in LENGTH_FIELDS)


@dataclass
class History:
    """What past runs on the target hardware measured, each figure from the first KB that has it."""

    walls: dict = field(default_factory=dict)  # cell key -> its ok runs' mean wall time
    steps: dict = field(default_factory=dict)  # (shape, optimizer, strategy) -> median s per update
    startups: dict = field(default_factory=dict)  # (shape, length, strategy) -> mean wall less training
    rss: dict = field(default_factory=dict)  # (shape, optimizer, strategy) -> median peak RSS, GB
    gflops: dict = field(default_factory=dict)  # (model, preset), and None for all -> median GFLOP/s

    def add(self, other: History) -> None:
        """`other`'s figures where this history has none (KBs are added in order of trust)."""
        for name in ("walls", "steps", "startups", "rss", "gflops"):
            mine = getattr(self, name)
            for key, figure in getattr(other, name).items():
                mine.setdefault(key, figure)


def read_history(kbs: list[KB], target, models: set[str]) -> History:
    """The figures of every readable KB's ok runs of `models` on hardware `target` accepts, the first KB
    first. A KB whose reading fails (its time bound, a damaged page) is left out, and why is kept."""
    history = History()
    for kb in kbs:
        if kb.conn is None:
            continue
        try:
            rows = past_runs(kb.conn, target, models)
        except sqlite3.DatabaseError as e:
            kb.problem = f"reading {kb.path} failed ({e}); its runs are left out"
            continue
        history.add(_history_of(rows, kb.label))
    return history


def _history_of(rows, label: str) -> History:
    """One KB's figures from its runs' rows (for_planning.past_runs); a row whose config cannot be read is left out."""
    walls, steps, startups, rss, gflops = {}, {}, {}, {}, {}
    for key, source, config, optimizer, strategy, data, wall, trained, updates, untimed, peak, rate in rows:
        run = _config(config)
        if run is None:
            continue
        shape = (*(run.get(f) for f in SHAPE_FIELDS), data == "generated")
        pair, length = (shape, optimizer, strategy), tuple(run.get(f) for f in LENGTH_FIELDS)
        if source == "measured" and _finite(wall):
            walls.setdefault(key, []).append(wall)
        if _finite(trained) and updates and not untimed:
            steps.setdefault(pair, []).append(trained / updates)
            if _finite(wall):
                startups.setdefault((shape, length, strategy), []).append(wall - trained)
        if _finite(peak):
            rss.setdefault(pair, []).append(peak)
        if _finite(rate):
            for by in ((run.get("model"), run.get("preset")), None):
                gflops.setdefault(by, []).append(rate)
    return History(
        walls=_figures(walls, statistics.fmean, label),
        steps=_figures(steps, statistics.median, label),
        startups=_figures(startups, lambda v: max(0.0, statistics.fmean(v)), label),
        rss=_figures(rss, statistics.median, label),
        gflops=_figures(gflops, statistics.median, label),
    )


def _config(text) -> dict | None:
    """A run's stored config, if it is a JSON object of plain values (a KB is untrusted input)."""
    try:
        config = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    plain = (str, int, float, bool, type(None))
    return config if all(isinstance(config.get(f), plain) for f in SHAPE_FIELDS + LENGTH_FIELDS) else None


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _figures(values: dict, summary, label: str) -> dict:
    return {key: PastFigure(summary(v), len(v), label) for key, v in values.items()}
