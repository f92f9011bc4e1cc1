"""`advisor fit --method`: TRL's steps (SFT; DPO with its reference a frozen copy, the disabled adapter, or
precomputed; a reward model; GRPO generating its completions with transformers, without a reference, with a
frozen copy, with the disabled adapter) predicted against the same step run for real by TRL's own trainer on
the CPU,
measured by PyTorch's MemTracker (tests/measuring/tracer/trlstep.py), in three architectures: Llama, Qwen3, and
Gemma 2 (its final-logit softcapping takes another path through TRL's fused head). The vocabulary spans
two of TRL's 32,768-wide chunks, so the chunking itself is exercised."""

from dataclasses import replace

import pytest
import torch

from advisor.measuring.model.families import family
from advisor.measuring.tracer.methods import trl_kernels
from advisor.measuring.tracer.payloads import predict
from advisor.measuring.tracer.spec import ONCE, Spec
from advisor.prediction.step import Adapter, Method, at_generation, phase_peaks, tensor_peak

from ...conftest import RULES
from .test_menu import tiny
from .trlstep import real_trl_peaks

ARCHS = {
    "llama": dict(num_hidden_layers=2),
    "qwen3": dict(num_hidden_layers=2, head_dim=16),
    "gemma2": dict(num_hidden_layers=2, head_dim=16, final_logit_softcapping=30.0),
}
STEPS = [  # (method, reference, adapter)
    ("sft", None, "full"),
    ("sft", None, "lora"),
    ("dpo", "model", "full"),
    ("dpo", "adapter", "lora"),
    ("dpo", "precomputed", "full"),
    ("reward", None, "full"),
    ("reward", None, "lora"),
    ("grpo", None, "full"),
    ("grpo", "model", "full"),
    ("grpo", "adapter", "lora"),
]
COMPLETION = 8  # GRPO's generated tokens of the spec's 32: a prompt of 24
VOCAB = 40_000  # two chunks of TRL's head: 32,768 and the rest


def spec_of(arch: str, method: str, reference, adapter: str, device: str = "cpu") -> Spec:
    config = tiny(arch, vocab_size=VOCAB, **ARCHS[arch])
    kind = Adapter() if adapter == "full" else Adapter("lora", r=8, alpha=16)
    attention = "eager" if arch == "gemma2" else "sdpa"  # Gemma 2 has no SDPA path in transformers
    return Spec(
        config,
        family("decoder", RULES),
        32,
        None,
        "fp32",
        device,
        kind,
        attention,
        method=Method("grpo", reference, COMPLETION, "transformers")
        if method == "grpo"
        else Method(method, reference),
    )


def errors(spec: Spec, strategy: str = "standard") -> dict[str, float]:
    """Predicted / real - 1 at micro-batch 2, the optimizer's state held: of the step's peak before the
    optimizer's step (GRPO's rollout, the forward, the reference's, the backward; the optimizer's step is
    Trainer's under every method: tests/measuring/tracer/test_menu.py), and for GRPO of its rollout's alone
    (generation and scoring, TRL's `_prepare_inputs`)."""
    payload = predict(spec, ["adamw"], [strategy], RULES.fit)[("adamw", strategy)]
    peaks = phase_peaks(payload, 2)
    step, rollout = real_trl_peaks(spec, strategy)
    out = {"step": max(v for phase, v in peaks.items() if phase != "optimizer_step") / step - 1}
    if rollout is not None:
        out["rollout"] = max(v for p, v in peaks.items() if p in ONCE) / rollout - 1
    return out


def error(spec: Spec, strategy: str = "standard") -> float:
    """The largest of `errors` (by size)."""
    return max(errors(spec, strategy).values(), key=abs)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_trl_steps_are_predicted_within_one_percent_of_trls_own(arch):
    errors = {step: error(spec_of(arch, *step)) for step in STEPS}
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= 0.01, f"{worst}: {errors[worst]:+.2%} (all: {errors})"


@pytest.mark.slow
def test_a_checkpointed_dpo_step_is_predicted_too():
    assert abs(error(spec_of("llama", "dpo", "model", "full"), "checkpointing")) <= 0.01


@pytest.mark.slow
def test_grpo_in_mixed_precision_with_checkpointing_is_predicted_too():
    """Generation runs without checkpointing (TRL turns it off) in accelerate's autocast, one per forward;
    a peft model generates through its base's forward, outside it."""
    for adapter, reference in (("full", "model"), ("lora", None)):
        spec = replace(spec_of("qwen3", "grpo", reference, adapter), dtype="bf16-mixed")
        assert abs(error(spec, "checkpointing")) <= 0.01, (adapter, reference)


def test_grpos_generation_holds_the_whole_generation_batchs_kv_cache():
    """The decoding step holds the KV cache of every completion at full length: it grows with the prompt
    and completion lengths, and (at_generation) an accumulating step generates for its whole window."""
    spec = spec_of("llama", "grpo", None, "full")
    payload = predict(spec, ["adamw"], ["accumulation"], RULES.fit)[("adamw", "accumulation")]
    config = spec.config
    kv_per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    decode = [phase_peaks(payload, b)["decode"] for b in (2, 3)]
    assert decode[1] - decode[0] >= kv_per_token * (spec.seq_len - 1)
    window = at_generation(payload, 16)
    assert (
        phase_peaks(window, 1)["decode"]
        == phase_peaks(window, 4)["decode"]
        == phase_peaks(payload, 16)["decode"]
    )


def test_the_reference_copy_is_held_through_the_step_and_the_adapter_costs_none():
    """DPO with a frozen copy holds one more model's weights in every phase than with the adapter off or
    with precomputed log-probabilities; those two hold the same weights."""
    spec = spec_of("llama", "dpo", "model", "full")
    held = {}
    for reference in ("model", "precomputed"):
        payload = predict(replace(spec, method=Method("dpo", reference)), ["adamw"], ["standard"])
        held[reference] = tensor_peak(payload[("adamw", "standard")], 2)[1]["parameters"]
    config = spec.config
    weights = sum(p.numel() for p in _model_params(config)) * 4
    assert held["model"] - held["precomputed"] == pytest.approx(weights, rel=0.01)


def _model_params(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return list(AutoModelForCausalLM.from_config(config).parameters())


def test_trls_cuda_path_scores_only_what_it_must_and_makes_no_fp32_copies():
    """On a CUDA spec the head takes TRL's CUDA path (its Triton fold in place, fp32 accumulation straight
    from bf16): less than the CPU path's torch fold at the same shape, and traced without a real GPU."""
    cpu, cuda = (spec_of("llama", "sft", None, "full", device) for device in ("cpu", "cuda"))
    assert trl_kernels(cpu).__class__.__name__ == "nullcontext"
    peaks = {
        s.device: sum(tensor_peak(predict(s, ["adamw"], ["standard"])[("adamw", "standard")], 2)[1].values())
        for s in (cpu, cuda)
    }
    assert peaks["cuda"] < peaks["cpu"]
