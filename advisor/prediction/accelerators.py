"""Accelerators by the names people type (`--gpu A100-80GB`, `a100_40gb`, `H100`, `RTX4090`) and by the
names CUDA reports (`NVIDIA A100-SXM4-40GB`), from rules/hardware.toml."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from advisor.errors import InputError
from advisor.rules import GB_PER_GIB, Accelerator, Link, Rules, gib  # noqa: F401 (the units, where accelerators are)

PRECISION = {"fp32": "fp32", "bf16-mixed": "bf16", "bf16": "bf16", "fp16-mixed": "fp16"}  # dtype -> peak used


class UnknownAccelerator(InputError):
    """A --gpu name no accelerator of rules/hardware.toml answers to; the message lists close matches."""

    def __init__(self, message: str):
        super().__init__(message, "gpu")


def normalize(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100sxm480gb': case, spaces, dashes, underscores and the vendor dropped."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return re.sub(r"^(nvidia|amd|geforce|tesla)+", "", key) or key


def _names(acc: Accelerator) -> set[str]:
    return {normalize(n) for n in (acc.key, acc.name, *acc.aliases)}


def find(name: str, rules: Rules) -> Accelerator | None:
    """The accelerator a name or alias means, or None."""
    key = normalize(name)
    return next((a for a in rules.accelerators.values() if key in _names(a)), None)


def resolve(name: str, rules: Rules) -> Accelerator:
    """The accelerator a --gpu value names, or the one it begins the name of ('mi300' for MI300X);
    UnknownAccelerator listing the choices when it begins several ('A100': 40 or 80 GB) or none."""
    found = find(name, rules)
    if found is not None:
        return found
    key = normalize(name)
    starts = sorted(
        {a.key for a in rules.accelerators.values() for n in _names(a) if key and n.startswith(key)}
    )
    if len(starts) == 1:
        return rules.accelerators[starts[0]]
    if len(starts) > 1:
        listed = ", ".join(f"{k} ({rules.accelerators[k].memory_gib:g} GB)" for k in starts)
        raise UnknownAccelerator(f"--gpu {name} could mean {listed}: name one of them.")
    import difflib  # the error path only

    choices = {n: a.key for a in rules.accelerators.values() for n in _names(a)}
    close = difflib.get_close_matches(normalize(name), list(choices), n=6, cutoff=0.5)
    suggest = sorted({choices[c] for c in close}) or sorted(rules.accelerators)
    raise UnknownAccelerator(
        f"unknown accelerator {name!r}. Did you mean: {', '.join(suggest)}? "
        "(all: advisor fit --list-gpus; or pass --memory GiB)"
    )


def memory_gb(acc: Accelerator) -> float:
    """Capacity in GB (10^9 bytes): the datasheet's binary GB, or this machine's RAM for `cpu`."""
    if acc.memory_gib is None:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return acc.memory_gib * 2**30 / 1e9


def peak_tflops(acc: Accelerator, dtype: str) -> float | None:
    """Dense peak TFLOP/s at the precision a dtype computes in, or None where the chip lacks it."""
    return acc.tflops.get(PRECISION[dtype])


@dataclass(frozen=True)
class Links:
    """The links a job's collectives go through: within a node and between nodes (None: unknown), and the
    scopes `--interconnect` named rather than the accelerator's defaults."""

    node: Link | None
    network: Link | None
    given: tuple[str, ...] = ()


def links(acc: Accelerator | None, interconnect: str | None, rules: Rules) -> Links:
    """The accelerator's own link and its usual network (rules/hardware.toml), each replaced by the
    --interconnect entry of its scope ('pcie4,eth-100'); InputError for an unknown name or two of a scope."""
    default = rules.links.get(rules.fit["distributed"]["network"])
    found = {
        "node": acc.node_link if acc else None,
        "network": rules.links.get(acc.network) if acc and acc.network else default,
    }
    given: list[str] = []
    for name in (interconnect or "").split(","):
        key = name.strip().lower()
        if not key and interconnect is not None:
            raise InputError(
                "--interconnect needs link names, e.g. nvlink4,ib-ndr (rules/hardware.toml [links]).",
                "interconnect",
            )
        if not key:
            continue
        link = rules.links.get(key)
        if link is None:
            import difflib  # the error path only

            close = difflib.get_close_matches(key, list(rules.links), n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise InputError(
                f"unknown link {name.strip()!r}.{hint} Links: {', '.join(rules.links)}.",
                "interconnect",
            )
        if link.scope in given:
            raise InputError(
                f"two links {'within a node' if link.scope == 'node' else 'between nodes'}: "
                "give one of each scope at most (e.g. pcie4,eth-100).",
                "interconnect",
            )
        given.append(link.scope)
        found[link.scope] = link
    return Links(found["node"], found["network"], tuple(given))
