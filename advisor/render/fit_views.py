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

from advisor.prediction.accelerators import memory_gb
from advisor.render.numbers import fmt
from advisor.rules import Rules


def fit_view(answer, everything: bool = False) -> RenderableType:
    """`advisor fit`: the model and accelerator, the pick (or the ladder to one), the configurations that
    matter, where their memory goes, how to run the pick, and what the numbers rest on."""
    rows = answer.shown(everything)
    parts = [_fit_head(answer)]
    if answer.ladder:
        parts.append(_ladder(answer))
    parts += [_fit_table(answer, rows), _memory_table(rows)]
    trades = {r.optimizer: r.trade for r in rows if r.trade}
    if trades:
        text = Text("What the other optimizers trade\n", style="bold")
        for name, trade in trades.items():
            text.append(f"• {name}: {trade}\n")
        parts.append(text)
    shown = answer.pick or answer.several or min(answer.rows, key=lambda r: r.total)
    label = (
        "Run it"
        if answer.pick
        else f"Run it on {answer.several.world} GPUs"
        if answer.several
        else "The smallest configuration"
    )
    parts.append(Text(f"{label} ({shown.label}):", style="bold"))
    parts.append(Text(shown.trainer_code + "\n"))
    if shown.launch:
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
    notes.append(
        f"• Step time: FLOPs ÷ (peak FLOP/s × utilization {answer.mfu:.2f}); {answer.mfu_source}\n",
        style="dim",
    )
    for a in answer.assumptions:
        notes.append(f"• {first_sentence(a)}\n", style="dim")
    notes.append("(each with its source: --json, or rules/fit.toml)\n", style="dim")
    parts.append(notes)
    return RGroup(*parts)


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


def _fit_head(answer) -> Panel:
    q = answer.question
    head = Text()
    family = q.model.family.name if q.model.listed else "unknown family"
    head.append(f"{q.model.name}", style="bold")
    head.append(
        f" ({q.model.model_type or 'reference model'}, {family}) · {answer.n_params / 1e9:.3g} B parameters\n"
    )
    where = q.accelerator.name if q.accelerator else "a custom budget"
    if q.world > 1:
        nodes = f" × {q.nodes} nodes" if q.nodes > 1 else ""
        where = f"{q.gpus} × {where}{nodes}, per rank"
    head.append(f"{where}: {q.budget_gb:.1f} GB · micro-batch {q.batch_size}")
    head.append(f" × {q.seq_len} tokens" if q.seq_len else "")
    head.append(f" · {q.image_size} px images" if q.image_size and not q.seq_len else "")
    head.append(f" · accumulation {q.accumulation_steps} · attention {answer.attention}\n")
    pick, n = answer.pick, len(answer.rows)
    if pick:
        speed = f", {pick.tokens_per_s:,.0f} tokens/s" if pick.tokens_per_s else ""
        head.append(f"{len(answer.fitting)} of {n} configurations fit. ", style="bold green")
        head.append(f"The pick: {pick.label} ({pick.total:.1f} GB{speed})")
    elif answer.several:
        r = answer.several
        head.append(f"None of {n} configurations fits one GPU. ", style="bold yellow")
        head.append(f"The fewest that hold it: {r.label} ({r.total:.1f} GB per rank)")
    else:
        head.append(f"None of {n} configurations fits.", style="bold red")
    cache = (
        "every prediction from the cache" if answer.computed == 0 else f"{answer.computed} traced now, cached"
    )
    shown = len(answer.shown())
    more = f" · {shown} of {n} shown (--all for every one)" if shown < n else ""
    head.append(f"\n{cache}{more}", style="dim")
    return Panel(head, title="advisor fit", title_align="left", border_style="green" if pick else "red")


def _ladder(answer) -> Text:
    text = Text("Nothing as asked fits. The ladder, lever by lever:\n", style="bold yellow")
    for rung in answer.ladder:
        text.append(f"{'✓' if rung.fits else '✗'} {rung.sentence}\n", style="green" if rung.fits else None)
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
    for col in ("#", "adapter dtype optimizer strategy", "fits", "GB", "host", "batch", rate):
        table.add_column(
            col,
            justify="left" if col[0] in "af" else "right",
            no_wrap=col != "adapter dtype optimizer strategy",
        )
    for i, r in enumerate(rows, 1):
        speed = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else fmt(r.throughput)
        table.add_row(
            str(i),
            _what(r),
            "[green]✓[/green]" if r.fits else "[red]✗[/red]",
            f"{r.total:.1f}",
            f"{r.host_gb:.1f}" if r.host_gb >= 0.05 else "",
            str(r.max_batch_size) if r.max_batch_size else "—",
            speed,
        )
    return table


def _memory_table(rows) -> Table:
    table = Table(
        title="Where the memory goes (GB at the step's peak; # as above)",
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
        table.add_row(str(i), *(f"{r.memory_gb[c]:.1f}" for c in cols), r.peak_phase.rstrip("0123456789"))
    return table


def gpus_view(rules: Rules) -> Table:
    table = Table(
        title="Accelerators (rules/hardware.toml): TFLOP/s by precision, memory and link GB/s",
        title_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("--gpu", "name", "GB", "bf16", "fp16", "fp32", "mem GB/s", "link GB/s"):
        table.add_column(col, no_wrap=col == "--gpu")
    for key, a in rules.accelerators.items():
        table.add_row(
            key,
            a.name,
            f"{memory_gb(a):.1f}",
            *(fmt(a.tflops.get(p)) for p in ("bf16", "fp16", "fp32")),
            fmt(a.bandwidth_gbs),
            fmt(a.link_gbs),
        )
    return table
