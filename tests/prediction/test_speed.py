"""The speed model's parts (advisor/prediction/speed.py): each constant from rules, the generation's
efficiency, the token factor, QLoRA's dequantization, and what they do to `advisor fit`'s tokens/s."""

from dataclasses import replace

import pytest

import advisor
from advisor.prediction import speed
from advisor.rules import load_rules


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def test_an_accelerator_gets_its_generations_efficiency_and_says_so(rules):
    a100 = rules.accelerators["a100-80gb"]
    use = speed.generation_efficiency(a100, rules)
    assert use.value == rules.fit["speed"]["generations"]["ampere"] and use.source.startswith("ampere")
    t4 = rules.accelerators["t4"]  # no published run on Turing in bench/speed_anchors.toml
    assert speed.generation_efficiency(t4, rules).value == rules.fit["speed"]["default_mfu"]


def test_each_micro_batch_pays_a_fixed_cost_a_given_utilization_does_not(rules):
    overhead = rules.fit["speed"]["micro_batch_overhead_s"]
    modelled = speed.Utilization(0.5, "ampere")
    assert speed.overhead_seconds(8, modelled, rules) == pytest.approx(8 * overhead)
    assert speed.overhead_seconds(8, replace(modelled, modelled=False), rules) == 0.0


def test_dequantization_is_per_pass_per_micro_batch_and_grows_with_the_bits(rules):
    a100_bw = rules.accelerators["a100-80gb"].bandwidth_gbs * 1e9
    one = speed.dequant_seconds(7_000_000_000, 4, 2, 1, a100_bw, rules)
    assert speed.dequant_seconds(7_000_000_000, 4, 3, 1, a100_bw, rules) == pytest.approx(1.5 * one)
    assert speed.dequant_seconds(7_000_000_000, 4, 2, 8, a100_bw, rules) == pytest.approx(8 * one)
    assert speed.dequant_seconds(7_000_000_000, 8, 2, 1, a100_bw, rules) > one
    assert speed.dequant_passes(checkpointing=True) == 3 and speed.dequant_passes(checkpointing=False) == 2


@pytest.mark.slow
def test_qlora_is_slower_than_lora_most_at_few_tokens(tmp_path):
    """The mechanism published runs show (Qwen's README: 2.5x at 256 tokens, 5 % at 8,192 on an A100): the
    base's dequantization is paid per micro-batch whatever its tokens; LoRA's compute grows with them."""

    def tokens_per_s(adapter: str, seq_len: int) -> float:
        answer = advisor.fit(
            "llama-3.2-1b",
            db=tmp_path / "kb.sqlite",
            gpu="A100-80GB",
            adapters=(adapter,),
            dtype="bf16-mixed",
            optimizers=("adamw",),
            strategies=("checkpointing",),
            offload=("none",),
            batch_size=1,
            seq_len=seq_len,
        )
        band = answer.as_dict()["mfu"]["band"]  # an A100: Ampere has held-out published rows
        assert band["held_out_rows"] >= speed.MIN_HELD_OUT and band["ratio_p10"] < 1 < band["ratio_p90"]
        return answer.rows[0].tokens_per_s

    short = tokens_per_s("lora", 256) / tokens_per_s("qlora", 256)
    long_ = tokens_per_s("lora", 4096) / tokens_per_s("qlora", 4096)
    assert short > long_ > 1.0
    assert short - 1 > 2 * (long_ - 1)  # the gap closes as the tokens grow


def test_compute_is_the_flops_at_the_utilizations_share_of_the_peak():
    use = speed.Utilization(0.4, "--mfu", modelled=False)
    assert speed.compute_seconds(1e15, 312, use) == pytest.approx(1e15 / (312e12 * 0.4))


def test_the_error_band_stands_only_where_held_out_published_runs_tested_the_generation(rules):
    a100, t4, b200 = (rules.accelerators[n] for n in ("a100-80gb", "t4", "b200"))
    held_out = rules.fit["speed"]["held_out"]["ampere"]
    band = speed.band(a100, speed.generation_efficiency(a100, rules), rules)
    assert (band.rows, band.low, band.high, band.median) == tuple(
        held_out[k] for k in ("rows", "low", "high", "median")
    )
    low, high = band.interval(1000.0)  # the published figure's range: predicted / p90 to predicted / p10
    assert low == pytest.approx(1000 / held_out["high"]) and high == pytest.approx(1000 / held_out["low"])
    assert speed.band(t4, speed.generation_efficiency(t4, rules), rules) is None  # the default's: unmeasured
    assert "held-out" in speed.unbanded(t4, speed.generation_efficiency(t4, rules), rules)
    assert speed.unbanded(a100, speed.generation_efficiency(a100, rules), rules) is None
    b200_use = speed.generation_efficiency(b200, rules)  # fitted on its one published row, none held out
    assert b200_use.value == rules.fit["speed"]["generations"]["blackwell"]
    assert speed.band(b200, b200_use, rules) is None
    assert speed.band(a100, speed.Utilization(0.5, "--mfu", modelled=False), rules) is None


