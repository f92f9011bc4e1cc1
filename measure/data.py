"""Training data per family, following the paper: image classification (vision), masked LM (encoder),
causal LM (decoder), captioning (vlm).

The paper's MM-IMDb is loaded through `datasets` when the hub can be reached; offline (always in tests
and CI), a deterministic MM-IMDb-like corpus is generated from the seed: movie plots as byte-level text,
posters whose colour and stripes encode the genre, captions that describe the poster. Both go through
the same `datasets.Dataset` path, splits and seeded shuffling.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import numpy as np

from measure.models import BOS, EOS, MASK, PAD, Shape

MMIMDB = "pranavmr/MM-IMDb"
GENRES = [
    "drama",
    "comedy",
    "romance",
    "thriller",
    "crime",
    "action",
    "adventure",
    "horror",
    "documentary",
    "mystery",
    "sci-fi",
    "fantasy",
    "family",
    "biography",
    "war",
    "history",
    "music",
    "animation",
    "musical",
    "western",
    "sport",
    "short",
    "film-noir",
]
COLOURS = [
    (200, 40, 40),
    (40, 160, 60),
    (40, 70, 200),
    (220, 200, 40),
    (150, 50, 170),
    (30, 180, 190),
    (240, 130, 30),
    (120, 120, 120),
]
WORDS = {
    "adj": [
        "young",
        "lonely",
        "brave",
        "retired",
        "mysterious",
        "ambitious",
        "reluctant",
        "clever",
        "haunted",
    ],
    "who": ["detective", "teacher", "soldier", "singer", "farmer", "scientist", "widow", "thief", "boxer"],
    "verb": ["discovers", "hides", "chases", "loves", "betrays", "rescues", "follows", "fights", "escapes"],
    "what": ["a secret", "an old friend", "the truth", "a stranger", "the treasure", "a killer", "the past"],
    "where": ["in Paris", "at sea", "in a small town", "during the war", "on the moon", "in the desert"],
}
MASK_RATE = 0.15  # the masked-LM convention (BERT, ModernBERT)
IGNORE = -100  # label of positions without a target


def offline() -> bool:
    return os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


_hub_failed = False  # one failed attempt per process: the hub's retries cost ~20 s each


def load(family: str, shape: Shape, n_samples: int, seed: int):
    """A `datasets.Dataset` of n_samples training examples for the family, shuffled by the seed.

    Returns (dataset, name of the data source) so that the run can record which data it trained on.
    """
    global _hub_failed
    import datasets

    datasets.disable_progress_bars()
    raw, source = None, "generated MM-IMDb-like corpus (offline)"
    if not offline() and not _hub_failed:
        raw = _mmimdb(n_samples)
        _hub_failed = raw is None
        source = MMIMDB if raw is not None else source
    if raw is None:
        raw = datasets.Dataset.from_dict(_generated(n_samples, seed))
    encoded = raw.map(lambda ex: _encode(family, shape, ex), remove_columns=raw.column_names)
    return encoded.shuffle(seed=seed).with_format("numpy"), source


def _mmimdb(n_samples: int):
    """The paper's MM-IMDb (plot, genre, poster), or None where the hub cannot be reached."""
    import datasets

    try:
        ds = datasets.load_dataset(MMIMDB, split=f"train[:{n_samples}]")
    except Exception:  # no network, no access, or a changed dataset: fall back to the generated corpus
        return None
    plot = next(c for c in ("plot", "text", "overview") if c in ds.column_names)
    genre = next(c for c in ("genre", "genres", "label") if c in ds.column_names)
    image = next(c for c in ("image", "poster") if c in ds.column_names)

    def to_common(ex):
        g = ex[genre][0] if isinstance(ex[genre], list) else ex[genre]
        label = (
            GENRES.index(g.lower()) if isinstance(g, str) and g.lower() in GENRES else int(g) % len(GENRES)
        )
        img = np.asarray(ex[image].convert("RGB"), dtype=np.uint8)
        return {"plot": ex[plot], "label": label, "poster": img, "caption": f"a {GENRES[label]} movie poster"}

    return ds.map(to_common, remove_columns=ds.column_names)


