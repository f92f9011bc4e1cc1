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
        assert answer.as_dict()["mfu"]["band"] == answer.speed_band > 0  # an A100: Ampere has published rows
        return answer.rows[0].tokens_per_s

    short = tokens_per_s("lora", 256) / tokens_per_s("qlora", 256)
    long_ = tokens_per_s("lora", 4096) / tokens_per_s("qlora", 4096)
    assert short > long_ > 1.0
    assert short - 1 > 2 * (long_ - 1)  # the gap closes as the tokens grow


def test_compute_is_the_flops_at_the_utilizations_share_of_the_peak():
    use = speed.Utilization(0.4, "--mfu", modelled=False)
    assert speed.compute_seconds(1e15, 312, use) == pytest.approx(1e15 / (312e12 * 0.4))


def test_the_error_band_stands_only_where_published_runs_measured_the_generation(rules):
    a100, t4 = rules.accelerators["a100-80gb"], rules.accelerators["t4"]
    held_out = rules.fit["speed"]["held_out_error"]
    assert speed.band(a100, speed.generation_efficiency(a100, rules), rules) == held_out
    assert speed.band(t4, speed.generation_efficiency(t4, rules), rules) is None  # the default's: unmeasured
    assert speed.band(a100, speed.Utilization(0.5, "--mfu", modelled=False), rules) is None
