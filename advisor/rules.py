"""The declarative knowledge in rules/*.toml, loaded and checked once, with lookups by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from advisor.places import shipped_rules_dir, user_rules_dir
from advisor.rules_files import RULE_FILES, RulesFiles, parsed, readable_dir, user_files
from advisor.rules_schema import (
    NAMED,
    REFERENCES,
    found,
    shown,
    suggestion,
)


@dataclass(frozen=True)
class Metric:
    """A metric a question optimizes (rules/metrics.toml): its direction, unit and the measures that state it."""

    name: str
    direction: str  # 'min' or 'max'
    unit: str
    label: str
    measures: tuple[str, ...]

    def best(self, values):
        return min(values) if self.direction == "min" else max(values)


@dataclass(frozen=True)
class Measure:
    """A stored measure (rules/metrics.toml): its label, the factor to its metric's unit, what it is of."""

    name: str
    label: str
    factor: float = 1.0
    scale: str | None = None  # a column of `runs` the value is multiplied by
    note: str | None = None
    accelerator: bool = False  # memory of the accelerator (what --memory means), not host RAM
    unit: str | None = None  # the measure's own unit, where it is not its metric's (a prediction per sample)


# The words for each measure, the same wherever a figure is shown (rules/metrics.toml names them too).
MEASURE_WORDS = {
    "eval_loss": "held-out loss",
    "loss": "training loss (run mean)",
    "gpu_mem_peak_gb": "GPU peak GB",
    "tensor_peak_gb": "tensor peak GB",
    "peak_rss_gb": "RSS growth GB",
}

INPUTS = ("text", "image")  # what a family's models may take


@dataclass(frozen=True)
class FamilyRecord:
    """A family as rules/families.toml declares it: its names, grid, model types, and what its models take
    (so that no code outside the rules asks a family's name what it can do)."""

    name: str
    aliases: tuple[str, ...]
    reference_model: str
    description: str
    grid_optimizers: tuple[str, ...]
    grid_strategies: tuple[str, ...]
    model_types: tuple[str, ...]
    inputs: tuple[str, ...]  # of INPUTS: text, image, or both
    fit_seq_len: int  # `advisor fit`'s default tokens per sample (a VLM's: one caption)
    module: str | None = (
        None  # the measurement side's module for the family (advisor.measuring.model.families.<name>)
    )
    hub: str | None = None  # the published model of the reference model's paper size: what fit's code loads
    # model types of the family that people fine-tune on text first (Gemma 3): advisor fit prices them at
    # text_seq_len tokens without an image unless --image-size asks for one
    text_first: tuple[str, ...] = ()
    text_seq_len: int = 2048
    methods: tuple[str, ...] = (
        "trainer",
    )  # the steps advisor fit traces for it (--method): TRL's on decoders

    @property
    def takes_text(self) -> bool:
        return "text" in self.inputs

    @property
    def takes_images(self) -> bool:
        return "image" in self.inputs


@dataclass(frozen=True)
class OptimizerRecord:
    """An optimizer as rules/optimizers.toml declares it: how Trainer names it, what class it is, what its
    state costs, and what it trades."""

    name: str
    adamw: bool  # AdamW-class: what practitioners pick first
    bits: int  # bits of its state per moment
    menu: bool  # in advisor fit's default menu
    trainer: str | None = None  # TrainingArguments' `optim`; None: passed to Trainer as an object (`code`)
    optim_args: str | None = None
    weight_decay: float | None = None
    code: str | None = None
    imports: str | None = None  # what `code` needs imported
    trade: str | None = None
    package: str | None = None
    offload: bool = False  # the host can run its step (ZeRO-Offload's CPU optimizers)
    adapters: tuple[str, ...] = ("full", "lora", "qlora")  # what it can train
    sharded: bool = False  # it steps FSDP2's sharded parameters


GB_PER_GIB = 2**30 / 1e9  # the unit on the box: a "24 GB" card holds 24 GiB (HBM and GDDR are binary)


def gib(gb: float) -> float:
    """GB of 10^9 bytes (how advisor computes and stores) in GiB, the unit on the box (how it shows)."""
    return gb / GB_PER_GIB


