"""How text becomes token ids: byte-level by default (ids 0..255 are UTF-8 bytes and the special tokens
follow; every preset's vocabulary is at least this big, so any model of a text family can train on any
text offline), or the tokenizer a user's model carries in its folder or the local cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PAD, BOS, EOS, MASK = 256, 257, 258, 259
BYTE_VOCAB = 260
SPECIAL_IDS = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)  # for transformers configs
# Files that say a model folder carries its own tokenizer (transformers' names for them).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json")


def encode(text: str) -> list[int]:
    """The UTF-8 bytes of text as token ids."""
    return list(text.encode("utf-8"))


@dataclass(frozen=True)
class Tokenizer:
    """Text to ids for one run: the byte-level default, or a model's own (`hf`, a transformers tokenizer)."""

    name: str = "byte-level"
    vocab_size: int = BYTE_VOCAB
    pad: int = PAD
    bos: int | None = BOS
    eos: int | None = EOS
    mask: int | None = MASK  # masked language modelling's [MASK]; None where the tokenizer has none
    special: frozenset[int] = frozenset({PAD, BOS, EOS, MASK})  # ids never chosen as masked-LM targets
    hf: object | None = field(default=None, compare=False, repr=False)

    def document(self, text: str, max_len: int, keep: float = 1.0) -> list[int]:
        """A document's ids with its start and end tokens, at most max_len; byte-level keeps the `keep`
        share of the room (the generated corpus varies its documents' lengths this way)."""
        if self.hf is None:
            length = int(keep * (max_len - 2))
            return [BOS] + encode(text)[: max(1, length)] + [EOS]
        return list(self.hf(text, add_special_tokens=True, truncation=True, max_length=max_len)["input_ids"])

    def text(self, text: str, max_len: int) -> list[int]:
        """Ids of text alone, no special tokens, at most max_len (captions: the VLM adds its own start)."""
        if self.hf is None:
            return encode(text)[:max_len]
        return list(self.hf(text, add_special_tokens=False, truncation=True, max_length=max_len)["input_ids"])


BYTE_LEVEL = Tokenizer()


def carries_tokenizer(folder: Path) -> bool:
    """Whether a model folder (or cached snapshot) holds its own tokenizer."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def from_folder(folder: Path, name: str) -> Tokenizer:
    """The tokenizer a model folder carries, loaded offline (transformers' AutoTokenizer)."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    pad = next((i for i in (hf.pad_token_id, hf.eos_token_id, hf.unk_token_id) if i is not None), 0)
    return Tokenizer(
        name=name,
        vocab_size=len(hf),
        pad=pad,
        bos=hf.bos_token_id if hf.bos_token_id is not None else hf.cls_token_id,
        eos=hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id,
        mask=hf.mask_token_id,
        special=frozenset(hf.all_special_ids),
        hf=hf,
    )
