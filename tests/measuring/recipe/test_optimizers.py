"""Conjugate gradient: exact on quadratics (secant), and as the grid runs it on stochastic minibatches
(Armijo backtracking, beta clipped to [0, beta_max], periodic restarts)."""

import pytest
import torch

from advisor.measuring.recipe.optimizers import (
    BUILDABLE,
    ConjugateGradient,
    make_optimizer,
    minimize_quadratic,
    quadratic,
)


def exact_cg(params, beta="pr+"):
    """Secant steps, unclipped, never restarted: linear CG on a quadratic."""
    return ConjugateGradient(
        params, lr=1e-3, beta=beta, line_search="secant", restart_every=None, beta_max=None
    )


def relative_error(x, x_star) -> float:
    return float(torch.linalg.norm(x - x_star) / torch.linalg.norm(x_star))


@pytest.mark.parametrize("beta", ["pr+", "fr"])
def test_exact_steps_converge_in_n_iterations(beta):
    n = 12
    a, b, x_star = quadratic(n, condition=50.0)
    x = minimize_quadratic(lambda p: exact_cg(p, beta), a, b, steps=n)
    assert relative_error(x, x_star) < 1e-8


# deterministic, CG's full acceleration (never restarted, unclipped); the grid's settings give some up to noise
@pytest.mark.parametrize("options,factor", [(dict(restart_every=None, beta_max=None), 10), (dict(), 5)])
def test_cgd_beats_sgd_on_an_ill_conditioned_quadratic(options, factor):
    a, b, x_star = quadratic(30, seed=1, condition=200.0)
    err = {}
    # SGD at 1/L, the largest step that is stable for every curvature; CGD backtracking from a step of 1.
    for name, factory in [
        ("sgd", lambda p: torch.optim.SGD(p, lr=1.0 / 200.0)),
        ("cgd", lambda p: ConjugateGradient(p, lr=1.0, line_search="armijo", **options)),
    ]:
        x = minimize_quadratic(factory, a, b, steps=30)
        err[name] = relative_error(x, x_star)
    assert err["cgd"] < err["sgd"] / factor, err


def test_armijo_with_the_grid_settings_converges_on_a_quadratic():
    a, b, x_star = quadratic(12, condition=50.0)
    x = minimize_quadratic(lambda p: ConjugateGradient(p, lr=1.0, line_search="armijo"), a, b, steps=100)
    assert relative_error(x, x_star) < 1e-6


def test_fixed_step_and_restarts_descend():
    a, b, x_star = quadratic(8, seed=2, condition=10.0)
    x = minimize_quadratic(lambda p: ConjugateGradient(p, lr=0.05, restart_every=4), a, b, steps=200)
    assert relative_error(x, x_star) < 1e-3


def step_with_gradient(opt, x, grad) -> dict:
    """One fixed step with this gradient set by hand; the optimizer's state after it."""
    x.grad = torch.tensor(grad, dtype=torch.float64)
    opt.step()
    return opt.state[x]


@pytest.mark.parametrize("beta", ["pr+", "fr"])
@pytest.mark.parametrize("beta_max", [1.0, 0.25])
def test_beta_is_clipped_to_beta_max(beta, beta_max):
    # a tiny gradient, then a large orthogonal one: PR+ and FR both give beta = 1 / 1e-6 = 1e6 unclipped
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = ConjugateGradient([x], lr=0.1, beta=beta, beta_max=beta_max)
    step_with_gradient(opt, x, [1e-3, 0.0])
    state = step_with_gradient(opt, x, [0.0, 1.0])
    assert state["beta"] == beta_max
    assert torch.equal(state["prev_dir"], torch.tensor([-1e-3 * beta_max, -1.0], dtype=torch.float64))


def test_unclipped_beta_is_what_the_clip_prevents():
    x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = ConjugateGradient([x], lr=0.1, beta_max=None)
    step_with_gradient(opt, x, [1e-3, 0.0])
    assert step_with_gradient(opt, x, [0.0, 1.0])["beta"] == pytest.approx(1e6)


