"""Payloads: the traces a question needs, each made once (`Tracer`), composed into the prediction of every
(optimizer, strategy[, offload]) that the answer side evaluates at any batch size without torch
(advisor/prediction/step.py); `predict`, one spec's."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from advisor.measuring.recipe.strategies import STRATEGIES, checkpointing_of
from advisor.measuring.tracer.fake_model import _has_experts, build, fake_tensors
from advisor.measuring.tracer.fsdp import TRACED_WORLD, fake_group, largest_module, sharded_points
from advisor.measuring.tracer.spec import HALF, ONCE, PHASES, Spec, at_depth, depth_knobs
from advisor.measuring.tracer.traces import Trace, _parameters, trace_optimizers, trace_windows
from advisor.measuring.tracer.tracing import LiveBytes
from advisor.prediction.step import (
    BATCHES,
    CATEGORIES,
    ENGINE_VERSION,
    EXPERTS,
    coefficients,
    depth_points,
    envelope,
    line,
)


class Tracer:
    """The traces a question needs, each made once: windows by (spec, depth, batch, checkpointing, sharded),
    optimizer steps by (spec, depth), then the payload of every (optimizer, strategy[, offload])."""

    def __init__(self, spec: Spec, fit_rules: dict | None = None):
        self.spec, self.fit_rules = spec, fit_rules or {}
        self.knobs = depth_knobs(spec.config)
        self._configs: dict = {}
        self._windows: dict = {}
        self._steps: dict = {}
        self._graded: dict = {}  # (adapter, images) -> names of the parameters the windows gave a gradient
        self._extra: dict = {}  # a dormant block's held bytes and parameters (_held)
        self._largest: dict = {}  # adapter -> the largest module with every expert (_largest_module)

    def points(self, sharded: bool = False) -> list[tuple[int, ...]]:
        """Depth points: 1 and 2 blocks of each stack; a sharded trace's deeper ones (advisor/measuring/tracer/fsdp.py)."""
        return sharded_points(self.knobs) if sharded else depth_points(self.knobs)

    def config(self, point) -> object:
        if point not in self._configs:
            self._configs[point] = at_depth(self.spec.config, dict(zip(self.knobs, point, strict=True)))
        return self._configs[point]

    @staticmethod
    def _key(spec: Spec) -> tuple:
        """What tells specs of one model apart (its config is the tracer's own)."""
        return (
            spec.dtype,
            spec.device,
            spec.adapter,
            spec.attention,
            spec.seq_len,
            spec.image_size,
            spec.images,
            spec.method,
        )

    def window(
        self, spec: Spec, point, batch: int, checkpointing: str | None, micro_batches: int = 2, sharded=False
    ) -> Trace:
        """A traced window, of `micro_batches` or more (two serve where one is asked; a second micro-batch
        costs nothing: it is derived)."""
        micro_batches = 2
        key = (self._key(spec), point, batch, checkpointing, sharded)
        for n in range(micro_batches, 3):
            if (*key, n) in self._windows:
                return self._windows[(*key, n)]
        below = self._dormant(point, sharded)
        if below is not None:  # a stack the step never runs, one block deeper: its parameters alone added
            base = self.window(spec, below, batch, checkpointing, micro_batches, sharded)
            held, count = self._held(spec, point, below, sharded)
            return replace(
                base,
                timeline={p: _with_parameters(t, held) for p, t in base.timeline.items()},
                n_params=base.n_params + count,
                param_bytes=base.param_bytes + held,
            )
        warm = any(k[0] == key[0] and k[3:5] == key[3:] for k in self._windows)  # another depth's
        shallow = None if warm or not sharded else self.config(depth_points(self.knobs)[0])
        # every batch a payload reads, on one model (an FSDP rank's model one per batch: its first forward
        # initializes FSDP's state, which a window at another batch would then skip)
        sizes = (batch,) if sharded else tuple(dict.fromkeys((batch, *BATCHES)))
        traced = trace_windows(
            spec, self.config(point), sizes, checkpointing, micro_batches, sharded, shallow
        )
        graded = self._graded.setdefault((spec.adapter, spec.images), set())
        for size, trace in traced.items():
            self._windows[(self._key(spec), point, size, checkpointing, sharded, micro_batches)] = trace
            graded |= trace.graded  # a deeper point's names hold a shallower one's
        return traced[batch]

    def _largest_module(self, spec: Spec) -> int:
        """The most parameters one module holds (DeepSpeed's L) with every expert: the traced points hold a
        unit of them, and a mixture's experts are its largest module."""
        if spec.adapter not in self._largest:
            depths = {k: full if k.rpartition(".")[2] == EXPERTS else 1 for k, full in self.knobs.items()}
            with fake_tensors() as (mode, _):
                self._largest[spec.adapter] = largest_module(
                    build(spec, at_depth(self.spec.config, depths), mode)
                )
        return self._largest[spec.adapter]

    def _dormant(self, point, sharded: bool) -> tuple | None:
        """The point below this one, where it raises only a stack the step never runs (a VLM's vision tower on
        text alone: its blocks hold parameters and nothing else); None: a point to trace."""
        base = self.points(sharded)[0]
        if self.spec.images or point == base:
            return None
        raised = [i for i, (p, b) in enumerate(zip(point, base, strict=True)) if p != b]
        if all(list(self.knobs)[i].startswith("vision_config.") for i in raised):
            return base
        return None

    def _held(self, spec: Spec, point, below, sharded: bool) -> tuple[int, int]:
        """(bytes, parameters of the model's own) that the model at `point` holds beyond the one at `below`
        (a dormant stack's block and its adapters), each model built once under fake tensors."""
        key = (spec.dtype, spec.adapter, point, below, sharded)
        if key not in self._extra:
            held = []
            for at in (point, below):
                with fake_group() if sharded else nullcontext() as mesh, fake_tensors() as (mode, _):
                    model = build(spec, self.config(at), mode, None, mesh)
                    live = LiveBytes()
                    live.track_module(model, gradients=False)
                    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
                    own = _parameters(model) - (trained if spec.adapter.kind != "full" else 0)
                    held.append((live.now["parameters"], own))
            self._extra[key] = (held[0][0] - held[1][0], held[0][1] - held[1][1])
        return self._extra[key]

    def steps(self, spec: Spec, point, names: list[str]) -> dict[str, dict]:
        """Each optimizer's step at a depth point: traced at 1 and 2 blocks, affine in depth beyond (a sharded
        trace's deeper points: the step's bytes and traffic are sums over tensors, or the largest one's)."""
        singles = depth_points(self.knobs)
        if point not in singles:
            by_point = {d: self.steps(spec, d, names) for d in singles}
            return {n: _affine({d: by_point[d][n] for d in singles}, point, self.knobs) for n in names}
        below = self._dormant(point, sharded=False)
        if below is not None:  # the dormant block's parameters take no step: they get no gradient
            held, _ = self._held(spec, point, below, False)
            base = self.steps(spec, below, names)
            return {
                n: {**st, "peak": {**st["peak"], "parameters": st["peak"]["parameters"] + held}}
                for n, st in base.items()
            }
        key = self._key(spec)
        todo = [n for n in names if (key, point, n) not in self._steps]
        if todo:
            graded = self._graded.get((spec.adapter, spec.images))
            graded = frozenset(graded) if graded else None  # no window yet: every trainable parameter
            traced_steps = trace_optimizers(spec, self.config(point), todo, self.fit_rules, graded)
            for n, traced in traced_steps.items():
                self._steps[(key, point, n)] = traced
        return {n: self._steps[(key, point, n)] for n in names}

    def payloads(
        self, spec: Spec, optimizers: list[str], strategies: list[str], offload: bool = False, sharded=False
    ) -> dict:
        """(optimizer, strategy) -> payload. Offloaded: the device runs the half-precision window without the
        optimizer's state, which (with the fp32 master weights and gradients) is counted on the host. Sharded:
        one rank of FSDP2 at TRACED_WORLD ranks; its optimizer step is the single-process step over a shard."""
        device_spec = replace(spec, dtype=HALF[spec.dtype]) if offload else spec
        points = self.points(sharded)
        windows = {}  # first: the optimizer's step needs to know which parameters get a gradient
        for ckpt in sorted({checkpointing_of(s) for s in strategies}, key=str):
            asked = [s for s in strategies if checkpointing_of(s) == ckpt]
            micro = 2 if any(s.endswith("accumulation") for s in asked) else 1
            windows[ckpt] = (
                asked,
                {
                    (d, b): self.window(device_spec, d, b, ckpt, micro, sharded)
                    for d in points
                    for b in BATCHES
                },
            )
        steps = {d: self.steps(spec, d, optimizers) for d in points}
        if sharded:
            steps = {d: {n: _over_shard(st) for n, st in by.items()} for d, by in steps.items()}
        first = next(iter(windows.values()))[1]
        steps = {d: _with_reference(by, first[(d, BATCHES[0])].reference_bytes) for d, by in steps.items()}
        out = {}
        for asked, traces in windows.values():
            lines = {d: _window_lines(traces[(d, BATCHES[0])], traces[(d, BATCHES[1])]) for d in points}
            common = self._common(device_spec, traces, points, sharded)
            for strategy in asked:
                micro = (0, 1) if strategy.endswith("accumulation") else (0,)
                names = [p for p in ONCE if p in lines[points[0]]]
                names += [f"{p}{i}" for i in micro for p in PHASES if f"{p}{i}" in lines[points[0]]]
                for name in optimizers:
                    by_point = {d: steps[d][name] for d in points}
                    out[(name, strategy)] = self._payload(
                        common, lines, names, by_point, traces, offload, points
                    )
        return out

    def _common(self, spec: Spec, traces: dict, points: list, sharded: bool) -> dict:
        one, two = BATCHES
        first = traces[(points[0], one)]
        structure = dict(first.structure)
        if any(k.rpartition(".")[2] == EXPERTS for k in self.knobs):  # traced on a unit of the experts
            structure["largest_module"] = self._largest_module(spec)
        out = {
            "engine": ENGINE_VERSION,
            "depth": self.knobs,
            "knobs": list(self.knobs),  # the order of the points' depths (a stored payload's keys are sorted)
            "points": [list(d) for d in points],
            "n_params": [traces[(d, one)].n_params for d in points],
            "trainable": [traces[(d, one)].trainable for d in points],
            "attention": first.attention,
            "experts": _has_experts(self.spec.config),
            "flops": [line(traces[(d, one)].flops, traces[(d, two)].flops) for d in points],
            "inputs": line(first.inputs, traces[(points[0], two)].inputs),
            "structure": structure,
            "grad_bytes_per_param": first.grad_bytes / max(first.trainable, 1),
        }
        if sharded:
            out["sharded"] = {"world": TRACED_WORLD}  # grad_bytes counts a DTensor's global size already
        return out

    def _payload(self, common, lines, names, steps, traces, offload: bool, points) -> dict:
        one = BATCHES[0]
        traffic = [steps[d]["traffic"] for d in points]
        if offload:  # the device holds no optimizer state; the step is the host's
            device_steps = {d: _offloaded_step(traces[(d, one)]) for d in points}
            host = [_host_bytes(steps[d], traces[(d, one)].trainable) for d in points]
            payload = {
                **common,
                "optimizer_traffic": [0] * len(points),
                "host": host,
                "host_traffic": traffic,
            }
        else:
            device_steps = {d: _on_device(steps[d]) for d in points}
            payload = {**common, "optimizer_traffic": traffic, "host": [steps[d]["paged"] for d in points]}
        payload["phases"] = {
            **{p: [_with_state(lines[d][p], device_steps[d]) for d in points] for p in names},
            "optimizer_step": [[_step_line(device_steps[d], common["inputs"])] for d in points],
        }
        return payload


