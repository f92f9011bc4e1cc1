"""Resolving `--model NAME|PATH|HF_ID` once into a `ResolvedModel` that every later step receives: its name
as the KB stores it, its family's rules record, and its config.json read once (no transformers import).
Only the entry points call `resolve_model`: the command line, the Python API, grid planning.

A name is tried as a reference model ('llama'), a local folder, a published model advisor ships the config
of ('llama-3.1-8b', models/index.toml), the Hugging Face cache, and last the Hub (config.json alone)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from functools import cache, cached_property
from pathlib import Path

from advisor.errors import ModelNotResolved, UnsupportedModel
from advisor.model_config import MOST_CONFIG_BYTES, parse, printable
from advisor.places import shipped_models_dir, user_rules_dir
from advisor.rules import FamilyRecord, Rules
from advisor.rules_files import toml_data


@dataclass(frozen=True)
class ResolvedModel:
    """A model as the rest of advisor knows it. Frozen and picklable: a grid cell ships it to its process."""

    name: str  # as the KB stores it: 'vit', an HF id, or a path
    family: FamilyRecord  # whose inputs, loss and evidence apply
    config: dict | None = None  # config.json as read; None for a reference model (its family builds it)
    config_path: Path | None = None
    listed: bool = True  # the family lists its model_type (False: told by the end of its class name)
    preset: str = "paper"  # a reference model's size: tiny, small, paper (its family builds it so)
    hub: str | None = None  # a shipped variant's own Hub id (an instruct model: models/index.toml `variants`)
    architecture_of: str | None = None  # the shipped model whose config a variant shares ('Qwen2.5-7B')

    @property
    def hub_id(self) -> str:
        """What `from_pretrained` loads: a published model's (or variant's) Hub id, the Hugging Face id or folder
        as given, or the published model of a reference model's size (rules/families.toml `hub`)."""
        if self.hub:
            return self.hub
        if self.twinned:
            return self.family.hub
        shipped = (
            shipped_model(self.name)
            if self.config_path and self.config_path.is_relative_to(shipped_models_dir())
            else None
        )
        return shipped_models()[shipped[0]]["hub"] if shipped else self.name

    @property
    def twinned(self) -> bool:
        """A reference model ('vit') whose family names the published model of its paper size to load."""
        return self.reference and self.name == self.family.reference_model and bool(self.family.hub)

    @property
    def reference(self) -> bool:
        """One of the families' reference models ('vit', 'llama', ...), built by its family at a preset."""
        return self.config is None

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type") if self.config else None

    @cached_property
    def config_hash(self) -> str:
        """What predictions of this model are keyed by: its config, or a reference model's name."""
        text = (
            f"reference:{self.name}:{self.preset}"
            if self.reference
            else json.dumps(self.config, sort_keys=True)
        )
        import hashlib  # 3 ms (OpenSSL): only where a prediction is keyed

        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def max_seq_len(self) -> int | None:
        """The most positions the config allows (None: a reference model, or not stated)."""
        text = self.config and (self.config.get("text_config") or self.config)
        return next(
            (text[k] for k in ("max_position_embeddings", "n_positions") if text and text.get(k)), None
        )

    @cached_property
    def approx_params(self) -> int | None:
        """About how many parameters the config builds (None: a reference model, or a config this cannot read):
        enough to state a scale ratio between this model and the evidence, never a prediction's figure."""
        return config_params(self.config) if self.config else None

    @property
    def experts(self) -> bool:
        """A mixture of experts: its config names more than one expert per layer."""
        text = self.config and (self.config.get("text_config") or self.config)
        return bool(text) and any(isinstance(text.get(k), int) and text[k] > 1 for k in EXPERT_KEYS)

    @property
    def image_size(self) -> int | None:
        """The image side the config states, for a family that takes images."""
        if not self.config or not self.family.takes_images:
            return None
        return (self.config.get("vision_config") or self.config).get("image_size")


EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # a config's experts per layer
GATED = ("silu", "swish", "swiglu", "geglu")  # activations of a gated MLP: three matrices, not two
GATED_TYPES = ("gemma", "modernbert")  # model types whose MLP is gated whatever their activation's name


