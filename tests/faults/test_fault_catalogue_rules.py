"""The fault catalogue of the user's rules: every malformed file in their rules folder (wrong types, values out
of range, unknown keys and names, files that cannot be read) makes a real command end with exit code 2 and one
sentence that names the file, never a traceback and never a silently different answer."""

import os
import re

import pytest

from advisor.places import user_rules_dir

BIG = "[ranking]\n" + "# padding\n" * 110_000  # over 1 MB

# (id, file in the user's rules folder, its content, what the sentence must say). Content is TOML text, bytes,
# or one of the SETUPS below for what is not a file's text.
CASES = [
    # wrong types
    (
        "tie_tolerance text",
        "flowchart.toml",
        '[ranking]\ntie_tolerance = "0.001"\n',
        "line 2: ranking.tie_tolerance must be a number",
    ),
    ("ranking not a table", "flowchart.toml", "ranking = 3\n", "line 1: ranking must be a table, not 3"),
    (
        "alpha boolean",
        "flowchart.toml",
        "[ranking]\nalpha = true\n",
        "ranking.alpha must be a number between 0 and 1 (e.g. 0.05), not true.",
    ),
    (
        "tie_break_metrics a string",
        "flowchart.toml",
        '[ranking]\ntie_break_metrics = "loss"\n',
        "must be a list, not 'loss'",
    ),
    (
        "prefer_optimizers numbers",
        "flowchart.toml",
        "[ranking]\nprefer_optimizers = [1]\n",
        "prefer_optimizers[0] must be a non-empty string, not 1",
    ),
    (
        "margins a number",
        "flowchart.toml",
        "[ranking]\nequivalence_margins = 0.05\n",
        "equivalence_margins must be a table",
    ),
    (
        "model_types a string",
        "families.toml",
        '[families.decoder]\nmodel_types = "llama"\n',
        "families.decoder.model_types must be a list",
    ),
    (
        "aliases nested list",
        "families.toml",
        '[families.decoder]\naliases = [["x"]]\n',
        "aliases[0] must be a non-empty string, not a list",
    ),
    ("families a list", "families.toml", 'families = ["decoder"]\n', "families must be a table, not a list"),
    (
        "menu text",
        "optimizers.toml",
        '[optimizers.adamw]\nmenu = "yes"\n',
        "optimizers.adamw.menu must be true or false, not 'yes'",
    ),
    ("bits fractional", "optimizers.toml", "[optimizers.adamw]\nbits = 8.5\n", "bits must be a whole number"),
    (
        "tflops a number",
        "hardware.toml",
        "[accelerators.h100-80gb]\ntflops = 989\n",
        "tflops must be a table, not 989",
    ),
    (
        "measures a string",
        "metrics.toml",
        '[metrics.loss]\nmeasures = "loss"\n',
        "metrics.loss.measures must be a list",
    ),
    ("caveats a table", "caveats.toml", '[caveats]\nid = "x"\n', "caveats must be a list, not a table"),
    (
        "when flag text",
        "caveats.toml",
        '[[caveats]]\nid = "new"\ntext = "t"\nwhen = { predicted = "yes" }\n',
        "caveats[0].when.predicted must be true or false",
    ),
    ("seed fractional", "protocol.toml", "[tuning]\nseed = 1000.5\n", "tuning.seed must be a whole number"),
    (
        "headroom a date",
        "fit.toml",
        "[fits]\nheadroom = 2024-01-01\n",
        "fits.headroom must be a number at least 0 and below 1 (e.g. 0.05), not a date or time",
    ),
    (
        "target text",
        "protocol.toml",
        '[targets.vision]\nsmall = "2.4"\n',
        "targets.vision.small must be a number above 0",
    ),
    # values out of range: the red team's two, and their kin
    (
        "tie_tolerance 1e300",
        "flowchart.toml",
        "[ranking]\ntie_tolerance = 1e300\n",
        "tie_tolerance must be a number at least 0 and below 1 (e.g. 0.001), not 1e+300",
    ),
    (
        "negative GPU memory",
        "hardware.toml",
        "[accelerators.h100-80gb]\nmemory_gib = -80\n",
        "accelerators.h100-80gb.memory_gib must be a number above 0",
    ),
    (
        "alpha zero",
        "flowchart.toml",
        "[ranking]\nalpha = 0\n",
        "ranking.alpha must be a number between 0 and 1 (e.g. 0.05), not 0.",
    ),
    (
        "margin above 1",
        "flowchart.toml",
        "[ranking]\nequivalence_margins = { loss = 1.5 }\n",
        "equivalence_margins.loss must be a fraction between 0 and 1 (e.g. 0.01 for 1 %), not 1.5.",
    ),
    (
        "fragmentation negative",
        "fit.toml",
        "[cuda]\nfragmentation = -0.1\n",
        "cuda.fragmentation must be a number at least 0 and at most 1",
    ),
    (
        "default mfu zero",
        "fit.toml",
        "[speed]\ndefault_mfu = 0\n",
        "speed.default_mfu must be a number above 0",
    ),
    (
        "micro-batch overhead negative",
        "fit.toml",
        "[speed]\nmicro_batch_overhead_s = -1\n",
        "speed.micro_batch_overhead_s must be a number at least 0",
    ),
    (
        "dequant efficiency above 1",
        "fit.toml",
        "[speed]\ndequant_efficiency = 2\n",
        "speed.dequant_efficiency must be a number above 0 and at most 1",
    ),
    (
        "generation efficiency a word",
        "fit.toml",
        '[speed.generations]\nampere = "fast"\n',
        "speed.generations.ampere must be a number",
    ),
    (
        "extend negative",
        "protocol.toml",
        "[tuning]\nextend = -1\n",
        "tuning.extend must be a whole number at least 0",
    ),
    (
        "fit_seq_len zero",
        "families.toml",
        "fit_seq_len = 0\n",
        "fit_seq_len must be a whole number at least 1",
    ),
    (
        "bandwidth infinite",
        "hardware.toml",
        "[accelerators.l4]\nbandwidth_gbs = inf\n",
        "bandwidth_gbs must be a number above 0",
    ),
    ("alpha NaN", "flowchart.toml", "[ranking]\nalpha = nan\n", "not nan"),
    (
        "weight decay negative",
        "optimizers.toml",
        "[optimizers.adamw]\nweight_decay = -0.01\n",
        "weight_decay must be a number at least 0",
    ),
    (
        "rates decreasing",
        "protocol.toml",
        "[tuning]\nfactors = [30.0, 20.0]\n",
        "tuning.factors must be in increasing order",
    ),
    (
        "direction unknown",
        "metrics.toml",
        '[metrics.loss]\ndirection = "minimum"\n',
        "must be one of 'min', 'max', not 'minimum'; did you mean min?",
    ),
    (
        "inputs unknown",
        "families.toml",
        '[families.vlm]\ninputs = ["audio"]\n',
        "families.vlm.inputs[0] must be one of 'text', 'image', not 'audio'",
    ),
    (
        "alternatives negative",
        "flowchart.toml",
        "[ranking]\nalternatives = -1\n",
        "ranking.alternatives must be a whole number at least 0",
    ),
    (
        "link zero",
        "hardware.toml",
        "[accelerators.t4]\nlink_gbs = 0\n",
        "accelerators.t4.link_gbs must be a number above 0",
    ),
    ("empty label", "metrics.toml", '[metrics.loss]\nlabel = " "\n', "metrics.loss.label must not be empty"),
    # unknown keys, with the nearest known one
    (
        "key misspelt",
        "flowchart.toml",
        "[ranking]\ntie_tolerence = 0.01\n",
        "line 2: ranking.tie_tolerence is not a key advisor knows; did you mean tie_tolerance?",
    ),
    (
        "optimizer key misspelt",
        "optimizers.toml",
        "[optimizers.adamw]\nweight_decy = 0.1\n",
        "did you mean weight_decay?",
    ),
    (
        "accelerator key misspelt",
        "hardware.toml",
        "[accelerators.h200]\nmemory_gb = 141\n",
        "accelerators.h200.memory_gb is not a key advisor knows; did you mean memory_gib?",
    ),
    ("fit key misspelt", "fit.toml", "[cuda]\ncontext = 1\n", "did you mean context_gb?"),
    (
        "table misspelt",
        "flowchart.toml",
        "[rankings]\nalpha = 0.01\n",
        "line 1: rankings is not a key advisor knows; did you mean ranking?",
    ),
    (
        "precision misspelt",
        "hardware.toml",
        "[accelerators.h200]\ntflops = { bf61 = 3 }\n",
        "tflops.bf61 is not a name advisor knows; did you mean bf16?",
    ),
    (
        "caveat condition misspelt",
        "caveats.toml",
        '[[caveats]]\nid = "new"\ntext = "t"\nwhen = { familly = "decoder" }\n',
        "did you mean family?",
    ),
    (
        "top-level key unknown",
        "protocol.toml",
        "colour = 1\n",
        "line 1: colour is not a key advisor knows; use one of tuning",
    ),
    # names another file defines
    (
        "optimizer unknown",
        "flowchart.toml",
        '[ranking]\nprefer_optimizers = ["adam", "adamx"]\n',
        "line 2: ranking.prefer_optimizers[1] names 'adamx', not an optimizer of optimizers.toml; did you mean adam",
    ),
    (
        "strategy unknown",
        "families.toml",
        '[families.decoder]\ngrid_strategies = ["checkpoint"]\n',
        "not a strategy of families.toml `strategies`; did you mean checkpointing?",
    ),
    (
        "caveat family unknown",
        "caveats.toml",
        '[[caveats]]\nid = "new"\ntext = "t"\nwhen = { family = "decodr" }\n',
        "line 4: caveats[0].when.family names 'decodr', not a family",
    ),
    (
        "tuning strategy unknown",
        "protocol.toml",
        '[tuning.with]\naccumulation = "acumulation"\n',
        "tuning.with.accumulation names 'acumulation', not a strategy of families.toml `strategies`; did you "
        "mean accumulation?",
    ),
    (
        "tuning strategy key unknown",
        "protocol.toml",
        '[tuning.with]\naccumulate = "accumulation"\n',
        "names 'accumulate', not a strategy of families.toml `strategies`",
    ),
    (
        "pretraining genres past the corpus",
        "protocol.toml",
        "[pretraining]\ngenres = 30\n",
        "pretraining.genres must be a whole number",
    ),
    (
        "pretraining optimizer unknown",
        "protocol.toml",
        '[pretraining]\noptimizer = "adamm"\n',
        "pretraining.optimizer names 'adamm', not an optimizer",
    ),
    (
        "deciding one seed",
        "protocol.toml",
        "[deciding]\nmax_seeds = 1\n",
        "deciding.max_seeds must be a whole number",
    ),
    (
        "deciding metric unknown",
        "protocol.toml",
        '[deciding]\nmetrics = ["los"]\n',
        "deciding.metrics[0] names 'los', not a metric",
    ),
    ("tuning around zero", "protocol.toml", "[tuning]\naround = 0\n", "tuning.around must be a whole number"),
    (
        "adapter that fit does not predict",
        "families.toml",
        'adapters = { accumulation = "standard" }\n',
        "adapters.accumulation names 'accumulation': it must be a strategy of `strategies` and an adapter",
    ),
    (
        "adapter on a measured arm",
        "families.toml",
        'adapters = { lora = "accumulation-equal-samples" }\n',
        "must name a strategy of `strategies` that is neither a measured arm nor an adapter",
    ),
    (
        "only_for_their_model preset unknown",
        "flowchart.toml",
        '[evidence]\nonly_for_their_model = ["smal"]\n',
        "evidence.only_for_their_model[0] names 'smal', not a preset",
    ),
    (
        "target family unknown",
        "protocol.toml",
        "[targets.visoin]\nsmall = 2.0\n",
        "targets.visoin names 'visoin', not a family of families.toml; did you mean vision?",
    ),
    (
        "architecture family unknown",
        "families.toml",
        '[architectures]\nForCausalLM = "decodr"\n',
        "architectures.ForCausalLM names 'decodr'",
    ),
    (
        "metric reads no measure",
        "metrics.toml",
        '[metrics.final]\ndirection = "min"\nunit = ""\nlabel = "final"\nmeasures = ["los"]\n',
        "metrics.final.measures[0] names 'los', not a measure",
    ),
    # what a new entry needs
    (
        "optimizer without adamw",
        "optimizers.toml",
        '[optimizers.mine]\ntrainer = "adamw_torch"\nbits = 32\nmenu = false\n',
        "line 1: optimizers.mine.adamw must be true or false; add it.",
    ),
    (
        "optimizer with trainer and code",
        "optimizers.toml",
        '[optimizers.mine]\ntrainer = "x"\ncode = "y"\nadamw = true\nbits = 8\nmenu = false\n',
        "optimizers.mine needs exactly one of trainer and code",
    ),
    (
        "accelerator without memory",
        "hardware.toml",
        '[accelerators.mine]\nname = "Mine"\nsource = "me"\n',
        "accelerators.mine needs memory_gib",
    ),
    (
        "family without inputs",
        "families.toml",
        '[families.speech]\nmodule = "speech"\n',
        "families.speech.inputs must be a list, each item one of 'text', 'image'; add it.",
    ),
    (
        "model type in two families",
        "families.toml",
        '[families.decoder]\nmodel_types = ["bert"]\n',
        "lists 'bert', which families.encoder lists too",
    ),
    (
        "caveat id repeated",
        "caveats.toml",
        '[[caveats]]\nid = "cgd-decoder"\ntext = "again"\n',
        "caveats[0].id repeats 'cgd-decoder'",
    ),
    ("empty name", "families.toml", '[families.""]\ninputs = ["text"]\n', "has an empty name"),
    # files that are not rules files, or cannot be read
    (
        "not UTF-8",
        "families.toml",
        b'[families.decoder]\nmodel_types = ["caf\xe9"]\n',
        "line 2: byte 0xe9 is not UTF-8 text",
    ),
    (
        "not TOML",
        "caveats.toml",
        "[[caveats]\n",
        "is not valid TOML: expected ']]' at the end of an array declaration (at line 1, column 10)",
    ),
    ("a key twice", "flowchart.toml", "[ranking]\nalpha = 0.05\nalpha = 0.01\n", "is not valid TOML"),
    (
        "nested too deeply",
        "families.toml",
        "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "nests lists or tables too deeply",
    ),
    (
        "hexadecimal number too long",
        "optimizers.toml",
        "[optimizers.adamw]\nbits = 0x" + "f" * 5000 + "\n",
        "optimizers.adamw.bits must be a whole number at least 1 and at most 64 (e.g. 32), not a number too long to show.",
    ),
    (
        "number too long",
        "fit.toml",
        "[cuda]\ncontext_gb = " + "9" * 5000 + "\n",
        "holds a number too long to read",
    ),
    ("too large", "flowchart.toml", BIG, "too large for a rules file"),
    ("a folder", "families.toml", "folder", "is a folder, not a rules file"),
    ("a link in a loop", "families.toml", "loop", "cannot read"),
    ("a link to nothing", "hardware.toml", "dangling", "is a link to a file that is not there"),
    ("a pipe", "fit.toml", "fifo", "is not a regular file"),
    ("unreadable", "metrics.toml", "unreadable", "permission denied"),
    (
        "name misspelt",
        "familes.toml",
        "[families.decoder]\n",
        "is not a rules file advisor reads; did you mean families.toml?",
    ),
    ("claims", "claims.toml", "[[claims]]\n", "is not read: the claims are the paper's"),
]


