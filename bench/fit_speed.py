"""advisor fit's tokens/s against published training runs (bench/speed_anchors.toml), row by row.

    python bench/fit_speed.py [--fit] [--out bench/results/fit-speed.json]

Each row is asked of `advisor fit` with the settings its source states (one configuration: the row's
adapter and its rank and targets, precision, strategy, sharding, micro-batch and accumulation,
the optimizer: AdamW unless the row names one), traced into a KB of its own,
and its predicted tokens/s per GPU divided by the published figure. The median |ratio - 1| and the worst
are reported for the rows the constants were fitted on and for the held-out rows apart; rows marked
split = "excluded" (their `excluded` says why) are printed and left out of both. "needs" is the share of the
chip's dense peak the published figure implies for the executed FLOPs alone: above 100 %, the stated settings
cannot be what was measured.

Each generation's held-out rows also give the 10th and 90th percentiles of the ratio and the share of them
inside (rules/fit.toml [speed.held_out]: the interval `advisor fit` prints around its tokens/s, where a
generation has at least five held-out rows).

--fit also searches the constants (each generation's efficiency, [speed] micro_batch_overhead_s and
dequant_efficiency, [distributed.hidden] fsdp and zero3) that minimise the squared log
ratios of the `fit` rows, from each row's parts (its FLOPs at the peak, the recomputed share of them, its
dequantization at the bandwidth, its collectives' seconds, the rest as predicted), and prints the held-out
error they would give; copy them into rules/fit.toml and run again to get the table `advisor fit` itself gives.
It also tries two terms the model does not have, to see whether the anchors ask for them: a recompute cost
below the forward's (recompute_cost: fitted 1.0 on the checkpointed rows, so none) and an efficiency of
attention's own on Hopper (attention_hopper: fitted 0.50 against the whole step's 0.49, so none).
A row's `interconnect` is passed as --interconnect; `power_w` (a power cap below the datasheet's) is the
source's, kept for the record: the model has no power term.
"""

import argparse
import json
import math
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

from machine import device, versions  # bench/machine.py: the script's own folder is on sys.path

import advisor
from advisor.prediction import accelerators, speed
from advisor.rules import load_rules

ANCHORS = Path(__file__).with_name("speed_anchors.toml")


def model_of(row: dict, anchors: dict, folder: Path) -> str:
    """The row's --model: a shipped name, or its config written as a Llama config.json."""
    if "model" in row:
        return row["model"]
    from transformers import LlamaConfig

    path = folder / row["config"]
    if not path.exists():
        LlamaConfig(**anchors["configs"][row["config"]], max_position_embeddings=32768).save_pretrained(path)
    return str(path)


def predict(row: dict, anchors: dict, folder: Path, db: Path):
    """advisor fit's answer for the row's one configuration: (its row, the answer)."""
    answer = advisor.fit(
        model_of(row, anchors, folder),
        db=db,
        gpu=row["gpu"],
        gpus=row["gpus"],
        nodes=row["nodes"],
        shardings=(row["sharding"],),
        adapters=(row["adapter"],),
        dtype=row["dtype"],
        optimizers=(row.get("optimizer", "adamw"),),
        strategies=(row["strategy"],),
        offload=("none",),
        batch_size=row["batch"],
        accumulation_steps=row.get("accumulation"),
        seq_len=row["seq_len"],
        interconnect=row.get("interconnect"),
        **{
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in row.items()
            if k in ("lora_r", "lora_targets")
        },
    )
    return answer.rows[0], answer


def published(row: dict) -> float:
    """The published tokens/s per GPU (from seconds per step where the source gives those)."""
    if "tokens_per_s_per_gpu" in row:
        return row["tokens_per_s_per_gpu"]
    return row["batch"] * row.get("accumulation", 1) * row["seq_len"] / row["s_per_step"]


def parts(row: dict, anchors: dict, answer, r, rules) -> dict:
    """The row's step at unit efficiencies: FLOPs at the peak (and the share of them that recomputes the
    forward), dequantization at the bandwidth, its collectives' seconds, and the rest (the optimizer's
    traffic) as predicted; what --fit rescales."""
    acc = answer.question.accelerator
    k = row.get("accumulation", 1)
    peak = accelerators.peak_tflops(acc, row["dtype"]) * 1e12
    rows = row["batch"] * k
    attention = attention_flops(answer.question.model.config, row["seq_len"], rows, row["strategy"]) / peak
    compute = r.step_flops / peak - attention
    now = rules.fit["speed"]
    dequant = 0.0
    if row["adapter"] == "qlora":  # at unit efficiency: the model's seconds times its efficiency
        quantized = answer.n_params - _embeddings(answer.question.model.config)
        passes = speed.dequant_passes(row["strategy"].startswith("checkpointing"))
        at_model = speed.dequant_seconds(quantized, 4, passes, k, acc.bandwidth_gbs * 1e9, rules)
        dequant = at_model * now["dequant_efficiency"]
    e0 = speed.generation_efficiency(acc, rules).value
    recomputed = recomputed_share(row["strategy"], row["adapter"] == "full")
    talk, exposed = r.collectives_s or (0.0, 0.0)
    d = rules.fit["distributed"]
    zero3 = row["sharding"] == "zero3"
    at_link = talk * (d["zero3_efficiency"] if zero3 else d["collective_efficiency"])  # at 100 % of the links
    modelled = (
        compute / e0
        + attention / e0
        + k * now["micro_batch_overhead_s"]
        + dequant / now["dequant_efficiency"]
    )
    return {
        "compute": compute,
        "attention": attention,
        "recomputed": recomputed,
        "dequant": dequant,
        "micro_batches": k,
        "talk": at_link,
        "zero3": zero3,
        "efficiency": d["collective_efficiency"],
        "hidden": _hidden_key(row["sharding"]),
        "rest": r.predicted_step_s - exposed - modelled,
        "generation": acc.generation,
    }


