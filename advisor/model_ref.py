"""Resolving `--model NAME|HF_ID|PATH` to a family offline, from config.json's model_type (no transformers import)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from advisor.rules import Family, Rules


class ModelNotResolved(Exception):
    """The model's family cannot be found without the network."""


@dataclass(frozen=True)
class ResolvedModel:
    name: str  # as the KB stores it: 'vit', an HF id, or a path
    family: Family
    model_type: str | None
    config_path: Path | None


def resolve_model(name: str, rules: Rules) -> ResolvedModel:
    """A reference model name ('vit'), a local folder with config.json, or an HF id found in the local cache."""
    for fam in rules.families.values():
        if name.lower() == fam.reference_model:
            return ResolvedModel(fam.reference_model, fam, None, None)
    config_path = config_path_of(name)
    if config_path is None:
        raise ModelNotResolved(
            f"cannot resolve model {name!r} offline: it is not one of "
            f"{', '.join(f.reference_model for f in rules.families.values())}, not a folder with a config.json, "
            "and not in the local Hugging Face cache. Pass --arch FAMILY instead, or download the model first."
        )
    model_type = read_config(config_path).get("model_type")
    if not model_type:
        raise ModelNotResolved(f"{config_path} has no model_type; pass --arch FAMILY instead.")
    family = rules.family_of_model_type(model_type)
    if family is None:
        from advisor.rules import user_rules_dir

        where = user_rules_dir() / "families.toml"
        raise ModelNotResolved(
            f"model_type {model_type!r} of {name!r} belongs to no family in the rules; pass --arch FAMILY, "
            f'or add it to a family in {where}, e.g. [families.decoder] model_types = ["{model_type}"].'
        )
    return ResolvedModel(name, family, model_type, config_path)


def read_config(path: Path) -> dict:
    """A config.json as a dict, or ModelNotResolved with a sentence (unreadable, not UTF-8, not JSON, not an object)."""
    try:
        config = json.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as e:
        raise ModelNotResolved(f"cannot read {path}: {e.strerror or e}.") from e
    except UnicodeDecodeError as e:
        raise ModelNotResolved(f"{path} is not UTF-8 text, so not a config.json.") from e
    except json.JSONDecodeError as e:
        raise ModelNotResolved(f"{path} is not valid JSON ({e.msg} at line {e.lineno}).") from e
    if not isinstance(config, dict):
        raise ModelNotResolved(
            f"{path} holds a JSON {type(config).__name__}, not a model config (an object)."
        )
    return config


def config_path_of(name: str) -> Path | None:
    """config.json of a local folder (or the file itself) or of an HF id in the local cache, or None."""
    return _local_config(name) or _cached_config(name)


def _local_config(name: str) -> Path | None:
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file() and path.name == "config.json":
        return path
    return None


def _cached_config(repo_id: str) -> Path | None:
    """config.json of an HF id in the hub cache (the layout huggingface_hub writes), newest snapshot first."""
    if repo_id.count("/") != 1:
        return None
    hub = Path(
        os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub"
    )
    snapshots = hub.expanduser() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    configs = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return configs[0] if configs else None
