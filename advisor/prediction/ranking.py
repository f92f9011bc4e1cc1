"""How `advisor fit` orders the menu, as a practitioner picks, and what it says when nothing fits.

The order: among configurations that fit, an AdamW-class optimizer that reaches the effective batch, giving
up as little as possible (the ladder's order: pure bf16, then 8-bit states, then checkpointing, then LoRA,
then 4-bit states, then QLoRA, then offload), at the highest precision, fastest by tokens/s; then the rest. A
configuration short of the effective batch (a step of one sample where sixteen are asked) ranks after every
one that reaches it: its updates are not the recipe's. Full fine-tuning with 4-bit optimizer states ranks
after LoRA: a 4-bit state (Li et al. 2023) has far less published fine-tuning behind it than LoRA, and its
step costs more (rules/fit.toml [optimizers]), so a practitioner reaches for LoRA first; it still ranks
before QLoRA, which quantizes the weights themselves.

The ladder: when nothing as asked fits, each rung of the menu quantified, the first that fits the answer.

The levers: when no AdamW-class configuration of the question fits (nothing does, or only SGD, Adafactor and
the like, which fine-tuning rarely tolerates), the levers beyond the asked menu, each asked as a question of
its own (traced like any other, then cached) and pulled alone, with its figure. The first that fits on the
user's own hardware is the answer's pick, said as a lever; more hardware (a second GPU) is shown, never
picked. In the order a fine-tuner reaches for them: 8-bit optimizer states (near-lossless, the same
adapters), LoRA instead of full fine-tuning, LoRA on the attention projections alone (far fewer trained
weights: all-linear adapts a mixture's every expert), QLoRA (a 4-bit base), shorter sequences (the data cut
to them), a second GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from advisor.errors import Error
from advisor.prediction.accelerators import gib
from advisor.prediction.fit_request import FitRequest
from advisor.prediction.menu import installed
from advisor.prediction.question import Question
from advisor.prediction.row import Row
from advisor.rules import Rules

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
    """The practitioner's order: what fits, AdamW-class, reaching the effective batch (`effective` samples
    per step: short of it, a noisier update than the recipe asks), the least given up, the highest precision
    and state bits, then the fastest at that batch (the least memory where no speed is known)."""
    speed = -(row.tokens_per_s or row.throughput or 0.0)
    if not row.fits:
        return (1, not row.adamw, rung(row), row.total)
    return (
        0,
        not row.adamw,
        row.effective_batch < effective,
        rung(row),
        PRECISION[row.dtype],
        -row.bits,
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


# --- the levers beyond the asked menu ------------------------------------------------------------------------

# What a lever's question traces: the strategies of the menu but selective checkpointing (on request), with
# AdamW, so that each lever costs one stage of a trace
LEVER_STRATEGIES = ("standard", "checkpointing", "accumulation", "checkpointing+accumulation")
EIGHT_BIT = ("adamw_bnb_8bit", "adamw_torch_8bit")  # the first installed is the 8-bit lever's optimizer
SHORTEST = 128  # tokens: the shortest sequence the shorter-sequences lever proposes
HALVINGS = 3  # it tries the asked length / 2, / 4, / 8, and stops at the first that fits
LEVERS_NOTE = "Nothing as asked fits with an AdamW-class optimizer. The levers, each pulled alone:"
STATIC = ("parameters", "gradients", "optimizer_state")  # what no sequence length changes


@dataclass
class Lever:
    """One lever: what it changes (as the flags that ask it) and the configuration it gives (its pick, else
    its smallest; None where it could not be asked, `why_not` saying why)."""

    name: str
    flags: str
    row: Row | None = None
    question: Question | None = None  # the lever's own question (the row's code and JSON read it)
    why_not: str | None = None
    own_hardware: bool = True  # False: more hardware than asked (shown, never the pick)

    @property
    def fits(self) -> bool:
        return self.row is not None and self.row.fits

    @property
    def sentence(self) -> str:
        if self.row is None:
            return f"{self.name} ({self.flags}): {self.why_not}"
        r = self.row
        per = " per rank" if r.world > 1 else ""
        speed = f", {r.tokens_per_s:,.0f} tokens/s" if r.tokens_per_s else ""
        verdict = "fits" if r.fits else "does not fit"
        return f"{self.name} ({self.flags}): {r.label}, {gib(r.total):.1f} GiB{per}{speed}: {verdict}"

    def as_dict(self) -> dict:
        return {
            "lever": self.name,
            "flags": self.flags,
            "fits": self.fits,
            "own_hardware": self.own_hardware,
            "configuration": self.row.as_dict(self.question) if self.row and self.question else None,
            "note": self.why_not,
        }


def needed(q: Question, rows: list[Row], request: FitRequest, rules: Rules) -> bool:
    """Whether to pull the levers: no AdamW-class configuration fits, and the question asked for one."""
    info = rules.optimizer_info
    asks_adamw = not request.optimizers or any(info[o].adamw for o in request.optimizers if o in info)
    return asks_adamw and not any(r.fits and r.adamw for r in rows)


def candidates(
    q: Question, rows: list[Row], request: FitRequest, rules: Rules, usable_gb: float
) -> list[tuple[str, str, FitRequest, bool]]:
    """(name, flags, the lever's request, on the user's own hardware) of every lever that applies to what was
    asked (`rows`: its answer; `usable_gb`: what a configuration may take): none that the asked menu pulls
    already, and no shorter sequence where the weights, gradients and state alone outgrow the memory."""
    base = replace(
        request,
        optimizers=("adamw",),
        strategies=request.strategies or LEVER_STRATEGIES,
        offload=("none",),
        batch_size=None,
        accumulation_steps=None,
    )
    adapters = set(q.configs[i].adapter for i in range(len(q.configs)))
    cuda = q.device == "cuda"
    out = []
    asked_bits = {rules.optimizer_info[o].bits for o in request.optimizers if o in rules.optimizer_info}
    eight = next((o for o in EIGHT_BIT if installed(rules, o)), None)
    # first: the same training (the same loss, exactly), its logits never whole
    fused = rules.fit["loss"]["fused"]["model_types"]
    if q.method == "trainer" and q.loss == "logits" and cuda and q.model.model_type in fused:
        out.append(("fused loss", "--loss fused", replace(base, loss="fused"), True))
    if request.optimizers and 8 not in asked_bits and eight and cuda:
        out.append(("8-bit states", f"--optimizer {eight}", replace(base, optimizers=(eight,)), True))
    if adapters == {"full"}:
        out.append(("LoRA", "--adapter lora", replace(base, adapters=("lora",)), True))
    adapted = [a for a in ("lora", "qlora") if a in adapters]
    targets = attention_targets(q, rules)
    if adapted and not request.lora_targets and targets:
        flags = f"--lora-targets {','.join(targets)}"
        out.append(
            ("attention-only LoRA", flags, replace(base, adapters=(adapted[0],), lora_targets=targets), True)
        )
    if "qlora" not in adapters and cuda:
        lever = replace(base, adapters=("qlora",), dtype=tuple(d for d in q.dtypes if d != "fp32"))
        out.append(("QLoRA", "--adapter qlora", lever, True))
    static = min((sum(r.memory_gb[c] for c in STATIC) for r in rows if r.adamw), default=0.0)
    if q.seq_len and static < usable_gb:  # else no length makes room: activations are never negative
        for k in range(1, HALVINGS + 1):
            shorter = q.seq_len >> k
            if shorter >= SHORTEST:
                lever, flags = replace(base, seq_len=shorter), f"--seq-len {shorter}"
                if q.rollout is not None:  # GRPO: prompt and completion both halved
                    completion = max(1, q.rollout.completion >> k)
                    lever = replace(lever, completion_len=completion)
                    flags += f" --completion-len {completion}"
                out.append(("shorter sequences", flags, lever, True))
    if q.rollout is not None and q.rollout.generation != "vllm-server" and cuda:
        lever = replace(base, generation="vllm-server")
        out.append(("generation on other GPUs", "--generation vllm-server", lever, False))
    if q.world == 1 and cuda and q.accelerator is not None:
        only_ddp = adapters == {"qlora"} or q.rollout is not None  # GRPO: predicted under DDP alone
        shardings = ("ddp",) if only_ddp else ("ddp", "zero2", "zero3")
        lever = replace(base, gpus=2, shardings=shardings)
        out.append(("a second GPU", f"--gpus 2 --sharding {'/'.join(shardings)}", lever, False))
    return out


def attention_targets(q: Question, rules: Rules) -> tuple[str, ...]:
    """The attention projections of the model's blocks, as peft names them (rules/fit.toml [levers])."""
    table = rules.fit["levers"]["attention_targets"]
    return tuple(table.get(q.model.model_type or "", table["default"]))


