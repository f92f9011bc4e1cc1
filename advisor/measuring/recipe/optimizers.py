"""The optimizers: torch.optim's SGD (plain and with momentum), Adam, AdamW, Adagrad, Adadelta, transformers'
Adafactor, our nonlinear conjugate gradient (torch has none), and the fine-tuning menu's: bitsandbytes' 8-bit
AdamW (paged and not) and Lion (32- and 8-bit), torchao's 8- and 4-bit AdamW, schedule-free AdamW, and
torch's Muon for the hidden matrices with AdamW for the rest. Named as Hugging Face Trainer's `optim` names
them where it has a name."""

from __future__ import annotations

import importlib.util
import warnings
from contextlib import ExitStack, contextmanager
from unittest import mock

import torch

from advisor.measuring.recipe.config import DEFAULT_LR

BUILDABLE = (  # the names make_optimizer builds: every optimizer of rules/optimizers.toml
    "sgd",
    "sgd-momentum",
    "adam",
    "adamw",
    "adagrad",
    "adadelta",
    "cgd",
    "adafactor",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "adamw_torch_8bit",
    "adamw_torch_4bit",
    "lion_32bit",
    "lion_8bit",
    "schedule_free_adamw",
    "muon",
    "nadamw",
)
MOMENTUM = 0.9  # sgd-momentum: the conventional heavy-ball coefficient
WEIGHT_DECAY = 0.01  # adamw: torch's default decoupled weight decay
TORCHAO_BLOCK = 256  # Trainer's block size for torchao's 8- and 4-bit AdamW (adamw_torch_8bit/4bit)
# where each optimizer comes from, for what it needs installed
PACKAGES = {
    "adafactor": "transformers",
    "adamw_bnb_8bit": "bitsandbytes",
    "paged_adamw_8bit": "bitsandbytes",
    "lion_32bit": "bitsandbytes",
    "lion_8bit": "bitsandbytes",
    "adamw_torch_8bit": "torchao",
    "adamw_torch_4bit": "torchao",
    "schedule_free_adamw": "schedulefree",
}


def make_optimizer(
    name: str, params, lr: float, cuda_defaults: bool = False, model=None, adamw_lr=None, **cgd_options
) -> torch.optim.Optimizer:
    """An optimizer by name; cgd_options go to ConjugateGradient (ignored by the others); `adamw_lr` is
    Muon's AdamW part's rate (None: AdamW's default).

    cuda_defaults: build the implementation a CUDA run gets (torch's foreach kernels, and the fused AdamW
    that Trainer's default `adamw_torch_fused` selects) even where the parameters are not on a GPU, as
    `advisor fit` needs when it traces a GPU step on the CPU. Otherwise torch chooses by device. `model`:
    what Trainer's choices need besides the parameters (bitsandbytes keeps embeddings at 32 bits; Muon
    takes the hidden matrices, AdamW the embeddings and the output layer)."""
    params = list(params)
    if name == "cgd":
        return ConjugateGradient(params, lr=lr, **cgd_options)
    if name == "muon":
        return _muon(params, lr, cuda_defaults, model, adamw_lr)
    if name in EXTRA:
        return EXTRA[name](params, lr, cuda_defaults, model)
    if name == "adafactor":  # as Trainer's optim="adafactor" builds it: a fixed rate, no relative step
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=lr, scale_parameter=False, relative_step=False)
    impl = {"foreach": True} if cuda_defaults else {}
    fused = {"fused": True} if cuda_defaults else {}
    builders = {
        "sgd": lambda: torch.optim.SGD(params, lr=lr, **impl),
        "sgd-momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, **impl),
        "adam": lambda: torch.optim.Adam(params, lr=lr, **fused),
        "adamw": lambda: torch.optim.AdamW(params, lr=lr, weight_decay=WEIGHT_DECAY, **fused),
        # torch's single-tensor NAdam, traced too: its foreach step computes bias corrections as Python
        # floats from each step count, which fake tensors cannot give; the state is the same, the temporaries
        # per parameter (a CUDA run's default foreach step holds them for every parameter at once)
        "nadamw": lambda: torch.optim.NAdam(
            params, lr=lr, weight_decay=WEIGHT_DECAY, decoupled_weight_decay=True, foreach=False
        ),
        "adagrad": lambda: torch.optim.Adagrad(params, lr=lr, **impl),
        "adadelta": lambda: torch.optim.Adadelta(params, lr=lr, **impl),
    }
    if name not in builders:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(BUILDABLE)}")
    return builders[name]()


