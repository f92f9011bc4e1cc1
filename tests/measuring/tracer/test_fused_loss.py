"""`advisor fit --loss fused`: Liger's fused linear cross-entropy (advisor/measuring/tracer/fused_loss.py, its
CUDA path in torch) traced, against the same step run for real on the CPU and measured by PyTorch's
MemTracker; and what it saves against the model's own loss, whose logits are whole."""

from dataclasses import replace

import pytest
import torch

from advisor.measuring.tracer.fused_loss import causal_lm_loss, chunk_tokens
from advisor.measuring.tracer.payloads import predict
from advisor.prediction.step import Method, tensor_peak

from ...conftest import RULES
from .realstep import real_step_peaks
from .test_methods import spec_of


def fused(arch: str, adapter: str, dtype: str = "fp32"):
    """A CUDA question's step (its optimizer's CUDA implementation, as the real step makes it too)."""
    spec = spec_of(arch, "trainer", None, adapter, "cuda")
    return replace(spec, dtype=dtype, method=Method(loss="fused"))


def peak(spec, strategy: str = "standard") -> float:
    payload = predict(spec, ["adamw"], [strategy], RULES.fit)[("adamw", strategy)]
    return sum(tensor_peak(payload, 2)[1].values())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "adapter", "dtype", "strategy"),
    [
        ("llama", "full", "fp32", "standard"),
        ("llama", "lora", "fp32", "checkpointing"),
        ("qwen3", "full", "bf16", "accumulation"),
        ("qwen3", "lora", "bf16-mixed", "standard"),
    ],
)
def test_the_fused_loss_is_predicted_as_it_runs(arch, adapter, dtype, strategy):
    spec = fused(arch, adapter, dtype)
    real = real_step_peaks(spec, strategy, ["adamw"], 2)["adamw"].tensors
    assert peak(spec, strategy) / real - 1 == pytest.approx(0, abs=0.005)


def test_the_fused_loss_never_holds_the_logits_and_saves_them():
    """At a 40,000-token vocabulary and 64 tokens a micro-batch (fp32), the model's own loss holds the
    [tokens, vocab] logits through its backward; the fused one about [tokens, hidden] of them at a time."""
    saved = peak(spec_of("llama", "trainer", None, "full", "cuda")) - peak(fused("llama", "full"))
    assert saved > 0.9 * 64 * 40_000 * 4


def test_liger_s_chunk_holds_about_the_hidden_states_worth_of_logits():
    assert chunk_tokens(16_384, 4096, 32_000) == 2048  # Liger's own example
    assert chunk_tokens(64, 64, 40_000) == 1
    assert chunk_tokens(100, 4096, 1000) == 100  # one chunk, never more than the tokens


def test_the_fused_loss_is_the_cross_entropy_and_its_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, 2] = -100
    loss = causal_lm_loss(hidden, weight, labels)
    logits = hidden @ weight.t()
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    assert loss.item() == pytest.approx(expected.item())
    grads = torch.autograd.grad(loss, (hidden, weight))
    truth = torch.autograd.grad(expected, (hidden, weight))
    assert all(torch.allclose(a, b) for a, b in zip(grads, truth, strict=True))
