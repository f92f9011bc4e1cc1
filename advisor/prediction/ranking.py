"""How `advisor fit` orders the menu, as a practitioner picks: among configurations that fit, an AdamW-class
optimizer, giving up as little as possible (the ladder's order: pure bf16, then 8-bit states, then
checkpointing, then LoRA, then 4-bit states, then QLoRA, then offload), at the highest precision, reaching the
effective batch, fastest by tokens/s; then the rest. When nothing as asked fits, the ladder quantifies each
rung and the first that fits is the answer.

Full fine-tuning with 4-bit optimizer states ranks after LoRA: a 4-bit state (Li et al. 2023) has far less
published fine-tuning behind it than LoRA, and its step costs more (rules/fit.toml [optimizers]), so a
practitioner reaches for LoRA first; it still ranks before QLoRA, which quantizes the weights themselves."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.prediction.accelerators import gib
from advisor.prediction.row import Row

RUNGS = ("as asked", "pure bf16", "8-bit states", "checkpointing", "LoRA", "4-bit states", "QLoRA", "offload")
# Each rung is the best configuration that pulls its lever, with whichever levers above it that one needs: not
# cumulative (LoRA's base is half precision under bf16-mixed already; its state needs no 8 bits)
LADDER_NOTE = "Nothing as asked fits. The ladder: each lever's best (not cumulative):"
PRECISION = {"fp32": 0, "bf16-mixed": 1, "fp16-mixed": 1, "bf16": 2}  # highest first
SHOWN = 12  # rows of the default output
SEVERAL_GPUS = (
    "several GPUs: not even 64 hold it with ZeRO, or no pure-bf16 trace is at hand to compose ZeRO from; pass "
    "--gpus N (and --nodes M) for FSDP, ZeRO and DDP predicted per rank"
)


def rung(row: Row) -> int:
    """The furthest lever a configuration pulls, in the ladder's order (0: none, as asked)."""
    if row.offload != "none":
        return 7
    if row.adapter.kind == "qlora":
        return 6
    if row.adapter.kind == "full" and row.bits < 8:
        return 5
    if row.adapter.kind == "lora":
        return 4
    if row.strategy in ("checkpointing", "selective-checkpointing", "checkpointing+accumulation"):
        return 3
    if row.bits < 32:
        return 2
    return 1 if row.dtype == "bf16" else 0


def key(row: Row, effective: int = 1) -> tuple:
    """The practitioner's order: what fits, AdamW-class, the least given up, the highest precision and state
    bits, reaching the effective batch (`effective` samples per step) with the fewest micro-batches a step,
    then the fastest (the least memory where no speed is known)."""
    speed = -(row.tokens_per_s or row.throughput or 0.0)
    if not row.fits:
        return (1, not row.adamw, rung(row), row.total)
    return (
        0,
        not row.adamw,
        rung(row),
        PRECISION[row.dtype],
        -row.bits,
        row.effective_batch < effective,  # short of it: a noisier update than the recipe asks
        row.accumulation_steps,
        row.optimizer.startswith("paged_"),  # a paged twin only where its unpaged one does not fit
        speed,
        row.total,
    )


def ranked(rows: list[Row], effective: int = 1) -> list[Row]:
    """Rows in the practitioner's order, for a question whose recipe steps on `effective` samples."""
    return sorted(rows, key=lambda r: key(r, effective))


def ordered_by_time(above: Row, row: Row, effective: int = 1) -> bool:
    """Whether `row` comes after `above` for its tokens/s alone: every earlier part of the order ties."""
    a, b = key(above, effective), key(row, effective)
    return a[0] == 0 and a[:-2] == b[:-2] and bool(above.tokens_per_s and row.tokens_per_s)