def test_a_generation_with_fewer_than_five_held_out_runs_has_no_band_and_says_so(rules):
    held = {**rules.fit["speed"]["held_out"], "ampere": {"rows": 4, "low": 0.9, "high": 1.1, "median": 0.05}}
    few = replace(rules, fit={**rules.fit, "speed": {**rules.fit["speed"], "held_out": held}})
    a100 = rules.accelerators["a100-80gb"]
    use = speed.generation_efficiency(a100, few)
    assert speed.band(a100, use, few) is None
    assert "4 held-out published runs" in speed.unbanded(a100, use, few)


@pytest.fixture(scope="module")
def a100_answer(tmp_path_factory):
    """A real answer on an A100 (Ampere: held-out published rows, so a band): full fine-tuning of
    Qwen2-0.5B with AdamW, traced in seconds."""
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "tests/fixtures/configs/Qwen2-0.5B"
    return advisor.fit(
        str(config),
        db=tmp_path_factory.mktemp("kb") / "kb.sqlite",
        gpu="A100-80GB",
        adapters=("full",),
        dtype="bf16-mixed",
        optimizers=("adamw",),
        strategies=("standard",),
        offload=("none",),
        batch_size=1,
        seq_len=256,
    )


def test_a_time_order_within_the_band_is_marked_undecided_and_one_beyond_it_is_not(a100_answer):
    answer, top = a100_answer, a100_answer.rows[0]
    band = answer.speed_band
    assert band and top.tokens_per_s
    close = replace(top, tokens_per_s=top.tokens_per_s * (1 - band.median / 2))
    far = replace(top, tokens_per_s=top.tokens_per_s * (1 - 2 * band.median))
    assert answer.time_ties([top, close]) == [False, True]
    assert answer.time_ties([top, far]) == [False, False]
    other_rung = replace(close, config=replace(close.config, strategy="checkpointing"))
    assert answer.time_ties([top, other_rung]) == [False, False]  # placed for what it gives up, not its time
    no_band = replace(answer, speed_band=None)
    assert no_band.time_ties([top, close]) == [False, False]  # no published rows: nothing to mark by


def test_the_table_and_json_say_which_time_orders_are_undecided(a100_answer):
    from rich.console import Console

    from advisor.render.fit_views import _fit_table

    top = a100_answer.rows[0]
    close = replace(top, tokens_per_s=top.tokens_per_s * 0.99)
    answer = replace(a100_answer, rows=[top, close])
    console = Console(width=160, record=True)
    console.print(_fit_table(answer, answer.rows))
    text = console.export_text()
    assert f"≈ {close.tokens_per_s:,.0f}" in text and f"({answer.speed_band.median:.0%})" in text
    assert [c["time_tie_with_above"] for c in answer.as_dict()["configurations"]] == [False, True]
    console = Console(width=160, record=True)
    console.print(_fit_table(a100_answer, a100_answer.rows[:1]))
    assert "≈" not in console.export_text()


def test_depth_coefficients_are_exact_for_sums_and_for_layers_times_expert_units():
    """A quantity affine in each knob, with a product term for a mixture's expert units and its layers
    (every unit in every layer), is recovered exactly at the full depths from the traced points alone."""
    from advisor.prediction.step import coefficients, depth_points

    knobs = {"num_hidden_layers": 48, "vision_config.num_hidden_layers": 27, "experts": 8}
    points = depth_points(knobs)
    assert len(points) == 5  # base, each knob raised, layers and units raised together

    def f(layers, vision, units):
        return 7 + 11 * layers + 3 * vision + 5 * units + 13 * layers * units

    weights = coefficients(knobs, [full - 1 for full in knobs.values()])
    assert sum(w * f(*p) for w, p in zip(weights, points, strict=True)) == f(48, 27, 8)


def test_a_cached_payload_reads_as_the_traced_one(tmp_path):
    """The KB stores a payload with its keys sorted, which put Gemma 3's full-attention kind (10 of its 62
    layers) before its sliding one (52): the depths were read against the wrong points, and a cached answer
    differed from the fresh one. The payload carries its knobs' order; a cached answer is the fresh one."""
    import json

    from advisor.prediction.step import n_params

    payload = {
        "depth": {"layers@sliding": 52, "layers@full": 10},
        "knobs": ["layers@sliding", "layers@full"],
        "points": [[1, 1], [2, 1], [1, 2]],
        "n_params": [100, 103, 111],  # a sliding block holds 3, a full one 11
    }
    stored = json.loads(json.dumps(payload, sort_keys=True))
    assert list(stored["depth"]) == ["layers@full", "layers@sliding"]  # what the KB gives back
    assert n_params(stored) == n_params(payload) == 100 + 51 * 3 + 9 * 11
