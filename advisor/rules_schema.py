"""What every rules file may hold, as data (each key's type, range, and whether it is required), and one
checker that walks a parsed file with it, so that a bad value is one sentence naming the file, the line and
the key, never a traceback or a silently different answer. Standard library only: it runs on every command."""

from __future__ import annotations

import math
import re

# --- the schema's vocabulary: every node is a plain dict -------------------------------------------------


def text(*, empty: bool = False, choices: tuple[str, ...] | None = None, required: bool = False) -> dict:
    """A string: non-empty unless `empty`, one of `choices` when given."""
    return {"type": "str", "empty": empty, "choices": choices, "required": required}


def flag(*, required: bool = False) -> dict:
    """true or false."""
    return {"type": "bool", "required": required}


def whole(*, low: int | None = None, high: int | None = None, eg=None, required: bool = False) -> dict:
    """A whole number within [low, high] (either bound may be absent)."""
    return {"type": "int", "min": low, "max": high, "eg": eg, "required": required}


def number(
    *,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    below: float | None = None,
    eg=None,
    says: str | None = None,
    required: bool = False,
) -> dict:
    """A finite number, whole or not: at least `low`, at most `high`, above `above`, below `below`; `says`
    what it is, where the bounds alone would not (a fraction)."""
    return {
        "type": "number",
        "says": says,
        "min": low,
        "max": high,
        "above": above,
        "below": below,
        "eg": eg,
        "required": required,
    }


def listing(
    item: dict,
    *,
    at_least: int = 0,
    unique: bool = False,
    increasing: bool = False,
    unique_by: str | None = None,
    required: bool = False,
) -> dict:
    """A list of `item`s: at least `at_least` of them, no repeats when `unique` (or no two tables with the same
    `unique_by` key), strictly increasing when `increasing`."""
    return {
        "type": "list",
        "item": item,
        "min_len": at_least,
        "unique": unique,
        "increasing": increasing,
        "unique_by": unique_by,
        "required": required,
    }


def table(
    keys: dict | None = None,
    *,
    entries: dict | None = None,
    names: tuple[str, ...] | None = None,
    at_least: int = 0,
    required: bool = False,
) -> dict:
    """A table of known `keys`; with `entries`, any other key is a named entry of that schema (its name one
    of `names` when given), e.g. [optimizers.NAME]; `at_least` entries when the file is checked whole."""
    return {
        "type": "table",
        "keys": keys or {},
        "entries": entries,
        "names": names,
        "min_entries": at_least,
        "required": required,
    }


def either(*nodes: dict, required: bool = False) -> dict:
    """One of several shapes (a string or a list of strings), told apart by the value's type."""
    return {"type": "either", "nodes": nodes, "required": required}


def req(node: dict) -> dict:
    """The node, required where its table is checked whole."""
    return {**node, "required": True}


# --- each rules file's schema: X_TOML checks rules/x.toml ------------------------------------------------

METRICS_TOML = table(
    {
        "metrics": req(
            table(
                entries=table(
                    {
                        "direction": req(text(choices=("min", "max"))),
                        "unit": req(text(empty=True)),
                        "label": req(text()),
                        "measures": req(listing(text(), at_least=1, unique=True)),
                    }
                ),
                at_least=1,
            )
        ),
        "measures": req(
            table(
                entries=table(
                    {
                        "label": req(text()),
                        "note": text(),
                        "factor": number(above=0, high=1_000_000, eg=0.01),
                        "scale": text(),
                        "accelerator": flag(),
                        "unit": text(),
                    }
                ),
                at_least=1,
            )
        ),
    }
)

