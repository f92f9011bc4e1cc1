"""Tracing a training step without its memory: live tensor bytes by category and phase, and real values
for what is computed from the inputs alone.

Written here rather than taken from torch's `MemTracker` (torch.distributed._tools.mem_tracker): a
prediction needs the peak of each phase (forward, backward, optimizer step) with its breakdown, so that
phases can be extrapolated in depth and batch separately; MemTracker keeps one global peak.
"""

from __future__ import annotations

import sys
import weakref

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    is_traceable_wrapper_subclass,
)
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

from advisor.prediction.step import CATEGORIES  # the answer side evaluates what this module records


class LiveBytes(TorchDispatchMode):
    """Bytes of live tensor storage by category, and the peak of each phase with its breakdown.

    A storage is counted once (views share it) from the op that creates it until it is freed. Its category
    is set by the phase it was created in (forward: activations; backward or optimizer: temporaries) and
    changed when it becomes a parameter's gradient or an optimizer's state."""

    def __init__(self, timeline: bool = False, flops: bool = False, values: InputValues | None = None):
        super().__init__()
        # with values: InputValues' work done in this mode, not one of its own below it (one mode fewer per op)
        self.values = values
        self.phase = "setup"
        self.now = dict.fromkeys(CATEGORIES, 0)
        # with flops: the FLOPs of the matrix products, convolutions and attention seen (op_flops), counted in this
        # mode: one more mode would cost every op a call
        self.flops = 0 if flops else None
        self.peaks: dict[str, tuple[int, dict[str, int]]] = {}
        # with timeline: phase -> (op, live bytes by category after it, in CATEGORIES order) for every op
        self.timeline: dict[str, list[tuple[str, tuple[int, ...]]]] | None = {} if timeline else None
        self._storages = WeakIdKeyDictionary()  # storage -> [nbytes, category, weakref]

    @property
    def total(self) -> int:
        return sum(self.now.values())

    def track(self, t: torch.Tensor, category: str, retag: bool = False) -> None:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return
        if is_traceable_wrapper_subclass(t):  # its own storage is nominal (its dense size, no data):
            for name in t.__tensor_flatten__()[0]:  # the tensors it holds are what takes memory
                self.track(getattr(t, name), category, retag)
            return
        st = t.untyped_storage()
        entry = self._storages.get(st)
        if entry is not None:
            if st.nbytes() != entry[0]:  # resized in place (an out= op): count its new size
                self.now[entry[1]] += st.nbytes() - entry[0]
                entry[0] = st.nbytes()
            if retag and entry[1] != category:
                self.now[entry[1]] -= entry[0]
                self.now[category] += entry[0]
                entry[1] = category
            return
        nbytes = st.nbytes()
        entry = [nbytes, category, None]
        entry[2] = weakref.ref(st, lambda _, e=entry: self._free(e))
        self._storages[st] = entry
        self.now[category] += nbytes

    def _free(self, entry) -> None:
        self.now[entry[1]] -= entry[0]

    def track_module(self, module: torch.nn.Module, gradients: bool = True) -> list:
        """Parameters and buffers as `parameters`; with `gradients`, each gradient retagged once it is
        accumulated. Returns the hook handles (remove them when done)."""
        for t in [*module.parameters(), *module.buffers()]:
            self.track(t, "parameters")
        if not gradients:
            return []
        return [
            p.register_post_accumulate_grad_hook(lambda p: self.track(p.grad, "gradients", retag=True))
            for p in module.parameters()
            if p.requires_grad
        ]

    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's state tensors as `optimizer_state` (call after a step)."""
        for state in optimizer.state.values():
            tree_map_only(torch.Tensor, lambda t: self.track(t, "optimizer_state", retag=True), state)

    def start(self, phase: str) -> None:
        self.phase = phase
        self._note_peak("start")

    def _note_peak(self, op: str) -> None:
        if self.timeline is not None:
            self.timeline.setdefault(self.phase, []).append((op, tuple(self.now.values())))
        total = self.total
        if total > self.peaks.get(self.phase, (-1, None))[0]:
            self.peaks[self.phase] = (total, dict(self.now))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = self.values.dispatch(func, args, kwargs) if self.values is not None else func(*args, **kwargs)
        # a metadata query (a fake tensor's device: most ops seen) moves no bytes
        if func.namespace == "prim":
            return out
        if self.flops is not None:
            self.flops += op_flops(func, args, kwargs, out)
        category = "activations" if self.phase.startswith("forward") else "temporaries"
        for t in tensors_in(out):
            self.track(t, category)
        self._note_peak(func.__name__)
        return out


