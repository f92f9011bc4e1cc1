"""FSDP2 for a trace: one rank of a fake process group (torch's own, as torchtitan's estimator uses it), the
model wrapped as Trainer's FSDP plugin wraps it (`fully_shard` on every block and on the root), and the depth
points a sharded trace is taken at.

A fake process group runs every collective as a no-op of the right shapes, so one process traces one rank
exactly: the sharded parameters (DTensors whose local shard is what the rank holds), the all-gathered block and
the prefetched next one, the reduce-scatter input, the root that FSDP2 does not reshard after forward. The
device mesh reads values, so it is made outside fake tensors.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from advisor.prediction.step import depth_points

TRACED_WORLD = 2  # ranks a sharded trace is taken at; a rank's sharded bytes scale as 1/N from there
SHARDED_BASE = 4  # the shallowest depth a sharded trace is linear from: the root's gather dominates below


@contextmanager
def fake_group(world: int = TRACED_WORLD):
    """A fake process group of `world` ranks, this process rank 0, and its 1-D device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield init_device_mesh("cpu", (world,))
    finally:
        dist.destroy_process_group()


def blocks(model) -> list[torch.nn.Module]:
    """The blocks FSDP wraps one by one: modules of the classes the model names in `_no_split_modules` (what
    transformers' FSDP auto-wrap policy takes as transformer_layer_cls_to_wrap)."""
    names = set()
    for module in model.modules():
        names |= set(getattr(module, "_no_split_modules", None) or [])
    # by the class or its bases: fully_shard swaps a block's class for a subclass (FSDPLlamaDecoderLayer)
    return [m for m in model.modules() if any(k.__name__ in names for k in type(m).__mro__)]


def shard(model, mesh, dtype: str) -> None:
    """fully_shard on every block, then on the root. bf16-mixed as MixedPrecisionPolicy: bf16 gathers and
    compute, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if dtype == "bf16-mixed"
        else MixedPrecisionPolicy()
    )
    for block in blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def root_parameters(model) -> int:
    """Parameters outside every block (embeddings, the output layer, the final norm): the root's group."""
    inside = {id(p) for b in blocks(model) for p in b.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in inside)


def largest_module(model) -> int:
    """The most parameters one module holds directly (DeepSpeed's L: `estimate_zero3_model_states_mem_needs`)."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)


def sharded_points(knobs: dict[str, int]) -> list[tuple[int, ...]]:
    """Depth points of a sharded trace: every stack at SHARDED_BASE blocks, then each one deeper (and each
    pair that multiplies, both: depth_points); the full depth alone where a stack is too shallow for that."""
    if any(full < SHARDED_BASE + 2 for full in knobs.values()):
        return [tuple(knobs.values())]
    return depth_points(knobs, tuple(SHARDED_BASE for _ in knobs))
