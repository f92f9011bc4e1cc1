"""The optimizers: torch.optim's SGD (plain and with momentum), Adam, AdamW, Adagrad, Adadelta,
transformers' Adafactor, and our nonlinear conjugate gradient (torch has none)."""

from __future__ import annotations

import torch

OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw", "adagrad", "adadelta", "cgd", "adafactor")
MOMENTUM = 0.9  # sgd-momentum: the conventional heavy-ball coefficient
WEIGHT_DECAY = 0.01  # adamw: torch's default decoupled weight decay

# Learning rates for the tiny and small presets, where the paper's per-model rate does not apply: each
# optimizer's conventional default (torch's own where it has one; SGD and CGD have none, these train the
# small models stably). The paper preset uses the paper's one rate per model for every optimizer.
DEFAULT_LR = {
    "sgd": 0.1,
    "sgd-momentum": 0.01,
    "adam": 1e-3,
    "adamw": 1e-3,
    "adagrad": 1e-2,
    "adadelta": 1.0,
    "cgd": 0.05,
    "adafactor": 1e-3,
}


def make_optimizer(
    name: str, params, lr: float, cuda_defaults: bool = False, **cgd_options
) -> torch.optim.Optimizer:
    """An optimizer by name; cgd_options go to ConjugateGradient (ignored by the others).

    cuda_defaults: build the implementation a CUDA run gets (torch's foreach kernels, and the fused AdamW
    that Trainer's default `adamw_torch_fused` selects) even where the parameters are not on a GPU, as
    `advisor fit` needs when it traces a GPU step on the CPU. Otherwise torch chooses by device."""
    if name == "cgd":
        return ConjugateGradient(params, lr=lr, **cgd_options)
    if name == "adafactor":  # as Trainer's optim="adafactor" builds it: a fixed rate, no relative step
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    impl = {"foreach": True} if cuda_defaults else {}
    builders = {
        "sgd": lambda: torch.optim.SGD(params, lr=lr, **impl),
        "sgd-momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, **impl),
        "adam": lambda: torch.optim.Adam(params, lr=lr, **({"fused": True} if cuda_defaults else {})),
        "adamw": lambda: torch.optim.AdamW(
            params, lr=lr, weight_decay=WEIGHT_DECAY, **({"fused": True} if cuda_defaults else {})
        ),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=lr, **impl),
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr, **impl),
    }
    if name not in builders:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    return builders[name]()


