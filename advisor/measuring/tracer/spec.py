"""What is traced: one model config at one shape and precision (`Spec`), the dtypes it trains in, and the
depth of its config (each stack of blocks and each kind of block a stack mixes, a mixture's expert units),
at which the tracer builds it shallow (`Tracer`, payloads.py)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from advisor.measuring.model.families import Family
from advisor.prediction.step import EXPERTS, Adapter, Method

DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
SUB_CONFIGS = ("text_config", "vision_config")
HALF = {"bf16-mixed": "bf16"}  # a mixed precision whose optimizer can be offloaded: its device half
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
PHASES = ("forward", "reference", "backward")  # a micro-batch's traced phases, in order (reference: DPO's)
# GRPO's phases once per optimizer step, before its first micro-batch (methods.rollout; step.py ROLLOUT)
ONCE = ("prefill", "decode", "scoring", "reference")


@dataclass(frozen=True)
class Spec:
    """What is predicted: one model config at one shape and precision, with what trains, for a CUDA or a CPU
    run."""

    config: object  # a transformers PretrainedConfig
    family: Family  # inputs and model class (advisor.measuring.model.families)
    seq_len: int | None  # text tokens per sample (None for vision-only models)
    image_size: int | None
    dtype: str  # fp32 | bf16-mixed | fp16-mixed | bf16 (rules/fit.toml [precision])
    device: str = "cuda"  # which optimizer implementations and kernels a run gets
    adapter: Adapter = field(default_factory=Adapter)
    attention: str = "sdpa"  # sdpa | eager
    images: bool = True  # a model that takes images given one (False: a text-first VLM on text alone)
    method: Method = field(default_factory=Method)  # Trainer's step, or TRL's (methods.py)


def precision(spec: Spec) -> tuple[torch.dtype, torch.dtype | None]:
    """(the weights' dtype, autocast's dtype or None). Mixed precision trains fp32 and multiplies in half:
    full fine-tuning keeps fp32 weights; an adapter keeps its frozen base in half (nothing to update there)
    and its adapters in fp32 (peft's default). Pure bf16 keeps everything in bf16."""
    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(spec.dtype)
    if spec.dtype == "bf16":
        return torch.bfloat16, None
    if half is None:
        return torch.float32, None
    return (torch.float32 if spec.adapter.kind == "full" else half), half


# --- depth: the stacks of blocks, and the kinds of block each mixes ---------------------------------------


def depth_knobs(config) -> dict[str, int]:
    """Each stack of blocks a config has ('key' or 'sub_config.key'), split by the kinds of block it mixes
    ('key@kind': its per-layer `layer_types`, or DeepSeek's dense first layers and mixture-of-experts rest),
    with how many blocks of each."""
    out = {}
    for prefix, sub in [("", config)] + [(f"{s}.", getattr(config, s, None)) for s in SUB_CONFIGS]:
        if sub is None:
            continue
        key = next((k for k in DEPTH_KEYS if isinstance(getattr(sub, k, None), int)), None)
        if key:
            kinds = _kinds(sub, getattr(sub, key))
            out |= {prefix + key + (f"@{k}" if len(kinds) > 1 else ""): n for k, n in kinds.items()}
            units = _expert_units(sub)
            if units:
                out[prefix + EXPERTS] = units
    if not out:
        raise ValueError("the config names no number of layers (num_hidden_layers, n_layer, num_layers)")
    return out


def _expert_units(config) -> int | None:
    """A mixture's experts as a knob like depth: E experts of which each token picks k are g = gcd(E, k)
    units of E/g experts picking k/g, and every expert's bytes and FLOPs (its weights, its routed tokens, its
    share of the router) scale with the units at a fixed number of tokens per expert; traced at 1 and 2
    units, evaluated at g, as blocks are (tests/measuring/tracer/test_menu.py checks it against a trace of all of
    them). Worth a knob past 2 units (Qwen3's 128 experts picking 8: 8 units of 16); None otherwise, and for
    routing in groups of experts (DeepSeek's n_group), which no unit divides."""
    experts = next((getattr(config, k) for k in MOE_KEYS if isinstance(getattr(config, k, None), int)), None)
    picks = getattr(config, "num_experts_per_tok", None)
    grouped = getattr(config, "n_group", None)
    if not (isinstance(experts, int) and isinstance(picks, int) and experts > 1 and picks > 0):
        return None
    if isinstance(grouped, int) and grouped > 1:
        return None
    units = math.gcd(experts, picks)
    return units if units > 2 else None


def _kinds(config, depth: int) -> dict[str, int]:
    """Blocks of a stack by kind, in the order the kinds first appear."""
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and len(types) >= depth:
        kinds: dict[str, int] = {}
        for t in types[:depth]:
            kinds[t] = kinds.get(t, 0) + 1
        return kinds
    dense = getattr(config, "first_k_dense_replace", None)
    if isinstance(dense, int) and 0 < dense < depth:
        return {"dense": dense, "moe": depth - dense}
    return {"all": depth}


def at_depth(config, depths: dict[str, int]):
    """A copy of the config with each stack (and each kind of block in it) at the given depth; per-layer
    lists rebuilt to match."""
    config = copy.deepcopy(config)
    stacks: dict[str, dict[str, int]] = {}
    for knob, depth in depths.items():
        if knob.rpartition(".")[2] == EXPERTS:
            _with_units(config if "." not in knob else getattr(config, knob.split(".")[0]), depth)
            continue
        stack, _, kind = knob.partition("@")
        stacks.setdefault(stack, {})[kind or "all"] = depth
    for stack, kinds in stacks.items():
        owner, key = (
            (config, stack)
            if "." not in stack
            else (getattr(config, stack.split(".")[0]), stack.split(".")[1])
        )
        total = sum(kinds.values())
        setattr(owner, key, total)
        if isinstance(getattr(owner, "layer_types", None), list):
            owner.layer_types = (
                owner.layer_types[:total]
                if set(kinds) == {"all"}
                else [k for k, n in kinds.items() for _ in range(n)]
            )
        if "dense" in kinds:
            owner.first_k_dense_replace = kinds["dense"]
    return config


def _with_units(owner, units: int) -> None:
    """A mixture's experts and picks at `units` of its expert units (_expert_units), in place."""
    full = _expert_units(owner)
    key = next(k for k in MOE_KEYS if isinstance(getattr(owner, k, None), int))
    setattr(owner, key, getattr(owner, key) // full * units)
    owner.num_experts_per_tok = owner.num_experts_per_tok // full * units
