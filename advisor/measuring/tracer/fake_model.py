"""The model under PyTorch's fake tensors: built from its config alone (no weight allocated), quantized,
adapted and checkpointed as the spec says, sharded as FSDP2 on a fake mesh; CUDA's kernels as a CPU trace
stands for them, and autocast for mixed precision."""

from __future__ import annotations

import copy
import warnings
from contextlib import ExitStack, contextmanager, nullcontext
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, fake_tensor_tls
from transformers import PreTrainedModel
from transformers.utils import import_utils
from transformers.utils import logging as hf_logging

from advisor.measuring.model.adapters import Gemm4bitDecomposed, adapted, quantize
from advisor.measuring.model.families.base import from_config
from advisor.measuring.recipe.strategies import enable_checkpointing
from advisor.measuring.tracer.fsdp import shard
from advisor.measuring.tracer.methods import configured, model_class, prepare, prepare_reference
from advisor.measuring.tracer.spec import MOE_KEYS, SUB_CONFIGS, Spec, precision
from advisor.measuring.tracer.tracing import InputValues


@contextmanager
def fake_tensors(experts: bool = False):
    """A fake-tensor session: (mode, input values; `experts`: a mixture's routing spread evenly). Transformers treats FakeTensors as tracing and then
    takes branches a real run never takes (materialized attention masks instead of is_causal); here the
    fakes stand for real tensors and InputValues supplies the values those branches read, so transformers
    is told they are not fake."""
    mode = FakeTensorMode()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' notices about a config ("loss_type=None ..."): not news
    try:
        with mock.patch.object(import_utils, "is_fake_tensor", lambda x: False), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # libraries' deprecation notices about their own calls
            yield mode, InputValues(mode, experts)
    finally:
        hf_logging.set_verbosity(verbosity)


@contextmanager
def cuda_kernels(spec: Spec):
    """What CUDA runs, for a trace on the CPU. Attention: FlashAttention for fp16/bf16 without a mask,
    grouped-query attention included; otherwise the memory-efficient kernel, which takes masks and fp32 but
    not grouped-query attention; otherwise the math kernel, which materializes the seq x seq scores.
    Transformers asks for grouped-query attention whenever there is no mask, so an fp32 step of a GQA model
    (Llama's 8 KV heads) gets the math kernel on CUDA: 21 % more memory on Llama-3.2-1B, measured on an H200.
    Dropout: CUDA's fused kernel keeps a bool mask, the CPU's a mask in the input's dtype."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if spec.device != "cuda":
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        head_dim = query.shape[-1]
        dtype = (
            torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
        )  # as it runs
        flash = dtype in (torch.float16, torch.bfloat16) and attn_mask is None and head_dim <= 256
        efficient = not enable_gqa
        backend = nullcontext() if flash or efficient else sdpa_kernel([SDPBackend.MATH])
        with backend:
            return original(
                query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
            )

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0:
            return input
        return torch.native_dropout(input, p, True)[0]

    with (
        mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa),
        mock.patch.object(torch.nn.functional, "dropout", dropout),
    ):
        yield


def build(spec: Spec, config, mode, checkpointing: str | None = None, mesh=None, frozen: bool = False):
    """The model under fake tensors, weights uninitialised (their values never matter), quantized and adapted
    as the spec says, with the checkpointing asked for ('full', 'selective' or None), in train mode, as the
    method's trainer prepares it; with a device mesh, built on the meta device and sharded as FSDP2
    (advisor/measuring/tracer/fsdp.py), then materialized. `frozen`: DPO's reference model (the policy's
    weights as loaded, quantized under QLoRA, no adapter, nothing trains, in eval mode)."""
    weights, half = precision(spec)
    # from_config keeps the object, and checkpointing changes it: never share one
    config = configured(spec, copy.deepcopy(config))
    kwargs = experts_of(spec, config, sharded=mesh is not None)
    meta = _on_meta() if mesh is not None else nullcontext()
    with mode, meta, mock.patch.object(PreTrainedModel, "initialize_weights", lambda self: None):
        try:
            model = from_config(
                model_class(spec), config, dtype=weights, attn_implementation=spec.attention, **kwargs
            )
        except (ValueError, ImportError):  # an architecture without SDPA support: its eager attention
            model = from_config(
                model_class(spec), config, dtype=weights, attn_implementation="eager", **kwargs
            )
    if spec.adapter.kind == "qlora":
        quantize(model, spec.adapter.base_bits, half or weights, mode)
    if frozen:
        prepare_reference(model)
    else:
        if checkpointing:
            enable_checkpointing(model, selective=checkpointing == "selective")
        if spec.adapter.kind != "full":
            model = adapted(model, spec.adapter, spec.dtype, mode)
        prepare(spec, model)
    if mesh is not None:
        with mode:
            shard(model, mesh, spec.dtype)
            model.to_empty(device="cpu")
    if not frozen:
        model.train()
    return model


@contextmanager
def _on_meta():
    """The meta device inside fake tensors, for a model FSDP shards before it is materialized. A constant a
    model makes from a Python number (Gemma's `torch.tensor(embed_scale)` buffer) is a meta tensor there that
    a CPU-only build does not lift into the fake mode (it lifts CPU tensors only): let the mode take it in,
    for the model's construction alone."""
    fake_tensor_tls.allow_non_fake_inputs_override = True
    try:
        with torch.device("meta"):
            yield
    finally:
        fake_tensor_tls.allow_non_fake_inputs_override = None


def experts_of(spec: Spec, config, sharded: bool = False) -> dict:
    """How a mixture's experts run (from_config's keyword; none for a dense model): grouped GEMM, transformers'
    default, where they compute in bf16 (its kernel takes bf16 alone: pure bf16, an adapter's bf16 base, FSDP's
    bf16 gathers), else the eager loop over experts (the printed code asks for it then: rules/fit.toml [moe])."""
    if not _has_experts(config):
        return {}
    weights, _ = precision(spec)
    bf16 = weights == torch.bfloat16 or (sharded and spec.dtype == "bf16-mixed")
    return {"experts_implementation": "grouped_mm" if bf16 else "eager"}


def _has_experts(config) -> bool:
    subs = [config] + [getattr(config, s, None) for s in SUB_CONFIGS]
    return any(
        isinstance(getattr(c, k, None), int) and getattr(c, k) > 1
        for c in subs
        if c is not None
        for k in MOE_KEYS
    )


def autocast(spec: Spec):
    _, half = precision(spec)
    if half is not None:
        return torch.autocast("cpu", dtype=half)  # traced on the CPU: CPU autocast's op lists
    return ExitStack()


def kernels(spec: Spec):
    """CUDA's kernels a trace decomposes to see their temporaries and FLOPs: bitsandbytes' 4-bit product as
    CUDA computes it for training-sized inputs. Entered inside the counters, which then see its parts."""
    return (
        Gemm4bitDecomposed() if spec.adapter.kind == "qlora" and spec.adapter.base_bits == 4 else ExitStack()
    )
