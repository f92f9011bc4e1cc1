"""Vision transformers (ViT and kin): image classification (the generated corpus: the posters' genre)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from advisor.measuring.data import corpus
from advisor.measuring.model.families import register
from advisor.measuring.model.families.base import (
    DEFAULT_SHAPE,
    VISION_SIZES,
    Family,
    Shape,
    model_inputs,
    pixels,
    side,
)

NUM_LABELS = len(corpus.GENRES)  # MM-IMDb's genres


@register
class Vision(Family):
    name = "vision"
    task = "image classification"
    roles = ("image", "label")

    def reference_config(self, preset):
        from transformers import ViTConfig

        if preset == "paper":  # google/vit-base-patch16-224: hidden 768, 12 layers, 12 heads
            config = ViTConfig(image_size=224, patch_size=16, num_labels=NUM_LABELS)
            return config, Shape(image_size=224, num_labels=NUM_LABELS)
        v = VISION_SIZES[preset]
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

    def model_class(self):
        from transformers import AutoModelForImageClassification

        return AutoModelForImageClassification

    def shape_of(self, config):
        image = side(getattr(config, "image_size", 224))
        return Shape(image_size=image, num_labels=getattr(config, "num_labels", NUM_LABELS))

    def sized(self, config, shape, sizes, reference):
        size, labels = sizes.image_size or shape.image_size, sizes.num_labels or shape.num_labels
        if reference:
            check_patches(size, config.patch_size)
            config.image_size, config.num_labels = size, labels  # random init: built to the data
        elif size != shape.image_size:
            raise ValueError(f"this model takes {shape.image_size} px images, not --image-size {size}")
        elif labels > config.num_labels:
            raise ValueError(
                f"the data has {labels} classes, more than this model's head ({config.num_labels})"
            )
        norm = {k: v for k, v in (("image_mean", sizes.image_mean), ("image_std", sizes.image_std)) if v}
        return config, replace(shape, image_size=size, num_labels=config.num_labels, **norm)

    def encode(self, shape, example):
        return {
            "pixels": corpus.image(example, shape.image_size),
            "label": example["label"] % shape.num_labels,
        }

    def collate(self, rows, rng, shape=DEFAULT_SHAPE):
        labels = np.asarray(rows["label"], dtype=np.int64)
        images = pixels(rows["pixels"], shape.image_mean, shape.image_std)
        return {"pixel_values": images, "labels": labels, "n_targets": len(labels)}

    def predictions(self, model, batch):
        return model(**model_inputs(batch)).logits, batch["labels"]  # (batch, classes), (batch,)

    def fit_sizes(self, config):
        return {"seq_len": None, "image_size": self.shape_of(config).image_size, "max_seq_len": None}

    def fit_batch(self, config, batch_size, seq_len, image_size, images=True):
        import torch

        size = image_size or self.shape_of(config).image_size
        return {
            "pixel_values": torch.randn(batch_size, 3, size, size),
            "labels": torch.zeros(batch_size, dtype=torch.long),
        }


def check_patches(size: int, patch: int) -> None:
    """Refuse an image size the patches do not tile."""
    patch = side(patch)
    if size % patch:
        raise ValueError(f"--image-size {size} is not a multiple of the model's patch size ({patch} px)")
