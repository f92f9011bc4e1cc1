"""Predictions cached in the KB a write would go to, keyed by everything they depend on (the config, shape,
precision, implementations and versions): a repeated question is answered without torch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from advisor.errors import KBError
from advisor.kb.open import connect_kb_readonly, writing
from advisor.kb.queries.for_prediction import prediction_payloads, predictions_held, traced_predictions
from advisor.places import resolve_write_path
from advisor.prediction.question import Question
from advisor.prediction.sharding import basis
from advisor.prediction.step import ENGINE_VERSION, Config
from advisor.rules import Rules

LIBRARIES = ("peft", "bitsandbytes", "torchao", "schedulefree")  # what some configurations trace


@cache  # read once per process: each version is a file read
def software() -> dict:
    """The versions predictions depend on: the engine, torch, transformers and the menu's libraries."""
    return {"engine": ENGINE_VERSION} | {
        pkg: installed_version(pkg) for pkg in ("torch", "transformers", *LIBRARIES)
    }


def installed_version(name: str) -> str | None:
    """What `importlib.metadata.version(name)` says (None: not installed), read as it reads it: the first
    folder on sys.path holding the package's metadata, its one `.dist-info` there, its METADATA's Version.
    Written by hand because importlib.metadata's import (email, zipfile, csv) is 25-30 ms of a 0.3 s cached
    answer; anything else (an egg, a zip on sys.path, two versions side by side) is left to it."""
    wanted = (
        re.sub(r"[-_.]+", "_", name).lower(),
        name.lower().replace("-", "_"),
    )  # an egg's legacy spelling
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except NotADirectoryError:  # a zip on sys.path: importlib.metadata reads inside it
            return _metadata_version(name)
        except OSError:
            continue
        found = [n for n in names if _metadata_of(n) in wanted]
        if not found:
            continue
        if len(found) > 1 or not found[0].endswith(".dist-info"):
            return _metadata_version(name)
        version = _version_field(Path(entry or ".") / found[0] / "METADATA")
        return version if version is not None else _metadata_version(name)
    return None


def _metadata_of(child: str) -> str | None:
    """The normalized project name a folder entry holds metadata of ('torch-2.13.0+cpu.dist-info': 'torch')."""
    low = child.lower()
    if not low.endswith((".dist-info", ".egg-info")):
        return None
    base = low.rpartition(".")[0].partition("-")[0]
    return base if low.endswith(".egg-info") else re.sub(r"[-_.]+", "_", base)


