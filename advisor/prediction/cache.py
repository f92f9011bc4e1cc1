"""Predictions cached in the KB a write would go to, keyed by everything they depend on (the config, shape,
precision, implementations and versions): a repeated question is answered without torch."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import store
from advisor.kb.schema import connect_readonly
from advisor.places import resolve_write_path
from advisor.prediction.question import Question
from advisor.prediction.step import ENGINE_VERSION


def software() -> dict:
    out = {"engine": ENGINE_VERSION}
    for pkg in ("torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def prediction_key(q: Question, optimizer: str, strategy: str, soft: dict) -> str:
    """Everything a prediction depends on, hashed: the config, shape, precision, implementations, versions."""
    parts = {
        "config": q.model.config_hash,
        "seq_len": q.seq_len,
        "image_size": q.image_size,
        "dtype": q.dtype,
        "device": q.device,
        "optimizer": optimizer,
        "strategy": strategy,
        **soft,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


@dataclass
class PredictionCache:
    """Where predictions are read (`read`: the KB, when it exists and is usable) and stored (`path`)."""

    read: sqlite3.Connection | None
    path: Path | None

    def get(self, keys: list[str]) -> dict[str, dict]:
        """key -> payload of the predictions the KB holds."""
        if self.read is None or not keys:
            return {}
        marks = ",".join("?" * len(keys))
        rows = self.read.execute(f"SELECT key, payload FROM predictions WHERE key IN ({marks})", keys)
        return {k: json.loads(p) for k, p in rows}

    def put(self, q: Question, fresh: dict[tuple[str, str], dict], keys: dict, soft: dict) -> None:
        """Store freshly traced payloads, one row per (optimizer, strategy)."""
        if self.path is None:
            return
        rows = [
            {
                "key": keys[(o, s)],
                "model": q.model.name,
                "config_hash": q.model.config_hash,
                "model_type": q.model.model_type,
                "family": q.model.family.name if q.model.listed else None,
                "optimizer": o,
                "strategy": s,
                "dtype": q.dtype,
                "seq_len": q.seq_len,
                "image_size": q.image_size,
                "device": q.device,
                "software": soft,
                "payload": payload,
            }
            for (o, s), payload in fresh.items()
        ]
        with store.writing(self.path) as conn:
            store.add_predictions(conn, rows)

    def missing(self, q: Question) -> bool:
        """Whether answering `q` needs tracing (torch): some prediction is not in the cache."""
        soft = software()
        keys = [prediction_key(q, o, s, soft) for o in q.optimizers for s in q.strategies]
        return len(self.get(keys)) < len(keys)

    def close(self) -> None:
        if self.read is not None:
            self.read.close()


def open_cache(db) -> PredictionCache:
    """Predictions are read from and cached in the KB a write would go to (--db, $ADVISOR_DB, the user's)."""
    path = resolve_write_path(db)
    if not path.exists():
        return PredictionCache(None, path)
    try:
        return PredictionCache(connect_readonly(path), path)
    except KBError:
        return PredictionCache(
            None, path
        )  # an older or foreign KB: fit still answers; caching says what is wrong