FAMILIES_TOML = table(
    {
        "strategies": req(listing(text(), at_least=1, unique=True)),
        "arms": table(entries=text()),
        "adapters": table(entries=text()),
        "presets": req(listing(text(), at_least=1, unique=True)),
        "architectures": table(entries=text()),
        "grid_optimizers": req(listing(text(), at_least=1, unique=True)),
        "grid_strategies": req(listing(text(), at_least=1, unique=True)),
        "fit_seq_len": req(whole(low=1, high=10_000_000, eg=2048)),
        "families": req(
            table(
                entries=table(
                    {
                        "module": text(),
                        "aliases": listing(text(), unique=True),
                        "reference_model": text(),
                        "hub": text(),
                        "description": text(empty=True),
                        "inputs": req(listing(text(choices=("text", "image")), at_least=1, unique=True)),
                        "grid_optimizers": listing(text(), at_least=1, unique=True),
                        "grid_strategies": listing(text(), at_least=1, unique=True),
                        "model_types": listing(text(), unique=True),
                        "fit_seq_len": whole(low=1, high=10_000_000, eg=2048),
                        "text_first": listing(text(), unique=True),
                        "methods": listing(
                            text(choices=("trainer", "sft", "dpo", "reward", "grpo")), unique=True
                        ),
                    }
                ),
                at_least=1,
            )
        ),
    }
)

OPTIMIZERS_TOML = table(
    {
        "optimizers": req(
            table(
                entries=table(
                    {
                        "trainer": text(),
                        "optim_args": text(),
                        "weight_decay": number(low=0, high=1, eg=0.01),
                        "code": text(),
                        "imports": text(),
                        "adamw": req(flag()),
                        "bits": req(whole(low=1, high=64, eg=32)),
                        "menu": req(flag()),
                        "trade": text(),
                        "package": text(),
                        "offload": flag(),
                        "adapters": listing(text(choices=("full", "lora", "qlora")), at_least=1, unique=True),
                        "sharded": flag(),
                    }
                ),
                at_least=1,
            )
        ),
    }
)

MARGIN = "a fraction between 0 and 1"
FLOWCHART_TOML = table(
    {
        "metrics": req(listing(text(), at_least=1, unique=True)),
        "filters": req(
            table(
                {
                    "divergence": req(
                        table(
                            {
                                "metric": req(text()),
                                "final": req(text()),
                                "start": req(text()),
                                "applies_to": req(listing(text(), unique=True)),
                                "declared": listing(
                                    table(
                                        {
                                            "source": req(text()),
                                            "family": req(text()),
                                            "optimizer": req(text()),
                                            "strategy": text(),
                                            "reason": req(text()),
                                        }
                                    )
                                ),
                            }
                        )
                    )
                }
            )
        ),
        "ranking": req(
            table(
                {
                    "alpha": req(number(above=0, below=1, eg=0.05, says="a number between 0 and 1")),
                    "tie_tolerance": req(number(low=0, below=1, eg=0.001)),
                    "equivalence_margins": req(
                        table(
                            {"default": req(number(above=0, below=1, eg="0.05 for 5 %", says=MARGIN))},
                            entries=number(above=0, below=1, eg="0.01 for 1 %", says=MARGIN),
                        )
                    ),
                    "tie_break_metrics": req(listing(text(), unique=True)),
                    "prefer_optimizers": req(listing(text(), unique=True)),
                    "prefer_strategies": req(listing(text(), unique=True)),
                    "alternatives": req(whole(low=0, high=1000, eg=4)),
                }
            )
        ),
        "evidence": req(
            table(
                {
                    "preset_rank": req(table(entries=whole(low=-1000, high=1000, eg=2))),
                    "protocol_rank": req(
                        table(entries=whole(low=-1000, high=1000, eg=1), names=("fair", "paper"))
                    ),
                    "source_rank": req(table(entries=whole(low=-1000, high=1000, eg=1))),
                    "answer_never": listing(text(), unique=True),
                    "only_for_their_model": listing(text(), unique=True),
                    "match_scale_ratio": req(number(low=1, eg=2)),
                    "scale_warning_ratio": req(number(low=1, eg=3)),
                }
            )
        ),
    }
)

