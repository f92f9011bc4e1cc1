"""The four model families at three presets (tiny, small, paper), or any local/cached Hugging Face model.

Models are built from configs (random init) unless pretrained weights are on disk; the run records which.
"""

from __future__ import annotations

from dataclasses import dataclass

PRESETS = ("tiny", "small", "paper")
REFERENCE_MODELS = {"vit": "vision", "modernbert": "encoder", "llama": "decoder", "nanovlm": "vlm"}


@dataclass(frozen=True)
class Shape:
    """What the data must look like for a model: sequence length, vocabulary, image size, labels."""

    seq_len: int = 32  # text tokens per sample (captions for vlm)
    vocab_size: int = 260  # byte-level tokens (256) + pad/bos/eos/mask
    image_size: int = 32
    num_labels: int = 10
    image_token_id: int | None = None  # vlm: the placeholder id the model replaces with image features
    image_tokens: int = 0  # vlm: placeholders per image


@dataclass
class BuiltModel:
    model: object  # a transformers PreTrainedModel
    family: str
    shape: Shape
    pretrained: bool
    n_params: int
    name: str


# Byte-level text: ids 0..255 are bytes; the specials follow. Every preset's vocabulary is at least this big.
PAD, BOS, EOS, MASK = 256, 257, 258, 259
BYTE_VOCAB = 260

# (vision, encoder, decoder, vlm) sizes per preset. `paper` is the paper's real size.
TEXT = {
    "tiny": dict(hidden=32, layers=2, heads=2, kv_heads=2, ffn=64, seq=32, vocab=BYTE_VOCAB),
    "small": dict(hidden=128, layers=4, heads=4, kv_heads=2, ffn=256, seq=64, vocab=BYTE_VOCAB),
}
VISION = {
    "tiny": dict(hidden=32, layers=2, heads=2, ffn=64, image=32, patch=8),
    "small": dict(hidden=96, layers=4, heads=4, ffn=192, image=64, patch=8),
}
NUM_LABELS = 23  # MM-IMDb's genres


def build_model(model: str, preset: str, dropout: float | None = None, seed: int = 0) -> BuiltModel:
    """A reference model ('vit', 'modernbert', 'llama', 'nanovlm') at a preset, or an HF id / local folder."""
    import torch

    torch.manual_seed(seed)  # random init is part of the seed's run
    if model in REFERENCE_MODELS:
        family = REFERENCE_MODELS[model]
        config, shape = _reference_config(family, preset)
        if dropout is not None:
            _set_dropout(config, dropout)
        net = _model_class(family).from_config(config)
        pretrained = False
    else:
        net, family, shape, pretrained = _hub_model(model, dropout)
    net.train()
    n_params = sum(p.numel() for p in net.parameters())
    return BuiltModel(net, family, shape, pretrained, n_params, model)


def reference_shape(model: str, preset: str) -> tuple[str, Shape]:
    """The family and data shape of a reference model at a preset, without building (initialising) it."""
    family = REFERENCE_MODELS[model]
    return family, _reference_config(family, preset)[1]


def _model_class(family: str):
    import transformers as tf

    return {
        "vision": tf.AutoModelForImageClassification,
        "encoder": tf.AutoModelForMaskedLM,
        "decoder": tf.AutoModelForCausalLM,
        "vlm": tf.AutoModelForImageTextToText,
    }[family]


def _reference_config(family: str, preset: str):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    return {"vision": _vit, "encoder": _modernbert, "decoder": _llama, "vlm": _nanovlm}[family](preset)


def _vit(preset):
    from transformers import ViTConfig

    if preset == "paper":  # google/vit-base-patch16-224: hidden 768, 12 layers, 12 heads
        config = ViTConfig(image_size=224, patch_size=16, num_labels=NUM_LABELS)
        return config, Shape(image_size=224, num_labels=NUM_LABELS)
    v = VISION[preset]
    config = ViTConfig(
        image_size=v["image"],
        patch_size=v["patch"],
        hidden_size=v["hidden"],
        num_hidden_layers=v["layers"],
        num_attention_heads=v["heads"],
        intermediate_size=v["ffn"],
        num_labels=NUM_LABELS,
    )
    return config, Shape(image_size=v["image"], num_labels=NUM_LABELS)


