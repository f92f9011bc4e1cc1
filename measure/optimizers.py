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

    direction d_k = -g_k + beta_k d_{k-1}, with beta Polak–Ribière+ (max(0, g·(g - g_prev) / |g_prev|²),
    default) or Fletcher–Reeves (|g|² / |g_prev|²); restarts with steepest descent every `restart_every`
    steps and whenever d is not a descent direction. Step length along d:
      - "fixed": lr (the paper's setting: the same rate as every other optimizer);
      - "armijo": backtracking from lr until f(x + a d) <= f(x) + c1 a g·d (needs a closure);
      - "secant": one extra gradient at x + lr d gives the curvature d·H·d; exact on quadratics, so with it
        CG converges in at most n steps on an n-dimensional quadratic (needs a closure).
    A closure re-evaluates the loss and its gradients (zero_grad, forward, backward), as for torch's LBFGS.
    """

    def __init__(
        self,
        params,
        lr: float = 0.05,
        beta: str = "pr+",
        line_search: str = "fixed",
        restart_every: int | None = None,
        c1: float = 1e-4,
        backtrack: float = 0.5,
        max_backtracks: int = 20,
    ):
        if beta not in ("pr+", "fr"):
            raise ValueError("beta must be 'pr+' (Polak-Ribiere+) or 'fr' (Fletcher-Reeves)")
        if line_search not in ("fixed", "armijo", "secant"):
            raise ValueError("line_search must be 'fixed', 'armijo' or 'secant'")
        defaults = dict(
            lr=lr,
            beta=beta,
            line_search=line_search,
            restart_every=restart_every,
            c1=c1,
            backtrack=backtrack,
            max_backtracks=max_backtracks,
        )
        super().__init__(params, defaults)

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
            g = self._flat_grad(params)
            d = self._direction(group, state, g)
            slope = float(g @ d)  # directional derivative g·d < 0
            alpha = self._step_length(group, params, d, g, slope, loss, closure)
            self._add(params, d, alpha)
            state["prev_grad"], state["prev_dir"] = g, d
            state["step"] = state.get("step", 0) + 1
        return loss

    def _direction(self, group, state, g: torch.Tensor) -> torch.Tensor:
        prev_g, prev_d, k = state.get("prev_grad"), state.get("prev_dir"), state.get("step", 0)
        restart = group["restart_every"]
        if prev_g is None or (restart and k % restart == 0):
            return -g
        denom = float(prev_g @ prev_g)
        if denom == 0.0:
            return -g
        if group["beta"] == "fr":
            beta = float(g @ g) / denom
        else:
            beta = max(0.0, float(g @ (g - prev_g)) / denom)
        d = -g + beta * prev_d
        return d if float(g @ d) < 0 else -g  # not a descent direction: restart

    def _step_length(self, group, params, d, g, slope, loss, closure) -> float:
        lr, mode = group["lr"], group["line_search"]
        if mode == "fixed":
            return lr
        if closure is None:
            raise RuntimeError(f"line_search={mode!r} needs a closure that re-evaluates the loss")
        if mode == "secant":
            self._add(params, d, lr)
            with torch.enable_grad():
                closure()
            curvature = (float(self._flat_grad(params) @ d) - slope) / lr  # d·H·d
            self._add(params, d, -lr)
            return -slope / curvature if curvature > 0 else lr
        f0, alpha = float(loss.detach()), lr
        for _ in range(group["max_backtracks"]):
            self._add(params, d, alpha)
            with torch.enable_grad():
                f = float(closure().detach())
            self._add(params, d, -alpha)
            if f <= f0 + group["c1"] * alpha * slope:
                return alpha
            alpha *= group["backtrack"]
        return alpha


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