NAMES = either(text(), listing(text(), at_least=1))  # a caveat's `when`: one value, or any of a list
PROTOCOL = text(choices=("fair", "paper", "trainer"))  # kb/migrations.py PROTOCOLS: how evidence was measured
CAVEATS_TOML = table(
    {
        "caveats": req(
            listing(
                table(
                    {
                        "id": req(text()),
                        "when": table(
                            {
                                "family": NAMES,
                                "metric": NAMES,
                                "source": NAMES,
                                "preset": NAMES,
                                "optimizer": NAMES,
                                "strategy": NAMES,
                                "measure": NAMES,
                                "protocol": either(PROTOCOL, listing(PROTOCOL, at_least=1)),
                                "predicted": flag(),
                                "single_run": flag(),
                                "contended": flag(),
                                "flagged": flag(),
                            }
                        ),
                        "text": req(text()),
                    }
                ),
                unique_by="id",
            )
        ),
    }
)

HARDWARE_TOML = table(
    {
        "accelerators": req(
            table(
                entries=table(
                    {
                        "name": req(text()),
                        "aliases": listing(text()),
                        "memory_gib": number(above=0, high=100_000, eg=80),
                        "memory_from_host": flag(),
                        "tflops": table(
                            entries=number(above=0, high=1_000_000, eg=989.4),
                            names=("bf16", "fp16", "tf32", "fp32"),
                        ),
                        "bandwidth_gbs": number(above=0, high=1_000_000, eg=3350),
                        "source": req(text()),
                        "note": text(),
                        "link": text(),
                        "link_gbs": number(above=0, high=1_000_000, eg=450),
                        "link_source": text(),
                        "generation": text(),
                        "network": text(),
                    }
                ),
                at_least=1,
            )
        ),
        "links": table(
            entries=table(
                {
                    "name": req(text()),
                    "scope": text(choices=("node", "network"), required=True),
                    "gbs": req(number(above=0, high=1_000_000, eg=50)),
                    "per": text(choices=("gpu", "node")),
                    "source": req(text()),
                }
            )
        ),
    }
)


def _texts(*names: str) -> dict:
    """Required sentences, e.g. the sources of fit.toml's figures."""
    return {name: req(text()) for name in names}


RECIPE_FAMILIES = (
    "decoder",
    "vlm",
    "encoder",
    "vision",
    "other",
)  # fit.toml [recipe.effective_batch] names each
_LEARNING_RATE = table(
    {
        "lr": req(number(above=0, high=10, eg=2e-4)),
        "schedule": req(text(choices=("constant", "cosine", "linear"))),
        "warmup_ratio": req(number(low=0, below=1, eg=0.03)),
        **_texts("source", "short"),
    }
)

