"""`advisor fit`'s views: the head, the ladder, the configurations and where their memory goes, the code and
launch of the pick, the assumptions; and `--list-gpus`. Apart from views.py so that a fit imports none of the
evidence side's answers."""

from __future__ import annotations

import json

from rich.console import Group as RGroup
from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from advisor.model_ref import shipped_model, shipped_models
from advisor.prediction.accelerators import gib
from advisor.prediction.question import text_first
from advisor.prediction.ranking import LADDER_NOTE, LEVERS_NOTE
from advisor.prediction.speed import CALIBRATED
from advisor.render.numbers import fmt
from advisor.rules import Rules

MORE = "--verbose: configurations, memory breakdown, code, assumptions · --code · --json"


def fit_view(answer, everything: bool = False, verbose: bool = False) -> RenderableType:
    """`advisor fit`: the model and accelerator, the pick (or the ladder to one); with `verbose` (or
    `everything`), the configurations that matter, where their memory goes, how to run the pick, and what
    the numbers rest on. The short answer stays about 15 lines: the question people have first."""
    parts = [_fit_head(answer, verbose or everything)]
    if answer.ladder:
        parts.append(_ladder(answer))
    if answer.levers:
        parts.append(_levers(answer))
    if not (verbose or everything):
        return RGroup(*parts, Text(MORE, style="dim"))
    rows = answer.shown(everything)
    parts += [_fit_table(answer, rows), _memory_table(rows)]
    trades = {r.optimizer: r.trade for r in rows if r.trade}
    adapters = {r.adapter.kind: r.adapter_trade for r in rows if r.adapter_trade}
    if trades or adapters:
        text = Text("What the other optimizers and the adapters trade\n", style="bold")
        for name, trade in {
            **trades,
            **{"LoRA" if a == "lora" else a: t for a, t in adapters.items()},
        }.items():
            text.append(f"• {name}: {trade}\n")
        parts.append(text)
    shown = runnable(answer)
    if shown is None:
        parts.append(Text(f"No code: {NOTHING_FITS}\n", style="bold"))
    else:
        label = "Run it" if answer.pick else f"Run it on {shown.world} GPUs"
        parts.append(Text(f"{label} ({shown.label}):", style="bold"))
        parts.append(Text(code_of(answer, shown) + "\n", no_wrap=True, overflow="ignore"))  # copies as is
    if shown is not None and shown.launch:
        parts.append(
            Text(
                "Launch it (or with accelerate.yaml below: " + shown.launch["accelerate_command"] + "):",
                style="bold",
            )
        )
        parts.append(Text(shown.launch["command"] + "\n"))
        parts.append(Text("accelerate.yaml:\n" + shown.launch["accelerate_config"]))
        if shown.launch["deepspeed"]:
            parts.append(Text("ds_config.json:\n" + json.dumps(shown.launch["deepspeed"], indent=2) + "\n"))
    notes = Text("Assumptions\n", style="bold")
    notes.append(f"• {step_time_sentence(answer)}\n", style="dim")
    for a in band_lines(answer) + answer.assumptions:
        notes.append(f"• {first_sentence(a)}\n", style="dim")
    notes.append("(each with its source: --json, or rules/fit.toml)\n", style="dim")
    parts.append(notes)
    return RGroup(*parts)


NOTHING_FITS = (
    "nothing fits, not even with the levers above: pass a larger --gpu (or --memory), --gpus N, or a shorter "
    "--seq-len."
)


def runnable(answer):
    """The configuration whose code the answer prints: the pick, else the fewest GPUs that hold the question;
    None when nothing fits (no recipe that does not fit is printed)."""
    return answer.pick or answer.several


def code_of(answer, row) -> str:
    """A row's code, said as a lever's recipe where the pick pulls one beyond what was asked."""
    lever = answer.pick_lever
    if lever is None or row is not answer.pick:
        return row.trainer_code
    return (
        f"# Nothing as asked fits with AdamW: this recipe pulls one lever, {lever.name} ({lever.flags}).\n"
        + row.trainer_code
    )


