"""Byte-level text: ids 0..255 are UTF-8 bytes and the special tokens follow. Every preset's vocabulary
is at least this big, so any model of a text family can train on the generated corpus offline."""

from __future__ import annotations

PAD, BOS, EOS, MASK = 256, 257, 258, 259
BYTE_VOCAB = 260
SPECIAL_IDS = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)  # for transformers configs


def encode(text: str) -> list[int]:
    """The UTF-8 bytes of text as token ids."""
    return list(text.encode("utf-8"))
