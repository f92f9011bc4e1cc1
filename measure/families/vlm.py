"""Vision-language models (nanoVLM as transformers expresses it: Idefics3/SmolVLM): poster captioning."""

from __future__ import annotations

import numpy as np

from measure import data
from measure.families import register
from measure.families.base import (
    IGNORE,
    TEXT_SIZES,
    VISION_SIZES,
    Family,
    Shape,
    max_positions,
    model_inputs,
    next_tokens,
    pad,
    pixels,
    text_vocab,
    token_ids,
)
from measure.families.decoder import llama_text_config
from measure.tokenizer import BOS, PAD, SPECIAL_IDS

PIXEL_SHUFFLE = 2  # nanoVLM's modality projector: 4 patches become one image token


@register
class VisionLanguage(Family):
    name = "vlm"
    task = "captioning the posters"

    def reference_config(self, preset):
        """SigLIP vision tower, pixel shuffle 2, Llama-style text model (paper: SigLIP-B/16-224 + SmolLM2-135M)."""
        from transformers import Idefics3Config, LlamaConfig

        if preset == "paper":  # 222M parameters
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
                pad_token_id=SPECIAL_IDS["pad_token_id"],
            )
            seq = 128
        else:
            v, t = VISION_SIZES[preset], TEXT_SIZES[preset]
            vision = dict(
                hidden_size=v["hidden"],
                intermediate_size=v["ffn"],
                num_hidden_layers=v["layers"] // 2,
                num_attention_heads=v["heads"],
                image_size=v["image"],
                patch_size=v["patch"],
            )
            text = llama_text_config(preset)
            seq = t["seq"] + 16  # captions of unequal length fit: padding in every batch
        image_token_id = text.vocab_size - 1  # a byte-level vocabulary never produces it
        config = Idefics3Config(
            vision_config=vision,
            text_config=text.to_dict(),
            image_token_id=image_token_id,
            scale_factor=PIXEL_SHUFFLE,
            tie_word_embeddings=text.tie_word_embeddings,
        )
        return config, self._shape(config, seq)

    def _shape(self, config, seq: int) -> Shape:
        vision = config.vision_config
        image = vision.image_size[0] if isinstance(vision.image_size, list | tuple) else vision.image_size
        scale = getattr(config, "scale_factor", 1)
        return Shape(
            seq_len=seq,
            vocab_size=text_vocab(config),
            image_size=image,
            image_token_id=config.image_token_id,
            image_tokens=(image // vision.patch_size) ** 2 // scale**2,
        )

    def model_class(self):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText

    def shape_of(self, config):
        return self._shape(config, seq=64)

    def encode(self, shape, example):
        caption = data.caption_ids(example)[: shape.seq_len - 1]
        ids = [shape.image_token_id] * shape.image_tokens + [BOS] + caption
        labels = [IGNORE] * (shape.image_tokens + 1) + caption  # loss on caption tokens only
        return {"pixels": data.image(example, shape.image_size), "ids": ids, "labels": labels}

    def collate(self, rows, rng):
        ids = pad(rows["ids"], PAD)
        labels = pad(rows["labels"], IGNORE)
        return {
            "input_ids": ids,
            "attention_mask": (ids != PAD).astype(np.int64),
            "labels": labels,
            "pixel_values": pixels(rows["pixels"])[:, None],  # (batch, images=1, 3, H, W)
            "n_targets": int((labels[:, 1:] != IGNORE).sum()),
        }

    def predictions(self, model, batch):
        return next_tokens(model(**model_inputs(batch)).logits, batch["labels"])

    def fit_sizes(self, config):
        if not hasattr(config, "vision_config") or not hasattr(config, "image_token_id"):
            raise ValueError(
                f"cannot build a training step for model_type {config.model_type!r}: advisor fit knows the "
                "inputs of Idefics3-style vision-language models (SmolVLM, nanoVLM) only"
            )
        return {
            "seq_len": 128,
            "image_size": self.shape_of(config).image_size,
            "max_seq_len": max_positions(config),
        }

    def fit_batch(self, config, batch_size, seq_len, image_size):
        """An image's tokens, then seq_len caption tokens; the loss on the caption (as in captioning)."""
        import torch

        self.fit_sizes(config)  # refuses a VLM whose inputs it does not know
        shape = self.shape_of(config)
        if image_size and image_size != shape.image_size:
            raise ValueError(
                f"this model's vision tower takes {shape.image_size} px images, not {image_size}"
            )
        caption = token_ids(config, batch_size, seq_len)
        image = torch.full((batch_size, shape.image_tokens), shape.image_token_id, dtype=torch.long)
        ids = torch.cat([image, caption], dim=1)
        labels = torch.cat([torch.full_like(image, IGNORE), caption], dim=1)
        pixels = torch.randn(batch_size, 1, 3, shape.image_size, shape.image_size)
        return {"input_ids": ids, "labels": labels, "pixel_values": pixels}
