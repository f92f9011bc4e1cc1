"""Vision-language models (nanoVLM as transformers expresses it: Idefics3/SmolVLM): image captioning."""

from __future__ import annotations

from dataclasses import replace

from advisor.measuring.data import corpus
from advisor.measuring.data.tokenizer import SPECIAL_IDS
from advisor.measuring.model.families import register
from advisor.measuring.model.families.base import (
    DEFAULT_SHAPE,
    IGNORE,
    TEXT_SIZES,
    VISION_SIZES,
    Family,
    Shape,
    check_vocab,
    fit_positions,
    max_positions,
    model_inputs,
    next_tokens,
    pad,
    padded,
    pixels,
    side,
    text_vocab,
    token_ids,
)
from advisor.measuring.model.families.decoder import llama_text_config

PIXEL_SHUFFLE = 2  # nanoVLM's modality projector: 4 patches become one image token
IMAGE_LISTS = (
    "idefics2",
    "idefics3",
    "smolvlm",
)  # take pixel_values as (batch, images, 3, H, W); others (batch, 3, H, W)


@register
class VisionLanguage(Family):
    name = "vlm"
    task = "image captioning"
    roles = ("image", "caption")

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
        image = side(vision.image_size)
        scale = getattr(config, "scale_factor", 1)
        pooled = getattr(config, "mm_tokens_per_image", None)  # Gemma 3 pools an image to a fixed count
        return Shape(
            seq_len=seq,
            vocab_size=text_vocab(config),
            image_size=image,
            image_token_id=config.image_token_id,
            image_tokens=pooled or (image // vision.patch_size) ** 2 // scale**2,
        )

    def model_class(self):
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText

    def shape_of(self, config):
        return self._shape(config, seq=64)

    def sized(self, config, shape, sizes, reference):
        size, seq = sizes.image_size or shape.image_size, sizes.seq_len or shape.seq_len
        vision = config.vision_config
        if reference:
            patch = side(vision.patch_size)
            if size % (patch * PIXEL_SHUFFLE):
                raise ValueError(f"--image-size {size} is not a multiple of {patch * PIXEL_SHUFFLE} px")
            vision.image_size = size
        elif size != shape.image_size:
            raise ValueError(
                f"this model's vision tower takes {shape.image_size} px images, not --image-size {size}"
            )
        shape = self._shape(config, seq)
        fit_positions(config, shape.image_tokens + seq + 1, reference)
        tokenizer = sizes.tokenizer or shape.tokenizer
        check_vocab(config, tokenizer)
        norm = {k: v for k, v in (("image_mean", sizes.image_mean), ("image_std", sizes.image_std)) if v}
        return config, replace(shape, tokenizer=tokenizer, **norm)

    def encode(self, shape, example):
        tok = shape.tokenizer
        start = [tok.bos] if tok.bos is not None else []
        caption = tok.text(example["caption"], shape.seq_len - len(start))
        ids = [shape.image_token_id] * shape.image_tokens + start + caption
        labels = [IGNORE] * (shape.image_tokens + len(start)) + caption  # loss on caption tokens only
        return {"pixels": corpus.image(example, shape.image_size), "ids": ids, "labels": labels}

    def collate(self, rows, rng, shape=DEFAULT_SHAPE):
        ids, mask = padded(rows["ids"], shape.tokenizer.pad)
        labels = pad(rows["labels"], IGNORE)
        images = pixels(rows["pixels"], shape.image_mean, shape.image_std)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            "pixel_values": images[:, None],  # (batch, images=1, 3, H, W)
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

    def fit_batch(self, config, batch_size, seq_len, image_size, images=True):
        """An image's tokens, then seq_len caption tokens; the loss on the caption (as in captioning). Without
        `images`, seq_len tokens of text alone (a VLM fine-tuned as the language model it is: Gemma 3)."""
        import torch

        if (
            not images
        ):  # as a text collator gives it: a tokenizer makes no token_type_ids (Gemma 3's processor
            caption = token_ids(config, batch_size, seq_len)  # does, to mark image tokens; there are none)
            return {"input_ids": caption, "labels": caption}
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
        listed = config.model_type in IMAGE_LISTS
        pixels = torch.randn(batch_size, *((1,) if listed else ()), 3, shape.image_size, shape.image_size)
        batch = {"input_ids": ids, "labels": labels, "pixel_values": pixels}
        if (
            config.model_type == "gemma3"
        ):  # its processor marks image tokens: attention over them is bidirectional
            batch["token_type_ids"] = torch.cat([torch.ones_like(image), torch.zeros_like(caption)], dim=1)
        return batch