def first_sentence(text: str) -> str:
    """An assumption's claim without its evidence: up to the first full stop that ends a sentence."""
    for i, ch in enumerate(text):
        if (
            ch == "."
            and (i + 1 == len(text) or text[i + 1] == " ")
            and not text[max(0, i - 3) : i].endswith(("e.g", "i.e", "al", "vs"))
        ):
            return text[: i + 1]
    return text


def _fit_head(answer, verbose: bool) -> Panel:
    """The question in two lines, then the pick and how many configurations fit."""
    q = answer.question
    head = Text()
    family = q.model.family.name if q.model.listed else "unknown family"
    head.append(f"{q.model.name}", style="bold")
    shares = f"; {q.model.architecture_of}'s architecture" if q.model.architecture_of else ""
    head.append(
        f" ({q.model.model_type or 'reference model'}, {family}{shares}) · {answer.n_params / 1e9:.3g} B "
        "parameters\n"
    )
    where = q.accelerator.name if q.accelerator else "a custom budget"
    if q.world > 1:
        nodes = f" × {q.nodes} nodes" if q.nodes > 1 else ""
        where = f"{q.gpus} × {where}{nodes}, per rank"
    pick, n = answer.pick, len(answer.rows)
    head.append(f"{where}: {gib(q.budget_gb):.4g} GiB")
    head.append(f" · {q.seq_len} tokens a sample" if q.seq_len else "")
    if text_first(q.model) and q.image_size is None:
        head.append(f" (text alone: --image-size {q.model.image_size} adds an image)")
    head.append(f" · {q.image_size} px images" if q.image_size and not q.seq_len else "")
    head.append(f" · attention {answer.attention}\n" if verbose else "\n")
    method = method_line(answer)
    head.append(f"{method}\n" if method else "")
    if pick:
        lever = answer.pick_lever
        if lever is not None:
            head.append(
                f"None of {n} configurations fits with AdamW as asked; one lever does: {lever.name} "
                f"({lever.flags})\n",
                style="bold yellow",
            )
        speed = (
            f", {_tokens_per_s(pick.tokens_per_s, answer.speed_band)}"
            if pick.tokens_per_s
            else f", {fmt(pick.throughput)} samples/s"
            if pick.throughput
            else ""
        )
        head.append("The pick: ", style="bold green")
        head.append(f"{pick.label}\n", style="bold")
        head.append(f"{gib(pick.total):.1f} GiB{speed} · {_batch(pick)}\n")
        rate = pick.rate
        head.append(
            f"Learning rate {rate.lr:g}, {rate.schedule}: {rate.short}"
            + ("" if rate.tuned else ", not tuned")
        )
        trade = qlora_trade(answer)
        head.append(f"\n{trade}" if trade else "")
        short = short_of_batch(answer)
        head.append(f"\n{short}" if short else "", style="yellow")
        if answer.band_note and pick.tokens_per_s and not verbose:
            head.append(f"\n{first_sentence(answer.band_note)}", style="dim")
        head.append(f"\n{len(answer.fitting)} of {n} configurations fit")
    elif answer.several:
        r = answer.several
        head.append(f"None of {n} configurations fits one GPU. ", style="bold yellow")
        head.append(f"The fewest that hold it: {r.label} ({gib(r.total):.1f} GiB per rank, {_batch(r)})")
    else:
        head.append(f"None of {n} configurations fits.", style="bold red")
    cache = "from the cache" if answer.computed == 0 else f"{answer.computed} traced now, cached"
    if answer.not_cached:
        cache = f"{answer.computed} traced now, not cached"  # why: a line on stderr (advisor fit)
    listed = len(answer.shown())
    more = f" · {listed} of {n} shown (--all for every one)" if verbose and listed < n else ""
    head.append(f" · {cache}{more}", style="dim")
    # the title as text, not markup (rich's emoji table is not read for it)
    return Panel(head, title=Text("advisor fit"), title_align="left", border_style="green" if pick else "red")


