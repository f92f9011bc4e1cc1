"""The held-out set of the fair protocol and its evaluation: loss per target and top-1 accuracy, on
examples no run trains on, the same batches for every seed and configuration."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from advisor.measuring.data.corpus import heldout_batches, load_heldout
from advisor.measuring.recipe.strategies import autocast, to_device


@dataclass(frozen=True)
class Evaluation:
    loss: float  # mean cross-entropy per target (nats)
    accuracy: float  # share of targets predicted right (top-1)
    targets: int


class HeldOut:
    """The held-out batches of one family and data shape, evaluated in eval mode without gradients."""

    def __init__(
        self, family, shape, n_examples: int, batch_size: int, split: str = "test", view=None, name=None
    ):
        """From the generated corpus (its split's own seed), or from a dataset's fixed held-out rows (`view`,
        a advisor.measuring.data.table.DataView, called `name`): always the corpus the run trains on."""
        self.family = family
        if view is None:
            dataset, self.source = load_heldout(family, shape, n_examples, split)
        else:
            dataset = view.heldout(family, shape, split)
            self.source = f"{name}: {len(dataset)} held-out examples of its {view.split} split ({split})"
        self.batches = list(heldout_batches(dataset, family, batch_size, shape))

    @classmethod
    def of(cls, family, shape, dataset, batch_size: int, source: str = "given") -> HeldOut:
        """A held-out set of examples already encoded (advisor pretrain's own genres)."""
        out = cls.__new__(cls)
        out.family, out.source = family, source
        out.batches = list(heldout_batches(dataset, family, batch_size, shape))
        return out

    def evaluate(self, model, device, dtype: str = "fp32") -> Evaluation:
        was_training = model.training
        model.eval()  # no dropout
        loss = right = targets = 0
        try:
            with torch.no_grad():
                for batch in self.batches:
                    with autocast(device, dtype):
                        part, correct = self.family.evaluate(model, to_device(batch, device))
                    loss, right, targets = loss + part, right + correct, targets + batch["n_targets"]
        finally:
            model.train(was_training)
        return Evaluation(loss / targets, right / targets, targets)