def tensors_in(*values) -> list[torch.Tensor]:
    """The tensors among an op's arguments or outputs: tensors, and tensors in lists and tuples (an aten
    schema nests no deeper). Written out because pytree's walk is most of a dispatch mode's own cost."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            for x in v:
                if isinstance(x, torch.Tensor):
                    out.append(x)
                elif isinstance(x, list | tuple | dict):
                    out += tree_flatten(x)[0]
        elif isinstance(v, dict):
            out += [x for x in tree_flatten(v)[0] if isinstance(x, torch.Tensor)]
    return [t for t in out if isinstance(t, torch.Tensor)]


class _OpCounter(TorchDispatchMode):
    """Runs every op and adds what `count` says it cost to `total`."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.total += self.count(func, args, kwargs, out)
        return out


def op_flops(func, args, kwargs, out) -> int:
    """FLOPs of one op: the matrix products, convolutions and attention a step runs, by torch's own formulas
    (`torch.utils.flop_counter.flop_registry`), plus what that registry lacks (0 for any other op). Written
    here because `FlopCounterMode` also tracks modules, with hooks that keep each module's outputs alive until
    backward: under checkpointing that changes the very memory being traced."""
    formula = _flop_formulas().get(func._overloadpacket)
    if formula is None:
        return 0
    # an out= overload (TRL's fp32 accumulation, `addmm(..., out_dtype=, out=)`): its output is `out`
    # and its out_dtype, which the formula does not take (positional in that overload)
    if func._overloadname.startswith("dtype"):
        args = args[:3]
    kwargs = {k: v for k, v in kwargs.items() if k not in ("out", "out_dtype")}
    return formula(*args, **kwargs, out_val=out)


class OpTraffic(_OpCounter):
    """Bytes the ops read and write (every tensor argument read; outputs and arguments an op writes in place
    written): the memory traffic of a bandwidth-bound phase such as an optimizer step. A view moves nothing;
    an argument some kernels' schemas mark writable without writing it (fused AdamW's gradients, which only
    a gradient scale would touch; bitsandbytes' gradients and tables) is read only."""

    READ_ONLY = {
        "_fused_adamw_": {"grads"},
        "_fused_adam_": {"grads"},
        "optimizer_update_8bit_blockwise": {"g", "qmap1", "qmap2"},
        "optimizer_update_32bit": {"g"},
    }

    def count(self, func, args, kwargs, out) -> int:
        if func.is_view or not _moves_data(func):
            return 0
        read = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        unwritten = self.READ_ONLY.get(func._schema.name.split("::")[-1], set())
        written = [
            t
            for arg, value in zip(func._schema.arguments, args, strict=False)
            if arg.alias_info is not None and arg.alias_info.is_write and arg.name not in unwritten
            for t in tree_flatten(value)[0]
            if isinstance(t, torch.Tensor)
        ]
        ids = {id(t) for t in read}
        written += [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and id(t) not in ids]
        return sum(t.nbytes for t in read) + sum(t.nbytes for t in written)


def _moves_data(func) -> bool:
    """Whether an op reads or writes tensor data: not a metadata query (prim.device, sym_size, is_contiguous,
    ...), which returns no tensor and writes none."""
    if func.namespace == "prim":
        return False
    schema = func._schema
    returns = any("Tensor" in str(r.type) for r in schema.returns)
    writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return returns or writes