METHOD_WORDS = {
    "sft": "TRL's SFTTrainer (chunked log-probabilities: no full logits)",
    "dpo": "TRL's DPOTrainer (a pair's chosen and rejected in one forward: 2 sequences a sample)",
    "reward": "TRL's RewardTrainer (a one-label classifier on pairs: 2 sequences a sample)",
    "grpo": "TRL's GRPOTrainer",
}
GENERATION_WORDS = {
    "transformers": "sampled by the policy's own generate on the training GPU (its KV cache counted)",
    "vllm-colocate": "sampled by vLLM beside training, holding 30 % of each GPU (TRL's default share)",
    "vllm-server": "sampled by a vLLM server on GPUs of its own (not counted here)",
}
FUSED_LOSS = (
    "Liger's fused linear cross-entropy (use_liger_kernel, its other kernels off): the output layer and the loss "
    "in chunks of about the hidden states' size, the logits never whole, their gradients made in the forward"
)
PLAIN_PHASES = {"forward", "backward", "optimizer_step"}  # every step's: named per phase only beside others
REFERENCE_WORDS = {
    "model": "a frozen copy of the model in memory",
    "adapter": "the base with the adapter off (no weights of its own)",
    "precomputed": "log-probabilities precomputed before training",
}


def method_line(answer) -> str | None:
    """The training method when it is TRL's, with DPO's reference and the pick's figure per phase."""
    q = answer.question
    if q.method == "trainer":
        return FUSED_LOSS if q.loss == "fused" else None
    line = METHOD_WORDS[q.method]
    pick = answer.pick
    if q.method == "dpo":
        line += (
            f"; reference: {REFERENCE_WORDS[q.method_of(pick.adapter.kind).reference]}"
            if pick
            else "; reference: a frozen copy (full) or the base with the adapter off (LoRA)"
        )
    if q.method == "grpo":
        line += _rollout_words(q, pick)
    if (
        pick and set(pick.phases_gb) - PLAIN_PHASES
    ):  # a reference's or a generation's phases beside the step's
        phases = " · ".join(f"{p.replace('_', ' ')} {gib(v):.1f}" for p, v in pick.phases_gb.items())
        line += f"\nThe pick's tensors per phase, GiB: {phases}"
    if pick and pick.generation_tokens_s:
        line += (
            f"\nGeneration: about {pick.generation_tokens_s:,.0f} completion tokens/s, in the step time (modelled, "
            "not measured: decoding bound by memory, every weight (a quantized one dequantized) and the KV cache "
            "read once per token)"
        )
    return line


def _rollout_words(q, pick) -> str:
    """GRPO's generation and reference in a sentence."""
    r = q.rollout
    prompt = q.seq_len - r.completion
    out = (
        f" ({r.generations} completions of up to {r.completion:,} tokens per prompt of {prompt:,}, "
        f"{GENERATION_WORDS[r.generation]}"
    )
    method = q.method_of(pick.adapter.kind if pick else "full")
    if method.reference is None:
        return out + "; no reference: KL coefficient 0, TRL's default)"
    return out + f"; reference for β {r.beta:g}: {REFERENCE_WORDS[method.reference]})"


def _batch(row) -> str:
    """A row's recipe batch in a few words: 'batch 2 × 8 accumulated = 16 a step'."""
    if row.accumulation_steps == 1 and row.world == 1:
        return f"batch {row.batch_size}"
    ranks = f" × {row.world} GPUs" if row.world > 1 else ""
    steps = f" × {row.accumulation_steps} accumulated" if row.accumulation_steps > 1 else ""
    return f"batch {row.batch_size}{steps}{ranks} = {row.effective_batch}"


def _rate_origin(rate) -> str:
    """Where a learning rate comes from, in a few words."""
    return (
        "tuned in your KB" if rate.tuned else "a published default, not tuned for this model (--json: source)"
    )


def qlora_trade(answer) -> str | None:
    """What QLoRA would buy beside a LoRA pick that fits: its memory and speed against the pick's."""
    pick = answer.pick
    if pick is None or pick.adapter.kind != "lora":
        return None
    twin = next(
        (
            r
            for r in answer.fitting
            if r.adapter.kind == "qlora"
            and (r.optimizer, r.strategy, r.dtype) == (pick.optimizer, pick.strategy, pick.dtype)
        ),
        None,
    )
    if twin is None:
        return None
    twin = twin.at(pick.batch_size, pick.accumulation_steps)  # alike: the pick's micro-batch and accumulation
    speed = ""
    if pick.tokens_per_s and twin.tokens_per_s:
        change = twin.tokens_per_s / pick.tokens_per_s - 1
        speed = (
            ", the same predicted speed"
            if abs(change) < 0.005
            else f", {abs(change):.0%} {'fewer' if change < 0 else 'more'} tokens/s"
        )
        band = answer.speed_band
        if band and 0.005 <= abs(change) < band.median:
            speed += f" (within the speed model's median error of {band.median:.0%}: undecided)"
    return f"QLoRA at this batch: {gib(twin.total):.1f} GiB{speed}"


