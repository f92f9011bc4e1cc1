"""What a model family is on the measurement side: its preset configs, its model class, how a raw
example becomes model input, how examples collate into a micro-batch, and its summed loss."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from advisor.errors import Error
from advisor.measuring.data.shape import DEFAULT_SHAPE, Shape
from advisor.measuring.data.tokenizer import BYTE_VOCAB, Tokenizer

IGNORE = -100  # label of positions without a target (torch's cross-entropy ignore_index)

# Sizes of the reduced presets, shared by families that combine them (the VLM has a vision tower and a
# text model). `paper` sizes are each family's own.
TEXT_SIZES = {
    "tiny": dict(hidden=32, layers=2, heads=2, kv_heads=2, ffn=64, seq=32),
    # a few million parameters: differences between configurations exceed noise, a grid fits in an hour
    "small": dict(hidden=256, layers=4, heads=4, kv_heads=2, ffn=1024, seq=64),
}
VISION_SIZES = {
    "tiny": dict(hidden=32, layers=2, heads=2, ffn=64, image=32, patch=8),
    "small": dict(hidden=192, layers=6, heads=4, ffn=768, image=64, patch=8),
}


class UnknownFamily(Error):
    """A family the rules or the registry do not know: an error, never a fall-through into another family."""


@dataclass(frozen=True)
class Sizes:
    """What the run asks of the data shape (None: the model's or preset's): flags, and what the data and
    the model's folder say."""

    seq_len: int | None = None  # --seq-len
    image_size: int | None = None  # --image-size
    num_labels: int | None = None  # the classes the data's labels hold
    tokenizer: Tokenizer | None = None  # the model's own, where its folder carries one
    image_mean: tuple[float, ...] | None = None  # the model's image processor's, where it has one
    image_std: tuple[float, ...] | None = None


class Family:
    """One architecture family. Subclasses set `name` (as in rules/families.toml) and implement the rest."""

    name: str = ""
    task: str = ""  # what it is trained on, for humans: "causal language modelling", ...
    roles: tuple[str, ...] = ()  # the columns it reads (ROLE_COLUMNS): ("text",), ("image", "label"), ...

    def reference_config(self, preset: str):
        """(transformers config, Shape) of the family's reference model at a preset (tiny, small, paper)."""
        raise NotImplementedError

    def model_class(self):
        """The transformers Auto class that builds the family's models from a config."""
        raise NotImplementedError

    def shape_of(self, config) -> Shape:
        """The data shape for a user's model of this family, from its config."""
        raise NotImplementedError

    def sized(self, config, shape: Shape, sizes: Sizes, reference: bool):
        """(config, shape) fitted to what the run asks: a reference model (random init) is built to the
        sizes; a user's model takes them only where they agree with it (ValueError saying why not)."""
        return config, shape

    def encode(self, shape: Shape, example: dict) -> dict:
        """One raw example (its role columns: text, image, label, caption) as model-ready fields."""
        raise NotImplementedError

    def collate(self, rows: dict, rng: np.random.Generator, shape: Shape = DEFAULT_SHAPE) -> dict:
        """Encoded rows as one micro-batch of numpy arrays, with `n_targets`: the positions the loss sums over."""
        raise NotImplementedError

    def predictions(self, model, batch: dict):
        """(logits, labels): one row of logits per position that may be a target, (N, classes), and its
        label, (N,), IGNORE where the position is not a target. The loss and the accuracy both read these."""
        raise NotImplementedError

    def summed_loss(self, model, batch: dict):
        """Cross-entropy summed over the batch's targets (never averaged: the accumulation window divides once)."""
        import torch.nn.functional as F

        logits, labels = self.predictions(model, batch)
        return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")

    def evaluate(self, model, batch: dict) -> tuple[float, int]:
        """(summed loss, targets predicted right: top-1) of a held-out batch; the caller holds no_grad."""
        import torch.nn.functional as F

        logits, labels = self.predictions(model, batch)
        loss = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")
        right = ((logits.argmax(-1) == labels) & (labels != IGNORE)).sum()
        return float(loss), int(right)

    def fit_batch(
        self, config, batch_size: int, seq_len: int, image_size: int | None, images: bool = True
    ) -> dict:
        """One micro-batch as a Hugging Face Trainer step sees it (inputs and labels, the model computes its
        loss), full length with no padding: what `advisor fit` traces (`images`: a model that takes images
        given one; without, text alone). Torch tensors."""
        raise NotImplementedError

    def fit_sizes(self, config) -> dict:
        """The data sizes a config implies, for `advisor fit`'s defaults: seq_len (text), image_size (images),
        max_seq_len (the longest sequence the model takes; None where unbounded or not text)."""
        raise NotImplementedError


