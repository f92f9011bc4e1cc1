"""Vision transformers (ViT and kin): genre classification of the posters."""

from __future__ import annotations

import numpy as np

from measure import data
from measure.families import register
from measure.families.base import VISION_SIZES, Family, Shape, model_inputs, pixels

NUM_LABELS = len(data.GENRES)  # MM-IMDb's genres


@register
class Vision(Family):
    name = "vision"
    task = "genre classification of the posters"

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
        image = getattr(config, "image_size", 224)
        image = image[0] if isinstance(image, list | tuple) else image
        return Shape(image_size=image, num_labels=getattr(config, "num_labels", NUM_LABELS))

    def encode(self, shape, example):
        return {"pixels": data.image(example, shape.image_size), "label": example["label"] % shape.num_labels}

    def collate(self, rows, rng):
        labels = np.asarray(rows["label"], dtype=np.int64)
        return {"pixel_values": pixels(rows["pixels"]), "labels": labels, "n_targets": len(labels)}

    def predictions(self, model, batch):
        return model(**model_inputs(batch)).logits, batch["labels"]  # (batch, classes), (batch,)

    def fit_sizes(self, config):
        return {"seq_len": None, "image_size": self.shape_of(config).image_size, "max_seq_len": None}

    def fit_batch(self, config, batch_size, seq_len, image_size):
        import torch

        size = image_size or self.shape_of(config).image_size
        return {
            "pixel_values": torch.randn(batch_size, 3, size, size),
            "labels": torch.zeros(batch_size, dtype=torch.long),
        }