def pulled(
    q: Question,
    rows: list[Row],
    request: FitRequest,
    rules: Rules,
    usable_gb: float,
    ask: Callable[[FitRequest, str], tuple[Question, object]],
) -> list[Lever]:
    """Each lever that applies, asked (`ask(request, name)`: its question and answer), with its figure; the
    shorter sequences only down to the first length that fits."""
    out: list[Lever] = []
    for name, flags, lever, own in candidates(q, rows, request, rules, usable_gb):
        if name == "shorter sequences" and any(x.name == name and x.fits for x in out):
            continue
        try:
            asked, answer = ask(lever, name)
        except Error as e:
            out.append(Lever(name, flags, why_not=str(e), own_hardware=own))
            continue
        row = answer.pick or min(answer.rows, key=lambda r: r.total)
        out.append(Lever(name, flags, row, asked, own_hardware=own))
    shorter = [x for x in out if x.name == "shorter sequences"]
    if shorter:  # only the longest that fits, or the shortest tried
        keep = next((x for x in shorter if x.fits), shorter[-1])
        out = [x for x in out if x.name != "shorter sequences" or x is keep]
    return out


def picked(levers: list[Lever]) -> Lever | None:
    """The first lever that fits on the user's own hardware."""
    return next((x for x in levers if x.fits and x.own_hardware), None)