def _tokens_per_s(predicted: float, band) -> str:
    """'2,900 tokens/s (2,700–3,100)': the prediction, and where published runs fell around it on this
    generation (speed.Band: 8 held-out runs of 10), where it has a band."""
    if band is None:
        return f"{predicted:,.0f} tokens/s"
    low, high = band.interval(predicted)
    return f"{predicted:,.0f} tokens/s ({low:,.0f}–{high:,.0f})"


def band_lines(answer) -> list[str]:
    """What the speed band is (--verbose), or why there is none."""
    band = answer.speed_band
    if band is None:
        return [answer.band_note] if answer.band_note else []
    return [
        f"Speed band: where the measured tokens/s fell for 8 of 10 of {band.rows} held-out published runs on "
        f"{band.generation} (predicted / published from {band.low:.2f} to {band.high:.2f}; median error "
        f"{band.median:.0%}; bench/results/fit-speed.json)."
    ]


def short_of_batch(answer) -> str | None:
    """Why the pick steps on fewer samples than the recipe asks, where it does."""
    pick, wanted = answer.pick, answer.question.effective_batch
    if pick is None or pick.effective_batch >= wanted:
        return None
    return (
        f"{pick.effective_batch} samples a step, short of {wanted}: no configuration asked that fits reaches it "
        "(accumulation holds the gradients between micro-batches; --strategy narrows what is asked)."
    )


def _levers(answer) -> Text:
    """Each lever beyond the asked menu, a line each: ✓ or ✗, the flags that ask it, its figure."""
    text = Text(f"{LEVERS_NOTE}\n", style="bold yellow")
    for lever in answer.levers:
        more = " (more hardware: never the pick)" if not lever.own_hardware and lever.fits else ""
        mark = "✓" if lever.fits else "✗"
        text.append(f"{mark} {lever.sentence}{more}\n", style="green" if lever.fits else None)
    return text


def _ladder(answer) -> Text:
    """Each lever in turn, a line each: ✓ or ✗, what it changes, its memory (the sentences: --json)."""
    text = Text(f"{LADDER_NOTE}\n", style="bold yellow")
    for rung in answer.ladder:
        if rung.row is None:
            text.append(f"✗ {rung.sentence}\n")
            continue
        r = rung.row
        host = f" (+{gib(r.host_gb):.1f} host)" if r.host_gb >= 0.05 else ""
        per = " per rank" if r.world > 1 else ""
        line = f"{'✓' if rung.fits else '✗'} {rung.name}: {r.label}: {gib(r.total):.1f} GiB{per}{host}\n"
        text.append(line, style="green" if rung.fits else None)
    return text


SHORT_STRATEGY = {  # tables must fit 80 columns
    "checkpointing+accumulation": "ckpt+accum",
    "selective-checkpointing": "selective",
    "checkpointing": "ckpt",
    "accumulation": "accum",
}
SHORT_DTYPE = {"bf16-mixed": "bf16-mix", "fp16-mixed": "fp16-mix"}


def _what(r) -> str:
    """The configuration as a table shows it: 'lora16 bf16-mix adamw ckpt'."""
    a = r.adapter
    adapter = {"full": "full", "lora": f"lora{a.r}", "qlora": f"qlora{a.base_bits}"}[a.kind]
    strategy = SHORT_STRATEGY.get(r.strategy, r.strategy) + {"none": "", "optimizer": "+offload"}.get(
        r.offload, "+offload+params"
    )
    sharding = "" if r.sharding == "none" else f" {r.sharding}"
    return f"{adapter} {SHORT_DTYPE.get(r.dtype, r.dtype)} {r.optimizer} {strategy}{sharding}"


