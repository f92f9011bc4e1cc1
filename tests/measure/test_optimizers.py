"""Conjugate gradient on quadratics: converges in at most n exact steps, and beats SGD."""

import pytest
import torch

from measure.optimizers import OPTIMIZERS, ConjugateGradient, make_optimizer, minimize_quadratic, quadratic


@pytest.mark.parametrize("beta", ["pr+", "fr"])
def test_exact_steps_converge_in_n_iterations(beta):
    n = 12
    a, b, x_star = quadratic(n, condition=50.0)
    x = minimize_quadratic(
        lambda p: ConjugateGradient(p, lr=1e-3, beta=beta, line_search="secant"), a, b, steps=n
    )
    assert torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star) < 1e-8


def test_cgd_beats_sgd_on_an_ill_conditioned_quadratic():
    a, b, x_star = quadratic(30, seed=1, condition=200.0)
    err = {}
    # SGD at 1/L, the largest step that is stable for every curvature; CGD backtracking from a step of 1.
    for name, factory in [
        ("sgd", lambda p: torch.optim.SGD(p, lr=1.0 / 200.0)),
        ("cgd", lambda p: ConjugateGradient(p, lr=1.0, line_search="armijo")),
    ]:
        x = minimize_quadratic(factory, a, b, steps=30)
        err[name] = float(torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star))
    assert err["cgd"] < err["sgd"] / 10, err


def test_fixed_step_and_restarts_descend():
    a, b, x_star = quadratic(8, seed=2, condition=10.0)
    x = minimize_quadratic(lambda p: ConjugateGradient(p, lr=0.05, restart_every=4), a, b, steps=200)
    assert torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star) < 1e-3


def test_line_search_needs_closure_and_options_are_checked():
    x = torch.zeros(2, requires_grad=True)
    (x.sum() ** 2 + x @ x).backward()
    with pytest.raises(RuntimeError, match="needs a closure"):
        ConjugateGradient([x], line_search="armijo").step()
    with pytest.raises(ValueError):
        ConjugateGradient([x], beta="hs")


def test_every_grid_optimizer_builds_and_steps():
    for name in OPTIMIZERS:
        w = torch.nn.Parameter(torch.ones(3))
        opt = make_optimizer(name, [w], lr=0.1)
        (w**2).sum().backward()
        opt.step()
        assert not torch.equal(w.detach(), torch.ones(3)), name
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lion", [w], lr=0.1)
