"""The declarative knowledge in rules/*.toml, loaded and checked once, with lookups by name."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from advisor.errors import RulesError
from advisor.places import shipped_rules_dir, user_rules_dir


@dataclass(frozen=True)
class Metric:
    name: str
    direction: str  # 'min' or 'max'
    unit: str
    label: str
    measures: tuple[str, ...]

    def best(self, values):
        return min(values) if self.direction == "min" else max(values)


@dataclass(frozen=True)
class Measure:
    name: str
    label: str
    factor: float = 1.0
    scale: str | None = None  # a column of `runs` the value is multiplied by
    note: str | None = None
    accelerator: bool = False  # memory of the accelerator (what --memory means), not host RAM
    unit: str | None = None  # the measure's own unit, where it is not its metric's (a prediction per sample)


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
    module: str | None = None  # the measurement side's module for the family (measure.families.<name>)

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


@dataclass(frozen=True)
class Rules:
    metrics: dict[str, Metric]
    measures: dict[str, Measure]
    families: dict[str, FamilyRecord]
    optimizer_info: dict[str, OptimizerRecord]
    flowchart: dict
    caveats: list[dict]
    optimizers: tuple[str, ...]
    strategies: tuple[str, ...]
    arms: dict[str, str]  # a measured arm -> the strategy it is in memory and speed (families.toml `arms`)
    presets: tuple[str, ...]
    accelerators: dict[str, Accelerator]
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


def load_rules(directory: str | None = None) -> Rules:
    """Every rules file, cross-checked: the shipped rules (or `directory`'s), extended by the user's rules
    directory where it exists (not when a directory is named)."""
    base = Path(directory) if directory else shipped_rules_dir()
    extra = None if directory else user_rules_dir()
    return _load_rules(str(base), str(extra) if extra is not None and _readable_dir(extra) else None)


def _readable_dir(path: Path) -> bool:
    """A folder we may read (a user data folder we cannot even look into counts as absent)."""
    try:
        return path.is_dir() and os.access(path, os.R_OK | os.X_OK)
    except OSError:
        return False


RULE_FILES = ("metrics", "families", "optimizers", "flowchart", "caveats", "hardware", "fit", "protocol")


@cache
def _load_rules(directory: str, extra: str | None) -> Rules:
    """(Cached: the rules do not change during a process.)"""
    base = Path(directory)
    raw = {name: _read(base / f"{name}.toml") for name in RULE_FILES}
    if extra is not None:
        for name in RULE_FILES:
            if (Path(extra) / f"{name}.toml").exists():
                raw[name] = extended(raw[name], _read(Path(extra) / f"{name}.toml"))
    measures = {n: Measure(name=n, **m) for n, m in raw["metrics"].get("measures", {}).items()}
    metrics = {}
    for name, m in raw["metrics"].get("metrics", {}).items():
        metric = Metric(
            name=name,
            direction=m["direction"],
            unit=m["unit"],
            label=m["label"],
            measures=tuple(m["measures"]),
        )
        if metric.direction not in ("min", "max"):
            raise RulesError(f"metric {name}: direction must be 'min' or 'max', not {metric.direction!r}")
        unknown = [x for x in metric.measures if x not in measures]
        if unknown:
            raise RulesError(f"metric {name} reads undefined measures: {', '.join(unknown)}")
        metrics[name] = metric
    optimizers = _optimizers(raw["optimizers"])
    families = _families(raw["families"], tuple(optimizers))
    flowchart = raw["flowchart"]
    missing = [m for m in flowchart.get("metrics", []) if m not in metrics]
    if missing:
        raise RulesError(f"flowchart.toml walks undefined metrics: {', '.join(missing)}")
    _check_model_types_unique(families)
    _check_numbers(flowchart, raw["protocol"])
    return Rules(
        metrics=metrics,
        measures=measures,
        families=families,
        optimizer_info=optimizers,
        flowchart=flowchart,
        caveats=raw["caveats"].get("caveats", []),
        optimizers=tuple(optimizers),
        strategies=tuple(raw["families"]["strategies"]),
        arms=_arms(raw["families"]),
        presets=tuple(raw["families"]["presets"]),
        accelerators=_accelerators(raw["hardware"]),
        fit=raw["fit"],
        architectures=dict(raw["families"].get("architectures", {})),
        protocol=raw["protocol"],
    )


def _accelerators(raw: dict) -> dict[str, Accelerator]:
    out = {}
    for key, a in raw.get("accelerators", {}).items():
        try:
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
            )
        except KeyError as e:
            raise RulesError(f"hardware.toml: accelerator {key} needs {e.args[0]}") from e
    return out


def _optimizers(raw: dict) -> dict[str, OptimizerRecord]:
    """Optimizers of optimizers.toml, in its order."""
    out = {}
    for name, o in raw.get("optimizers", {}).items():
        try:
            out[name] = OptimizerRecord(
                name=name, **{k: tuple(v) if isinstance(v, list) else v for k, v in o.items()}
            )
        except TypeError as e:
            raise RulesError(f"optimizers.toml: optimizer {name}: {e}") from e
        if (out[name].trainer is None) == (out[name].code is None):
            raise RulesError(f"optimizers.toml: optimizer {name} needs exactly one of trainer and code")
    if not out:
        raise RulesError("optimizers.toml names no optimizer")
    return out


def _families(raw: dict, optimizers: tuple[str, ...]) -> dict[str, FamilyRecord]:
    """Families of families.toml; the grid defaults to the file's top-level grid_optimizers/strategies."""
    out = {}
    for name, f in raw.get("families", {}).items():
        try:
            inputs = tuple(f["inputs"])
            if not inputs or any(i not in INPUTS for i in inputs):
                raise RulesError(f"families.toml: family {name}'s inputs must be some of {', '.join(INPUTS)}")
            out[name] = FamilyRecord(
                name=name,
                aliases=tuple(f.get("aliases", ())),
                reference_model=f.get("reference_model", name),
                description=f.get("description", ""),
                grid_optimizers=tuple(f.get("grid_optimizers", raw["grid_optimizers"])),
                grid_strategies=tuple(f.get("grid_strategies", raw["grid_strategies"])),
                model_types=tuple(f.get("model_types", ())),
                inputs=inputs,
                fit_seq_len=int(f.get("fit_seq_len", raw["fit_seq_len"])),
                module=f.get("module"),
            )
        except KeyError as e:
            raise RulesError(
                f"families.toml: family {name} needs {e.args[0]} (or a top-level default)"
            ) from e
    for fam in out.values():
        unknown = [o for o in fam.grid_optimizers if o not in optimizers]
        unknown += [s for s in fam.grid_strategies if s not in raw["strategies"]]
        if unknown:
            raise RulesError(f"families.toml: family {fam.name}'s grid names unknown {', '.join(unknown)}")
    return out


# Numbers of the rules that answers read as they are: (file, table path, key, what a value must be, check)
_NUMBERS = (
    (
        "flowchart.toml",
        ("evidence",),
        "match_scale_ratio",
        "a ratio of at least 1 (e.g. 2)",
        lambda v: v >= 1,
    ),
    (
        "flowchart.toml",
        ("evidence",),
        "scale_warning_ratio",
        "a ratio of at least 1 (e.g. 3)",
        lambda v: v >= 1,
    ),
    (
        "protocol.toml",
        ("tuning",),
        "extend",
        "a whole number of grid steps, 0 or more (e.g. 3)",
        lambda v: v >= 0,
    ),
)


def _check_numbers(flowchart: dict, protocol: dict) -> None:
    """Each number of _NUMBERS present and of its kind, or RulesError with a sentence that names it."""
    files = {"flowchart.toml": flowchart, "protocol.toml": protocol}
    for file, path, key, what, ok in _NUMBERS:
        table = files[file]
        for part in path:
            table = table.get(part, {}) if isinstance(table, dict) else {}
        value = table.get(key) if isinstance(table, dict) else None
        whole = key == "extend"
        kind = int if whole else int | float
        if isinstance(value, bool) or not isinstance(value, kind) or not ok(value):
            raise RulesError(f"rules/{file}: [{'.'.join(path)}] {key} must be {what}, not {value!r}.")


def _arms(raw: dict) -> dict[str, str]:
    """families.toml `arms`: each a strategy of the list, standing for another strategy of the list."""
    arms = raw.get("arms", {})
    if not isinstance(arms, dict):
        raise RulesError("families.toml: arms must be a table of strategy = the strategy it is measured as.")
    for arm, base in arms.items():
        if arm not in raw["strategies"] or base not in raw["strategies"] or arm == base:
            raise RulesError(
                f"families.toml: arms.{arm} = {base!r} must name two different strategies of `strategies`."
            )
    return dict(arms)


def extended(base: dict, user: dict) -> dict:
    """The shipped rules with the user's merged in: tables merged key by key, lists extended with the
    user's new items (a model_type added to a family), any other value replaced by the user's."""
    out = dict(base)
    for key, value in user.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = extended(out[key], value)
        elif isinstance(value, list) and isinstance(out.get(key), list):
            out[key] = out[key] + [v for v in value if v not in out[key]]
        else:
            out[key] = value
    return out


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise RulesError(f"rules file {path} is missing") from e
    except tomllib.TOMLDecodeError as e:
        raise RulesError(f"rules file {path} is not valid TOML: {e}") from e


def _check_model_types_unique(families: dict[str, FamilyRecord]) -> None:
    seen: dict[str, str] = {}
    for fam in families.values():
        for mt in fam.model_types:
            if mt in seen:
                raise RulesError(f"model_type {mt!r} is listed under both {seen[mt]} and {fam.name}")
            seen[mt] = fam.name