def time_ties(rows: list[Row], band: float | None, effective: int = 1) -> list[bool]:
    """For each ranked row, whether its place below the row above rests on a tokens/s difference within the
    speed model's error band (`band`, a fraction): an order by time that the model cannot decide."""
    if not band:
        return [False] * len(rows)
    return [False] + [
        ordered_by_time(a, b, effective) and a.tokens_per_s <= b.tokens_per_s * (1 + band)
        for a, b in zip(rows, rows[1:], strict=False)
    ]


@dataclass
class Rung:
    """One rung of the ladder: the lever, and the configuration that pulls it (None: not predicted)."""

    name: str
    row: Row | None

    @property
    def fits(self) -> bool:
        return self.row is not None and self.row.fits

    @property
    def sentence(self) -> str:
        if self.row is None:
            return SEVERAL_GPUS + "."
        r = self.row
        speed = f", {r.tokens_per_s:,.0f} tokens/s" if r.tokens_per_s else ""
        host = f" (+{gib(r.host_gb):.1f} GiB on the host)" if r.host_gb >= 0.05 else ""
        verdict = "fits" if r.fits else "does not fit"
        per = " per rank" if r.world > 1 else ""
        return f"{self.name}: {r.label}, {gib(r.total):.1f} GiB{per}{host}{speed}: {verdict}."

    def as_dict(self) -> dict:
        return {
            "rung": self.name,
            "configuration": self.row.label if self.row else None,
            "fits": self.fits,
            "gpus": self.row.gpus if self.row else None,  # per node, as the configurations' are
            "nodes": self.row.nodes if self.row else None,
            "sharding": self.row.sharding if self.row else None,
            "memory_gb": self.row.total if self.row else None,
            "host_gb": round(self.row.host_gb, 4) if self.row else None,
            "tokens_per_s": self.row.tokens_per_s if self.row else None,
            "note": None if self.row else SEVERAL_GPUS,
        }


def ladder(rows: list[Row]) -> list[Rung]:
    """When no configuration as asked fits (full fine-tuning, the highest precision, 32-bit states, no
    checkpointing): each lever in turn, with its best AdamW-class configuration, up to the first that fits;
    several GPUs last when none does. Empty when something as asked fits, or nothing as asked was asked."""
    by_rung: dict[int, list[Row]] = {}
    for r in rows:  # rows are ranked: the first of each rung is its best
        by_rung.setdefault(rung(r), []).append(r)
    asked = [r for r in by_rung.get(0, []) if r.adamw] or by_rung.get(0, [])
    if not asked or any(r.fits for r in asked):
        return []
    out = []
    for i, name in enumerate(RUNGS):
        candidates = by_rung.get(i)
        if not candidates:
            continue
        adamw = [r for r in candidates if r.adamw]
        out.append(Rung(name, (adamw or candidates)[0]))
        if out[-1].fits:
            return out
    return out + [Rung("several GPUs", None)]


def shown(rows: list[Row], steps: list[Rung]) -> list[Row]:
    """The default output: the ladder's configurations, the pick, the best that fits of each adapter (and
    offload), precision, class (a non-AdamW optimizer, its trade said), strategy and optimizer, then the next
    best, SHOWN at most, in rank order."""
    fitting = [r for r in rows if r.fits]
    wanted: list[Row] = [s.row for s in steps if s.row is not None] + rows[:1]
    kinds = (
        lambda r: (r.adapter.kind, r.offload),
        lambda r: r.dtype,
        lambda r: r.adamw,
        lambda r: r.strategy,
        lambda r: r.optimizer,
    )
    for group in kinds:
        seen = set()
        for r in fitting:
            if group(r) not in seen:
                seen.add(group(r))
                wanted.append(r)
    wanted += fitting + rows
    out: dict[int, Row] = {}
    for r in wanted:
        if len(out) < SHOWN:
            out.setdefault(id(r), r)
    order = {id(r): i for i, r in enumerate(rows)}  # the several-GPUs rung's row is not a row: last
    return sorted(out.values(), key=lambda r: order.get(id(r), len(rows)))