FIT_TOML = table(
    {
        "fits": req(table({"headroom": req(number(low=0, below=1, eg=0.05)), **_texts("source")})),
        "cuda": req(
            table(
                {
                    "context_gb": req(number(low=0, high=1000, eg=0.65)),
                    "workspace_gb": req(number(low=0, high=1000, eg=0.03)),
                    "fragmentation": req(number(low=0, high=1, eg=0.1)),
                    **_texts("context_source", "workspace_source", "fragmentation_source"),
                }
            )
        ),
        "cpu": req(
            table(
                {
                    "process_gb": req(number(low=0, high=1000, eg=0.6)),
                    "fragmentation": req(number(low=0, high=1, eg=0.05)),
                    **_texts("process_source", "fragmentation_source"),
                }
            )
        ),
        "speed": req(
            table(
                {
                    "bandwidth_efficiency": req(number(above=0, high=1, eg=0.8)),
                    "default_mfu": req(number(above=0, high=1, eg=0.35)),
                    "generations": table(entries=number(above=0, high=1, eg=0.5)),
                    "micro_batch_overhead_s": req(number(low=0, high=10, eg=0.09)),
                    "dequant_efficiency": req(number(above=0, high=1, eg=0.2)),
                    "held_out": table(
                        entries=table(
                            {
                                "rows": req(whole(low=1, high=100_000, eg=8)),
                                "low": req(number(above=0, high=10, eg=0.9)),
                                "high": req(number(above=0, high=10, eg=1.1)),
                                "median": req(number(low=0, high=10, eg=0.06)),
                            }
                        )
                    ),
                    **_texts(
                        "bandwidth_source",
                        "mfu_source",
                        "generations_source",
                        "overhead_source",
                        "dequant_source",
                        "held_out_source",
                    ),
                }
            )
        ),
        "precision": req(table(_texts("fp32", "bf16-mixed", "fp16-mixed", "bf16"))),
        "adapters": req(table(_texts("lora", "qlora_4", "qlora_8", "prepare"))),
        "offload": req(
            table(
                {
                    "pcie_gbs": req(number(above=0, high=1_000_000, eg=25.0)),
                    "host_bandwidth_gbs": req(number(above=0, high=1_000_000, eg=40.0)),
                    **_texts("source", "pcie_source", "host_bandwidth_source"),
                }
            )
        ),
        "paged": req(table(_texts("source"))),
        "attention": req(table(_texts("flash_attention_2"))),
        "moe": req(table(_texts("source"))),
        "loss": req(
            table(
                {
                    "fused": req(
                        table(
                            {"model_types": req(listing(text(), at_least=1, unique=True)), **_texts("source")}
                        )
                    )
                }
            )
        ),
        "levers": req(
            table(
                {
                    "attention_targets": req(
                        table(
                            {"default": req(listing(text(), at_least=1, unique=True))},
                            entries=listing(text(), at_least=1, unique=True),
                        )
                    ),
                    **_texts("source"),
                }
            )
        ),
        "optimizers": table(
            entries=table(
                {"temporaries_per_element": req(number(low=0, high=1000, eg=8)), **_texts("source")}
            )
        ),
        "recipe": req(
            table(
                {
                    "micro_batch_source": req(text()),
                    "effective_batch": req(
                        table(
                            {
                                **{f: whole(low=1, high=1 << 20, eg=16) for f in RECIPE_FAMILIES},
                                "other": req(whole(low=1, high=1 << 20, eg=16)),
                                **_texts("source"),
                            }
                        )
                    ),
                    "learning_rate": req(
                        table(
                            entries=_LEARNING_RATE,
                            names=(
                                "lora",
                                "full",
                                "full_encoder",
                                "full_vision",
                                "full_vlm",
                                "dpo",
                                "reward",
                                "grpo",
                            ),
                        )
                    ),
                    "optimizers": table(
                        entries=table(
                            {
                                "lr": number(above=0, high=10, eg=1e-2),
                                "lr_factor": number(above=0, high=100, eg=0.3),
                                **_texts("source"),
                            }
                        )
                    ),
                }
            )
        ),
        "distributed": req(
            table(
                {
                    "network": req(text()),
                    "hidden": req(
                        table(
                            {
                                "ddp": req(number(low=0, high=1, eg=0.8)),
                                "fsdp": req(number(low=0, high=1, eg=0.8)),
                                "zero3": req(number(low=0, high=1, eg=0.5)),
                            }
                        )
                    ),
                    "collective_efficiency": req(number(above=0, high=1, eg=0.8)),
                    "zero3_efficiency": req(number(above=0, high=1, eg=0.5)),
                    **_texts(
                        "fsdp",
                        "hsdp",
                        "ddp",
                        "zero",
                        "zero_buffers",
                        "zero_offload",
                        "network_source",
                        "zero3_source",
                        "collective_source",
                        "overlap",
                        "offload_time",
                        "volume_source",
                    ),
                }
            )
        ),
    }
)