def _version_field(path: Path) -> str | None:
    """The Version header of a METADATA file (None: unreadable, or no plain one)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    return None  # the headers ended without one
                if line.startswith("Version:"):
                    version = line[len("Version:") :].strip()
                    return version if version and " " not in version else None
    except (OSError, UnicodeDecodeError):
        return None
    return None


def _metadata_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


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
        **q.method_of(config.adapter).key(),  # nothing for Trainer's step: its keys as they always were
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
    """Where predictions are read (`read`: the KB, when it exists and is usable) and stored (`path`), and
    why the last store failed (`unwritten`), if it did."""

    read: sqlite3.Connection | None
    path: Path | None
    unwritten: str | None = field(default=None, init=False)  # set by put: never a positional argument

    def get(self, keys: list[str]) -> dict[str, dict]:
        """key -> payload of the predictions the KB holds."""
        if self.read is None or not keys:
            return {}
        return prediction_payloads(self.read, keys)

    def put(self, q: Question, fresh: dict[Config, dict], keys: dict[Config, str], soft: dict) -> None:
        """Store freshly traced payloads, one row per configuration. A KB that cannot be written (a read-only
        file or folder, a full disk) costs the caching, never the answer: why is kept in `unwritten`."""
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
                        **q.method_of(c.adapter).key(),
                    },
                },
            }
            for c, payload in fresh.items()
        ]
        # the KB's writer (its admission checks: 8 ms of imports) is loaded only to store: a cached answer never
        from advisor.kb.store import add_predictions

        try:
            with writing(self.path) as conn:
                add_predictions(conn, rows)
        except (KBError, sqlite3.OperationalError) as e:
            if isinstance(e, KBError) and not isinstance(e.__cause__, sqlite3.OperationalError | OSError):
                raise  # a KB that is not advisor's (another application's, a newer one, an empty file): refused
            self.unwritten = str(e)  # a read-only file or folder, a full disk: the answer stands

    def missing(self, q: Question, rules: Rules) -> bool:
        """Whether answering `q` needs tracing (torch): some prediction is not in the cache."""
        keys = list(keys_of(q, rules, software()).values())
        if self.read is None:
            return True
        return predictions_held(self.read, keys) < len(set(keys))

    def close(self) -> None:
        if self.read is not None:
            self.read.close()


def open_cache(db) -> PredictionCache:
    """Predictions are read from and cached in the KB a write would go to (--db, $ADVISOR_DB, the user's)."""
    path = resolve_write_path(db)
    if not path.exists():
        return PredictionCache(None, path)
    try:
        return PredictionCache(connect_kb_readonly(path), path)
    except KBError:
        return PredictionCache(
            None, path
        )  # an older or foreign KB: fit still answers; caching says what is wrong


FULL = {"adapter": "full"}  # a full fine-tuning trace's adapter, as the cache stores it


@dataclass
class Traced:
    """One model at one shape as advisor fit's cache in the KB holds it: its traces, each with its
    configuration, the adapter settings and the attention it was traced with."""

    name: str  # as `advisor fit --model` was given it: a reference name, a Hugging Face id, a folder
    family: str | None
    seq_len: int | None
    image_size: int | None
    device: str  # cuda | cpu: which implementations were traced
    # each trace: its configuration, adapter settings (the cache's key), attention and payload
    traces: list[tuple[Config, dict, str, dict]] = field(default_factory=list)
    method: str = "trainer"  # the step traced: Trainer's or TRL's SFT (REPORTED)

    def options(self) -> dict:
        """The FitRequest the traces answer: the LoRA settings and attention most of them were traced with."""
        lora = Counter(_settings(a) for _, a, _, _ in self.traces if a != FULL).most_common(1)
        bits = Counter(a["base_bits"] for _, a, _, _ in self.traces if a["adapter"] == "qlora").most_common(1)
        attention = Counter(at for _, _, at, _ in self.traces).most_common(1)[0][0]
        r, alpha, targets = json.loads(lora[0][0]) if lora else (16, None, ())
        return dict(
            lora_r=r,
            lora_alpha=alpha,
            lora_targets=tuple(targets),
            base_bits=bits[0][0] if bits else 4,
            attention=attention,
            method=self.method,
        )

    def payloads(self, q: Question) -> dict[Config, dict]:
        """The traces a question reads: those of its adapter settings (alpha aside: it costs no memory) and
        attention."""
        return {
            c: payload
            for c, adapter, attention, payload in self.traces
            if attention == q.traced_attention and _same(adapter, q.adapter_of(c.adapter).key())
        }


def _settings(adapter: dict) -> str:
    """An adapter's LoRA settings as one comparable value: [r, alpha, targets]."""
    return json.dumps([adapter.get("r", 16), adapter.get("alpha"), sorted(adapter.get("targets", ()))])


def _same(stored: dict, asked: dict) -> bool:
    """Whether a trace's adapter is the one a question asks, alpha aside."""
    return _without_alpha(stored) == _without_alpha(asked)


def _without_alpha(adapter: dict) -> str:
    """An adapter key as one comparable value, alpha left out (it scales, it costs no memory)."""
    return json.dumps(
        {k: list(v) if isinstance(v, tuple) else v for k, v in adapter.items() if k != "alpha"},
        sort_keys=True,
    )


REPORTED = ("trainer", "sft")  # the steps traced_models keeps


def traced_models(conn: sqlite3.Connection) -> list[Traced]:
    """Every model, shape and step (Trainer's or TRL's SFT: the steps a fine-tuning report shows) the KB holds
    traces of, in the order of their names."""
    found: dict[tuple, Traced] = {}
    rows = traced_predictions(conn)
    for model, config_hash, seq_len, image_size, device, family, optimizer, strategy, dtype, text in rows:
        payload = json.loads(text)
        what = payload.get("configuration") or {}
        method = what.get("method", "trainer")
        if method not in REPORTED or "loss" in what:  # preference, reward, RL steps; Liger's loss
            continue
        key = (model, config_hash, seq_len, image_size, device, method)
        traced = found.setdefault(key, Traced(model, family, seq_len, image_size, device, method=method))
        adapter = what.get("adapter", FULL)
        offload, sharding = what.get("offload", "none"), what.get("sharding", "none")
        config = Config(adapter["adapter"], dtype, optimizer, strategy, offload, sharding)
        traced.traces.append((config, adapter, what.get("attention", "sdpa"), payload))
    return list(found.values())


@dataclass
class StoredPredictions(PredictionCache):
    """advisor fit's cache as the report reads it: the traces of one model and shape, found by configuration
    rather than by the key a trace was stored under (that hashes the versions of torch and transformers of the
    machine that traced it, which the machine making the report need not have); never written."""

    payloads: dict[str, dict] = field(default_factory=dict)  # the question's keys -> traces

    def get(self, keys: list[str]) -> dict[str, dict]:
        return {k: self.payloads[k] for k in keys if k in self.payloads}