class TextFamily(Family):
    """A family trained on text alone (encoder, decoder): documents of varied length."""

    roles = ("text",)

    def fit_sizes(self, config) -> dict:
        longest = max_positions(config)
        return {"seq_len": min(2048, longest or 2048), "image_size": None, "max_seq_len": longest}

    def shape_of(self, config) -> Shape:
        return Shape(seq_len=64, vocab_size=text_vocab(config))

    def sized(self, config, shape, sizes, reference):
        tokenizer = sizes.tokenizer or shape.tokenizer
        seq = sizes.seq_len or shape.seq_len
        fit_positions(config, seq, reference)
        check_vocab(config, tokenizer)
        return config, replace(shape, seq_len=seq, tokenizer=tokenizer)

    def encode(self, shape: Shape, example: dict) -> dict:
        return {"ids": shape.tokenizer.document(example["text"], shape.seq_len, example.get("keep", 1.0))}


def from_config(auto_class, config, **kwargs):
    """auto_class.from_config, also for a config that names no `architectures` where the Auto mapping holds
    several classes for its type (DeiT: with and without a teacher), which transformers cannot choose
    between: the mapping's first, the plain head."""
    if not getattr(config, "architectures", None):
        mapped = auto_class._model_mapping.get(type(config), None)
        if isinstance(mapped, list | tuple):
            config.architectures = [mapped[0].__name__]
    return auto_class.from_config(config, **kwargs)


def pad(seqs, value: int) -> np.ndarray:
    """Sequences of unequal length as one (batch, longest) int64 array, padded with value."""
    seqs = [list(s) for s in seqs]
    width = max(len(s) for s in seqs)
    return np.array([s + [value] * (width - len(s)) for s in seqs], dtype=np.int64)


def padded(seqs, value: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask), both (batch, longest): the mask from the lengths, since a tokenizer's pad id
    may also be a real token (Llama pads with its end-of-text)."""
    seqs = [list(s) for s in seqs]
    mask = pad([[1] * len(s) for s in seqs], 0)
    return pad(seqs, value), mask


DEFAULT_NORM = (0.5, 0.5, 0.5)


def pixels(images, mean=DEFAULT_NORM, std=DEFAULT_NORM) -> np.ndarray:
    """uint8 (batch, 3, H, W) to normalised float32: the ViT/SigLIP [-1, 1] by default, else a model's
    image processor's mean and std."""
    x = np.stack(list(images)).astype(np.float32)
    if tuple(mean) == DEFAULT_NORM and tuple(std) == DEFAULT_NORM:
        return x / 127.5 - 1.0
    shift, scale = (np.asarray(v, dtype=np.float32)[:, None, None] for v in (mean, std))
    return (x / 255.0 - shift) / scale


def side(size) -> int:
    """An image or patch size as one side in pixels (configs give an int or a (height, width) pair)."""
    return int(size[0] if isinstance(size, list | tuple) else size)


def fit_positions(config, seq_len: int, reference: bool) -> None:
    """A reference config grown to take seq_len positions; a user's model refused when it cannot."""
    longest = max_positions(config)
    if longest is None or seq_len <= longest:
        return
    if not reference:
        raise ValueError(f"--seq-len {seq_len} is longer than this model takes ({longest} positions)")
    text = getattr(config, "text_config", config)
    text.max_position_embeddings = seq_len


def check_vocab(config, tokenizer: Tokenizer) -> None:
    """Refuse a tokenizer whose ids the model's embedding cannot hold."""
    vocab = getattr(getattr(config, "text_config", config), "vocab_size", tokenizer.vocab_size)
    if tokenizer.vocab_size <= vocab:
        return
    if tokenizer.hf is None:
        raise ValueError(
            f"the model's vocabulary ({vocab}) is smaller than the byte-level data's ({tokenizer.vocab_size}) "
            "and its folder carries no tokenizer"
        )
    raise ValueError(
        f"the tokenizer ({tokenizer.name}) has {tokenizer.vocab_size} tokens, more than the model's ({vocab})"
    )


def model_inputs(batch: dict) -> dict:
    """The tensors a model's forward takes: everything but the labels and the target count."""
    return {k: v for k, v in batch.items() if k not in ("labels", "n_targets")}


def next_tokens(logits, labels):
    """Causal LM and captioning: position t predicts token t+1, as (logits, labels) rows."""
    return logits[:, :-1].flatten(0, 1), labels[
        :, 1:
    ].flatten()  # (batch * (seq-1), vocab), (batch * (seq-1))


def max_positions(config) -> int | None:
    """The longest sequence a text config takes (max_position_embeddings, n_positions), None if unbounded."""
    text = getattr(config, "text_config", config)
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def token_ids(config, batch_size: int, seq_len: int):
    """(batch, seq) of one ordinary token id (values never matter to memory, only shapes)."""
    import torch

    vocab = getattr(getattr(config, "text_config", config), "vocab_size", 1000)
    return torch.full((batch_size, seq_len), min(100, vocab - 1), dtype=torch.long)


def text_vocab(config) -> int:
    """A text model's vocabulary (whether the run's tokenizer fits in it is `check_vocab`'s to say)."""
    return getattr(getattr(config, "text_config", config), "vocab_size", BYTE_VOCAB)