PROTOCOL_TOML = table(
    {
        "tuning": req(
            table(
                {
                    "factors": req(
                        listing(number(above=0, high=1_000_000, eg=0.316), at_least=2, increasing=True)
                    ),
                    "extend": req(whole(low=0, high=100, eg=3)),
                    "seed": req(whole(low=0, high=2**32 - 1, eg=1000)),
                    "strategy": req(text()),
                    "with": table(entries=text()),
                    "around": whole(low=1, high=10, eg=1),
                }
            )
        ),
        "deciding": req(
            table(
                {
                    "max_seeds": req(whole(low=2, high=1000, eg=6)),
                    "rounds": req(whole(low=1, high=100, eg=2)),
                    "metrics": req(listing(text(), at_least=1, unique=True)),
                }
            )
        ),
        "pretraining": req(
            table(
                {
                    "genres": req(whole(low=1, high=23, eg=12)),
                    "steps": req(whole(low=1, high=10_000_000, eg=600)),
                    "batch_size": req(whole(low=1, high=65_536, eg=16)),
                    "optimizer": req(text()),
                    "lr": req(number(above=0, high=10, eg=0.001)),
                    "warmup_ratio": req(number(low=0, high=1, eg=0.05)),
                    "seed": req(whole(low=0, high=2**32 - 1, eg=20011)),
                    "eval_every": req(whole(low=1, high=10_000_000, eg=100)),
                }
            )
        ),
        "target_checks": table({"every": whole(low=0, high=1_000_000, eg=4)}),
        "targets": table(entries=table(entries=number(above=0, high=1_000_000, eg=2.4))),
        "contention": table(
            {
                "others_cpu": number(low=0, high=10_000, eg=0.25),
                "step_time_cv": number(low=0, high=100, eg=0.3),
            }
        ),
    }
)

SIDE = either(text(), table({"optimizer": req(text()), "strategy": req(text())}))  # a claim's a and b
EXPECT = table({"family": req(text()), "metric": req(text()), "optimizer": text(), "strategy": text()})
CLAIMS_TOML = table(
    {
        "source": req(text()),
        "claims": req(
            listing(
                table(
                    {
                        "id": req(text()),
                        "text": req(text()),
                        "paper": text(),
                        "kind": req(
                            text(
                                choices=(
                                    "ratio",
                                    "ratio_all",
                                    "range",
                                    "best",
                                    "diverged",
                                    "never_best",
                                    "path_counts",
                                )
                            )
                        ),
                        "protocol": text(choices=("paper", "fair")),
                        "family": text(),
                        "families": listing(text(), at_least=1, unique=True),
                        "metric": text(),
                        "measure": text(),
                        "optimizer": text(),
                        "optimizers": listing(text(), at_least=1, unique=True),
                        "strategy": text(),
                        "a": SIDE,
                        "b": SIDE,
                        "min": number(low=0),
                        "max": number(low=0),
                        "expect": listing(EXPECT, at_least=1),
                        "count": whole(low=0),
                        "paths": whole(low=0),
                        "note": text(),
                    }
                ),
                at_least=1,
                unique_by="id",
            )
        ),
    }
)

SCHEMAS = {
    "metrics": METRICS_TOML,
    "families": FAMILIES_TOML,
    "optimizers": OPTIMIZERS_TOML,
    "flowchart": FLOWCHART_TOML,
    "caveats": CAVEATS_TOML,
    "hardware": HARDWARE_TOML,
    "fit": FIT_TOML,
    "protocol": PROTOCOL_TOML,
    "claims": CLAIMS_TOML,
}

