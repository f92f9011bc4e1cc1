"""What makes two runs the same run, and two runs the same cell, in any KB: hashes of their provenance."""

from __future__ import annotations

import hashlib
import json

# Identity fields of a run: what makes two rows the same run, in any KB.
IDENTITY = (
    "source",
    "model",
    "optimizer",
    "strategy",
    "preset",
    "hardware",
    "seed",
    "started_at",
    "owner",
    "config",
)


def run_uid(run: dict) -> str:
    """A run's identity: a hash of its provenance (never of its outcome, which changes)."""
    config = run.get("config") or {}
    if isinstance(config, str):
        config = json.loads(config)
    payload = {k: run.get(k) for k in IDENTITY if k != "config"} | {"config": config}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cell_key(config: dict) -> str:
    """A stable hash of a run's configuration, seed excluded: runs with the same key repeat one cell."""
    payload = json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
