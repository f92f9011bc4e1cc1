"""LoRA and QLoRA on a transformers model, as peft and bitsandbytes build them for a Hugging Face Trainer run,
for real or under fake tensors (advisor fit's traces).

- LoRA: `peft.get_peft_model` with a `LoraConfig` (r, alpha, target modules; peft's defaults otherwise).
  Under fake tensors peft's `.to()` calls fail ("Couldn't swap Linear.weight"): FakeTensorMode keeps a
  weakref to every fake tensor it makes through `detach`, and `torch.utils.swap_tensors`, which
  `Module._apply` always uses for a fake parameter, refuses a tensor with a weakref. `no_fake_memo`
  empties that memo while peft runs (the memo only serves `from_tensor` identity, which peft never needs).
- QLoRA: the base's linear layers quantized as transformers' bitsandbytes integration does
  (`BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)`, or
  `load_in_8bit`), every `nn.Linear` but the output embeddings, the module of the last parameter and tied
  weights. `Params4bit` cannot hold a fake tensor, so under fake tensors a layer is a real
  `bnb.nn.Linear4bit` (peft wraps it with its 4-bit LoRA layer) whose weight is a plain fake uint8 tensor
  of the packed size carrying the attributes of a `Params4bit`, and whose quantization state (absmax,
  tables, scales) is registered as buffers so that it is counted; bitsandbytes registers fake kernels for
  all its ops, so its own forward and backward run.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from unittest import mock

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.errors import InputError
from advisor.prediction.step import Adapter

NF4_BLOCK = 64  # bitsandbytes' 4-bit block size; double quantization groups 256 absmax blocks
NESTED_BLOCK = 256


def lora_config(adapter: Adapter, heads: tuple[str, ...] = ()):
    """peft's LoraConfig for the adapter (peft's defaults besides rank, alpha and targets); `heads`: modules
    trained in full beside the adapters (peft's modules_to_save)."""
    from peft import LoraConfig

    targets = list(adapter.targets) if adapter.targets else "all-linear"
    save = list(heads) or None
    return LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, target_modules=targets, modules_to_save=save)


def classifier_heads(model) -> tuple[str, ...]:
    """A classifier's label head (a model without output embeddings, with a `classifier` or `score` layer, as
    peft names them): what a LoRA fine-tune to new labels trains in full, as peft's image- and
    sequence-classification recipes do (modules_to_save); none for a language model, whose output layer
    is its embeddings."""
    if model.get_output_embeddings() is not None:
        return ()
    return tuple(n for n in ("classifier", "score") if isinstance(getattr(model, n, None), nn.Module))


