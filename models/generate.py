"""Writes models/<name>/config.json for the published models advisor ships (python models/generate.py [NAME ...]).

Each config is the model's published hyperparameters (its Hugging Face repository's config.json, by hand:
this project's machines cannot reach the Hub) written through transformers' own config class, so every
field a model build reads has transformers' value. tests/advisor/test_shipped_models.py builds each on the
meta device and checks its parameter count against the published one (PUBLISHED in that test).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent

LLAMA3 = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, rms_norm_eps=1e-5,
              rope_theta=500000.0, max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001)
LLAMA31_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
QWEN25 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rms_norm_eps=1e-6, rope_theta=1000000.0,
              max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643, use_sliding_window=False)
GEMMA2 = dict(model_type="gemma2", architectures=["Gemma2ForCausalLM"], vocab_size=256000, head_dim=256,
              hidden_activation="gelu_pytorch_tanh", sliding_window=4096, final_logit_softcapping=30.0,
              attn_logit_softcapping=50.0, max_position_embeddings=8192, rms_norm_eps=1e-6,
              query_pre_attn_scalar=256, tie_word_embeddings=True)
GEMMA3_TEXT = dict(vocab_size=262208, head_dim=256, hidden_activation="gelu_pytorch_tanh", sliding_window=1024,
                   max_position_embeddings=131072, rms_norm_eps=1e-6, query_pre_attn_scalar=256,
                   rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=dict(rope_type="linear", factor=8.0))
SIGLIP_896 = dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                  num_attention_heads=16, patch_size=14, image_size=896, vision_use_head=False)
PHI3 = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], vocab_size=32064, max_position_embeddings=4096,
            rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
            tie_word_embeddings=False)
LLAMA_ARCH = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_act="silu")
QWEN3 = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=128, vocab_size=151936, rms_norm_eps=1e-6,
             rope_theta=1000000.0, max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
             tie_word_embeddings=False, use_sliding_window=False, sliding_window=None)
QWEN3_MOE = dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], head_dim=128, vocab_size=151936,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960, bos_token_id=151643,
                 eos_token_id=151645, tie_word_embeddings=False, num_experts=128, num_experts_per_tok=8,
                 decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, use_sliding_window=False,
                 sliding_window=None)
# gpt-oss: 64 query heads of 64 on a 2,880-wide residual, 8 KV heads, alternating 128-token sliding and full
# attention with learned sinks, 4 experts of each layer's routed per token, bf16 weights as trained (the
# release's MXFP4 experts are dequantized to train them)
GPT_OSS = dict(model_type="gpt_oss", architectures=["GptOssForCausalLM"], hidden_size=2880, intermediate_size=2880,
               head_dim=64, num_attention_heads=64, num_key_value_heads=8, sliding_window=128, vocab_size=201088,
               num_experts_per_tok=4, max_position_embeddings=131072, rms_norm_eps=1e-5, attention_bias=True,
               tie_word_embeddings=False, swiglu_limit=7.0, router_aux_loss_coef=0.9, bos_token_id=199998,
               eos_token_id=200002, pad_token_id=199999,
               rope_scaling=dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                                 original_max_position_embeddings=4096, rope_theta=150000.0))
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], rms_norm_eps=1e-5, bos_token_id=1,
               eos_token_id=2, sliding_window=None)


def dims(h, i, layers, heads, kv, **more):
    return dict(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, **more)


MODELS = {  # name -> (hub id, config fields)
    "Llama-3.2-1B": ("meta-llama/Llama-3.2-1B", {**LLAMA3, **dims(2048, 8192, 16, 32, 8), "head_dim": 64,
                     "tie_word_embeddings": True, "rope_scaling": {**LLAMA31_ROPE, "factor": 32.0}}),
    "Llama-3.2-3B": ("meta-llama/Llama-3.2-3B", {**LLAMA3, **dims(3072, 8192, 28, 24, 8), "head_dim": 128,
                     "tie_word_embeddings": True, "rope_scaling": {**LLAMA31_ROPE, "factor": 32.0}}),
    "Llama-3.1-8B": ("meta-llama/Llama-3.1-8B", {**LLAMA3, **dims(4096, 14336, 32, 32, 8),
                     "rope_scaling": LLAMA31_ROPE}),
    "Llama-3.1-70B": ("meta-llama/Llama-3.1-70B", {**LLAMA3, **dims(8192, 28672, 80, 64, 8),
                      "rope_scaling": LLAMA31_ROPE}),
    "Llama-3.3-70B-Instruct": ("meta-llama/Llama-3.3-70B-Instruct", {**LLAMA3, **dims(8192, 28672, 80, 64, 8),
                               "rope_scaling": LLAMA31_ROPE, "eos_token_id": [128001, 128008, 128009]}),
    "Llama-3.1-405B": ("meta-llama/Llama-3.1-405B", {**LLAMA3, **dims(16384, 53248, 126, 128, 8),
                       "rope_scaling": LLAMA31_ROPE}),
    "Mistral-7B-v0.3": ("mistralai/Mistral-7B-v0.3", {**MISTRAL, **dims(4096, 14336, 32, 32, 8), "vocab_size": 32768,
                        "rope_theta": 1000000.0, "max_position_embeddings": 32768}),
    "Mistral-Nemo-Base-2407": ("mistralai/Mistral-Nemo-Base-2407", {**MISTRAL, **dims(5120, 14336, 40, 32, 8),
                               "head_dim": 128, "vocab_size": 131072, "rope_theta": 1000000.0,
                               "max_position_embeddings": 1024000}),
    "Mixtral-8x7B-v0.1": ("mistralai/Mixtral-8x7B-v0.1", {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
                          **dims(4096, 14336, 32, 32, 8), "vocab_size": 32000, "num_local_experts": 8,
                          "num_experts_per_tok": 2, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                          "rms_norm_eps": 1e-5, "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2}),
    "Mixtral-8x22B-v0.1": ("mistralai/Mixtral-8x22B-v0.1", {"model_type": "mixtral",
                           "architectures": ["MixtralForCausalLM"], **dims(6144, 16384, 56, 48, 8),
                           "vocab_size": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
                           "rope_theta": 1000000.0, "max_position_embeddings": 65536, "rms_norm_eps": 1e-5,
                           "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2}),
    "Qwen2.5-0.5B": ("Qwen/Qwen2.5-0.5B", {**QWEN25, **dims(896, 4864, 24, 14, 2), "vocab_size": 151936,
                     "tie_word_embeddings": True}),
    "Qwen2.5-1.5B": ("Qwen/Qwen2.5-1.5B", {**QWEN25, **dims(1536, 8960, 28, 12, 2), "vocab_size": 151936,
                     "tie_word_embeddings": True}),
    "Qwen2.5-3B": ("Qwen/Qwen2.5-3B", {**QWEN25, **dims(2048, 11008, 36, 16, 2), "vocab_size": 151936,
                   "tie_word_embeddings": True}),
    "Qwen2.5-7B": ("Qwen/Qwen2.5-7B", {**QWEN25, **dims(3584, 18944, 28, 28, 4), "vocab_size": 152064,
                   "max_position_embeddings": 131072}),
    "Qwen2.5-14B": ("Qwen/Qwen2.5-14B", {**QWEN25, **dims(5120, 13824, 48, 40, 8), "vocab_size": 152064,
                    "max_position_embeddings": 131072}),
    "Qwen2.5-32B": ("Qwen/Qwen2.5-32B", {**QWEN25, **dims(5120, 27648, 64, 40, 8), "vocab_size": 152064,
                    "max_position_embeddings": 131072}),
    "Qwen2.5-72B": ("Qwen/Qwen2.5-72B", {**QWEN25, **dims(8192, 29568, 80, 64, 8), "vocab_size": 152064,
                    "max_position_embeddings": 131072}),
    "gemma-2-2b": ("google/gemma-2-2b", {**GEMMA2, **dims(2304, 9216, 26, 8, 4)}),
    "gemma-2-9b": ("google/gemma-2-9b", {**GEMMA2, **dims(3584, 14336, 42, 16, 8)}),
    "gemma-2-27b": ("google/gemma-2-27b", {**GEMMA2, **dims(4608, 36864, 46, 32, 16), "head_dim": 128,
                    "query_pre_attn_scalar": 144}),
    "gemma-3-1b-pt": ("google/gemma-3-1b-pt", {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
                      **GEMMA3_TEXT, **dims(1152, 6912, 26, 4, 1), "vocab_size": 262144, "sliding_window": 512,
                      "max_position_embeddings": 32768, "rope_scaling": None}),
    "gemma-3-4b-pt": ("google/gemma-3-4b-pt", {"model_type": "gemma3",
                      "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
                      "text_config": {"model_type": "gemma3_text", **GEMMA3_TEXT, **dims(2560, 10240, 34, 8, 4)},
                      "vision_config": SIGLIP_896}),
    "gemma-3-12b-pt": ("google/gemma-3-12b-pt", {"model_type": "gemma3",
                       "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
                       "text_config": {"model_type": "gemma3_text", **GEMMA3_TEXT, **dims(3840, 15360, 48, 16, 8)},
                       "vision_config": SIGLIP_896}),
    "gemma-3-27b-pt": ("google/gemma-3-27b-pt", {"model_type": "gemma3",
                       "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
                       "text_config": {"model_type": "gemma3_text", **GEMMA3_TEXT, **dims(5376, 21504, 62, 32, 16),
                                       "head_dim": 128, "query_pre_attn_scalar": 168},
                       "vision_config": SIGLIP_896}),
    "SmolLM2-1.7B": ("HuggingFaceTB/SmolLM2-1.7B", {**LLAMA_ARCH, **dims(2048, 8192, 24, 32, 32), "vocab_size": 49152,
                     "rope_theta": 130000.0, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                     "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2}),
    "Qwen3-0.6B": ("Qwen/Qwen3-0.6B", {**QWEN3, **dims(1024, 3072, 28, 16, 8), "tie_word_embeddings": True}),
    "Qwen3-1.7B": ("Qwen/Qwen3-1.7B", {**QWEN3, **dims(2048, 6144, 28, 16, 8), "tie_word_embeddings": True}),
    "Qwen3-4B": ("Qwen/Qwen3-4B", {**QWEN3, **dims(2560, 9728, 36, 32, 8), "tie_word_embeddings": True}),
    "Qwen3-8B": ("Qwen/Qwen3-8B", {**QWEN3, **dims(4096, 12288, 36, 32, 8)}),
    "Qwen3-14B": ("Qwen/Qwen3-14B", {**QWEN3, **dims(5120, 17408, 40, 40, 8)}),
    "Qwen3-32B": ("Qwen/Qwen3-32B", {**QWEN3, **dims(5120, 25600, 64, 64, 8)}),
    "Qwen3-30B-A3B": ("Qwen/Qwen3-30B-A3B", {**QWEN3_MOE, **dims(2048, 6144, 48, 32, 4), "moe_intermediate_size": 768}),
    "Qwen3-235B-A22B": ("Qwen/Qwen3-235B-A22B", {**QWEN3_MOE, **dims(4096, 12288, 94, 64, 4),
                        "moe_intermediate_size": 1536}),
    "Phi-3-mini-4k-instruct": ("microsoft/Phi-3-mini-4k-instruct", {**PHI3, **dims(3072, 8192, 32, 32, 32)}),
    "Phi-3-medium-4k-instruct": ("microsoft/Phi-3-medium-4k-instruct", {**PHI3, **dims(5120, 17920, 40, 40, 10)}),
    "phi-4": ("microsoft/phi-4", {**PHI3, **dims(5120, 17920, 40, 40, 10), "vocab_size": 100352,
              "max_position_embeddings": 16384, "rope_theta": 250000.0, "bos_token_id": 100257,
              "eos_token_id": 100257, "pad_token_id": 100257}),
    "SmolLM3-3B": ("HuggingFaceTB/SmolLM3-3B", {"model_type": "smollm3", "architectures": ["SmolLM3ForCausalLM"],
                   **dims(2048, 11008, 36, 16, 4), "vocab_size": 128256, "max_position_embeddings": 65536,
                   "rope_theta": 5000000.0, "no_rope_layer_interval": 4, "rms_norm_eps": 1e-6,
                   "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128012,
                   "pad_token_id": 128004}),
    "Mistral-Small-24B-Base-2501": ("mistralai/Mistral-Small-24B-Base-2501", {**MISTRAL, **dims(5120, 32768, 40, 32, 8),
                                    "head_dim": 128, "vocab_size": 131072, "rope_theta": 100000000.0,
                                    "max_position_embeddings": 32768}),
    "gpt-oss-20b": ("openai/gpt-oss-20b", {**GPT_OSS, "num_hidden_layers": 24, "num_local_experts": 32}),
    "gpt-oss-120b": ("openai/gpt-oss-120b", {**GPT_OSS, "num_hidden_layers": 36, "num_local_experts": 128}),
}


def written(fields: dict) -> dict:
    """The config as transformers' config class writes it: every field the model build reads."""
    from transformers import AutoConfig

    fields = dict(fields)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    out = config.to_diff_dict()
    out.pop("transformers_version", None)
    return out


def main(only: list[str]) -> None:
    """Writes every model's config.json, or those named (a new model's, leaving the others as written)."""
    index = tomllib.loads((HERE / "index.toml").read_text())["models"]
    assert set(index) == set(MODELS), set(index) ^ set(MODELS)
    for name, (hub_id, fields) in MODELS.items():
        if only and name not in only:
            continue
        assert index[name]["hub"] == hub_id, name
        folder = HERE / name
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(json.dumps(written(fields), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