# Names one rules file uses that another defines: (file, where: "*" any entry or item, KEYS the names of a
# table's entries, what kind of name, names allowed besides). A list where one name belongs is each of its items.
KEYS = "<keys>"
REFERENCES = (
    ("metrics", ("metrics", "*", "measures", "*"), "measure", ()),
    ("families", ("grid_optimizers", "*"), "optimizer", ()),
    ("families", ("grid_strategies", "*"), "strategy", ()),
    ("families", ("families", "*", "grid_optimizers", "*"), "optimizer", ()),
    ("families", ("families", "*", "grid_strategies", "*"), "strategy", ()),
    ("families", ("architectures", "*"), "family", ()),
    ("flowchart", ("metrics", "*"), "metric", ()),
    ("flowchart", ("filters", "divergence", "metric"), "metric", ()),
    ("flowchart", ("filters", "divergence", "applies_to", "*"), "metric", ()),
    ("flowchart", ("filters", "divergence", "final"), "measure", ()),
    ("flowchart", ("filters", "divergence", "start"), "measure", ()),
    ("flowchart", ("filters", "divergence", "declared", "*", "family"), "family", ()),
    ("flowchart", ("filters", "divergence", "declared", "*", "optimizer"), "optimizer", ()),
    ("flowchart", ("filters", "divergence", "declared", "*", "strategy"), "strategy", ()),
    ("flowchart", ("ranking", "equivalence_margins", KEYS), "metric", ("default",)),
    ("flowchart", ("ranking", "tie_break_metrics", "*"), "metric", ()),
    ("flowchart", ("ranking", "prefer_optimizers", "*"), "optimizer", ()),
    ("flowchart", ("ranking", "prefer_strategies", "*"), "strategy", ()),
    ("flowchart", ("evidence", "preset_rank", KEYS), "preset", ("custom",)),
    ("flowchart", ("evidence", "only_for_their_model", "*"), "preset", ("custom",)),
    ("caveats", ("caveats", "*", "when", "family"), "family", ()),
    ("caveats", ("caveats", "*", "when", "metric"), "metric", ()),
    ("caveats", ("caveats", "*", "when", "preset"), "preset", ("custom",)),
    ("caveats", ("caveats", "*", "when", "optimizer"), "optimizer", ()),
    ("caveats", ("caveats", "*", "when", "strategy"), "strategy", ()),
    ("caveats", ("caveats", "*", "when", "measure"), "measure", ()),
    ("fit", ("optimizers", KEYS), "optimizer", ()),
    ("protocol", ("tuning", "strategy"), "strategy", ()),
    ("protocol", ("pretraining", "optimizer"), "optimizer", ()),
    ("protocol", ("deciding", "metrics", "*"), "metric", ()),
    ("protocol", ("tuning", "with", KEYS), "strategy", ()),
    ("protocol", ("tuning", "with", "*"), "strategy", ()),
    ("protocol", ("targets", KEYS), "family", ()),
    ("protocol", ("targets", "*", KEYS), "preset", ("custom",)),
)

NAMED = {
    "measure": "a measure of metrics.toml [measures]",
    "metric": "a metric of metrics.toml [metrics]",
    "optimizer": "an optimizer of optimizers.toml",
    "strategy": "a strategy of families.toml `strategies`",
    "family": "a family of families.toml",
    "preset": "a preset of families.toml `presets`",
}


def found(data, where: tuple, path: tuple = ()):
    """(path, name) for each name at `where` in a file's tables ("*": every entry or item; KEYS: the names
    of a table's entries); a list where one name belongs yields each of its items."""
    if not where:
        items = enumerate(data) if isinstance(data, list) else [(None, data)]
        yield from ((path if i is None else (*path, i), v) for i, v in items)
        return
    head, rest = where[0], where[1:]
    if head == KEYS and isinstance(data, dict):
        yield from (((*path, key), key) for key in data)
    elif head == "*" and isinstance(data, dict | list):
        for key, value in data.items() if isinstance(data, dict) else enumerate(data):
            yield from found(value, rest, (*path, key))
    elif isinstance(data, dict) and head in data:
        yield from found(data[head], rest, (*path, head))


# --- the checker -----------------------------------------------------------------------------------------


class Problem(Exception):
    """What is wrong, and where in the parsed file: `path` (keys and list indices) and the rest of a sentence."""

    def __init__(self, path: tuple, message: str):
        super().__init__(f"{dotted(path)} {message}")
        self.path, self.message = path, message


def check(value, node: dict, partial: bool = False, path: tuple = ()) -> None:
    """Raise a Problem at the first value that breaks `node`. `partial`: a user's file that extends the
    shipped one, so required keys and least counts are left to the merged whole."""
    _CHECKS[node["type"]](value, node, partial, path)


def _check_table(value, node: dict, partial: bool, path: tuple) -> None:
    if not isinstance(value, dict):
        raise Problem(path, f"must be a table, not {shown(value)}.")
    keys, entries = node["keys"], node["entries"]
    for key, child in value.items():
        if key in keys:
            check(child, keys[key], partial, (*path, key))
        elif entries is not None:
            _check_name(key, node, (*path, key))
            check(child, entries, partial, (*path, key))
        else:
            raise Problem((*path, key), "is not a key advisor knows" + suggestion(key, keys))
    if not partial:
        _check_complete(value, node, path)


