"""Predictions cached in the KB a write would go to, keyed by everything they depend on (the config, shape,
precision, implementations and versions): a repeated question is answered without torch."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from advisor.errors import KBError
from advisor.kb import store
from advisor.kb.schema import connect_readonly
from advisor.places import resolve_write_path
from advisor.prediction.question import Question
from advisor.prediction.sharding import basis
from advisor.prediction.step import ENGINE_VERSION, Config
from advisor.rules import Rules

LIBRARIES = ("peft", "bitsandbytes", "torchao", "schedulefree")  # what some configurations trace


@cache  # read once per process: each version is a file read
def software() -> dict:
    """The versions predictions depend on: the engine, torch, transformers and the menu's libraries."""
    from importlib.metadata import PackageNotFoundError, version  # 10 ms: only where a prediction is read

    out = {"engine": ENGINE_VERSION}
    for pkg in ("torch", "transformers", *LIBRARIES):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _libraries(config: Config, package: str | None) -> set[str]:
    """The menu's libraries a configuration's trace runs: a version change of another leaves it valid."""
    out = {package} if package else set()
    if config.adapter != "full":
        out.add("peft")
    if config.adapter == "qlora":
        out.add("bitsandbytes")
    return out


def prediction_key(
    q: Question, config: Config, soft: dict, package: str | None = None, modelled: dict | None = None
) -> str:
    """Everything a prediction depends on, hashed: the config, shape, precision, what trains, attention,
    implementations, versions (`package`: the optimizer's library, rules/optimizers.toml; `modelled`: what
    rules/fit.toml models of its step, baked into the payload)."""
    return _key(_shared(q, soft), q, config, soft, package, modelled)


def _shared(q: Question, soft: dict) -> str:
    """What every prediction of a question depends on alike."""
    parts = {
        "config": q.model.config_hash,
        "seq_len": q.seq_len,
        "image_size": q.image_size,
        "device": q.device,
        "attention": q.traced_attention,
        **{k: v for k, v in soft.items() if k not in LIBRARIES},
    }
    return json.dumps(parts, sort_keys=True)


def _key(shared: str, q: Question, config: Config, soft: dict, package, modelled) -> str:
    parts = {
        "dtype": config.dtype,
        "optimizer": config.optimizer,
        "strategy": config.strategy,
        "offload": config.offload,
        "sharding": config.sharding,
        **{k: v for k, v in q.adapter_of(config.adapter).key().items() if k != "alpha"},  # alpha: no memory
        "modelled": modelled,
        **{k: soft[k] for k in sorted(_libraries(config, package))},
    }
    return hashlib.sha256((shared + json.dumps(parts, sort_keys=True)).encode()).hexdigest()


_KEYS: dict[int, tuple[Question, dict]] = {}  # the last question's keys: asked twice per answer


def keys_of(q: Question, rules: Rules, soft: dict) -> dict[Config, str]:
    """The cache key of each traced configuration a question reads (its configurations' bases: sharding.py)."""
    memo = _KEYS.get(id(q))
    if memo is not None and memo[0] is q:
        return memo[1]
    modelled = rules.fit.get("optimizers", {})
    shared = _shared(q, soft)
    traced = dict.fromkeys(basis(c) for c in q.configs)
    keys = {
        c: _key(shared, q, c, soft, rules.optimizer_info[c.optimizer].package, modelled.get(c.optimizer))
        for c in traced
    }
    _KEYS.clear()
    _KEYS[id(q)] = (q, keys)
    return keys


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

    def put(self, q: Question, fresh: dict[Config, dict], keys: dict[Config, str], soft: dict) -> None:
        """Store freshly traced payloads, one row per configuration."""
        if self.path is None:
            return
        rows = [
            {
                "key": keys[c],
                "model": q.model.name,
                "config_hash": q.model.config_hash,
                "model_type": q.model.model_type,
                "family": q.model.family.name if q.model.listed else None,
                "optimizer": c.optimizer,
                "strategy": c.strategy,
                "dtype": c.dtype,
                "seq_len": q.seq_len,
                "image_size": q.image_size,
                "device": q.device,
                "software": soft,
                "payload": {
                    **payload,
                    "configuration": {
                        "adapter": q.adapter_of(c.adapter).key(),
                        "offload": c.offload,
                        "sharding": c.sharding,
                        "attention": q.traced_attention,
                    },
                },
            }
            for c, payload in fresh.items()
        ]
        with store.writing(self.path) as conn:
            store.add_predictions(conn, rows)

    def missing(self, q: Question, rules: Rules) -> bool:
        """Whether answering `q` needs tracing (torch): some prediction is not in the cache."""
        keys = list(keys_of(q, rules, software()).values())
        if self.read is None:
            return True
        marks = ",".join("?" * len(keys))
        (n,) = self.read.execute(f"SELECT count(*) FROM predictions WHERE key IN ({marks})", keys).fetchone()
        return n < len(set(keys))

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
