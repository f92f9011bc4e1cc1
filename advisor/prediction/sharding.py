"""Training across accelerators, per rank, from traced payloads (no torch): DDP and DeepSpeed ZeRO 1/2/3 composed
from a single-process trace, FSDP2 and HSDP read from a trace of one rank under a fake process group and
rescaled to any number of ranks; the bytes each rank sends per step; the host memory an offload takes.

What is composed rather than traced, and the buffers and links it takes, are stated in rules/fit.toml
[distributed] with their sources.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from advisor.prediction.question import Question
from advisor.prediction.step import Config, host_bytes, n_params, phase_bytes, trainable

if TYPE_CHECKING:
    from advisor.prediction.row import Row
from advisor.rules import Rules

SHARDED = ("parameters", "gradients", "optimizer_state")  # what an FSDP rank holds 1/N of
ZERO_STATES = ("parameters", "gradients", "optimizer_state")  # what ZeRO's model states replace
ADDITIONAL_BUFFER_FACTOR = 1.5  # DeepSpeed's estimators' default, for host memory
MAX_LIVE = 1e9  # DeepSpeed's stage3_max_live_parameters default (elements)


def basis(c: Config) -> Config:
    """The traced configuration a row is read from: itself on one accelerator; DDP the same step on one; ZeRO
    a pure-bf16 step (DeepSpeed's bf16 mode runs the model in bf16), for LoRA the mixed-precision step the
    single-GPU menu traces (its frozen base is 16-bit already; only the adapters' few bytes are fp32);
    FSDP and HSDP one rank's sharded trace."""
    if c.sharding == "ddp":
        return replace(c, sharding="none")
    if c.sharding.startswith("zero"):
        dtype = "bf16" if c.adapter == "full" else c.dtype
        return replace(c, dtype=dtype, sharding="none", offload="none")
    if c.sharding in ("fsdp", "hsdp"):
        return replace(c, sharding="fsdp", offload="none")
    return c


def shard_size(c: Config, q: Question) -> int:
    """Ranks a rank's shard is of: all of them, or the node's under HSDP."""
    return q.gpus if c.sharding == "hsdp" else q.world


def per_rank(c: Config, payload: dict, q: Question, rules: Rules) -> dict:
    """The payload of one rank's step under the configuration's sharding (`payload`: its basis's)."""
    if c.sharding == "ddp":
        buckets = trainable(payload) * payload["grad_bytes_per_param"]

        def ddp(a: dict, b: dict) -> None:
            a["gradients"] += buckets

        return _mapped(payload, ddp)
    if c.sharding.startswith("zero"):
        return _zero(c, payload, q, rules)
    if c.sharding in ("fsdp", "hsdp"):
        factor = 0 if c.offload == "optimizer+params" else payload["sharded"]["world"] / shard_size(c, q)

        def fsdp(a: dict, b: dict) -> None:
            for category in SHARDED:
                a[category] *= factor
                b[category] *= factor

        return _mapped(payload, fsdp)
    return payload


def _mapped(payload: dict, edit) -> dict:
    """The payload with every phase line's bytes edited in place by edit(constant terms, per-sample terms), on
    copies (a few hundred rows each map their basis: copies of the lines, not of every value through a call)."""

    def edited(ln: dict) -> dict:
        a, b = dict(ln["a"]), dict(ln["b"])
        edit(a, b)
        return {"a": a, "b": b}

    phases = {
        phase: [[edited(ln) for ln in lines] for lines in points]
        for phase, points in payload["phases"].items()
    }
    return {k: v for k, v in payload.items() if not k.startswith("_")} | {"phases": phases}


def zero_states(c: Config, payload: dict, q: Question, rules: Rules) -> dict[str, float]:
    """DeepSpeed's model states per rank, by category, as its estimators count them for Adam (8 bytes of fp32
    state per parameter), with the optimizer's own state instead of Adam's."""
    n, trained = q.world, trainable(payload)
    frozen = n_params(payload) - (trained if c.adapter == "full" else 0)
    state = _state_per_param(c, payload, rules) * trained / n
    fp32 = 8 * trained / n  # master weights and the gradient partition
    weights = 2 * (trained + frozen)
    largest = 4 * payload["structure"]["largest_module"]
    if c.sharding == "zero3":
        if c.offload == "optimizer+params":
            return {"parameters": largest, "gradients": 0, "optimizer_state": 0}
        if c.offload == "optimizer":
            return {"parameters": largest + weights / n, "gradients": 0, "optimizer_state": 0}
        return {"parameters": largest + weights / n, "gradients": fp32, "optimizer_state": state}
    if c.offload == "optimizer":  # ZeRO-Offload, stage 2
        return {"parameters": weights, "gradients": 0, "optimizer_state": 0}
    grads16 = 2 * trained if c.sharding == "zero1" else 2 * trained / n
    return {"parameters": weights, "gradients": grads16 + fp32, "optimizer_state": state}


def _state_per_param(c: Config, payload: dict, rules: Rules) -> float:
    """fp32 bytes of optimizer state per trained parameter: the basis trace's state, doubled where it
    follows the weights' dtype and the basis is pure bf16 (32-bit optimizers; 8- and 4-bit states keep their
    size)."""
    state = phase_bytes(payload, "optimizer_step", 0)["optimizer_state"]
    return state * fp32_factor(c, rules) / max(trainable(payload), 1)


def fp32_factor(c: Config, rules: Rules) -> int:
    """How many times a ZeRO rank's fp32 optimizer state (and its step's traffic) is its basis trace's: 2
    where the basis is pure bf16 and the state follows the weights' dtype, else 1."""
    follows = rules.optimizer_info[c.optimizer].bits == 32
    return 2 if follows and basis(c).dtype == "bf16" else 1


def _zero(c: Config, payload: dict, q: Question, rules: Rules) -> dict:
    states = zero_states(c, payload, q, rules)
    h = payload["structure"]["hidden"]
    bucket = 2 * h * h  # reduce_bucket_size 'auto' = h x h elements of 16-bit gradients
    if c.sharding == "zero3" and c.offload != "optimizer+params":
        # the prefetch bucket, and the gathered parameters it keeps beyond the rank's own shard
        live = min(n_params(payload), MAX_LIVE)
        bucket += 2 * 0.9 * h * h + 2 * live / q.world
    step_temps = phase_bytes(payload, "optimizer_step", 0)["temporaries"] / q.world

    def zero(a: dict, b: dict) -> None:
        for category in ZERO_STATES:
            a[category], b[category] = states[category], 0
        a["temporaries"] += bucket

    out = _mapped(payload, zero)
    step = out["phases"]["optimizer_step"]
    for lines in step:
        for ln in lines:
            ln["a"]["temporaries"] = step_temps + bucket
    return out


def host_per_node(c: Config, payload: dict, q: Question) -> float | None:
    """Host memory per node an offload takes (DeepSpeed's estimators, with their 1.5 buffer factor; FSDP's CPU
    offload: every rank's fp32 shard of weights and gradients and its optimizer state); None: not offloaded."""
    if c.sharding == "ddp":  # a paged optimizer's state, every rank's
        return host_bytes(payload) * q.gpus
    if c.offload == "none":
        return None
    trained = trainable(payload)
    f = ADDITIONAL_BUFFER_FACTOR
    if c.sharding == "zero2" or (c.sharding == "none" and c.offload == "optimizer"):
        return trained * max(4 * q.world, 16) * f
    if c.sharding == "zero3":
        frozen = 2 * n_params(payload) if c.adapter != "full" else 0  # a LoRA base's 16-bit weights
        states = trained * (18 if c.offload == "optimizer+params" else 16) * f
        return (states + (frozen if c.offload == "optimizer+params" else 0)) / q.nodes
    if c.sharding in ("fsdp", "hsdp"):
        shard = sum(phase_bytes(payload, "optimizer_step", 0)[k] for k in SHARDED)
        return shard * payload["sharded"]["world"] / shard_size(c, q) * q.gpus
    return None


@dataclass(frozen=True)
class Collective:
    """One collective a rank joins: what it moves (`tensor`: the whole tensor's bytes, every rank's part),
    how (all-reduce, all-gather, reduce-scatter), how often (each micro-batch or once per optimizer step)
    and over which ranks (the shard's, or one per node across nodes under HSDP)."""

    name: str
    kind: str
    tensor: float
    per: str  # "micro-batch" | "step"
    ranks: int
    across_nodes: bool = False  # HSDP's replicas: one rank per node, over the network

    @property
    def sent(self) -> float:
        """Bytes a rank sends, ring algorithms: an all-reduce 2(N-1)/N of the tensor, the others (N-1)/N."""
        share = (self.ranks - 1) / self.ranks
        return (2 if self.kind == "all-reduce" else 1) * share * self.tensor

    def per_step(self, micro_batches: int) -> float:
        return self.sent * (micro_batches if self.per == "micro-batch" else 1)


def collectives(c: Config, payload: dict, q: Question) -> list[Collective]:
    """The collectives of one rank's optimizer step, as the libraries issue them: DDP all-reduces the gradients
    once per step (Trainer's no_sync while accumulating); ZeRO-1 reduces 16-bit gradients at the step and
    all-gathers the updated weights; ZeRO-2 reduce-scatters gradients every micro-batch (its backward hooks)
    and all-gathers the weights at the step; ZeRO-3 and FSDP gather the weights for every micro-batch's forward
    and again for its backward (reshard after forward: FSDP's FULL_SHARD default, ZeRO-3 always; FSDP2 keeps
    the root's through backward) and reduce-scatter its gradients; HSDP all-reduces the gradient shards
    across nodes every micro-batch. Empty on one rank."""
    n = q.world
    if n == 1 or c.sharding == "none":
        return []
    trained = trainable(payload)
    width = 4 if c.dtype == "fp32" and c.sharding in ("fsdp", "hsdp") else 2  # bytes a gathered weight takes
    weights = width * (n_params(payload) + (trained if c.adapter != "full" else 0))
    grads = trained * payload["grad_bytes_per_param"]
    if c.sharding == "ddp":
        return [Collective("gradients", "all-reduce", grads, "step", n)]
    if c.sharding in ("zero1", "zero2"):
        per = "step" if c.sharding == "zero1" else "micro-batch"
        return [
            Collective("16-bit gradients", "reduce-scatter", 2 * trained, per, n),
            Collective("updated 16-bit weights", "all-gather", 2 * trained, "step", n),
        ]
    if c.sharding == "zero3":
        return [
            Collective("weights for forward", "all-gather", weights, "micro-batch", n),
            Collective("weights for backward", "all-gather", weights, "micro-batch", n),
            Collective("16-bit gradients", "reduce-scatter", 2 * trained, "micro-batch", n),
        ]
    s = shard_size(c, q)
    root = width * payload["structure"]["root"]
    out = [
        Collective("weights for forward", "all-gather", weights, "micro-batch", s),
        Collective("weights for backward (the root kept)", "all-gather", weights - root, "micro-batch", s),
        Collective("gradients", "reduce-scatter", grads, "micro-batch", s),
    ]
    if c.sharding == "hsdp" and q.nodes > 1:
        out.append(
            Collective("gradient shards across nodes", "all-reduce", grads / s, "micro-batch", q.nodes, True)
        )
    return out


def communication(c: Config, payload: dict, q: Question, micro_batches: int = 1) -> dict:
    """A rank's collectives per optimizer step of `micro_batches`: the bytes it sends (`sent`, ring algorithms),
    the bytes each GPU moves over its node's link (`intra`) and the bytes that enter each node over the network
    (`inter`). A collective over G GPUs of a node moves (G-1)/G of its tensor within it; over M nodes, (M-1)/M
    of it enters each node, spread over the node's network ports (NCCL's rings, a channel per port), an
    all-reduce twice each; HSDP's replicas reduce the node's gradient shards, the whole gradient per node."""
    sent = intra = inter = 0.0
    g, m = q.gpus, q.nodes
    for op in collectives(c, payload, q):
        moved = op.per_step(micro_batches)
        sent += moved
        whole = moved / ((op.ranks - 1) / op.ranks)  # the tensor's bytes (twice, an all-reduce's), per step
        if op.across_nodes:
            inter += whole * g * (m - 1) / m  # every GPU's shard of it crosses, the node's together
            continue
        intra += whole * (g - 1) / g
        if m > 1 and c.sharding != "hsdp":
            inter += whole * (m - 1) / m
    return {"sent": sent, "intra": intra, "inter": inter}


def communication_seconds(volume: dict, q: Question, rules: Rules, sharding: str = "fsdp") -> float | None:
    """Seconds the step's collectives take: the slower of the node's link (Question.links: --interconnect,
    else the accelerator's own) and the node's network ports together (a ring pipelines both), at rules/fit.toml
    [distributed]'s collective efficiency (ZeRO-3's own: DeepSpeed gathers module by module, in messages far
    smaller than FSDP's per-block flat ones); None where a link that is used is unknown."""
    if not volume["intra"] and not volume["inter"]:
        return 0.0
    d = rules.fit["distributed"]
    efficiency = d["zero3_efficiency"] if sharding == "zero3" else d["collective_efficiency"]
    node, network = q.links.node, q.links.network
    if (volume["intra"] and node is None) or (volume["inter"] and network is None):
        return None
    within = volume["intra"] / (node.gbs * 1e9 * efficiency) if volume["intra"] else 0.0
    across = volume["inter"] / (network.node_gbs(q.gpus) * 1e9 * efficiency) if volume["inter"] else 0.0
    return max(within, across)


def hidden_share(c: Config, rules: Rules) -> float:
    """The share of the collectives' time that can hide behind compute (rules/fit.toml [distributed.hidden])."""
    shares = rules.fit["distributed"]["hidden"]
    return (
        shares["zero3"]
        if c.sharding == "zero3"
        else shares["fsdp" if c.sharding in ("fsdp", "hsdp") else "ddp"]
    )


def overlapped(compute_s: float, talk_s: float, share: float) -> float:
    """A step whose collectives take `talk_s` beside `compute_s` of compute: the hidden share of them runs
    under the compute (at most all of it), the rest adds to it."""
    return compute_s + talk_s - min(share * talk_s, compute_s)


def sharded_offload_seconds(
    c: Config, payload: dict, q: Question, step_traffic: float, rules: Rules
) -> float:
    """A rank's offloaded step, not overlapped (rules/fit.toml [offload]): its gradient shard down and its
    weight shard up over its own PCIe link, and the host stepping all of its node's shards at its memory
    bandwidth (`step_traffic`: one rank's); with the parameters offloaded too, each forward and backward
    brings the rank's weight shard up again (16-bit under ZeRO-3, FSDP's fp32 shard under mixed precision)."""
    off = rules.fit["offload"]
    ranks = shard_size(c, q)
    pcie = 4 * trainable(payload) / ranks
    if c.offload == "optimizer+params":
        width = 4 if c.sharding in ("fsdp", "hsdp") and c.dtype != "bf16" else 2
        pcie += 2 * width * n_params(payload) / ranks
    return pcie / (off["pcie_gbs"] * 1e9) + q.gpus * step_traffic / (off["host_bandwidth_gbs"] * 1e9)


def communication_share(row: Row | None) -> list[str]:
    """How much of the first fitting sharded row's step its collectives take, and how much of them hides."""
    if row is None or not row.collectives_s or not row.predicted_step_s:
        return []
    talk, exposed = row.collectives_s
    return [
        f"Communication of {row.label}: {talk:.3g} s of collectives a step, {1 - exposed / talk:.0%} of them "
        f"hidden behind compute: {exposed / row.predicted_step_s:.0%} of its {row.predicted_step_s:.3g} s step."
    ]


def distributed_assumptions(q: Question, rules: Rules) -> list[str]:
    """What per-rank figures and their time rest on (rules/fit.toml [distributed], rules/hardware.toml)."""
    d = rules.fit["distributed"]
    shardings = {c.sharding for c in q.configs}
    out = [d[s] for s in ("ddp", "fsdp", "hsdp") if s in shardings]
    if any(s.startswith("zero") for s in shardings):
        out += [d["zero"], d["zero_buffers"]]
        if any(c.offload != "none" and c.sharding.startswith("zero") for c in q.configs):
            out.append(d["zero_offload"])
    if any(c.offload != "none" and c.sharding != "none" for c in q.configs):
        out.append(d["offload_time"])
    node, network = q.links.node, q.links.network
    if node is not None:
        whence = (
            "as --interconnect gives"
            if "node" in q.links.given
            else "the accelerator's own (--interconnect to change)"
        )
        out.append(f"Within a node: {node.name}, {node.gbs:g} GB/s per direction, {whence}. {node.source}")
    if q.nodes > 1 and network is not None:
        whence = (
            "as --interconnect gives"
            if "network" in q.links.given
            else "what its machines usually carry (--interconnect to change)"
        )
        share = f", {network.node_gbs(q.gpus):g} GB/s a node of {q.gpus}" if network.per == "gpu" else ""
        out.append(
            f"Between nodes: {network.name}, {network.gbs:g} GB/s per direction{share}, {whence}. "
            f"{network.source}. {d['network_source']}"
        )
    out += [
        f"Collectives at {d['collective_efficiency']:.0%} of a link's bandwidth, ZeRO-3's at "
        f"{d['zero3_efficiency']:.0%}. {d['collective_source']} {d['zero3_source']}",
        d["overlap"] + " Hidden: " + ", ".join(f"{k} {v:.0%}" for k, v in d["hidden"].items()) + ".",
        d["volume_source"],
    ]
    return out
