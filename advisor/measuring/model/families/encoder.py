"""Encoder-only language models (ModernBERT, BERT and kin): masked-token prediction on the plots."""

from __future__ import annotations

import numpy as np

from advisor.measuring.data.tokenizer import BOS, BYTE_VOCAB, EOS, SPECIAL_IDS
from advisor.measuring.model.families import register
from advisor.measuring.model.families.base import (
    DEFAULT_SHAPE,
    IGNORE,
    TEXT_SIZES,
    Shape,
    TextFamily,
    model_inputs,
    padded,
    token_ids,
)

MASK_RATE = 0.15  # the masked-LM convention (BERT, ModernBERT)
BERT_IDS = dict(cls_token_id=BOS, sep_token_id=EOS, **SPECIAL_IDS)


@register
class Encoder(TextFamily):
    name = "encoder"
    task = "masked language modelling"

    def reference_config(self, preset):
        from transformers import ModernBertConfig

        if preset == "paper":  # answerdotai/ModernBERT-base: hidden 768, 22 layers, 12 heads
            config = ModernBertConfig(max_position_embeddings=8192, **BERT_IDS)
            return config, Shape(seq_len=512, vocab_size=config.vocab_size)
        t = TEXT_SIZES[preset]
        config = ModernBertConfig(
            vocab_size=BYTE_VOCAB,
            hidden_size=t["hidden"],
            num_hidden_layers=t["layers"],
            num_attention_heads=t["heads"],
            intermediate_size=t["ffn"],
            max_position_embeddings=4 * t["seq"],
            local_attention=t["seq"] // 2,
            global_attn_every_n_layers=2,
            **BERT_IDS,
        )
        return config, Shape(seq_len=t["seq"], vocab_size=BYTE_VOCAB)

    def model_class(self):
        from transformers import AutoModelForMaskedLM

        return AutoModelForMaskedLM

    def sized(self, config, shape, sizes, reference):
        config, shape = super().sized(config, shape, sizes, reference)
        if shape.tokenizer.mask is None:
            raise ValueError(f"the tokenizer ({shape.tokenizer.name}) has no mask token: masked LM needs one")
        return config, shape

    def collate(self, rows, rng, shape=DEFAULT_SHAPE):
        tok = shape.tokenizer
        ids, mask = padded(rows["ids"], tok.pad)
        ordinary = (mask == 1) & ~np.isin(ids, list(tok.special))  # never mask a start, end or pad token
        chosen = (rng.random(ids.shape) < MASK_RATE) & ordinary
        chosen[np.arange(len(ids)), 1] = True  # at least one target per sample
        labels = np.where(chosen, ids, IGNORE)
        ids = np.where(chosen, tok.mask, ids)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "n_targets": int(chosen.sum())}

    def predictions(self, model, batch):
        logits = model(**model_inputs(batch)).logits  # (batch, seq, vocab)
        return logits.flatten(0, 1), batch["labels"].flatten()

    def fit_batch(self, config, batch_size, seq_len, image_size, images=True):
        ids = token_ids(config, batch_size, seq_len)
        labels = ids.clone()
        labels[:, [i for i in range(seq_len) if i % round(1 / MASK_RATE)]] = IGNORE  # ~15 % of positions
        return {"input_ids": ids, "labels": labels}