class ConjugateGradient(torch.optim.Optimizer):
    """Nonlinear conjugate gradient over all parameters as one vector.

    direction d_k = -g_k + beta_k d_{k-1}, with beta Polak–Ribière+ (g·(g - g_prev) / |g_prev|², default)
    or Fletcher–Reeves (|g|² / |g_prev|²), clipped to [0, beta_max]: on stochastic minibatches consecutive
    gradients come from different batches, so g - g_prev is mostly noise and an unclipped beta amplifies it
    (logged on ViT-small, PR+ reached 12.7 and the loss spiked after it); beta_max=None leaves it unclipped,
    as exact CG on a quadratic needs. Restarts with steepest descent every `restart_every` steps (None:
    never periodically), whenever d is not a descent direction, and after a failed line search.
    Step length along d:
      - "fixed": lr (the paper's setting: the same rate as every other optimizer);
      - "armijo": backtracking from lr by `backtrack` until f(x + a d) <= f(x) + c1 a g·d on the closure's
        minibatch, at most `max_backtracks` tries; if none passes, no step (see `_armijo`);
      - "secant": one extra gradient at x + lr d gives the curvature d·H·d; exact on quadratics, so with it
        (and beta_max=None, restart_every=None) CG converges in at most n steps on an n-dimensional quadratic.
    A closure re-evaluates the loss and its gradients (zero_grad, forward, backward), as for torch's LBFGS;
    armijo and secant need one, deterministic (no fresh dropout mask per call) for Armijo's guarantee to hold.
    The defaults are the grid's stochastic settings except the line search: "fixed" needs no closure, so the
    optimizer steps like any torch optimizer. After step() the parameters' .grad is the gradient at the
    point the step started from, in every mode, as with torch's optimizers.
    """

    def __init__(
        self,
        params,
        lr: float = 0.05,
        beta: str = "pr+",
        line_search: str = "fixed",
        restart_every: int | None = 10,
        beta_max: float | None = 1.0,
        c1: float = 1e-4,
        backtrack: float = 0.5,
        max_backtracks: int = 20,
    ):
        if beta not in ("pr+", "fr"):
            raise ValueError("beta must be 'pr+' (Polak-Ribiere+) or 'fr' (Fletcher-Reeves)")
        if line_search not in ("fixed", "armijo", "secant"):
            raise ValueError("line_search must be 'fixed', 'armijo' or 'secant'")
        if beta_max is not None and beta_max < 0:
            raise ValueError("beta_max must be >= 0 (or None: unclipped)")
        defaults = dict(
            lr=lr,
            beta=beta,
            line_search=line_search,
            restart_every=restart_every,
            beta_max=beta_max,
            c1=c1,
            backtrack=backtrack,
            max_backtracks=max_backtracks,
        )
        super().__init__(params, defaults)
        if line_search != "fixed" and len(self.param_groups) > 1:
            # each group's search re-runs the closure, which moves every gradient and the loss under the others
            raise ValueError(f"line_search={line_search!r} needs all parameters in one group")

    def _params(self, group) -> list[torch.Tensor]:
        return [p for p in group["params"] if p.grad is not None]

    @staticmethod
    def _flat_grad(params) -> torch.Tensor:
        return torch.cat([p.grad.reshape(-1) for p in params])

    @staticmethod
    def _add(params, direction: torch.Tensor, alpha: float) -> None:
        offset = 0
        for p in params:
            n = p.numel()
            p.add_(direction[offset : offset + n].view_as(p), alpha=alpha)
            offset += n

    @staticmethod
    def _set_grads(params, flat: torch.Tensor) -> None:
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n

    @staticmethod
    def _evaluate(closure) -> float:
        with torch.enable_grad():
            return float(closure().detach())

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = self._params(group)
            if not params:
                continue
            state = self.state[params[0]]  # the whole group's state lives on its first parameter
            g = self._flat_grad(params)  # a copy: the line search's evaluations overwrite .grad
            d, state["beta"] = self._direction(group, state, g)
            # the last step's vectors are spent: freed before the line search's forward and backward passes
            state["prev_grad"], state["prev_dir"] = g, d
            if not self._move(group, params, g, d, loss, closure):
                state["prev_grad"] = state["prev_dir"] = None  # a failed search forgets d: next step restarts
            if group["line_search"] != "fixed":
                self._set_grads(params, g)
            state["step"] = state.get("step", 0) + 1
        return loss

    def _direction(self, group, state, g: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(d, beta): the conjugate direction, or (-g, 0) on a restart."""
        prev_g, prev_d, k = state.get("prev_grad"), state.get("prev_dir"), state.get("step", 0)
        restart = group["restart_every"]
        if prev_g is None or (restart and k % restart == 0):
            return -g, 0.0
        denom = float(prev_g @ prev_g)
        if denom == 0.0:
            return -g, 0.0
        beta = float(g @ g) / denom if group["beta"] == "fr" else float(g @ (g - prev_g)) / denom
        beta = max(0.0, beta if group["beta_max"] is None else min(beta, group["beta_max"]))
        d = -g + beta * prev_d
        return (d, beta) if float(g @ d) < 0 else (-g, 0.0)  # not a descent direction: restart

    def _move(self, group, params, g, d, loss, closure) -> float:
        """Move the parameters along d by the mode's step length; returns that length (0: no step)."""
        mode = group["line_search"]
        if mode == "fixed":
            self._add(params, d, group["lr"])
            return group["lr"]
        if closure is None:
            raise RuntimeError(f"line_search={mode!r} needs a closure that re-evaluates the loss")
        slope = float(g @ d)  # directional derivative g·d < 0
        if mode == "secant":
            return self._secant(group, params, d, slope, closure)
        return self._armijo(group, params, d, slope, float(loss.detach()), closure)

    def _secant(self, group, params, d, slope: float, closure) -> float:
        """The minimiser along d of the quadratic through f's slope at x and at x + lr d."""
        lr = group["lr"]
        self._add(params, d, lr)
        self._evaluate(closure)
        curvature = (float(self._flat_grad(params) @ d) - slope) / lr  # d·H·d
        self._add(params, d, -lr)
        alpha = -slope / curvature if curvature > 0 else lr
        self._add(params, d, alpha)
        return alpha

    def _armijo(self, group, params, d, slope: float, f0: float, closure) -> float:
        """The first of lr, lr·backtrack, … that passes f(x + a d) <= f(x) + c1 a g·d, with the parameters
        left at x + a d, where it was evaluated; 0 with the parameters back at x (up to rounding) if none of
        `max_backtracks` tries passes. No step rather than the smallest: its decrease was not verified (a
        descent d fails only where the loss is not smooth at that scale or float noise swamps the change),
        and an unverified step is what Armijo is there to prevent."""
        alpha, at = group["lr"], 0.0
        for _ in range(group["max_backtracks"]):
            self._add(params, d, alpha - at)  # from the previous trial point: one update per trial
            at = alpha
            if self._evaluate(closure) <= f0 + group["c1"] * alpha * slope:
                return alpha
            alpha *= group["backtrack"]
        self._add(params, d, -at)
        return 0.0


def quadratic(n: int, condition: float = 100.0, seed: int = 0):
    """f(x) = ½ xᵀAx − bᵀx with A symmetric positive definite of this condition number: (A, b, minimiser)."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    eig = torch.logspace(0, float(torch.log10(torch.tensor(condition))), n, dtype=torch.float64)
    a = q @ torch.diag(eig) @ q.T
    b = torch.randn(n, generator=gen, dtype=torch.float64)
    return a, b, torch.linalg.solve(a, b)


def minimize_quadratic(make_optimizer, a: torch.Tensor, b: torch.Tensor, steps: int) -> torch.Tensor:
    """Run an optimizer (built by make_optimizer([x])) for `steps` closure steps on ½ xᵀAx − bᵀx from 0."""
    x = torch.zeros(a.shape[0], dtype=torch.float64, requires_grad=True)
    opt = make_optimizer([x])

    def closure():
        opt.zero_grad()
        loss = 0.5 * x @ a @ x - b @ x
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return x.detach()