def _flop_formulas() -> dict:
    from torch.utils import flop_counter as fc

    if not hasattr(_flop_formulas, "table"):
        aten = torch.ops.aten

        def cpu_flash(query, key, value, *args, out_val=None, **kwargs):
            return fc.sdpa_flop_count(query.shape, key.shape, value.shape)

        def cpu_flash_backward(grad_out, query, key, value, *args, out_val=None, **kwargs):
            return fc.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)

        _flop_formulas.table = {
            **fc.flop_registry,
            aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_backward,
            aten.linear: _linear,  # reaches a dispatch mode whole when another mode's kernel calls F.linear
            aten._grouped_mm: _grouped_mm,  # a mixture's experts (transformers' default)
        }
    if not hasattr(_flop_formulas, "int8") and "bitsandbytes" in sys.modules:  # once bitsandbytes is loaded
        try:
            _flop_formulas.table[torch.ops.bitsandbytes.int8_linear_matmul] = _int8_matmul
            _flop_formulas.int8 = True
        except AttributeError:  # an older bitsandbytes: no int8 product op
            pass
    return _flop_formulas.table


def _linear(input, weight, bias=None, out_val=None, **kwargs) -> int:
    """F.linear: 2 x rows x in x out (the bias add is not a product)."""
    return 2 * input.numel() * weight.shape[0]


def _grouped_mm(a, b, *args, out_val=None, **kwargs) -> int:
    """torch's grouped GEMM, forward and backward: each row of `a` (a token routed to an expert, or a column of
    the weight's gradient) times the inner dimension times `b`'s columns, twice: 2 x a's elements x columns,
    whatever the groups' sizes (the routing)."""
    return 2 * a.numel() * b.shape[-1]


def _int8_matmul(a, b, *args, out_val=None, **kwargs) -> int:
    """bitsandbytes' LLM.int8 product A @ B.T: 2 x rows x inner x columns."""
    return 2 * a.numel() * b.shape[0]