@dataclass(frozen=True)
class Accelerator:
    """An accelerator as rules/hardware.toml states it: memory, dense peak TFLOP/s, bandwidth, link, source."""

    key: str
    name: str
    aliases: tuple[str, ...]
    memory_gib: float | None  # None: the host's RAM, read when asked (rules/hardware.toml: memory_from_host)
    tflops: dict  # precision -> dense peak TFLOP/s; a precision the chip lacks is absent
    bandwidth_gbs: float | None
    source: str
    note: str | None = None
    link: str | None = None  # the GPU-to-GPU link within a node (NVLink 4, PCIe 4.0 x16)
    link_gbs: float | None = None  # its bandwidth per direction, GB/s
    link_source: str | None = None
    generation: str | None = None  # ampere, hopper, ...: rules/fit.toml [speed.generations]
    network: str | None = None  # the [links] entry between nodes by default (rules/hardware.toml)

    @property
    def node_link(self) -> Link | None:
        """Its own link within a node, as a [links] entry would state it."""
        if not self.link_gbs:
            return None
        return Link(
            f"{self.key}-link", self.link or "its link", "node", self.link_gbs, self.link_source or ""
        )


@dataclass(frozen=True)
class Link:
    """A link collectives go through (rules/hardware.toml [links]): within a node or between nodes, its
    bandwidth per direction, per GPU or shared by a node's GPUs."""

    key: str
    name: str
    scope: str  # "node" | "network"
    gbs: float
    source: str
    per: str = "gpu"  # "gpu" | "node"

    def node_gbs(self, gpus: int) -> float:
        """Bandwidth a node of `gpus` GPUs has over it, its ports together."""
        return self.gbs * gpus if self.per == "gpu" else self.gbs


@dataclass(frozen=True)
class Rules:
    """Every rules file, loaded and checked (`load_rules`), with lookups by name."""

    metrics: dict[str, Metric]
    measures: dict[str, Measure]
    families: dict[str, FamilyRecord]
    optimizer_info: dict[str, OptimizerRecord]
    flowchart: dict
    caveats: list[dict]
    optimizers: tuple[str, ...]
    strategies: tuple[str, ...]
    arms: dict[str, str]  # a measured arm -> the strategy it is in memory and speed (families.toml `arms`)
    adapters: dict[str, str]  # an adapter strategy -> the strategy of its step (families.toml `adapters`)
    presets: tuple[str, ...]
    accelerators: dict[str, Accelerator]
    links: dict[str, Link]
    fit: dict  # rules/fit.toml: headroom, overheads, default utilization, each with its source
    architectures: dict[str, str]  # class-name suffix -> family whose inputs and loss fit uses
    protocol: dict = field(default_factory=dict)  # rules/protocol.toml: the fair protocol's targets and grids

    def family(self, name: str) -> FamilyRecord:
        """The family named by a family name, an alias or a reference model name (case-insensitive)."""
        key = name.strip().lower()
        for fam in self.families.values():
            if key == fam.name or key in fam.aliases or key == fam.reference_model:
                return fam
        raise KeyError(name)

    def family_choices(self) -> list[str]:
        return [n for f in self.families.values() for n in (f.name, *f.aliases)]

    def reference_models(self) -> dict[str, str]:
        """Reference model name ('vit') -> family name ('vision')."""
        return {f.reference_model: f.name for f in self.families.values()}

    def family_of_model_type(self, model_type: str) -> FamilyRecord | None:
        for fam in self.families.values():
            if model_type in fam.model_types:
                return fam
        return None

    def metric(self, name: str) -> Metric:
        return self.metrics[name.strip().lower()]

    def tuning_strategy(self, strategy: str) -> str:
        """The strategy a cell's rate is tuned with: its own where rules/protocol.toml [tuning.with] names one
        (an update unlike a plain step's), else the tuning's default (a plain step's update)."""
        tuning = self.protocol["tuning"]
        return tuning.get("with", {}).get(strategy, tuning["strategy"])

    def as_fit(self, strategy: str) -> tuple[str, str]:
        """(adapter, strategy) of advisor fit that a measured strategy is: a measured arm is the strategy it
        stands for (the same step, another data budget), an adapter strategy its adapter on its step's
        strategy, any other strategy full fine-tuning with itself."""
        if strategy in self.adapters:
            return strategy, self.adapters[strategy]
        return "full", self.arms.get(strategy, strategy)

    @property
    def fit_strategies(self) -> tuple[str, ...]:
        """The strategies advisor fit predicts by their own name: neither a measured arm nor an adapter."""
        return tuple(s for s in self.strategies if s not in self.arms and s not in self.adapters)