def _fit_table(answer, rows) -> Table:
    table = Table(title="Configurations (the pick first)", title_justify="left", box=None, pad_edge=False)
    rate = "tok/s" if answer.question.seq_len else "samples/s"
    for col in ("#", "adapter dtype optimizer strategy", "fits", "GiB", "host", "batch", rate):
        table.add_column(
            col,
            justify="left" if col[0] in "af" else "right",
            no_wrap=col != "adapter dtype optimizer strategy",
        )
    ties = answer.time_ties(rows)
    for i, (r, tie) in enumerate(zip(rows, ties, strict=True), 1):
        speed = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else fmt(r.throughput)
        speed = f"≈ {speed}" if tie else speed
        table.add_row(
            str(i),
            _what(r),
            "[green]✓[/green]" if r.fits else "[red]✗[/red]",
            f"{gib(r.total):.1f}",
            f"{gib(r.host_gb):.1f}" if r.host_gb >= 0.05 else "",
            str(r.max_batch_size) if r.max_batch_size else "—",
            speed,
        )
    if any(ties):
        table.caption = (
            "≈: placed below the row above by tokens/s alone, within the speed model's median error on held-out "
            f"runs ({answer.speed_band.median:.0%}): undecided by time"
        )
        table.caption_justify = "left"
    return table


def _memory_table(rows) -> Table:
    table = Table(
        title="Where the memory goes (GiB at the step's peak; # as above)",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    cols = {
        "parameters": "params",
        "gradients": "grads",
        "optimizer_state": "state",
        "activations": "acts",
        "temporaries": "temps",
        "overhead": "other",
        "total": "total",
    }
    table.add_column("#", justify="right")
    for header in cols.values():
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("peak at")
    for i, r in enumerate(rows, 1):
        table.add_row(
            str(i), *(f"{gib(r.memory_gb[c]):.1f}" for c in cols), r.peak_phase.rstrip("0123456789")
        )
    return table


def models_view() -> Table:
    """`--list-models`: the published models advisor ships configs of, with their architecture (model_type),
    Hub ids, aliases and variants (an instruct model with its own Hub id), every name whole."""
    table = Table(
        title="Published models (models/index.toml): --model takes any name of a row", show_edge=False
    )
    models = shipped_models()
    table.add_column("--model", no_wrap=True, min_width=max(map(len, models)))  # what is typed: whole
    table.add_column("type", no_wrap=True)
    table.add_column("Hugging Face id", overflow="fold")
    table.add_column("also (aliases; variants with their own Hub id)", overflow="fold")
    for name, entry in models.items():
        config = shipped_model(name)[1]
        model_type = json.loads(config.read_text()).get("model_type", "")
        also = [*entry.get("aliases", ()), *entry.get("variants", {})]
        table.add_row(name, model_type, entry["hub"], ", ".join(also))
    return table


def gpus_view(rules: Rules) -> Table:
    table = Table(
        title="Accelerators (rules/hardware.toml): TFLOP/s by precision, memory and link GB/s",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("--gpu", "name", "GiB", "bf16", "fp16", "fp32", "mem GB/s", "link GB/s"):
        table.add_column(col, no_wrap=col == "--gpu")
    for key, a in rules.accelerators.items():
        table.add_row(
            key,
            a.name,
            "host" if a.memory_gib is None else f"{a.memory_gib:g}",
            *(fmt(a.tflops.get(p)) for p in ("bf16", "fp16", "fp32")),
            fmt(a.bandwidth_gbs),
            fmt(a.link_gbs),
        )
    return table


def step_time_sentence(answer) -> str:
    """How a step's time was predicted (advisor/prediction/speed.py), in one sentence with its source."""
    if not answer.mfu_modelled:
        return f"Step time: FLOPs ÷ (peak FLOP/s × utilization {answer.mfu:.2f}); {answer.mfu_source}"
    if answer.mfu_source.startswith(CALIBRATED):
        return f"Step time: FLOPs, a micro-batch's fixed cost and the optimizer's traffic at the rates {answer.mfu_source}"
    return (
        f"Step time: FLOPs ÷ (peak FLOP/s × {answer.mfu:.2f}), a fixed cost per micro-batch, a quantized "
        f"base's dequantization and the optimizer's traffic at the memory bandwidth; {answer.mfu_source}"
    )
