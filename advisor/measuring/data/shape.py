"""What the data must look like for a model (`Shape`): the data wing's own word, which a family fills."""

from dataclasses import dataclass

from advisor.measuring.data.tokenizer import BYTE_LEVEL, Tokenizer


@dataclass(frozen=True)
class Shape:
    """What the data must look like for a model: sequence length, vocabulary, image size, labels."""

    seq_len: int = 32  # text tokens per sample (captions for vlm)
    vocab_size: int = 260  # byte-level tokens (256) + pad/bos/eos/mask
    image_size: int = 32
    num_labels: int = 10
    image_token_id: int | None = None  # vlm: the placeholder id the model replaces with image features
    image_tokens: int = 0  # vlm: placeholders per image
    tokenizer: Tokenizer = BYTE_LEVEL  # a user's model: its own tokenizer, where its folder carries one
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # pixel normalisation: a model's image processor's
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)


DEFAULT_SHAPE = Shape()  # byte-level text, [-1, 1] pixels: what collate assumes unless told