def config_params(config: dict) -> int | None:
    """A transformer's parameter count from its config.json's dimensions (embeddings, attention with grouped
    keys and values, a gated or plain MLP, experts): torch-free, within a few percent of the built model for
    the families the rules list (tests/test_model_size.py checks it against transformers on meta).
    Written by hand because the alternative, building the model on the meta device, imports torch (2 s)."""
    text = config.get("text_config") or config
    get = lambda *keys: next((text[k] for k in keys if isinstance(text.get(k), int)), None)  # noqa: E731
    h, layers = get("hidden_size", "n_embd", "d_model"), get("num_hidden_layers", "n_layer")
    patch = get("patch_size")  # a vision model embeds patches of pixels, not tokens
    vocab = get("vocab_size") or (patch and (get("num_channels") or 3) * patch * patch)
    if not (h and layers and vocab):
        return None
    heads = get("num_attention_heads", "n_head") or 1
    head_dim = get("head_dim") or h // heads
    kv = get("num_key_value_heads") or heads
    attention = h * head_dim * (2 * heads + 2 * kv)
    act = str(
        text.get("hidden_act") or text.get("hidden_activation") or text.get("activation_function") or ""
    )
    gated = act in GATED or str(text.get("model_type", "")).startswith(GATED_TYPES)
    experts = get(*EXPERT_KEYS) or 1
    inner = get("moe_intermediate_size") if experts > 1 and get("moe_intermediate_size") else None
    inner = inner or get("intermediate_size", "n_inner") or 4 * h
    mlp = experts * (3 if gated else 2) * h * inner + (h * experts if experts > 1 else 0)
    embeddings = vocab * h * (1 if text.get("tie_word_embeddings", True) else 2)
    return int(embeddings + layers * (attention + mlp))


def reference_models(rules: Rules) -> list[ResolvedModel]:
    """Every family's reference model ('vit', 'modernbert', 'llama', 'nanovlm'): what `--model all` means."""
    return [ResolvedModel(fam.reference_model, fam) for fam in rules.families.values()]


def reference_model(name: str, rules: Rules) -> ResolvedModel:
    """The reference model of that name ('llama'); KeyError for any other name."""
    for model in reference_models(rules):
        if model.name == name:
            return model
    raise KeyError(name)


def resolve_model(name: str, rules: Rules) -> ResolvedModel:
    """A reference model name ('vit'), a local folder with config.json, a shipped published model
    ('llama-3.1-8b'), an HF id in the local cache or, online, on the Hub; its family from model_type
    (rules/families.toml), else from the end of its class name (`architectures`)."""
    if printable(name) != name:
        raise ModelNotResolved(
            f"cannot resolve model '{printable(name)}': its name holds control characters (shown escaped), "
            "which no model name holds and which would reach your terminal: rename the folder."
        )
    if name.lower() in rules.reference_models():
        return reference_model(name.lower(), rules)
    shipped = shipped_model(name)
    local = _local_config(name)
    if local is None and shipped is not None:
        base, path = shipped
        resolved = _resolved_config(base, path, rules)
        variant = shipped_variant(name)
        if variant is None:
            return resolved
        return replace(resolved, name=variant[0], hub=variant[1], architecture_of=base)
    path = local or _cached_config(name) or _hub_config(name, rules)
    return _resolved_config(name, path, rules)


def _resolved_config(name: str, path: Path, rules: Rules) -> ResolvedModel:
    """The model whose config.json is at `path`, its family found (or a sentence saying why not)."""
    config = read_config(path)
    if "auto_map" in config:
        raise ModelNotResolved(
            f"{name} needs trust_remote_code (its config.json maps to code in the model's repository): "
            "advisor builds only architectures transformers itself defines, never downloaded code."
        )
    model_type = config.get("model_type")
    if not model_type:
        raise ModelNotResolved(f"{path} has no model_type: it is not a transformers model config.")
    if config.get("is_encoder_decoder"):
        raise UnsupportedModel(
            f"{name} is an encoder-decoder model ({model_type}: T5, BART, Whisper and the like), which advisor "
            "does not predict or measure yet: its families are encoder-only, decoder-only, vision and "
            "vision-language models."
        )
    family = rules.family_of_model_type(model_type)
    if family is not None:
        return ResolvedModel(name, family, config, path)
    by_class = _family_by_class(config, rules)
    if by_class is None:
        archs = ", ".join(config.get("architectures") or []) or "none"
        raise ModelNotResolved(
            f"cannot tell what {name} trains on: model_type {model_type!r} belongs to no family in the rules "
            f"and its architectures ({archs}) end in none of {', '.join(rules.architectures)}. Pass --arch "
            f"FAMILY, or add it to a family in {user_rules_dir() / 'families.toml'}, e.g. [families.decoder] "
            f'model_types = ["{model_type}"].'
        )
    return ResolvedModel(name, by_class, config, path, listed=False)


def _family_by_class(config: dict, rules: Rules) -> FamilyRecord | None:
    for arch in config.get("architectures") or []:
        for suffix, family in rules.architectures.items():
            if arch.endswith(suffix):
                return rules.families[family]
    return None


def read_config(path: Path) -> dict:
    """A config.json as a dict, its numbers and depth checked (advisor.model_config), or ModelNotResolved
    with a sentence: unreadable, larger than MOST_CONFIG_BYTES (refused before it is read, and never read
    past it), not UTF-8, not JSON, not an object, a bad size naming its key."""
    try:
        size = Path(path).stat().st_size
        if size > MOST_CONFIG_BYTES:
            raise _too_large(path, size)
        with open(path, "rb") as f:
            data = f.read(MOST_CONFIG_BYTES + 1)  # a file that grew since
    except OSError as e:
        raise ModelNotResolved(f"cannot read {path}: {e.strerror or e}.") from e
    if len(data) > MOST_CONFIG_BYTES:
        raise _too_large(path, len(data))
    return parse(data, path)


