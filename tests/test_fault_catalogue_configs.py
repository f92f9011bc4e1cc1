"""The fault catalogue, configs: a model's config.json that would crash a builder, the tracer or transformers
(deep nesting, sizes of zero, NaN, Infinity, floats and strings where counts belong, heads that do not divide,
an unknown RoPE type) is refused where it is read, by recommend, fit and measure alike: exit 1, one sentence
naming the key, no traceback (advisor/model_config.py)."""

import json

import pytest

GOOD = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 256,
}

# name -> (the config.json text, words the sentence must hold)
CONFIGS = {
    "nested 3,000 deep": (
        '{"model_type": "llama", "x": ' + "[" * 3000 + "]" * 3000 + "}",
        "nested too deeply",
    ),
    "nested 20 deep": (
        json.dumps({**GOOD, "text_config": json.loads('{"a": ' * 20 + "1" + "}" * 20)}),
        "levels deep",
    ),
    "zero heads": (json.dumps({**GOOD, "num_attention_heads": 0}), "num_attention_heads is 0"),
    "zero hidden size": (json.dumps({**GOOD, "hidden_size": 0}), "hidden_size is 0"),
    "NaN": (json.dumps(GOOD)[:-1] + ', "initializer_range": NaN}', "NaN"),
    "Infinity": (json.dumps(GOOD)[:-1] + ', "rms_norm_eps": Infinity}', "Infinity"),
    "float layers": (json.dumps({**GOOD, "num_hidden_layers": 2.5}), "num_hidden_layers is 2.5"),
    "string width": (json.dumps({**GOOD, "hidden_size": "64"}), 'hidden_size is "64"'),
    "boolean vocab": (json.dumps({**GOOD, "vocab_size": True}), "vocab_size is true"),
    "negative layers": (json.dumps({**GOOD, "num_hidden_layers": -2}), "num_hidden_layers is -2"),
    "huge vocab": (json.dumps({**GOOD, "vocab_size": 10**18}), "vocab_size is 1000000000000000000"),
    "heads that do not divide": (json.dumps({**GOOD, "num_attention_heads": 5}), "not a multiple"),
    "kv heads that do not divide": (json.dumps({**GOOD, "num_key_value_heads": 3}), "not a multiple"),
    "unknown rope type": (
        json.dumps({**GOOD, "rope_scaling": {"rope_type": "warp", "factor": 2.0}}),
        "rope_scaling.rope_type",
    ),
    "rope factor NaN-like": (
        json.dumps({**GOOD, "rope_scaling": {"rope_type": "linear", "factor": -1}}),
        "factor",
    ),
    "escape codes in architectures": (
        json.dumps({**GOOD, "architectures": ["Llama\u001b[2J\u001b]0;owned\u0007ForCausalLM"]}),
        "architectures must be a list of class names",
    ),
    "a control character in model_type": (
        json.dumps({**GOOD, "model_type": "llama\r"}),
        "model_type is not a name",
    ),
    "zero vision patch": (
        json.dumps({**GOOD, "vision_config": {"patch_size": 0, "hidden_size": 32}}),
        "vision_config.patch_size is 0",
    ),
}

COMMANDS = {
    "recommend": ["recommend", "--model", "{m}"],
    "fit": ["fit", "--model", "{m}", "--gpu", "T4"],
    "measure": ["measure", "--model", "{m}", "--preset", "tiny", "--plan"],
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CONFIGS)
def test_a_hostile_config_is_one_sentence(invoke, tmp_path, case, command):
    text, words = CONFIGS[case]
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    result = invoke(*[a.format(m=folder) for a in COMMANDS[command]], catch_exceptions=True)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and words in result.output, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output  # nothing reaches the terminal raw
    assert len(result.output.strip().splitlines()) <= 3  # a sentence, wrapped


def test_the_rope_types_are_those_transformers_builds():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from advisor.model_config import ROPE_TYPES

    assert set(ROPE_TYPES) == {"default", *ROPE_INIT_FUNCTIONS}  # (and Qwen2-VL's alias, ROPE_ALIASES)


def test_a_good_config_passes(invoke, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GOOD))
    assert invoke("recommend", "--model", folder).exit_code == 0
