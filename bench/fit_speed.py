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

--fit also searches rules/fit.toml [speed]'s constants (each generation's efficiency,
micro_batch_overhead_s, dequant_efficiency) that minimise the squared log ratios of the `fit` rows, from each row's parts (its FLOPs
at the peak, its dequantization at the bandwidth, the rest as predicted), and prints the held-out error they
would give; copy them into rules/fit.toml and run again to get the table `advisor fit` itself gives.
"""

import argparse
import itertools
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
    """The row's step at unit efficiencies: FLOPs at the peak, dequantization at the bandwidth, and the
    rest (optimizer, communication) as predicted; what --fit rescales."""
    acc = answer.question.accelerator
    k = row.get("accumulation", 1)
    compute = r.step_flops / (accelerators.peak_tflops(acc, row["dtype"]) * 1e12)
    now = rules.fit["speed"]
    dequant = 0.0
    if row["adapter"] == "qlora":  # at unit efficiency: the model's seconds times its efficiency
        quantized = answer.n_params - _embeddings(answer.question.model.config)
        passes = speed.dequant_passes(row["strategy"].startswith("checkpointing"))
        at_model = speed.dequant_seconds(quantized, 4, passes, k, acc.bandwidth_gbs * 1e9, rules)
        dequant = at_model * now["dequant_efficiency"]
    e0 = speed.generation_efficiency(acc, rules).value
    modelled = compute / e0 + k * now["micro_batch_overhead_s"] + dequant / now["dequant_efficiency"]
    return {
        "compute": compute,
        "dequant": dequant,
        "micro_batches": k,
        "rest": r.predicted_step_s - modelled,
        "generation": acc.generation,
    }


def _embeddings(cfg: dict) -> int:
    """Parameters a quantized base keeps unquantized: the embeddings, the output layer, the final norm."""
    tied = cfg.get("tie_word_embeddings", False)
    return cfg["vocab_size"] * cfg["hidden_size"] * (1 if tied else 2) + cfg["hidden_size"]


def step(p: dict, e: float, overhead: float, ed: float, per_step_tokens: float) -> float:
    """Tokens/s per GPU at these constants, from the row's parts."""
    seconds = p["compute"] / e + p["micro_batches"] * overhead + p["dequant"] / ed + p["rest"]
    return per_step_tokens / seconds


def fit(rows: list[dict], found: dict) -> dict:
    """The constants that minimise the fit rows' squared log ratios (a grid: a few thousand evaluations)."""
    gens = sorted({found[r["id"]]["parts"]["generation"] for r in rows if r["split"] == "fit"})
    best = None
    grid_e = [x / 100 for x in range(20, 91)]
    overheads = [x / 100 for x in range(0, 21)]
    for overhead, ed in itertools.product(overheads, [x / 100 for x in range(3, 61)]):
        constants, loss = {"micro_batch_overhead_s": overhead, "dequant_efficiency": ed}, 0.0
        for g in gens:  # each generation's efficiency on its own rows, given the others
            mine = [r for r in rows if r["split"] == "fit" and found[r["id"]]["parts"]["generation"] == g]
            errs = {
                e: sum(math.log(_ratio(found[r["id"]], e, overhead, ed)) ** 2 for r in mine) for e in grid_e
            }
            e = min(errs, key=errs.get)
            constants[g], loss = e, loss + errs[e]
        if best is None or loss < best[1]:
            best = (constants, loss)
    return best[0]


def _ratio(f: dict, e: float, overhead: float, ed: float) -> float:
    return step(f["parts"], e, overhead, ed, f["tokens_per_step"]) / f["published"]


def summary(rows: list[dict], ratios: dict, found: dict) -> dict:
    """Median and worst |ratio - 1| of the fit and held-out rows, and of each generation's held-out rows
    (what rules/fit.toml [speed.held_out] quotes as that generation's band)."""
    out = {}
    for split in ("fit", "held-out"):
        errs = [abs(ratios[r["id"]] - 1) for r in rows if r["split"] == split]
        if errs:
            out[split] = _errors(errs)
    held = [r for r in rows if r["split"] == "held-out"]
    for g in sorted({found[r["id"]]["parts"]["generation"] for r in held}):
        out[f"held-out {g}"] = _errors(
            [abs(ratios[r["id"]] - 1) for r in held if found[r["id"]]["parts"]["generation"] == g]
        )
    return out


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
        constants = fit(rows, found)
        gens = {
            k: v for k, v in constants.items() if k not in ("micro_batch_overhead_s", "dequant_efficiency")
        }
        ratios = {
            r["id"]: _ratio(
                found[r["id"]],
                gens.get(found[r["id"]]["parts"]["generation"], 0.35),
                constants["micro_batch_overhead_s"],
                constants["dequant_efficiency"],
            )
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
