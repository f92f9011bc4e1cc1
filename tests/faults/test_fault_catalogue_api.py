"""The fault catalogue, the Python API: every public function (advisor.fit, recommend, plan, measure, pretrain,
open_kb) given a wrong type or a value out of range raises advisor.InputError (an advisor.Error and a
ValueError, README § From Python) naming the option, never a raw exception and never a silent answer: the API
holds its values to what the command line's types hold them to (advisor/api/inputs.py `_typed`; the ranges declared
once in advisor/prediction/fit_request.py WHOLE and NUMBERS, which advisor/cli/params.py makes its types from)."""

import math
from pathlib import Path

import pytest

import advisor

QWEN = Path(__file__).resolve().parents[1] / "fixtures" / "configs" / "Qwen2-0.5B"
LLAMA = "llama-3.1-8b"
TINY = dict(preset="tiny", optimizers=("adam",), strategies=("standard",), epochs=1, steps_per_epoch=1)

# name -> (the call, the option its sentence names)
CASES = {
    # advisor.fit
    "fit(None)": (lambda: advisor.fit(None), "--model"),
    "fit(123)": (lambda: advisor.fit(123, gpu="H100"), "--model"),
    "fit(memory='24')": (lambda: advisor.fit(LLAMA, gpu="H100", memory="24"), "--memory"),
    "fit(memory=-5)": (lambda: advisor.fit(LLAMA, memory=-5), "--memory"),
    "fit(memory=nan)": (lambda: advisor.fit(LLAMA, memory=math.nan), "--memory"),
    "fit(memory=1e308)": (lambda: advisor.fit(LLAMA, memory=1e308), "--memory"),
    "fit(batch_size=10**18)": (lambda: advisor.fit(LLAMA, gpu="H100", batch_size=10**18), "--batch-size"),
    "fit(accumulation_steps=10**18)": (
        lambda: advisor.fit(LLAMA, gpu="H100", accumulation_steps=10**18),
        "--accumulation-steps",
    ),
    "fit(gpu=123)": (lambda: advisor.fit(LLAMA, gpu=123), "--gpu"),
    "fit(dtype=5)": (lambda: advisor.fit(LLAMA, gpu="H100", dtype=5), "--dtype"),
    "fit(adapters=5)": (lambda: advisor.fit(LLAMA, gpu="H100", adapters=5), "--adapter"),
    "fit(optimizers=[1])": (lambda: advisor.fit(LLAMA, gpu="H100", optimizers=[1]), "--optimizer"),
    "fit(interconnect=5)": (lambda: advisor.fit(LLAMA, gpu="H100", interconnect=5), "--interconnect"),
    "fit(beta=inf)": (lambda: advisor.fit(LLAMA, gpu="H100", method="grpo", beta=math.inf), "--beta"),
    "fit(db=123)": (lambda: advisor.fit(LLAMA, gpu="H100", db=123), "--db"),
    # advisor.recommend
    "recommend(db=123)": (lambda: advisor.recommend(arch="encoder", db=123), "--db"),
    "recommend(arch=123)": (lambda: advisor.recommend(arch=123), "--arch"),
    "recommend(model=123)": (lambda: advisor.recommend(model=123), "--model"),
    "recommend(max_time=nan)": (lambda: advisor.recommend(arch="encoder", max_time=math.nan), "--max-time"),
    "recommend(max_time=-1)": (lambda: advisor.recommend(arch="encoder", max_time=-1), "--max-time"),
    "recommend(max_time='1')": (lambda: advisor.recommend(arch="encoder", max_time="1"), "--max-time"),
    "recommend(memory=-5)": (lambda: advisor.recommend(arch="encoder", memory=-5), "--memory"),
    "recommend(memory='24')": (lambda: advisor.recommend(model="llama", memory="24"), "--memory"),
    "recommend(strategies=5)": (lambda: advisor.recommend(arch="encoder", strategies=5), "--strategy"),
    "recommend(source=5)": (lambda: advisor.recommend(arch="encoder", source=5), "--source"),
    "recommend(compare_groups='no')": (
        lambda: advisor.recommend(arch="encoder", compare_groups="no"),
        "--compare-groups",
    ),
    "recommend(conn=5)": (lambda: advisor.recommend(arch="encoder", conn=5), "conn"),
    # advisor.plan
    "plan(workers=(-1,))": (lambda: advisor.plan("vit", preset="tiny", workers=(-1,)), "--workers"),
    "plan(workers='2')": (lambda: advisor.plan("vit", preset="tiny", workers="2"), "--workers"),
    "plan(gpu=5)": (lambda: advisor.plan("vit", preset="tiny", gpu=5), "--gpu"),
    "plan(None)": (lambda: advisor.plan(None, preset="tiny"), "--model"),
    "plan(preset=5)": (lambda: advisor.plan("vit", preset=5), "--preset"),
    "plan(memory='24')": (lambda: advisor.plan("vit", preset="tiny", memory="24"), "--memory"),
    "plan(batch_size=10**18)": (
        lambda: advisor.plan("vit", preset="tiny", batch_size=10**18),
        "--batch-size",
    ),
    # advisor.measure: refused before any cell trains
    "measure(None)": (lambda: advisor.measure(None, **TINY), "--model"),
    "measure(epochs='x')": (lambda: advisor.measure("vit", **{**TINY, "epochs": "x"}), "--epochs"),
    "measure(lr=nan)": (lambda: advisor.measure("vit", **TINY, lr=math.nan), "--lr"),
    "measure(memory=-5)": (lambda: advisor.measure("vit", **TINY, memory=-5), "--memory"),
    "measure(seq_len=2)": (lambda: advisor.measure("llama", **TINY, seq_len=2), "--seq-len"),
    # advisor.pretrain, advisor.open_kb
    "pretrain(None)": (lambda: advisor.pretrain(None), "--model"),
    "pretrain(out=123)": (lambda: advisor.pretrain("vit", out=123), "--out"),
    "open_kb(123)": (lambda: advisor.open_kb(123), "--db"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_wrong_value_is_an_input_error_naming_the_option(case):
    call, option = CASES[case]
    with pytest.raises(advisor.InputError) as raised:
        call()
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, advisor.Error)
    assert option in str(raised.value), str(raised.value)


def test_a_path_is_a_model_and_one_name_is_a_tuple_of_one():
    """What the API takes as the command line would: a folder as a Path, one optimizer as a str."""
    assert advisor.recommend(model=QWEN).recommendation is not None
    answer = advisor.recommend(arch="encoder", optimizers="adam")
    assert answer.recommendation.optimizer == "adam"


@pytest.mark.parametrize("name", ["batch_size", "seq_len", "accumulation_steps", "lora_r", "nodes", "memory"])
def test_the_command_line_and_the_api_hold_a_number_to_one_range(name):
    """The click type of each option is made from the range the API checks (fit_request.WHOLE, NUMBERS)."""
    from advisor.cli.fitting import fit_command
    from advisor.prediction.fit_request import NUMBERS, WHOLE

    (option,) = [p for p in fit_command.params if p.name == name]
    least, most = (WHOLE[name][1:3]) if name in WHOLE else NUMBERS[name][1:3]
    assert (option.type.min, option.type.max) == (least, most)


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "--model", LLAMA, "--memory", "1e308"],
        ["fit", "--model", LLAMA, "--gpu", "H100", "--memory", "1e308"],
        ["recommend", "--model", LLAMA, "--memory", "1e308"],
        ["fit", "--model", LLAMA, "--gpu", "H100", "--batch-size", str(10**18)],
    ],
)
def test_a_number_too_large_for_the_arithmetic_is_a_usage_error(invoke, args):
    result = invoke(*args, catch_exceptions=True)
    assert result.exit_code == 2, result.output
    assert "is not in the range" in result.output and "Traceback" not in result.output