def _check_complete(value: dict, node: dict, path: tuple) -> None:
    """The required keys present and enough entries, where a table is checked whole."""
    for key, child in node["keys"].items():
        if child["required"] and key not in value:
            raise Problem((*path, key), f"must be {what(child)}; add it.")
    if node["entries"] is not None and sum(k not in node["keys"] for k in value) < node["min_entries"]:
        raise Problem(path, "names no entry: it needs at least one.")


def _check_name(key: str, node: dict, path: tuple) -> None:
    if not key.strip():
        raise Problem(path, "has an empty name: name it.")
    if node["names"] is not None and key not in node["names"]:
        raise Problem(path, "is not a name advisor knows" + suggestion(key, node["names"]))


def _check_list(value, node: dict, partial: bool, path: tuple) -> None:
    if not isinstance(value, list):
        raise Problem(path, f"must be a list, not {shown(value)}.")
    for i, item in enumerate(value):
        check(item, node["item"], partial, (*path, i))
    if not partial and len(value) < node["min_len"]:
        raise Problem(path, f"must list at least {node['min_len']}, not {len(value)}.")
    if node["unique"] and len(set(value)) < len(value):
        twice = next(v for i, v in enumerate(value) if v in value[:i])
        raise Problem(path, f"lists {shown(twice)} twice: keep one.")
    if node["unique_by"]:
        _check_unique_by(value, node["unique_by"], path)
    if node["increasing"] and any(b <= a for a, b in zip(value, value[1:], strict=False)):
        raise Problem(path, "must be in increasing order, each item larger than the one before.")


def _check_unique_by(value: list, key: str, path: tuple) -> None:
    seen: set = set()
    for i, item in enumerate(value):
        name = item.get(key)
        if name is not None and name in seen:
            raise Problem((*path, i, key), f"repeats {shown(name)}: each {key} must be unique.")
        seen.add(name)


def _check_str(value, node: dict, partial: bool, path: tuple) -> None:
    if not isinstance(value, str):
        raise Problem(path, f"must be {what(node)}, not {shown(value)}.")
    if not node["empty"] and not value.strip():
        raise Problem(path, "must not be empty.")
    if node["choices"] is not None and value not in node["choices"]:
        raise Problem(
            path, f"must be {what(node)}, not {shown(value)}" + suggestion(value, node["choices"], ".")
        )


def _check_bool(value, node: dict, partial: bool, path: tuple) -> None:
    if not isinstance(value, bool):
        raise Problem(path, f"must be true or false, not {shown(value)}.")


def _check_number(value, node: dict, partial: bool, path: tuple) -> None:
    whole_only = node["type"] == "int"
    kinds = int if whole_only else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not _within(value, node):
        raise Problem(path, f"must be {what(node)}, not {shown(value)}.")


def _within(value: float, node: dict) -> bool:
    """Finite and inside every bound the node sets."""
    low, high, above, below = node["min"], node["max"], node.get("above"), node.get("below")
    return (
        (isinstance(value, int) or math.isfinite(value))
        and (low is None or value >= low)
        and (high is None or value <= high)
        and (above is None or value > above)
        and (below is None or value < below)
    )


def _check_either(value, node: dict, partial: bool, path: tuple) -> None:
    """The shape whose type the value has, or a sentence naming every shape allowed."""
    for option in node["nodes"]:
        if _is(value, option["type"]):
            check(value, option, partial, path)
            return
    raise Problem(path, f"must be {what(node)}, not {shown(value)}.")


_CHECKS = {
    "table": _check_table,
    "list": _check_list,
    "str": _check_str,
    "bool": _check_bool,
    "int": _check_number,
    "number": _check_number,
    "either": _check_either,
}
_PYTHON = {"table": dict, "list": list, "str": str, "bool": bool, "int": int, "number": (int, float)}


def _is(value, kind: str) -> bool:
    """Whether a value has a kind's Python type (TOML's booleans are no numbers)."""
    return (
        isinstance(value, bool)
        if kind == "bool"
        else isinstance(value, _PYTHON[kind]) and not isinstance(value, bool)
    )


