"""Decoder-only causal language models (Llama and its kin): next-token prediction on the plots."""

from __future__ import annotations

import numpy as np

from advisor.measuring.data.tokenizer import BYTE_VOCAB, SPECIAL_IDS
from advisor.measuring.model.families import register
from advisor.measuring.model.families.base import (
    DEFAULT_SHAPE,
    IGNORE,
    TEXT_SIZES,
    Shape,
    TextFamily,
    model_inputs,
    next_tokens,
    padded,
    token_ids,
)


def llama_text_config(preset: str):
    """The Llama text model at a preset: meta-llama/Llama-3.2-1B at `paper`, byte-level reduced sizes else."""
    from transformers import LlamaConfig

    if preset == "paper":
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            tie_word_embeddings=True,
            **SPECIAL_IDS,
        )
    t = TEXT_SIZES[preset]
    return LlamaConfig(
        vocab_size=BYTE_VOCAB,
        hidden_size=t["hidden"],
        intermediate_size=t["ffn"],
        num_hidden_layers=t["layers"],
        num_attention_heads=t["heads"],
        num_key_value_heads=t["kv_heads"],
        max_position_embeddings=4 * t["seq"],
        **SPECIAL_IDS,
    )


@register
class Decoder(TextFamily):
    name = "decoder"
    task = "causal language modelling"

    def reference_config(self, preset):
        config = llama_text_config(preset)
        seq = 512 if preset == "paper" else TEXT_SIZES[preset]["seq"]
        return config, Shape(seq_len=seq, vocab_size=config.vocab_size)

    def model_class(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def collate(self, rows, rng, shape=DEFAULT_SHAPE):
        ids, mask = padded(rows["ids"], shape.tokenizer.pad)
        labels = np.where(mask == 1, ids, IGNORE)
        n_targets = int((labels[:, 1:] != IGNORE).sum())  # next-token targets
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "n_targets": n_targets}

    def predictions(self, model, batch):
        return next_tokens(model(**model_inputs(batch)).logits, batch["labels"])

    def fit_batch(self, config, batch_size, seq_len, image_size, images=True):
        """With the attention mask a data collator passes (all ones: full length, no padding); without it, a
        config with a pad token checks the ids for padding, which no fake tensor can answer."""
        ids = token_ids(config, batch_size, seq_len)
        return {"input_ids": ids, "attention_mask": ids.new_ones(ids.shape), "labels": ids.clone()}
