"""`advisor fit`'s engine: a step traced under fake tensors predicts the real step's live tensor bytes
(tracked by PyTorch's own MemTracker on real tensors), exactly enough to decide what fits; the composite
of shallow traces equals a full trace; published models have their published parameter counts."""

from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoConfig

from advisor.measuring.model.families import family
from advisor.measuring.tracer.payloads import predict
from advisor.measuring.tracer.spec import Spec, at_depth, depth_knobs
from advisor.measuring.tracer.traces import trace_optimizers, trace_window
from advisor.prediction.step import Adapter, n_params, step_flops, tensor_peak
from advisor.rules import load_rules

from ...conftest import RULES
from .realstep import real_step_peaks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "configs"
FAMILIES = list(load_rules().families)
# The paper's menu, checked in every family at two sizes; the fine-tuning menu's additions are
# tests/measuring/tracer/test_menu.py's.
OPTIMIZERS = ["sgd", "sgd-momentum", "adam", "adamw", "adagrad", "adadelta", "cgd", "adafactor"]
STRATEGIES = ["standard", "checkpointing", "accumulation", "checkpointing+accumulation"]


def spec_for(name: str, preset: str, dtype: str, seq_len: int = 32) -> Spec:
    fam = family(name, RULES)
    config, _ = fam.reference_config(preset)
    sizes = fam.fit_sizes(config)
    return Spec(config, fam, seq_len if sizes["seq_len"] else None, sizes["image_size"], dtype, device="cuda")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16-mixed"])
@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("name", FAMILIES)
def test_prediction_equals_the_real_steps_live_tensor_bytes(name, preset, dtype):
    """Every optimizer × strategy, with the implementations a GPU run gets (foreach, fused), run for real."""
    spec = spec_for(name, preset, dtype)
    predicted = predict(spec, list(OPTIMIZERS), list(STRATEGIES))
    errors = {}
    for strategy in STRATEGIES:
        real = real_step_peaks(spec, strategy, list(OPTIMIZERS), batch=2, accumulation_steps=2)
        for optimizer, peak in real.items():
            payload = predicted[(optimizer, strategy)]
            errors[(optimizer, strategy)] = sum(tensor_peak(payload, 2)[1].values()) / peak.tensors - 1
    worst = max(errors, key=lambda k: abs(errors[k]))
    assert abs(errors[worst]) <= 0.02, f"{worst}: {errors[worst]:+.2%}"


@pytest.mark.parametrize(
    "name, dtype, adapter, checkpointing",
    [(name, "fp32", "full", None) for name in FAMILIES]
    + [
        ("decoder", "bf16-mixed", "full", "full"),
        ("decoder", "bf16", "full", "selective"),
        ("decoder", "bf16-mixed", "lora", None),
        ("decoder", "bf16-mixed", "qlora", "full"),
    ],
)
def test_the_derived_second_micro_batch_equals_a_traced_one_op_by_op(name, dtype, adapter, checkpointing):
    """An accumulation window's second micro-batch is derived from its first (traces.accumulating): the same
    ops, the first's gradients held throughout; traced for real, every op's live bytes are the same."""
    spec = replace(spec_for(name, "tiny", dtype), adapter=Adapter(adapter))
    derived = trace_window(spec, spec.config, 2, checkpointing, 2).timeline
    traced = trace_window(spec, spec.config, 2, checkpointing, 2, derived=False).timeline
    for phase in ("forward0", "backward0", "forward1", "backward1"):
        assert [v for _, v in derived[phase]] == [v for _, v in traced[phase]], phase
    assert any(v[1] for _, v in traced["forward1"])  # the gradients are held: the check is not of zeros