def adapted(model, adapter: Adapter, dtype: str, mode=None, heads: tuple[str, ...] = ()):
    """The model with LoRA adapters (only they train, and `heads` in full), in fp32 (peft's default) unless
    training is pure bf16; `mode`: the FakeTensorMode it was built under."""
    from peft import get_peft_model

    try:
        with mode or nullcontext(), no_fake_memo(mode) if mode is not None else nullcontext():
            config = lora_config(adapter, heads)
            return get_peft_model(model, config, autocast_adapter_dtype=dtype != "bf16")
    except ValueError as e:
        if any(s in str(e) for s in ("not found in the base model", "Target modules", "is not supported")):
            names = sorted(
                {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
            )
            raise InputError(
                f"--lora-targets {','.join(adapter.targets)} match no linear layer of the model; name them by "
                f"their last part, as peft matches them: {', '.join(names)}.",
                "lora_targets",
            ) from e
        raise


@contextmanager
def no_fake_memo(mode):
    """FakeTensorMode's memo of fake tensors emptied, and kept empty, for the block (see the module's doc)."""
    converter = mode.fake_tensor_converter
    converter.meta_converter.tensor_memo.clear()
    with (
        mock.patch.object(converter, "set_tensor_memo", lambda t, v: None),
        mock.patch.object(converter.meta_converter, "set_tensor_memo", lambda t, v: None),
    ):
        yield


# --- the quantized base under fake tensors ----------------------------------------------------------------


def quantize(model, bits: int, compute_dtype: torch.dtype, mode) -> None:
    """Replace the linear layers transformers' bitsandbytes integration quantizes by fake 4- or 8-bit ones."""
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = get_keys_to_not_convert(model) + list(getattr(model, "_keep_in_fp32_modules", None) or [])
    make = fake_linear4bit if bits == 4 else fake_linear8bit
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and should_convert_module(name, skip):
            model.set_submodule(name, make(module, compute_dtype, mode))
    setattr(model, "is_loaded_in_4bit" if bits == 4 else "is_loaded_in_8bit", True)


def fake_linear4bit(linear: nn.Linear, compute_dtype: torch.dtype, mode) -> nn.Module:
    """A `bnb.nn.Linear4bit` (NF4, double quantization) whose weight and quantization state are fake tensors
    of their real sizes: packed weight ⌈n/2⌉ bytes, uint8 absmax per 64 values, fp32 scales per 256 blocks,
    the 16-value NF4 table, the 256-value dynamic table and an offset (bitsandbytes' quantize_4bit)."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    out_f, in_f = linear.out_features, linear.in_features
    with torch.device("meta"):
        new = bnb.nn.Linear4bit(
            in_f,
            out_f,
            bias=linear.bias is not None,
            compute_dtype=compute_dtype,
            compress_statistics=True,
            quant_type="nf4",
            quant_storage=torch.uint8,
        )
    blocks = -(out_f * in_f // -NF4_BLOCK)
    with mode:
        weight = nn.Parameter(
            torch.empty(((out_f * in_f + 1) // 2, 1), dtype=torch.uint8), requires_grad=False
        )
        nested = QuantState(
            absmax=torch.empty(-(blocks // -NESTED_BLOCK), dtype=torch.float32),
            code=torch.empty(256, dtype=torch.float32),
            blocksize=NESTED_BLOCK,
            dtype=torch.float32,
        )
        state = QuantState(
            absmax=torch.empty(blocks, dtype=torch.uint8),
            shape=torch.Size([out_f, in_f]),
            code=torch.empty(16, dtype=torch.float32),
            blocksize=NF4_BLOCK,
            quant_type="nf4",
            dtype=compute_dtype,
            offset=torch.empty((), dtype=torch.float32),
            state2=nested,
        )
    attributes = dict(
        quant_state=state,
        blocksize=NF4_BLOCK,
        compress_statistics=True,
        quant_type="nf4",
        quant_storage=torch.uint8,
        bnb_quantized=True,
        module=new,
    )
    for key, value in attributes.items():
        setattr(weight, key, value)
    new._parameters["weight"] = weight
    new.quant_state = state
    for i, t in enumerate((state.absmax, state.code, state.offset, nested.absmax, nested.code)):
        new.register_buffer(f"_quant_state_{i}", t, persistent=False)  # counted with the parameters
    _copy_bias(linear, new)
    return new.requires_grad_(False)


def fake_linear8bit(linear: nn.Linear, compute_dtype: torch.dtype, mode) -> nn.Module:
    """A `bnb.nn.Linear8bitLt` (LLM.int8, outlier threshold 6) whose int8 weight and per-row fp32 scales are
    fake tensors of their real sizes."""
    import bitsandbytes as bnb

    out_f, in_f = linear.out_features, linear.in_features
    with torch.device("meta"):
        new = bnb.nn.Linear8bitLt(
            in_f, out_f, bias=linear.bias is not None, has_fp16_weights=False, threshold=6.0
        )
    with mode:
        weight = nn.Parameter(torch.empty((out_f, in_f), dtype=torch.int8), requires_grad=False)
        scales = torch.empty(out_f, dtype=torch.float32)
    weight.CB, weight.SCB, weight.has_fp16_weights = weight, scales, False
    new._parameters["weight"] = weight
    new.state.has_fp16_weights, new.state.CB, new.state.SCB = False, weight, scales
    new.register_buffer("_scales", scales, persistent=False)
    _copy_bias(linear, new)
    return new.requires_grad_(False)


def _copy_bias(linear: nn.Linear, new: nn.Module) -> None:
    if linear.bias is not None:
        new._parameters["bias"] = nn.Parameter(linear.bias.detach(), requires_grad=False)


class Gemm4bitDecomposed(TorchDispatchMode):
    """bitsandbytes' 4-bit matrix product as its unfused path: the weight dequantized to a full compute-dtype
    tensor, then F.linear. What CUDA runs for training-sized inputs (more than 512 or 1536 rows) and what the
    CPU always runs, inside one op that no dispatch-level counter could see into otherwise."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.bitsandbytes.gemm_4bit.default:
            from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl

            return _gemm_4bit_default_impl(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
