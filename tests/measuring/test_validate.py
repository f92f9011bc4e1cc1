"""`advisor validate` passes on every family, fails loudly on a broken strategy, and is recorded in the KB."""

import json

import pytest
import torch

from advisor.measuring.recipe import strategies

from ..conftest import RULES, ref


def run_validate(invoke, db, *args):
    return invoke("validate", *args, "--db", db, "--json")


@pytest.mark.slow
def test_validate_passes_on_every_family_at_tiny(invoke, tmp_path):
    db = tmp_path / "v.sqlite"
    result = run_validate(invoke, db)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["passed"] is True
    names = {(c["name"], c["model"]) for c in out["checks"]}
    for model in ("vit", "modernbert", "llama", "nanovlm"):
        for check in (
            "checkpointing_dropout_off",
            "checkpointing_dropout_on",
            "accumulation_gradient",
            "accumulation_logged_loss",
        ):
            assert (check, model) in names
    assert ("cgd_quadratic", None) in names and ("monitor_overhead", None) in names
    assert ("cgd_stochastic_descent", None) in names


def broken_train_step(model, optimizer, family, window, device, before_micro_batch=None):
    """The October-2024 bug: each micro-batch's mean loss divided by k."""
    optimizer.zero_grad(set_to_none=True)
    logged = 0.0
    for batch in window:
        batch = strategies.to_device(batch, device)
        loss = family.summed_loss(model, batch) / batch["n_targets"]
        (loss / len(window)).backward()
        logged += loss.item() / len(window)
    optimizer.step()
    return logged


def test_validate_fails_with_a_clear_report_on_a_broken_strategy(invoke, tmp_path, monkeypatch):
    monkeypatch.setattr(strategies, "train_step", broken_train_step)
    db = tmp_path / "v.sqlite"
    result = invoke("validate", "--model", "llama", "--db", db)
    assert result.exit_code == 1
    assert "FAIL" in result.output and "accumulation_gradient (llama)" in result.output
    answer = json.loads(run_validate(invoke, db, "--model", "llama").stdout)
    failed = {c["name"] for c in answer["checks"] if not c["passed"]}
    assert "accumulation_gradient" in failed and "accumulation_logged_loss" in failed
    bad = next(c for c in answer["checks"] if c["name"] == "accumulation_gradient")
    assert bad["value"] > 0.01  # far outside float tolerance, not a rounding difference


def test_validation_is_recorded_and_shown_in_answers(invoke, tmp_path, measure_tiny):
    db = tmp_path / "v.sqlite"
    assert run_validate(invoke, db, "--model", "vit").exit_code == 0
    assert measure_tiny(db, "--optimizer", "sgd", "--strategy", "standard").exit_code == 0
    answer = json.loads(
        invoke("recommend", "--model", "vit", "--source", "measured", "--db", db, "--json").output
    )
    assert answer["validation"]["passed"] is True and answer["validation"]["checks"] >= 6
    text = invoke("recommend", "--model", "vit", "--source", "measured", "--db", db).output
    assert "Validated on this hardware" in text
    paper = json.loads(invoke("recommend", "--arch", "vit", "--source", "paper", "--json").output)
    assert paper["validation"] is None


def test_dropout_on_checkpointing_matches_given_the_seed():
    from advisor.measuring.validate import check_checkpointing

    check = check_checkpointing(ref("vit"), "tiny", RULES, dropout=0.1)
    assert check.passed, check.detail
    assert torch.are_deterministic_algorithms_enabled() is False  # the check does not rely on global flags


def test_the_grids_cgd_descends_on_every_minibatch_and_converges():
    from advisor.measuring.validate import CGD_STOCHASTIC_RATIO, check_cgd_stochastic

    check = check_cgd_stochastic()
    assert check.name == "cgd_stochastic_descent" and check.passed, check.detail
    assert check.value < CGD_STOCHASTIC_RATIO / 10  # passes by a margin, not at the edge
    assert "100/100 decreased" in check.detail


@pytest.mark.parametrize(
    "options",
    [
        dict(lr=10.0, line_search="fixed"),  # no line search and a huge step
        dict(lr=0.05, line_search="fixed", restart_every=None, beta_max=None),  # the grid's rate, no search
    ],
)
def test_the_stochastic_cgd_check_fails_without_a_line_search(options):
    from advisor.measuring.recipe.optimizers import ConjugateGradient
    from advisor.measuring.validate import check_cgd_stochastic

    check = check_cgd_stochastic(lambda params: ConjugateGradient(params, **options))
    assert not check.passed
    assert not check.value <= 1.0, check.detail  # the loss grew (inf or NaN included)