def _folder(path):
    path.mkdir()


def _loop(path):
    path.symlink_to(path.name)


def _dangling(path):
    path.symlink_to(path.parent / "nowhere.toml")


def _fifo(path):
    os.mkfifo(path)


def _unreadable(path):
    path.write_text("[metrics.loss]\n")
    path.chmod(0)


SETUPS = {"folder": _folder, "loop": _loop, "dangling": _dangling, "fifo": _fifo, "unreadable": _unreadable}


def write(name: str, content) -> str:
    """The case's file in the user's rules folder; its path as the sentence must name it."""
    folder = user_rules_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content in SETUPS:
        SETUPS[content](path)
    else:
        path.write_text(content)
    return str(path)


def one_sentence(result) -> str:
    """The command's only line, a sentence: 'Error: ...' ending in a full stop or a question mark."""
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert lines[0].endswith((".", "?")) and not re.search(r"[.?!] [A-Z]", lines[0]), lines[0]
    return lines[0]


@pytest.mark.parametrize(("file", "content", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_user_rules_file_is_one_sentence_and_exit_code_2(invoke, file, content, says):
    if content == "unreadable" and os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = write(file, content)
    result = invoke("recommend", "--arch", "vit", catch_exceptions=True)
    assert result.exit_code == 2, result.output
    line = one_sentence(result)
    assert path in line, line
    assert says in line, line


@pytest.mark.parametrize(
    "args", [("flowchart",), ("frontier", "--arch", "vit"), ("fit", "--model", "llama", "--memory", "80")]
)
def test_every_command_that_reads_the_rules_says_the_same(invoke, args):
    path = write("flowchart.toml", "[ranking]\ntie_tolerance = 1e300\n")
    result = invoke(*args, catch_exceptions=True)
    assert result.exit_code == 2, result.output
    assert one_sentence(
        result
    ) == f"Error: {path}, line 2: ranking.tie_tolerance must be a number at least 0 " + (
        "and below 1 (e.g. 0.001), not 1e+300."
    )


def test_the_catalogue_is_large():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)