def test_the_accumulation_window_peaks_by_its_second_micro_batch():
    """Traced with two micro-batches; a real step of four peaks at the same bytes."""
    spec = spec_for("decoder", "tiny", "fp32")
    payload = predict(spec, ["adam"], ["accumulation"])[("adam", "accumulation")]
    real = real_step_peaks(spec, "accumulation", ["adam"], batch=3, accumulation_steps=4)["adam"].tensors
    assert sum(tensor_peak(payload, 3)[1].values()) == pytest.approx(real, rel=0.001)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_the_composite_of_shallow_traces_equals_a_full_trace(name):
    """Depth 1 and 2 at batch 2 and 3, evaluated at the full depth and any batch, against one trace of the
    whole model at that batch. Exact where every block is alike; ModernBERT alternates global and local
    attention, so an added block is not every block: within 1 %."""
    spec = spec_for(name, "small", "fp32", seq_len=64)
    predicted = predict(spec, ["sgd", "adam"], ["standard", "checkpointing", "accumulation"])
    steps = trace_optimizers(spec, spec.config, ["sgd", "adam"])
    for (optimizer, strategy), payload in predicted.items():
        for batch in (1, 8):
            full = trace_window(spec, spec.config, batch, strategy == "checkpointing")
            phases = ["forward0", "backward0"] + (
                ["forward1", "backward1"] if strategy == "accumulation" else []
            )
            step = steps[optimizer]["peak"]
            whole = max(
                [max(sum(v) for _, v in full.timeline[p]) + step["optimizer_state"] for p in phases]
                + [sum(step.values()) + full.inputs]
            )
            assert sum(tensor_peak(payload, batch)[1].values()) == pytest.approx(whole, rel=0.01), (
                optimizer,
                strategy,
                batch,
            )
            assert step_flops(payload, batch) == full.flops
            assert n_params(payload) == full.n_params


@pytest.mark.parametrize(
    "folder,name,expected",
    [
        ("Llama-3.1-8B", "decoder", 8_030_261_248),
        ("Llama-3.1-70B", "decoder", 70_553_706_496),
        ("Llama-2-7b-hf", "decoder", 6_738_415_616),
        ("Qwen2-0.5B", "decoder", 494_032_768),
        ("Mistral-7B-v0.1", "decoder", 7_241_732_096),
        ("vit-base-patch16-224", "vision", 86_567_656),
    ],
)
def test_published_configs_give_published_parameter_counts(folder, name, expected):
    from advisor.measuring.tracer.traces import parameter_count

    config = AutoConfig.from_pretrained(FIXTURES / folder)
    assert parameter_count(Spec(config, family(name, RULES), 8, None, "bf16")) == expected


def test_memory_grows_with_batch_and_sequence_and_checkpointing_saves_activations():
    fam = family("decoder", RULES)
    config, _ = fam.reference_config("small")
    short, long = (predict(Spec(config, fam, s, None, "fp32"), ["adam"]) for s in (64, 128))
    peak = {
        (s, strategy, b): sum(tensor_peak(p[("adam", strategy)], b)[1].values())
        for s, p in ((64, short), (128, long))
        for strategy in STRATEGIES
        for b in (1, 4)
    }
    for strategy in STRATEGIES:
        assert peak[(64, strategy, 1)] < peak[(64, strategy, 4)] < peak[(128, strategy, 4)]
    standard = tensor_peak(long[("adam", "standard")], 8)[1]
    checkpointed = tensor_peak(long[("adam", "checkpointing")], 8)[1]
    assert sum(checkpointed.values()) < sum(standard.values())
    assert checkpointed["activations"] < standard["activations"] / 2


def test_depth_knobs_find_every_stack():
    vlm, _ = family("vlm", RULES).reference_config("small")
    assert depth_knobs(vlm) == {"text_config.num_hidden_layers": 4, "vision_config.num_hidden_layers": 3}
    shallow = at_depth(vlm, {"text_config.num_hidden_layers": 1, "vision_config.num_hidden_layers": 2})
    assert shallow.text_config.num_hidden_layers == 1 and vlm.text_config.num_hidden_layers == 4