def _generated(n: int, seed: int) -> dict:
    """n MM-IMDb-like examples: a plot of 1-4 sentences, a genre, a poster seed and a caption."""
    rng = random.Random(seed)
    plots, labels, posters, captions, keep = [], [], [], [], []
    for _ in range(n):
        label = rng.randrange(len(GENRES))
        sentences = [
            f"A {rng.choice(WORDS['adj'])} {rng.choice(WORDS['who'])} {rng.choice(WORDS['verb'])} "
            f"{rng.choice(WORDS['what'])} {rng.choice(WORDS['where'])}."
            for _ in range(rng.randint(1, 4))
        ]
        plots.append(f"{GENRES[label].capitalize()}. " + " ".join(sentences))
        labels.append(label)
        posters.append(rng.randrange(2**31))
        colour, stripes = label % len(COLOURS), label // len(COLOURS) + 1
        captions.append(f"a {GENRES[label]} poster, colour {colour}, {stripes} stripes")
        keep.append(rng.uniform(0.3, 1.0))  # documents of varied length: padding in every batch
    return {"plot": plots, "label": labels, "poster": posters, "caption": captions, "keep": keep}


def poster(label: int, poster_seed: int, size: int) -> np.ndarray:
    """A (3, size, size) uint8 poster: the genre's colour, its number of stripes, and noise."""
    rng = np.random.default_rng(poster_seed)
    colour = np.array(COLOURS[label % len(COLOURS)], dtype=np.float32)
    stripes = label // len(COLOURS) + 1
    img = np.ones((size, size, 3), dtype=np.float32) * colour * 0.6
    rows = (np.arange(size) * stripes * 2 // size) % 2 == 0
    img[rows] += 80.0
    img += rng.normal(0, 25, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8).transpose(2, 0, 1)


def _encode(family: str, shape: Shape, ex: dict) -> dict:
    if family in ("vision", "vlm"):
        img = ex["poster"]
        pixels = (
            poster(ex["label"], img, shape.image_size)
            if isinstance(img, int)
            else _resize(img, shape.image_size)
        )
        if family == "vision":
            return {"pixels": pixels, "label": ex["label"] % shape.num_labels}
        caption = _bytes(ex["caption"])[: shape.seq_len - 1]
        ids = [shape.image_token_id] * shape.image_tokens + [BOS] + caption
        labels = [IGNORE] * (shape.image_tokens + 1) + caption  # loss on caption tokens only
        return {"pixels": pixels, "ids": ids, "labels": labels}
    length = int(ex.get("keep", 1.0) * (shape.seq_len - 2))
    ids = [BOS] + _bytes(ex["plot"])[: max(1, length)] + [EOS]
    return {"ids": ids}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 to (3, size, size) by nearest neighbour (no image library needed)."""
    h, w = img.shape[:2]
    ys, xs = np.arange(size) * h // size, np.arange(size) * w // size
    return img[ys][:, xs].transpose(2, 0, 1)


def batches(dataset, family: str, batch_size: int, seed: int, epoch: int) -> Iterator[dict]:
    """Micro-batches of an epoch, reshuffled per (seed, epoch), as numpy arrays with their target count."""
    order = np.random.default_rng([seed, epoch]).permutation(len(dataset))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = dataset[order[start : start + batch_size]]
        yield collate(family, rows, np.random.default_rng([seed, epoch, start]))


def collate(family: str, rows: dict, rng: np.random.Generator) -> dict:
    """Pad, mask and label one micro-batch. `n_targets` counts the positions the loss is summed over."""
    if family == "vision":
        return {
            "pixel_values": _pixels(rows["pixels"]),
            "labels": np.asarray(rows["label"], dtype=np.int64),
            "n_targets": len(rows["label"]),
        }
    ids = _pad(rows["ids"], PAD)
    mask = (ids != PAD).astype(np.int64)
    if family == "encoder":
        chosen = (rng.random(ids.shape) < MASK_RATE) & (ids != PAD) & (ids != BOS) & (ids != EOS)
        chosen[np.arange(len(ids)), 1] = True  # at least one target per sample
        labels = np.where(chosen, ids, IGNORE)
        ids = np.where(chosen, MASK, ids)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "n_targets": int(chosen.sum())}
    if family == "decoder":
        labels = np.where(mask == 1, ids, IGNORE)
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": labels,
            "n_targets": int((labels[:, 1:] != IGNORE).sum()),
        }  # next-token targets
    labels = _pad(rows["labels"], IGNORE)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": labels,
        "pixel_values": _pixels(rows["pixels"])[:, None],  # (batch, images=1, 3, H, W)
        "n_targets": int((labels[:, 1:] != IGNORE).sum()),
    }


def _pad(seqs, value: int) -> np.ndarray:
    seqs = [list(s) for s in seqs]
    width = max(len(s) for s in seqs)
    return np.array([s + [value] * (width - len(s)) for s in seqs], dtype=np.int64)


def _pixels(images) -> np.ndarray:
    """uint8 (batch, 3, H, W) to float32 in [-1, 1], the ViT/SigLIP normalisation."""
    return np.stack(list(images)).astype(np.float32) / 127.5 - 1.0