def missing_package(name: str) -> str | None:
    """The package an optimizer needs that is not installed, or None."""
    package = PACKAGES.get(name)
    return package if package and importlib.util.find_spec(package) is None else None


# --- bitsandbytes ------------------------------------------------------------------------------------------


def _bnb(kind: str, bits: int, paged: bool = False):
    def build(params, lr, cuda_defaults, model):
        import bitsandbytes as bnb

        bnb.optim.GlobalOptimManager.get_instance().initialize()  # its overrides outlive optimizers: reset
        cls = bnb.optim.AdamW if kind == "adamw" else bnb.optim.Lion
        extra = {"weight_decay": WEIGHT_DECAY} if kind == "adamw" else {}
        with warnings.catch_warnings():  # paged memory falls back to ordinary tensors on a CPU, and says so
            warnings.simplefilter("ignore")
            optimizer = cls(params, lr=lr, optim_bits=bits, is_paged=paged, **extra)
        if bits == 8 and model is not None:  # as Trainer does: embeddings keep 32-bit state
            manager = bnb.optim.GlobalOptimManager.get_instance()
            for module in model.modules():
                if isinstance(module, torch.nn.Embedding):
                    manager.register_module_override(module, "weight", {"optim_bits": 32})
        return optimizer

    return build


def paged_state_bytes(optimizer) -> int:
    """Bytes of a paged bitsandbytes optimizer's state that CUDA's unified memory holds (state1 and state2 of
    parameters of at least 1e5 elements: bitsandbytes' get_state_buffer), which the driver may move to the
    host; 0 for any other optimizer."""
    if not getattr(optimizer, "is_paged", False):
        return 0
    return sum(
        t.untyped_storage().nbytes()
        for p, state in optimizer.state.items()
        if p.numel() >= 1e5
        for key, t in state.items()
        if key in ("state1", "state2") and isinstance(t, torch.Tensor)
    )


# --- torchao ------------------------------------------------------------------------------------------------


def _torchao(bits: int):
    def build(params, lr, cuda_defaults, model):
        from torchao.optim import AdamW4bit, AdamW8bit

        cls = AdamW8bit if bits == 8 else AdamW4bit
        return cls(params, lr=lr, weight_decay=WEIGHT_DECAY, block_size=TORCHAO_BLOCK)

    return build


def torchao_largest_quantized(optimizer) -> int:
    """Elements of the largest parameter whose state torchao quantizes (at least 4096 elements, a whole
    number of blocks: torchao/optim/adam.py): its compiled step's temporaries scale with it."""
    sizes = [
        p.numel()
        for group in optimizer.param_groups
        for p in group["params"]
        if p.numel() >= 4096 and p.numel() % TORCHAO_BLOCK == 0
    ]
    return max(sizes, default=0)


# --- schedule-free and Muon ----------------------------------------------------------------------------------


def _schedule_free(params, lr, cuda_defaults, model):
    from schedulefree import AdamWScheduleFree

    optimizer = AdamWScheduleFree(params, lr=lr, weight_decay=WEIGHT_DECAY)
    optimizer.train()  # as Trainer does before each training step: step() refuses otherwise
    return optimizer


def _muon(params, lr, cuda_defaults, model, adamw_lr=None):
    fused = {"fused": True} if cuda_defaults else {}
    adamw_lr = DEFAULT_LR["adamw"] if adamw_lr is None else adamw_lr
    return MuonWithAdamW.split(params, model, lr=lr, adamw_lr=adamw_lr, **fused)