def _with_reference(steps: dict[str, dict], held: int) -> dict[str, dict]:
    """Each optimizer's step with DPO's reference model held beside it (nothing to add without one)."""
    if not held:
        return steps
    return {
        n: {**st, "peak": {**st["peak"], "parameters": st["peak"]["parameters"] + held}}
        for n, st in steps.items()
    }


def _with_parameters(entries: list, held: int) -> list:
    """A phase's live bytes, op by op, with `held` more bytes of parameters throughout."""
    i = CATEGORIES.index("parameters")
    return [(op, (*v[:i], v[i] + held, *v[i + 1 :])) for op, v in entries]


def _affine(values: dict, point: tuple[int, ...], knobs: dict):
    """A step's figures (nested dicts of numbers) at a depth point, from the depth points at base 1 (step.py's
    combination, at any depth)."""
    weights = coefficients(knobs, [d - 1 for d in point])
    return _weighted(list(values.values()), weights)


def _weighted(values: list, weights: list):
    if isinstance(values[0], dict):
        return {k: _weighted([v[k] for v in values], weights) for k in values[0]}
    return sum(w * v for w, v in zip(weights, values, strict=True))


def _over_shard(step: dict) -> dict:
    """A single-process optimizer step over one rank's shard: every byte and its traffic / TRACED_WORLD (an
    elementwise update; `sharded` optimizers only, rules/optimizers.toml)."""
    peak = {c: v // TRACED_WORLD for c, v in step["peak"].items()}
    return {**step, "peak": peak, "traffic": step["traffic"] / TRACED_WORLD, "paged": 0}


def _on_device(step: dict) -> dict:
    """The step's bytes by category on the accelerator: a paged optimizer's unified memory is the host's to
    hold (the driver moves it there when the device runs out)."""
    peak = dict(step["peak"])
    peak["optimizer_state"] -= step["paged"]
    return peak


def _offloaded_step(window: Trace) -> dict:
    """The device at an offloaded step: the half-precision weights and gradients, nothing else."""
    return {**dict.fromkeys(CATEGORIES, 0), "parameters": window.param_bytes, "gradients": window.grad_bytes}


def _host_bytes(step: dict, trainable: int) -> int:
    """The host's bytes for an offloaded optimizer: its state, the fp32 master weights and fp32 gradients."""
    return step["peak"]["optimizer_state"] + 8 * trainable


def predict(
    spec: Spec, optimizers: list[str], strategies: list[str] = STRATEGIES, fit_rules: dict | None = None
) -> dict[tuple[str, str], dict]:
    """The prediction of every (optimizer, strategy): a payload the answer side evaluates at any batch size
    without torch (advisor/prediction/step.py): per phase and depth point, the lines of its peak in the batch."""
    return Tracer(spec, fit_rules).payloads(spec, list(optimizers), list(strategies))


def _window_lines(one: Trace, two: Trace) -> dict[str, list[dict]]:
    return {p: envelope(one.timeline[p], two.timeline[p]) for p in one.timeline}


def _with_state(lines: list[dict], step: dict[str, int]) -> list[dict]:
    """The optimizer's state is alive through forward and backward: added to every line."""
    state = step["optimizer_state"]
    return [
        {"a": {**ln["a"], "optimizer_state": ln["a"]["optimizer_state"] + state}, "b": ln["b"]}
        for ln in lines
    ]


def _step_line(step: dict[str, int], inputs: tuple[int, int]) -> dict:
    """The step: parameters, gradients, state and its temporaries, and the last micro-batch's inputs,
    which the training loop still holds."""
    return {
        "a": {**step, "activations": step["activations"] + inputs[0]},
        "b": {**dict.fromkeys(CATEGORIES, 0), "activations": inputs[1]},
    }
