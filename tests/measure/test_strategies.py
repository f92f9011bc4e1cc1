"""Strategies are numerically what they claim: checkpointing is the same function, accumulation the same
gradient as one big batch (padded sequences of unequal length included)."""

import numpy as np
import pytest
import torch

from measure.data import IGNORE, batches, load
from measure.models import PAD, build_model
from measure.strategies import prepare, summed_loss, train_step

FAMILIES = {"vit": "vision", "modernbert": "encoder", "llama": "decoder", "nanovlm": "vlm"}


def grads_after(model_name, strategy, windows, family, seed=0):
    built = build_model(model_name, "tiny", dropout=0.0, seed=seed)
    prepare(built.model, strategy)
    opt = torch.optim.SGD(built.model.parameters(), lr=0.0)  # lr 0: the step leaves the gradients to inspect
    losses = [train_step(built.model, opt, family, w, torch.device("cpu")) for w in windows]
    return losses, {n: p.grad.clone() for n, p in built.model.named_parameters() if p.grad is not None}


def micro_batches(model_name, n, seed=0):
    built = build_model(model_name, "tiny", seed=seed)
    dataset, _ = load(built.family, built.shape, 4 * n, seed)
    return list(batches(dataset, built.family, 4, seed, epoch=0))[:n]


@pytest.mark.parametrize("model", list(FAMILIES))
def test_checkpointing_is_bit_identical_with_dropout_off(model):
    family = FAMILIES[model]
    window = micro_batches(model, 1)
    plain_loss, plain = grads_after(model, "standard", [window], family)
    ckpt_loss, ckpt = grads_after(model, "checkpointing", [window], family)
    assert plain_loss == ckpt_loss
    assert plain.keys() == ckpt.keys()
    for name in plain:
        assert torch.equal(plain[name], ckpt[name]), name


def concat(window):
    """k micro-batches as one batch of k·b: padded to a common width, the same targets."""
    out = {}
    width = max(b["input_ids"].shape[1] for b in window) if "input_ids" in window[0] else None
    for key in window[0]:
        if key == "n_targets":
            out[key] = sum(b[key] for b in window)
            continue
        arrays = [b[key] for b in window]
        if width and key in ("input_ids", "attention_mask", "labels"):
            fill = {"input_ids": PAD, "attention_mask": 0, "labels": IGNORE}[key]
            arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=fill) for a in arrays]
        out[key] = np.concatenate(arrays)
    return out


@pytest.mark.parametrize("model", list(FAMILIES))
def test_accumulation_equals_one_large_batch(model):
    family = FAMILIES[model]
    window = micro_batches(model, 4)
    if "input_ids" in window[0]:
        widths = {b["input_ids"].shape[1] for b in window}
        targets = {b["n_targets"] for b in window}
        assert len(widths) > 1 or len(targets) > 1, "the test needs micro-batches of unequal length"
    acc_loss, acc = grads_after(model, "accumulation", [window], family)
    big_loss, big = grads_after(model, "standard", [[concat(window)]], family)
    assert acc_loss[0] == pytest.approx(big_loss[0], rel=1e-5)
    for name in big:
        torch.testing.assert_close(acc[name], big[name], rtol=1e-4, atol=1e-6, msg=name)


def test_dividing_each_micro_batch_mean_by_k_is_wrong():
    """The October-2024 accumulation bug, reproduced: it is what the window's single division avoids."""
    window = micro_batches("llama", 4)
    built = build_model("llama", "tiny", dropout=0.0)
    model = built.model
    model.zero_grad()
    for b in window:
        batch = {k: torch.as_tensor(v) if k != "n_targets" else v for k, v in b.items()}
        (summed_loss(model, "decoder", batch) / b["n_targets"] / len(window)).backward()
    naive = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    _, right = grads_after("llama", "accumulation", [window], "decoder")
    right = torch.cat([g.flatten() for g in right.values()])
    targets = [b["n_targets"] for b in window]
    assert len(set(targets)) > 1
    assert not torch.allclose(naive, right, rtol=1e-3, atol=1e-7)


def test_logged_loss_is_the_unscaled_mean_per_target():
    window = micro_batches("modernbert", 4)
    (logged,), _ = grads_after("modernbert", "accumulation", [window], "encoder")
    built = build_model("modernbert", "tiny", dropout=0.0)
    with torch.no_grad():
        total = sum(
            summed_loss(
                built.model, "encoder", {k: torch.as_tensor(v) for k, v in b.items() if k != "n_targets"}
            ).item()
            for b in window
        )
    assert logged == pytest.approx(total / sum(b["n_targets"] for b in window), rel=1e-6)
    assert 3.0 < logged < 8.0  # ~ln(260) at init, not divided by k