def load_rules(directory: str | None = None) -> Rules:
    """Every rules file, cross-checked: the shipped rules (or `directory`'s), extended by the user's rules
    directory where it exists (not when a directory is named)."""
    base = Path(directory) if directory else shipped_rules_dir()
    extra = None if directory else user_rules_dir()
    return _load_rules(str(base), str(extra) if extra is not None and readable_dir(extra) else None)


@cache
def _load_rules(directory: str, extra: str | None) -> Rules:
    """(Cached: the rules do not change during a process, so each file is read and checked once.)"""
    shipped = {name: parsed(Path(directory) / f"{name}.toml", name) for name in RULE_FILES}
    files = RulesFiles(shipped, user_files(Path(extra)) if extra is not None else {})
    raw = {name: files.merged(name) for name in RULE_FILES}
    _check_references(raw, files)
    optimizers = _optimizers(raw["optimizers"], files)
    families = _families(raw["families"])
    _check_model_types_unique(families, files)
    return Rules(
        metrics=_metrics(raw["metrics"]),
        measures={n: Measure(name=n, **m) for n, m in raw["metrics"]["measures"].items()},
        families=families,
        optimizer_info=optimizers,
        flowchart=raw["flowchart"],
        caveats=raw["caveats"].get("caveats", []),
        optimizers=tuple(optimizers),
        strategies=tuple(raw["families"]["strategies"]),
        arms=_arms(raw["families"], files),
        adapters=_adapters(raw["families"], files),
        presets=tuple(raw["families"]["presets"]),
        accelerators=_accelerators(raw["hardware"], files),
        links={k: Link(key=k, **v) for k, v in raw["hardware"].get("links", {}).items()},
        fit=raw["fit"],
        architectures=dict(raw["families"].get("architectures", {})),
        protocol=raw["protocol"],
    )


def _metrics(raw: dict) -> dict[str, Metric]:
    return {
        name: Metric(
            name=name,
            direction=m["direction"],
            unit=m["unit"],
            label=m["label"],
            measures=tuple(m["measures"]),
        )
        for name, m in raw["metrics"].items()
    }


def _check_references(raw: dict[str, dict], files: RulesFiles) -> None:
    """Every name one rules file uses that another defines (an optimizer, a strategy, a metric...) defined."""
    known = {
        "measure": raw["metrics"]["measures"],
        "metric": raw["metrics"]["metrics"],
        "optimizer": raw["optimizers"]["optimizers"],
        "strategy": raw["families"]["strategies"],
        "family": raw["families"]["families"],
        "preset": raw["families"]["presets"],
    }
    for name, where, kind, besides in REFERENCES:
        for path, value in found(raw[name], where):
            if value not in known[kind] and value not in besides:
                names = [*known[kind], *besides]
                files.fail(
                    name,
                    path,
                    f"names {shown(value)}, not {NAMED[kind]}"
                    + suggestion(value, names, "; define it there, or remove it."),
                )


def _accelerators(raw: dict, files: RulesFiles) -> dict[str, Accelerator]:
    out = {}
    for key, a in raw["accelerators"].items():
        if not a.get("memory_from_host") and "memory_gib" not in a:
            files.fail(
                "hardware",
                ("accelerators", key),
                "needs memory_gib (or memory_from_host = true).",
            )
        out[key] = Accelerator(
            key=key,
            name=a["name"],
            aliases=tuple(a.get("aliases", ())),
            memory_gib=None if a.get("memory_from_host") else float(a["memory_gib"]),
            tflops=dict(a.get("tflops", {})),
            bandwidth_gbs=a.get("bandwidth_gbs"),
            source=a["source"],
            note=a.get("note"),
            link=a.get("link"),
            link_gbs=a.get("link_gbs"),
            link_source=a.get("link_source"),
            generation=a.get("generation"),
            network=a.get("network"),
        )
        network = raw.get("links", {}).get(out[key].network or "", {"scope": "network"})
        if out[key].network is not None and (
            out[key].network not in raw["links"] or network["scope"] != "network"
        ):
            files.fail(
                "hardware", ("accelerators", key, "network"), "names no [links] entry of scope network."
            )
    return out