def _modernbert(preset):
    from transformers import ModernBertConfig

    if preset == "paper":  # answerdotai/ModernBERT-base: hidden 768, 22 layers, 12 heads
        config = ModernBertConfig(
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            cls_token_id=BOS,
            sep_token_id=EOS,
            max_position_embeddings=8192,
        )
        return config, Shape(seq_len=512, vocab_size=config.vocab_size)
    t = TEXT[preset]
    config = ModernBertConfig(
        vocab_size=t["vocab"],
        hidden_size=t["hidden"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        intermediate_size=t["ffn"],
        max_position_embeddings=4 * t["seq"],
        local_attention=t["seq"] // 2,
        global_attn_every_n_layers=2,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        cls_token_id=BOS,
        sep_token_id=EOS,
    )
    return config, Shape(seq_len=t["seq"], vocab_size=t["vocab"])


def _llama_text(preset, **extra):
    from transformers import LlamaConfig

    if preset == "paper":  # meta-llama/Llama-3.2-1B
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            tie_word_embeddings=True,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
            **extra,
        )
    t = TEXT[preset]
    return LlamaConfig(
        vocab_size=t["vocab"],
        hidden_size=t["hidden"],
        intermediate_size=t["ffn"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        num_key_value_heads=t["kv_heads"],
        max_position_embeddings=4 * t["seq"],
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        **extra,
    )


def _llama(preset):
    config = _llama_text(preset)
    seq = 512 if preset == "paper" else TEXT[preset]["seq"]
    return config, Shape(seq_len=seq, vocab_size=config.vocab_size)


def _nanovlm(preset):
    """nanoVLM as transformers expresses it (Idefics3/SmolVLM): SigLIP vision, pixel shuffle 2, Llama-style LM."""
    from transformers import Idefics3Config, LlamaConfig

    if preset == "paper":  # SigLIP-B/16-224 + SmolLM2-135M, 222M parameters
        vision = dict(
            hidden_size=768,
            intermediate_size=3072,
            num_hidden_layers=12,
            num_attention_heads=12,
            image_size=224,
            patch_size=16,
        )
        text = LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            tie_word_embeddings=True,
            pad_token_id=PAD,
        )
        seq, image = 128, 224
    else:
        v, t = VISION[preset], TEXT[preset]
        vision = dict(
            hidden_size=v["hidden"],
            intermediate_size=v["ffn"],
            num_hidden_layers=v["layers"] // 2,
            num_attention_heads=v["heads"],
            image_size=v["image"],
            patch_size=v["patch"],
        )
        text = _llama_text(preset)
        seq, image = t["seq"] + 16, v["image"]  # captions of unequal length fit: padding in every batch
    image_token_id = text.vocab_size - 1  # a byte-level vocabulary never produces it
    scale = 2
    image_tokens = (image // vision["patch_size"]) ** 2 // scale**2
    config = Idefics3Config(
        vision_config=vision,
        text_config=text.to_dict(),
        image_token_id=image_token_id,
        scale_factor=scale,
        tie_word_embeddings=text.tie_word_embeddings,
    )
    return config, Shape(
        seq_len=seq,
        vocab_size=text.vocab_size,
        image_size=image,
        image_token_id=image_token_id,
        image_tokens=image_tokens,
    )


def _set_dropout(config, p: float) -> None:
    """Every dropout probability of a config (and its sub-configs) set to p."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and "dropout" in key:
            setattr(config, key, p)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _set_dropout(value, p)


def _hub_model(name: str, dropout: float | None):
    """A local folder or a cached HF id: family from model_type via rules/, weights when present."""
    from transformers import AutoConfig

    from advisor.models import resolve_model
    from advisor.rules import load_rules

    resolved = resolve_model(name, load_rules())
    config = AutoConfig.from_pretrained(str(resolved.config_path.parent), local_files_only=True)
    if dropout is not None:
        _set_dropout(config, dropout)
    family = resolved.family.name
    cls = _model_class(family)
    folder = resolved.config_path.parent
    has_weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    if has_weights:
        net = cls.from_pretrained(str(folder), config=config, local_files_only=True)
    else:
        net = cls.from_config(config)
    return net, family, _shape_of(config, family), has_weights


def _shape_of(config, family: str) -> Shape:
    text = getattr(config, "text_config", config)
    vision = getattr(config, "vision_config", config)
    vocab = getattr(text, "vocab_size", BYTE_VOCAB)
    if vocab < BYTE_VOCAB and family != "vision":
        raise ValueError(
            f"the model's vocabulary ({vocab}) is smaller than the byte-level data's ({BYTE_VOCAB})"
        )
    image = getattr(vision, "image_size", 224)
    image = image[0] if isinstance(image, list | tuple) else image
    if family == "vlm":
        patch = vision.patch_size
        scale = getattr(config, "scale_factor", 1)
        return Shape(
            seq_len=64,
            vocab_size=vocab,
            image_size=image,
            image_token_id=config.image_token_id,
            image_tokens=(image // patch) ** 2 // scale**2,
        )
    labels = getattr(config, "num_labels", NUM_LABELS)
    return Shape(seq_len=64, vocab_size=vocab, image_size=image, num_labels=labels)