def attention_flops(config: dict | None, seq_len: int, rows: int, strategy: str) -> float:
    """Attention's two products over `rows` sequences, as torch's FLOP formulas count sdpa (what the trace
    summed, no causal discount): 4 s^2 (heads x head_dim) a layer and row forward, twice that backward, the
    forward again under full checkpointing. The model prices them with the rest; --fit tries a share of their
    own per generation (attention_<generation>) to see whether the anchors ask for one."""
    text = (config or {}).get("text_config") or config or {}
    heads, layers = text.get("num_attention_heads"), text.get("num_hidden_layers")
    if not (heads and layers):
        return 0.0
    width = heads * (text.get("head_dim") or text.get("hidden_size", 0) // heads)
    passes = 4 if strategy.startswith("checkpointing") else 3
    return 4 * seq_len**2 * width * layers * rows * passes


def recomputed_share(strategy: str, full: bool) -> float:
    """The share of a checkpointed step's FLOPs that recompute the forward: forward 2, backward 4 (a full
    fine-tune's weight and input gradients) or 2 (a frozen base's input gradients), the recomputed forward
    2. The model prices it at its full cost; --fit tries a cost below 1 (recompute_cost) to see whether the
    anchors ask for one."""
    if not strategy.startswith("checkpointing"):
        return 0.0
    return 2 / 8 if full else 2 / 6


def _hidden_key(sharding: str) -> str:
    """The [distributed.hidden] share a sharding's collectives take."""
    return "zero3" if sharding == "zero3" else "fsdp" if sharding in ("fsdp", "hsdp") else "ddp"


def _embeddings(cfg: dict) -> int:
    """Parameters a quantized base keeps unquantized: the embeddings, the output layer, the final norm."""
    tied = cfg.get("tie_word_embeddings", False)
    return cfg["vocab_size"] * cfg["hidden_size"] * (1 if tied else 2) + cfg["hidden_size"]


FITTED = (
    "micro_batch_overhead_s",
    "dequant_efficiency",
    "recompute_cost",
    "hidden_fsdp",
    "hidden_zero3",
    "zero3_efficiency",
    "attention_hopper",
)
GRIDS = {
    "micro_batch_overhead_s": [x / 100 for x in range(0, 21)],
    "dequant_efficiency": [x / 100 for x in range(3, 61)],
    "recompute_cost": [x / 20 for x in range(10, 21)],
    "hidden_fsdp": [x / 20 for x in range(0, 21)],
    "hidden_zero3": [x / 20 for x in range(0, 21)],
    "zero3_efficiency": [x / 20 for x in range(1, 17)],
    "attention_hopper": [x / 20 for x in range(2, 19)],
}
EFFICIENCIES = [x / 100 for x in range(20, 91)]


def step(p: dict, e: float, k: dict) -> float:
    """Seconds of the row's step at these constants (`k`: FITTED's, `e`: its generation's efficiency), from
    its parts: compute (attention at its generation's own share where `k` has one), fixed cost,
    dequantization and the rest, with the collectives' unhidden share on top."""
    compute = (
        p["compute"] * (1 - p["recomputed"] * (1 - k["recompute_cost"])) / e
        + p["attention"] / k.get(f"attention_{p['generation']}", e)
        + p["micro_batches"] * k["micro_batch_overhead_s"]
        + p["dequant"] / k["dequant_efficiency"]
        + p["rest"]
    )
    share = k.get(f"hidden_{p['hidden']}", 0.8)
    talk = p["talk"] / (k["zero3_efficiency"] if p["zero3"] else p["efficiency"])
    return compute + talk - min(share * talk, compute)


def _ratio(f: dict, e: float, k: dict) -> float:
    return f["tokens_per_step"] / step(f["parts"], e, k) / f["published"]


def fit(rows: list[dict], found: dict, start: dict) -> dict:
    """The constants that minimise the fit rows' squared log ratios: each generation's efficiency on its own
    rows given the rest, then each shared constant in turn over its grid (coordinate descent, a few rounds:
    the grid of every combination would take hours)."""
    fitting = [r for r in rows if r["split"] == "fit"]
    gens = sorted({found[r["id"]]["parts"]["generation"] for r in fitting})
    k = {name: start[name] for name in FITTED}

    def efficiencies(k: dict) -> tuple[dict, float]:
        out, loss = {}, 0.0
        for g in gens:
            mine = [found[r["id"]] for r in fitting if found[r["id"]]["parts"]["generation"] == g]
            errs = {e: sum(math.log(_ratio(f, e, k)) ** 2 for f in mine) for e in EFFICIENCIES}
            out[g] = min(errs, key=errs.get)
            loss += errs[out[g]]
        return out, loss

    for _ in range(4):
        for name in FITTED:
            losses = {v: efficiencies({**k, name: v})[1] for v in GRIDS[name]}
            k[name] = min(losses, key=losses.get)
    return {**efficiencies(k)[0], **k}


def summary(rows: list[dict], ratios: dict, found: dict) -> dict:
    """Median and worst |ratio - 1| of the fit and held-out rows, and for each generation's held-out rows also
    the 10th and 90th percentiles of the ratio and the share of them inside that band (what rules/fit.toml
    [speed.held_out] states, and `advisor fit` prints as the interval around its tokens/s)."""
    out = {}
    for split in ("fit", "held-out"):
        errs = [abs(ratios[r["id"]] - 1) for r in rows if r["split"] == split]
        if errs:
            out[split] = _errors(errs)
    held = [r for r in rows if r["split"] == "held-out"]
    for g in sorted({found[r["id"]]["parts"]["generation"] for r in held}):
        mine = sorted(ratios[r["id"]] for r in held if found[r["id"]]["parts"]["generation"] == g)
        out[f"held-out {g}"] = _errors([abs(x - 1) for x in mine]) | _band(mine)
    return out


def _band(ratios: list[float]) -> dict:
    """The 10th and 90th percentiles of the ratios (statistics' exclusive method) and how many fall within."""
    if len(ratios) < 2:
        return {}
    deciles = statistics.quantiles(ratios, n=10)
    low, high = deciles[0], deciles[-1]
    inside = sum(low <= x <= high for x in ratios)
    return {"p10": low, "p90": high, "inside": inside, "covered": inside / len(ratios)}


def _errors(errs: list[float]) -> dict:
    return {"rows": len(errs), "median_abs_error": statistics.median(errs), "worst": max(errs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="search the [speed] constants on the fit rows")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", help="rows whose id contains this")
    parser.add_argument("--db", type=Path, help="a KB to keep the traces in (default: a fresh one)")
    args = parser.parse_args()
    anchors = tomllib.loads(ANCHORS.read_text())
    rows = [r for r in anchors["rows"] if not args.only or args.only in r["id"]]
    rules = load_rules()
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder, db = Path(tmp), args.db or Path(tmp) / "kb.sqlite"
        for row in rows:
            r, answer = predict(row, anchors, folder, db)
            per_gpu = r.tokens_per_s / (row["gpus"] * row["nodes"]) if r.tokens_per_s else None
            found[row["id"]] = {
                "predicted": per_gpu,
                "published": published(row),
                "ratio": per_gpu / published(row) if per_gpu else None,
                "fits": r.fits,
                "parts": parts(row, anchors, answer, r, rules),
                "tokens_per_step": row["batch"] * row.get("accumulation", 1) * row["seq_len"],
            }
            f = found[row["id"]]
            f["implied_peak_share"] = f["parts"]["compute"] * f["published"] / f["tokens_per_step"]
            print(
                f"{row['id']:38s} {row['split']:8s} predicted {per_gpu:8.0f}  published {f['published']:8.0f}"
                f"  ratio {f['ratio']:.2f}  needs {f['implied_peak_share']:.0%} of peak",
                flush=True,
            )
    out = {
        "device": device(),
        "versions": versions("torch", "transformers"),
        "constants": rules.fit["speed"],
        "rows": found,
        "summary": summary(rows, {k: v["ratio"] for k, v in found.items()}, found),
    }
    print(json.dumps(out["summary"], indent=2))
    if args.fit:
        now = {
            **rules.fit["speed"],
            "recompute_cost": 1.0,
            "attention_hopper": rules.fit["speed"]["generations"]["hopper"],
            **{f"hidden_{k}": v for k, v in rules.fit["distributed"]["hidden"].items()},
            "zero3_efficiency": rules.fit["distributed"]["zero3_efficiency"],
        }
        constants = fit(rows, found, now)
        gens = {k: v for k, v in constants.items() if k not in FITTED}
        ratios = {
            r["id"]: _ratio(found[r["id"]], gens.get(found[r["id"]]["parts"]["generation"], 0.35), constants)
            for r in rows
        }
        out["fitted"] = {"constants": constants, "ratios": ratios, "summary": summary(rows, ratios, found)}
        print(
            "fitted:", json.dumps(out["fitted"]["constants"]), json.dumps(out["fitted"]["summary"], indent=2)
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