def _optimizers(raw: dict, files: RulesFiles) -> dict[str, OptimizerRecord]:
    """Optimizers of optimizers.toml, in its order."""
    out = {}
    for name, o in raw["optimizers"].items():
        out[name] = OptimizerRecord(
            name=name, **{k: tuple(v) if isinstance(v, list) else v for k, v in o.items()}
        )
        if (out[name].trainer is None) == (out[name].code is None):
            files.fail(
                "optimizers",
                ("optimizers", name),
                "needs exactly one of trainer and code.",
            )
    return out


def _families(raw: dict) -> dict[str, FamilyRecord]:
    """Families of families.toml; the grid defaults to the file's top-level grid_optimizers/strategies."""
    return {
        name: FamilyRecord(
            name=name,
            aliases=tuple(f.get("aliases", ())),
            reference_model=f.get("reference_model", name),
            description=f.get("description", ""),
            grid_optimizers=tuple(f.get("grid_optimizers", raw["grid_optimizers"])),
            grid_strategies=tuple(f.get("grid_strategies", raw["grid_strategies"])),
            model_types=tuple(f.get("model_types", ())),
            inputs=tuple(f["inputs"]),
            fit_seq_len=f.get("fit_seq_len", raw["fit_seq_len"]),
            module=f.get("module"),
            hub=f.get("hub"),
            text_first=tuple(f.get("text_first", ())),
            methods=tuple(f.get("methods", ("trainer",))),
            text_seq_len=raw["fit_seq_len"],
        )
        for name, f in raw["families"].items()
    }


def _arms(raw: dict, files: RulesFiles) -> dict[str, str]:
    """families.toml `arms`: each a strategy of the list, standing for another strategy of the list."""
    arms = raw.get("arms", {})
    for arm, base in arms.items():
        if arm not in raw["strategies"] or base not in raw["strategies"] or arm == base:
            files.fail(
                "families",
                ("arms", arm),
                f"= {base!r} must name two different strategies of `strategies`.",
            )
    return dict(arms)


ADAPTER_KINDS = (
    "lora",
)  # the adapters advisor measure trains on a frozen base (advisor/measuring/training/trainer.py)


def _adapters(raw: dict, files: RulesFiles) -> dict[str, str]:
    """families.toml `adapters`: each a strategy of the list named as an adapter advisor measure trains (and
    advisor fit predicts), standing on the step of another strategy of the list (neither an arm nor an
    adapter itself)."""
    adapters = raw.get("adapters", {})
    plain = set(raw["strategies"]) - set(raw.get("arms", {})) - set(adapters)
    for name, step in adapters.items():
        if name not in raw["strategies"] or name not in ADAPTER_KINDS:
            files.fail(
                "families",
                ("adapters", name),
                f"names {name!r}: it must be a strategy of `strategies` and an adapter advisor measure trains "
                f"({', '.join(ADAPTER_KINDS)}).",
            )
        if step not in plain:
            files.fail(
                "families",
                ("adapters", name),
                f"= {step!r} must name a strategy of `strategies` that is neither a measured arm nor an adapter.",
            )
    return dict(adapters)


def _check_model_types_unique(families: dict[str, FamilyRecord], files: RulesFiles) -> None:
    seen: dict[str, str] = {}
    for fam in families.values():
        for mt in fam.model_types:
            if mt in seen:
                files.fail(
                    "families",
                    ("families", fam.name, "model_types"),
                    f"lists {mt!r}, which families.{seen[mt]} lists too: a model_type belongs to one family.",
                )
            seen[mt] = fam.name
