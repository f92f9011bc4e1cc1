"""Strategies are numerically what they claim: checkpointing is the same function, accumulation the same
gradient as one big batch (padded sequences of unequal length included). The helpers are those of
`advisor validate` (advisor/measuring/validate.py), so these tests pin down what it checks."""

import pytest
import torch

from advisor.measuring.model.builder import build_model
from advisor.measuring.validate import concat_window, grads_after, micro_window

from ...conftest import RULES, ref

MODELS = list(RULES.reference_models())


@pytest.mark.parametrize("model", MODELS)
def test_checkpointing_is_bit_identical_with_dropout_off(model):
    family, window = micro_window(ref(model), "tiny", RULES, 1)
    plain_loss, plain = grads_after(ref(model), "tiny", RULES, "standard", [window], family, dropout=0.0)
    ckpt_loss, ckpt = grads_after(ref(model), "tiny", RULES, "checkpointing", [window], family, dropout=0.0)
    assert plain_loss == ckpt_loss
    assert plain.keys() == ckpt.keys()
    for name in plain:
        assert torch.equal(plain[name], ckpt[name]), name


@pytest.mark.parametrize("model", MODELS)
def test_accumulation_equals_one_large_batch(model):
    family, window = micro_window(ref(model), "tiny", RULES, 4)
    if "input_ids" in window[0]:
        widths = {b["input_ids"].shape[1] for b in window}
        targets = {b["n_targets"] for b in window}
        assert len(widths) > 1 or len(targets) > 1, "the test needs micro-batches of unequal length"
    acc_loss, acc = grads_after(ref(model), "tiny", RULES, "accumulation", [window], family, dropout=0.0)
    big_loss, big = grads_after(
        ref(model), "tiny", RULES, "standard", [[concat_window(window)]], family, dropout=0.0
    )
    assert acc_loss[0] == pytest.approx(big_loss[0], rel=1e-5)
    for name in big:
        torch.testing.assert_close(acc[name], big[name], rtol=1e-4, atol=1e-6, msg=name)


def test_dividing_each_micro_batch_mean_by_k_is_wrong():
    """The October-2024 accumulation bug, reproduced: it is what the window's single division avoids."""
    family, window = micro_window(ref("llama"), "tiny", RULES, 4)
    model = build_model(ref("llama"), "tiny", RULES, dropout=0.0).model
    model.zero_grad()
    for b in window:
        batch = {k: torch.as_tensor(v) if k != "n_targets" else v for k, v in b.items()}
        (family.summed_loss(model, batch) / b["n_targets"] / len(window)).backward()
    naive = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    _, right = grads_after(ref("llama"), "tiny", RULES, "accumulation", [window], family, dropout=0.0)
    right = torch.cat([g.flatten() for g in right.values()])
    assert len({b["n_targets"] for b in window}) > 1
    assert not torch.allclose(naive, right, rtol=1e-3, atol=1e-7)


def test_logged_loss_is_the_unscaled_mean_per_target():
    family, window = micro_window(ref("modernbert"), "tiny", RULES, 4)
    (logged,), _ = grads_after(
        ref("modernbert"), "tiny", RULES, "accumulation", [window], family, dropout=0.0
    )
    model = build_model(ref("modernbert"), "tiny", RULES, dropout=0.0).model
    with torch.no_grad():
        total = sum(
            family.summed_loss(
                model, {k: torch.as_tensor(v) for k, v in b.items() if k != "n_targets"}
            ).item()
            for b in window
        )
    assert logged == pytest.approx(total / sum(b["n_targets"] for b in window), rel=1e-6)
    assert 3.0 < logged < 8.0  # ~ln(260) at init, not divided by k