def _too_large(path: Path, size: int) -> ModelNotResolved:
    return ModelNotResolved(
        f"{path} is {size / (1 << 20):,.1f} MiB, larger than the {MOST_CONFIG_BYTES >> 20} MiB a model config may "
        "be (as a config.json from the Hub may be; published ones are tens of kB), so it was not read: pass the "
        "model's own config.json."
    )


def config_path_of(name: str) -> Path | None:
    """config.json of a local folder (or the file itself), a shipped published model or an HF id in the
    local cache, or None (never the network)."""
    shipped = shipped_model(name)
    return _local_config(name) or (shipped[1] if shipped else None) or _cached_config(name)


def _key(name: str) -> str:
    """A model name as people vary it: case and punctuation aside ('Llama-3.1-8B' == 'llama3.1_8b')."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


@cache  # read once a process: a --json menu asks each of its rows for its Hub id
def shipped_models() -> dict[str, dict]:
    """The published models advisor ships configs of (models/index.toml): name -> {hub, aliases, variants}."""
    index = shipped_models_dir() / "index.toml"
    return toml_data(index, index.read_text())["models"]


@cache
def _shipped_keys() -> dict[str, tuple[str, str | None]]:
    """Every spelling's key -> (the shipped model, the variant it names or None)."""
    keys: dict[str, tuple[str, str | None]] = {}
    for name, entry in shipped_models().items():
        for alias in (name, entry["hub"], entry["hub"].split("/")[1], *entry.get("aliases", ())):
            keys[_key(alias)] = (name, None)
        for variant, hub in entry.get("variants", {}).items():
            for alias in (variant, hub, hub.split("/")[1]):
                keys[_key(alias)] = (name, variant)
    return keys


def shipped_model(name: str) -> tuple[str, Path] | None:
    """(its name, its config.json) of a shipped published model that `name` names (or a variant of it), or None."""
    found = _shipped_keys().get(_key(name))
    return (found[0], shipped_models_dir() / found[0] / "config.json") if found else None


def shipped_variant(name: str) -> tuple[str, str] | None:
    """(its name, its Hub id) of a shipped model's variant that `name` names ('qwen2.5-7b-instruct'), or None."""
    found = _shipped_keys().get(_key(name))
    if not found or found[1] is None:
        return None
    return found[1], shipped_models()[found[0]]["variants"][found[1]]


def _hub_config(repo_id: str, rules: Rules) -> Path:
    """config.json of a Hub id, fetched alone (no weights) when online; else ModelNotResolved with the
    command that fetches it."""
    refs = ", ".join(f.reference_model for f in rules.families.values())
    if repo_id.startswith(
        (".", "/", "~")
    ):  # a path, never a Hub id (whose owner starts with a letter or digit)
        path = Path(repo_id).expanduser()
        held = (
            "has no config.json"
            if path.is_dir()
            else "is not there"
            if not path.exists()
            else "is not a folder"
        )
        raise ModelNotResolved(
            f"cannot resolve model {repo_id!r}: the folder {held}. Pass a folder that holds the model's "
            "config.json (the weights are not needed), a published model (`advisor fit --list-models`) or a "
            "Hugging Face id (owner/name)."
        )
    if repo_id.count("/") != 1 or Path(repo_id).expanduser().exists():
        raise ModelNotResolved(
            f"cannot resolve model {repo_id!r}: it is not one of {refs}, not a published model advisor ships "
            "(`advisor fit --list-models`), not a folder with a config.json and not a Hugging Face id "
            f"(owner/name).{_nearest(repo_id, rules)} Pass a folder that holds the model's config.json (the "
            "weights are not needed)."
        )
    fetch = f"hf download {repo_id} config.json"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ModelNotResolved(
            f"{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: fetch its config "
            f"alone with `{fetch}` (online), or pass a folder that holds its config.json."
        )
    from advisor.hub import fetch_config  # the network, only for an id nothing local has

    return fetch_config(repo_id)


def _nearest(name: str, rules: Rules) -> str:
    """' Did you mean: ...?' with the shipped and reference names closest to a misspelled one ('' if none is)."""
    import difflib  # the error path only

    names = {_key(n): n for n in rules.reference_models()}
    for entry, record in shipped_models().items():
        for n in (entry, record["hub"], *record.get("aliases", ()), *record.get("variants", {})):
            names.setdefault(_key(n), n)
    close = difflib.get_close_matches(_key(name.split("/")[-1]), list(names), n=4, cutoff=0.75)
    return f" Did you mean: {', '.join(names[c] for c in close)}?" if close else ""


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
    from advisor.hub import cache_dir  # urllib and threads: only for an id, not a name or a folder

    snapshots = cache_dir() / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    configs = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return configs[0] if configs else None