def test_restarts_with_steepest_descent_every_n_steps():
    # Fletcher–Reeves' beta is positive whenever g is not 0: a zero beta here is a restart
    a, b, _ = quadratic(8, seed=3, condition=10.0)
    x = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    opt = ConjugateGradient([x], lr=0.05, beta="fr", beta_max=None, restart_every=3)
    betas = []
    for _ in range(10):
        opt.zero_grad()
        (0.5 * x @ a @ x - b @ x).backward()
        opt.step()
        betas.append(opt.state[x]["beta"])
    assert [k for k, beta in enumerate(betas) if beta == 0.0] == [0, 3, 6, 9]


def logistic_minibatches(seed=0, n=256, dim=10, batch=16, steps=60):
    """(features, labels, the rows of each step's minibatch): a seeded logistic-regression problem."""
    gen = torch.Generator().manual_seed(seed)
    features = 3.0 * torch.randn(n, dim, generator=gen, dtype=torch.float64)
    labels = (features @ torch.randn(dim, generator=gen, dtype=torch.float64) > 0).to(torch.float64)
    return features, labels, [torch.randint(n, (batch,), generator=gen) for _ in range(steps)]


def test_armijo_decreases_every_minibatch_loss_by_the_sufficient_decrease():
    features, labels, windows = logistic_minibatches()
    w = torch.zeros(features.shape[1], dtype=torch.float64, requires_grad=True)
    opt = ConjugateGradient([w], lr=1.0, line_search="armijo")
    c1, lengths = opt.defaults["c1"], set()

    def loss_on(rows):
        return torch.nn.functional.binary_cross_entropy_with_logits(features[rows] @ w, labels[rows])

    def value(rows) -> float:
        with torch.no_grad():
            return float(loss_on(rows))

    full_start = value(slice(None))
    for rows in windows:

        def closure(rows=rows):
            opt.zero_grad()
            loss = loss_on(rows)
            loss.backward()
            return loss

        f0, start = float(closure().detach()), w.detach().clone()
        g = w.grad.clone()
        opt.step(closure)
        d = opt.state[w]["prev_dir"]
        alpha = float((w.detach() - start) @ d / (d @ d))
        assert value(rows) <= f0 + c1 * alpha * float(g @ d) < f0  # Armijo, hence descent
        assert torch.equal(w.grad, g)  # .grad is left at the gradient where the step started
        lengths.add(round(alpha, 9))
    assert len(lengths) > 1  # the search did backtrack: the test is not a fixed step in disguise
    assert value(slice(None)) < 0.5 * full_start


def test_a_failed_line_search_takes_no_step_and_restarts():
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    opt = ConjugateGradient([x], lr=0.5, line_search="armijo", max_backtracks=5)
    calls = []

    def closure():  # every trial point looks worse than the start: no step can pass
        opt.zero_grad()
        loss = (x**2).sum() + (100.0 if calls else 0.0)
        calls.append(1)
        loss.backward()
        return loss

    opt.step(closure)
    assert len(calls) == 1 + 5
    assert torch.allclose(x.detach(), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.equal(x.grad, 2 * torch.ones(3, dtype=torch.float64))
    assert opt.state[x]["prev_dir"] is None  # forgotten: the next step is steepest descent


def test_line_search_needs_closure_and_options_are_checked():
    x = torch.zeros(2, requires_grad=True)
    (x.sum() ** 2 + x @ x).backward()
    with pytest.raises(RuntimeError, match="needs a closure"):
        ConjugateGradient([x], line_search="armijo").step()
    with pytest.raises(ValueError):
        ConjugateGradient([x], beta="hs")
    with pytest.raises(ValueError, match="beta_max"):
        ConjugateGradient([x], beta_max=-1.0)
    with pytest.raises(ValueError, match="one group"):
        ConjugateGradient(
            [{"params": [x]}, {"params": [torch.zeros(1, requires_grad=True)]}], line_search="armijo"
        )


def test_every_grid_optimizer_builds_and_steps():
    for name in BUILDABLE:
        w = torch.nn.Parameter(torch.ones(3))
        opt = make_optimizer(name, [w], lr=0.1)
        (w**2).sum().backward()
        opt.step()
        assert not torch.equal(w.detach(), torch.ones(3)), name
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer("lion", [w], lr=0.1)
