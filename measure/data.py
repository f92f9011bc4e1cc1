"""Training data: raw MM-IMDb-like examples (plot, genre, poster, caption) that each family encodes for its
task (`measure.families`), and the seeded micro-batches of an epoch.

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

from measure import tokenizer
from measure.tokenizer import BOS, EOS

MMIMDB = "pranavmr/MM-IMDb"
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


def offline() -> bool:
    return os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"


_hub_failed = False  # one failed attempt per process: the hub's retries cost ~20 s each


def load(family, shape, n_samples: int, seed: int):
    """A `datasets.Dataset` of n_samples training examples encoded by the family (a `measure.families.Family`),
    shuffled by the seed.

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
    encoded = raw.map(lambda ex: family.encode(shape, ex), remove_columns=raw.column_names)
    return encoded.shuffle(seed=seed).with_format("numpy"), source


def load_heldout(family, shape, n_samples: int, split: str = "test", hub: bool = False):
    """A held-out set: n_samples examples no training run sees, the same for every seed and configuration;
    `validation` and `test` are disjoint. From the hub (MM-IMDb's last training examples: test the last
    n_samples, validation the n_samples before them) when the training data came from it (`hub`), else
    generated from the split's seed: training and held-out data always come from the same corpus.

    Returns (dataset, name of the data source)."""
    import datasets

    if split not in HELDOUT_SEEDS:
        raise ValueError(f"held-out split must be one of {', '.join(HELDOUT_SEEDS)}, not {split!r}")
    datasets.disable_progress_bars()
    if hub:
        n = n_samples
        rows = f"train[-{n}:]" if split == "test" else f"train[-{2 * n}:-{n}]"
        raw = _mmimdb(n, rows)
        if raw is None:
            raise RuntimeError(f"{MMIMDB} served the training data but not the {split} set: run again")
        source = f"{MMIMDB} {rows} ({split})"
    else:
        seed = HELDOUT_SEEDS[split]
        raw = datasets.Dataset.from_dict(_generated(n_samples, seed))
        source = f"generated MM-IMDb-like corpus (offline), seed {seed} ({split})"
    encoded = raw.map(lambda ex: family.encode(shape, ex), remove_columns=raw.column_names)
    return encoded.with_format("numpy"), source


def heldout_batches(dataset, family, batch_size: int) -> Iterator[dict]:
    """The held-out set in order, the last batch possibly smaller, collated with fixed randomness (the
    encoder's masks): every evaluation of every run sees the same batches."""
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start : start + batch_size]
        yield family.collate(rows, np.random.default_rng([EVAL_SEED, start]))


def _mmimdb(n_samples: int, rows: str | None = None):
    """The paper's MM-IMDb (plot, genre, poster): its first n_samples training examples (or the `rows`
    slice, e.g. "train[-64:]"), or None where the hub cannot be reached."""
    import datasets

    try:
        split = rows or f"train[:{n_samples}]"
        ds = datasets.load_dataset(MMIMDB, split=split)
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


def image(example: dict, size: int) -> np.ndarray:
    """An example's poster as (3, size, size) uint8: drawn from its seed (generated) or resized (MM-IMDb)."""
    img = example["poster"]
    return poster(example["label"], img, size) if isinstance(img, int) else _resize(img, size)


def plot_ids(example: dict, seq_len: int) -> list[int]:
    """BOS, the plot's bytes cut to the example's share of seq_len (documents of varied length), EOS."""
    length = int(example.get("keep", 1.0) * (seq_len - 2))
    return [BOS] + tokenizer.encode(example["plot"])[: max(1, length)] + [EOS]


def caption_ids(example: dict) -> list[int]:
    return tokenizer.encode(example["caption"])


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """(H, W, 3) uint8 to (3, size, size) by nearest neighbour (no image library needed)."""
    h, w = img.shape[:2]
    ys, xs = np.arange(size) * h // size, np.arange(size) * w // size
    return img[ys][:, xs].transpose(2, 0, 1)


def batches(dataset, family, batch_size: int, seed: int, epoch: int) -> Iterator[dict]:
    """Micro-batches of an epoch, reshuffled per (seed, epoch), collated by the family, with their target count."""
    order = np.random.default_rng([seed, epoch]).permutation(len(dataset))
    for start in range(0, len(order) - batch_size + 1, batch_size):
        rows = dataset[order[start : start + batch_size]]
        yield family.collate(rows, np.random.default_rng([seed, epoch, start]))