# --- words ---------------------------------------------------------------------------------------------


def what(node: dict) -> str:
    """What a node allows, as a phrase: 'a number above 0 and below 1 (e.g. 0.05)'."""
    kind = node["type"]
    if kind == "str":
        if node["choices"]:
            return "one of " + ", ".join(repr(c) for c in node["choices"])
        return "a string" if node["empty"] else "a non-empty string"
    if kind in ("int", "number"):
        return _number_phrase(node)
    if kind == "either":
        return " or ".join(what(n) for n in node["nodes"])
    if kind == "list":
        return f"a list, each item {what(node['item'])}"
    return {"bool": "true or false", "table": "a table"}[kind]


def _number_phrase(node: dict) -> str:
    if node.get("says"):
        return node["says"] + (f" (e.g. {node['eg']})" if node.get("eg") is not None else "")
    bounds = [
        f"{word} {node[key]:,}" if isinstance(node[key], int) else f"{word} {node[key]:g}"
        for key, word in (("min", "at least"), ("above", "above"), ("max", "at most"), ("below", "below"))
        if node.get(key) is not None
    ]
    noun = "a whole number" if node["type"] == "int" else "a number"
    eg = f" (e.g. {node['eg']})" if node.get("eg") is not None else ""
    return noun + (" " + " and ".join(bounds) if bounds else "") + eg


def shown(value) -> str:
    """A value as a sentence can quote it: short, on one line, in TOML's words for tables and lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and abs(value) > 10**18:
        return "a number too long to show"
    if isinstance(value, int | float | str):
        quoted = repr(value)
        return quoted if len(quoted) <= 40 else quoted[:37] + "..."
    return "a date or time" if type(value).__module__ == "datetime" else f"a {type(value).__name__}"


def dotted(path: tuple) -> str:
    """('ranking', 'tie_tolerance') -> 'ranking.tie_tolerance'; list items as [i] (from 0); the file's top
    level as 'the file'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + _bare(part)
    return out or "the file"


def _bare(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else shown(key)


def suggestion(word, known, otherwise: str = "; remove it.") -> str:
    """'; did you mean X?' for the nearest known word (difflib), else the known words when few, else
    `otherwise`: the end of a sentence."""
    import difflib  # here: only a broken file needs it, and every command loads the rules

    known = [k for k in known if isinstance(k, str)]
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6) if isinstance(word, str) else []
    if close:
        return f"; did you mean {close[0]}?"
    return f"; use one of {', '.join(known)}." if 0 < len(known) <= 12 else otherwise


# --- where a key is in the file's text -------------------------------------------------------------------

# Patterns compiled on first use (re caches them): only a broken file needs them.
_HEADER = r"^\s*(\[\[?)([^\[\],=]+)\]"
_KEY = r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"\n]*\"|'[^'\n]*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"\n]*\"|'[^'\n]*'))*)\s*="
_PART = r"\s*(?:([A-Za-z0-9_-]+)|\"([^\"]*)\"|'([^']*)')\s*"


def line_of(text: str, path: tuple) -> int | None:
    """The line that sets the deepest part of `path` found: a simple scan for `[table]` headers (arrays of
    tables counted) and `key =` lines, not a TOML parser: it misses keys set inside inline tables or spread
    over lines, and then names the line of the table or key around them."""
    best, depth, table, counts = None, 0, (), {}
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(_HEADER, line)
        if header:
            parts = _parts(header.group(2))
            if header.group(1) == "[[":
                counts[parts] = counts.get(parts, -1) + 1
                table = (*parts, counts[parts])
            else:
                table = parts
            here = table
        elif key := re.match(_KEY, line):
            here = (*table, *_parts(key.group(1)))
        else:
            continue
        if len(here) > depth and path[: len(here)] == here:
            best, depth = number, len(here)
    return best


def _parts(dotted_key: str) -> tuple:
    """'a."b.c".d' -> ('a', 'b.c', 'd')."""
    return tuple(next(g for g in m.groups() if g is not None) for m in re.finditer(_PART, dotted_key))