def _ends(model) -> list[torch.nn.Module]:
    """Every embedding of a model (tokens, learned positions such as GPT-2's `wpe`, token types) and its output
    layer (the output embeddings, else its last linear layer: a classification head): 2-D, yet not hidden
    matrices, so Muon's documentation sends them to AdamW."""
    if model is None:
        return []
    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    first = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    last = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if last is None:
        last = next((m for m in reversed(list(model.modules())) if isinstance(m, torch.nn.Linear)), None)
    found = [m for m in (first, *embeddings, last) if m is not None]
    return list({id(m): m for m in found}.values())


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon (momentum orthogonalized by Newton-Schulz) for the hidden 2-D weight matrices and AdamW for
    the other parameters (embeddings, the output layer, norms, biases), as Muon's documentation prescribes;
    one optimizer to Trainer (`optimizers=(MuonWithAdamW(...), None)`) and its schedule."""

    @classmethod
    def split(cls, params, model=None, **options) -> MuonWithAdamW:
        """Muon for the 2-D parameters but every embedding and the output layer (2-D, yet Muon's documentation
        sends them to AdamW), AdamW for the rest."""
        excluded = {id(p) for layer in _ends(model) for p in layer.parameters()}
        params = [p for p in params if p.requires_grad]
        hidden = [p for p in params if p.ndim == 2 and id(p) not in excluded]
        return cls(hidden, [p for p in params if p.ndim != 2 or id(p) in excluded], **options)

    @classmethod
    def for_model(cls, model, **options) -> MuonWithAdamW:
        """What trains of a model, split as `split` does: what a Trainer script passes as its optimizer."""
        return cls.split(model.parameters(), model, **options)

    def __init__(
        self, hidden, rest, lr: float = 1e-3, adamw_lr: float = 1e-3, weight_decay: float = 0.1, **adamw
    ):
        hidden, rest = list(hidden), list(rest)
        self.inner = [torch.optim.Muon(hidden, lr=lr, weight_decay=weight_decay)] if hidden else []
        if rest:
            self.inner.append(torch.optim.AdamW(rest, lr=adamw_lr, weight_decay=WEIGHT_DECAY, **adamw))
        super().__init__(hidden + rest, {})
        self.param_groups = [
            g for o in self.inner for g in o.param_groups
        ]  # a schedule reaches the inner ones

    @property
    def state(self) -> dict:
        """Every inner optimizer's state by parameter, merged (a ChainMap would look a parameter up in the
        first optimizer's defaultdict, which makes it an empty entry there and hides the second's)."""
        return {p: st for o in self.inner for p, st in o.state.items()}

    @state.setter
    def state(
        self, value
    ) -> None:  # torch.optim.Optimizer.__init__ assigns an empty one: the inner keep theirs
        pass

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for optimizer in self.inner:
            optimizer.step()
        return loss

    def state_dict(self):
        return {"inner": [o.state_dict() for o in self.inner]}

    def load_state_dict(self, state_dict) -> None:
        for optimizer, inner in zip(self.inner, state_dict["inner"], strict=True):
            optimizer.load_state_dict(inner)


EXTRA = {
    "adamw_bnb_8bit": _bnb("adamw", 8),
    "paged_adamw_8bit": _bnb("adamw", 8, paged=True),
    "lion_32bit": _bnb("lion", 32),
    "lion_8bit": _bnb("lion", 8),
    "adamw_torch_8bit": _torchao(8),
    "adamw_torch_4bit": _torchao(4),
    "schedule_free_adamw": _schedule_free,
    "muon": _muon,
}


@contextmanager
def traceable(name: str, fake_mode, update: bool = True):
    """What an optimizer needs to be built and stepped under fake tensors: bitsandbytes' quantization maps
    computed for real (its constructor reads them with .tolist()), and torchao's step run eagerly (its
    compiled kernel dereferences data pointers) with its quantization maps made for real first; without
    `update`, torchao's step makes its state and skips the update itself (a trace that models the step's
    memory and traffic needs the state alone: rules/fit.toml [optimizers])."""
    with ExitStack() as stack:
        if PACKAGES.get(name) == "bitsandbytes":
            import bitsandbytes.functional as F
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            real = F.create_dynamic_map

            def create_dynamic_map(*args, **kwargs):
                with unset_fake_temporarily():
                    out = real(*args, **kwargs)
                return fake_mode.from_tensor(out)

            stack.enter_context(mock.patch.object(F, "create_dynamic_map", create_dynamic_map))
        if PACKAGES.get(name) == "torchao":
            from torchao.optim import subclass_4bit, subclass_8bit

            for module in (subclass_8bit, subclass_4bit):
                module.get_qmap_signed()
                module.get_qmap_unsigned()
            eager = (lambda fn=None, **kw: fn or (lambda f: f)) if update else (lambda *a, **kw: _skipped)
            stack.enter_context(mock.patch.object(torch, "compile", eager))
        yield


def _skipped(*args, **kwargs) -> None:
    """torchao's per-parameter update, where a trace needs only the state it makes."""


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
