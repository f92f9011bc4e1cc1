"""Training data: examples in the roles the families read (text, image, label, caption), encoded by each
family for its task (`advisor.measuring.model.families`), and the seeded micro-batches of an epoch.

Where the examples come from is the run's choice (`--data`, resolved once per `advisor measure` by
`advisor.measuring.data.source`; `advisor.measuring.data.table` reads every dataset from local files): the
generated corpus, the default, offline and deterministic (MM-IMDb-like movie plots as text, posters whose
colour and stripes encode the genre, captions that describe the poster), or a dataset: the paper's MM-IMDb,
a Hugging Face dataset, the user's own files. Both go through the same `datasets.Dataset` path, encoding
and seeded shuffling.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import numpy as np

from advisor.measuring.data.shape import DEFAULT_SHAPE, Shape

# The held-out sets, one for every run, generated from these seeds: `validation` is what --tune-lr chooses
# rates on, `test` what runs report (held-out loss, accuracy, time to target, "did not train"), so that
# no reported figure is measured on the data that chose the rate.
HELDOUT_SEEDS = {"test": 10_007, "validation": 10_009}
EVAL_SEED = HELDOUT_SEEDS["test"]  # also fixes the held-out batches' collation randomness
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


GENERATED_SOURCE = "generated MM-IMDb-like corpus (offline)"
GENERATED_ROLES = {"plot": "text", "poster": "image"}  # the generated corpus's columns, as roles


def load(family, shape, n_samples: int, seed: int):
    """The generated corpus's training set: n_samples examples encoded by the family (a
    `advisor.measuring.model.families.Family`), shuffled by the seed. Returns (dataset, name of the data source)."""
    return encoded(generated_rows(n_samples, seed), family, shape).shuffle(seed=seed), GENERATED_SOURCE


def load_heldout(family, shape, n_samples: int, split: str = "test"):
    """A held-out set of the generated corpus: n_samples examples no training run sees, the same for every
    seed and configuration, generated from the split's own seed (`validation` and `test` are disjoint).

    Returns (dataset, name of the data source)."""
    if split not in HELDOUT_SEEDS:
        raise ValueError(f"held-out split must be one of {', '.join(HELDOUT_SEEDS)}, not {split!r}")
    seed = HELDOUT_SEEDS[split]
    source = f"{GENERATED_SOURCE}, seed {seed} ({split})"
    return encoded(generated_rows(n_samples, seed), family, shape), source


def generated_rows(n: int, seed: int, genres: int | None = None):
    """n generated examples as a `datasets.Dataset` in the roles the families read; `genres`: of the first
    that many genres only (advisor pretrain's corpus), else of every genre."""
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict(_generated(n, seed, genres)).rename_columns(GENERATED_ROLES)


def encoded(raw, family, shape):
    """Raw examples (role columns) encoded by the family for its task, in memory (no cache files)."""
    out = raw.map(lambda ex: family.encode(shape, ex), remove_columns=raw.column_names, keep_in_memory=True)
    return out.with_format("numpy")


def heldout_batches(dataset, family, batch_size: int, shape: Shape = DEFAULT_SHAPE) -> Iterator[dict]:
    """The held-out set in order, the last batch possibly smaller, collated with fixed randomness (the
    encoder's masks): every evaluation of every run sees the same batches."""
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        yield family.collate(rows, np.random.default_rng([EVAL_SEED, start]), shape)


def _generated(n: int, seed: int, genres: int | None = None) -> dict:
    """n MM-IMDb-like examples: a plot of 1-4 sentences, a genre (of the first `genres`, else of all), a poster
    seed and a caption."""
    if genres is not None and not 1 <= genres <= len(GENRES):
        raise ValueError(f"genres must be 1 to {len(GENRES)}, not {genres}")
    rng = random.Random(seed)
    plots, labels, posters, captions, keep = [], [], [], [], []
    for _ in range(n):
        label = rng.randrange(genres or len(GENRES))
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


def image(example: dict, size: int) -> np.ndarray:
    """An example's image as (3, size, size) uint8: a poster drawn from its seed (generated), or a
    dataset's image (PIL, as `datasets` decodes it) resized bilinearly."""
    img = example["image"]
    if isinstance(img, int):
        return poster(example["label"], img, size)
    if hasattr(img, "convert"):
        from PIL import Image

        rgb = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)
    return _resize(np.asarray(img, dtype=np.uint8), size)


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 to (3, size, size) by nearest neighbour (no image library needed)."""
    h, w = img.shape[:2]
    ys, xs = np.arange(size) * h // size, np.arange(size) * w // size
    return img[ys][:, xs].transpose(2, 0, 1)


def batches(
    dataset, family, batch_size: int, seed: int, epoch: int, shape: Shape = DEFAULT_SHAPE, turn: int = 0
) -> Iterator[dict]:
    """Micro-batches of one pass over the training set, reshuffled per (seed, epoch), collated by the
    family, with their target count. `turn` numbers further passes within an epoch (a small dataset)."""
    key = [seed, epoch] if turn == 0 else [seed, epoch, turn]
    order = np.random.default_rng(key).permutation(len(dataset))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = dataset[order[start : start + batch_size]]
        yield family.collate(rows, np.random.default_rng([*key, start]), shape)


def epoch_batches(dataset, family, batch_size: int, seed: int, epoch: int, shape: Shape = DEFAULT_SHAPE):
    """As many micro-batches as an epoch takes: a training set smaller than the epoch needs is gone through
    again, each time in a fresh order."""
    if len(dataset) < batch_size:
        raise ValueError(f"the training set has {len(dataset)} examples, fewer than a batch ({batch_size})")
    return itertools.chain.from_iterable(
        batches(dataset, family, batch_size, seed, epoch, shape, turn) for turn in itertools.count()
    )