class ScalarOracle(TorchDispatchMode):
    """Reading a scalar of a fake tensor (`float(g @ d)`) returns -1 instead of failing: for tracing an
    optimizer step only, where such scalars steer a branch. Our CGD then keeps its conjugate direction
    (g·d < 0, beta 1), its ordinary step and the one holding the most memory; the values never change
    the tensors' sizes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            return {torch.bool: False}.get(args[0].dtype, -1)
        return func(*args, **(kwargs or {}))


class ShardedLiveBytes(LiveBytes):
    """LiveBytes for one rank of FSDP2 (torch's FSDPMemTracker does the same three things): an op on DTensors
    is left to the local ops it runs on the shards (counted there); FSDP2 frees and re-allocates a block's
    gathered parameters with `UntypedStorage.resize_`, which no dispatch sees, so resizes are hooked; and the
    ops DTensor's sharding propagation runs under a fake mode of its own are not the rank's."""

    def __enter__(self):
        from torch._guards import active_fake_mode

        self._mode = active_fake_mode()
        self._resize = torch.UntypedStorage.resize_
        original, tracker = self._resize, self

        def resize_(storage, size):
            original(storage, size)
            entry = tracker._storages.get(storage)
            if entry is not None and entry[0] != storage.nbytes():
                tracker.now[entry[1]] += storage.nbytes() - entry[0]
                entry[0] = storage.nbytes()
                tracker._note_peak("resize_")

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._guards import active_fake_mode
        from torch.distributed.tensor import DTensor

        if any(t is DTensor for t in types):
            return NotImplemented
        if active_fake_mode() is not self._mode:  # DTensor's sharding propagation
            kwargs = kwargs or {}
            return (
                self.values.dispatch(func, args, kwargs) if self.values is not None else func(*args, **kwargs)
            )
        return super().__torch_dispatch__(func, types, args, kwargs)


# Ops whose result's size a boolean mask decides (InputValues._unmasked)
MASKED = (torch.ops.aten.index.Tensor, torch.ops.aten.masked_select.default)


class InputValues(TorchDispatchMode):
    """Real values for fake tensors computed from the inputs alone, so that data-dependent ops on them
    (a VLM dropping padding images, counting its image tokens, `.tolist()` of a count) work under fake
    tensors. Ops that touch any tensor without a value (a parameter) stay fake: no model memory is
    allocated. Factory ops get a value when small (masks, ranges)."""

    SMALL = 1 << 22  # elements: a factory's output gets a real value up to this size

    def __init__(self, fake_mode, experts: bool = False):
        super().__init__()
        self.fake_mode = fake_mode
        self.values = WeakIdKeyDictionary()  # fake tensor -> real tensor
        self.experts = experts  # a mixture of experts: its routing spread evenly (routed)

    def add(self, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        self.values[fake] = real
        return fake

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.dispatch(func, args, kwargs or {})

    def dispatch(self, func, args, kwargs: dict):
        """An op on fake tensors, or on their values where every tensor it takes has one (then a fake of its
        result, its value kept): this mode's work, which a LiveBytes given it does in its own dispatch."""
        if func.namespace == "prim":  # a fake tensor's device and the like: no value to compute
            return func(*args, **kwargs)
        tensors = tensors_in(*args, *kwargs.values())
        if func in MASKED and not all(t in self.values for t in tensors):
            args = self._unmasked(func, args)
        if not all(t in self.values for t in tensors) or (
            not tensors and not self._small_factory(func, args, kwargs)
        ):
            out = func(*args, **kwargs)
            if self.experts and func is torch.ops.aten.topk.default:
                self._routed(args[0], out[1])
            return out
        real_args, real_kwargs = tree_map(
            lambda a: self.values.get(a, a) if isinstance(a, torch.Tensor) else a, (args, kwargs)
        )
        with _disable_current_modes():
            real_out = func(*real_args, **real_kwargs)
        if func._schema.is_mutable:  # in place: keep the fake's own result, its value was updated above
            return func(*args, **kwargs)
        return tree_map_only(torch.Tensor, self._fake_of, real_out)

    def _unmasked(self, func, args: tuple) -> tuple:
        """A boolean mask with a value, on a tensor without one (TRL's head scoring only the labelled positions,
        `hidden[mask]`, and its backward's `masked_select`): the mask's positions as integer indices, which
        give the result its size under fake tensors (a mask alone makes it data-dependent)."""
        if func is torch.ops.aten.masked_select.default:
            source, mask = args
            if mask not in self.values:
                return args
            shape = torch.broadcast_shapes(source.shape, mask.shape)
            return (source.expand(shape), self._positions(mask, shape))
        source, indices = args[0], list(args[1])
        out = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype == torch.bool and index in self.values:
                out += self._positions(index, index.shape)
            else:
                out.append(index)
        return (source, out, *args[2:])

    def _positions(self, mask: torch.Tensor, shape) -> list[torch.Tensor]:
        """The positions a mask with a value holds, broadcast to `shape`, as fakes with values."""
        with _disable_current_modes():
            found = self.values[mask].expand(shape).nonzero(as_tuple=True)
        return [self._fake_of(i) for i in found]

    def _routed(self, logits: torch.Tensor, indices: torch.Tensor) -> None:
        """A mixture of experts' routing, for a trace: the top-k of a router's logits (computed from weights that
        have no value) gets indices spread evenly over the experts, token t to experts (t·k + j) mod E, as values
        the experts' data-dependent indexing can read. Activations and expert compute summed over experts do
        not depend on the spread; a real router's imbalance moves only which expert's temporaries are largest."""
        experts, k = logits.shape[-1], indices.shape[-1]
        with _disable_current_modes():
            rows = torch.arange(indices.numel() // k).unsqueeze(1) * k + torch.arange(k)
            self.add(indices, rows.remainder(experts).reshape(indices.shape))

    def _fake_of(self, real: torch.Tensor) -> torch.Tensor:
        with _disable_current_modes():
            fake = self.fake_mode.from_tensor(real)
        return self.add(fake, real)

    def _small_factory(self, func, args, kwargs) -> bool:
        if not func._schema.returns or "Tensor" not in str(func._schema.returns[0].type):
            return False
        try:
            with _disable_current_modes():
                probe = func(*args, **{**kwargs, "device": "meta"}) if "device" in str(func._schema) else None
        except Exception:
            return False
        return isinstance(probe, torch.Tensor) and probe.numel() <= self.SMALL
