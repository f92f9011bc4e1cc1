"""`advisor calibrate` (advisor/measuring/device_speed.py): this device's rates measured and recorded, and
`advisor fit --gpu cpu` pricing a step from them, near a real step of the same model."""

import json
import statistics
import time

import pytest
import torch

import advisor

from .distributed import tiny_llama

SHAPE = dict(gpu="cpu", adapters=("full",), dtype="fp32", optimizers=("adamw",), strategies=("standard",))


def _fit(folder, db):
    return advisor.fit(str(folder), db=db, batch_size=2, seq_len=128, offload=("none",), **SHAPE)


def _real_step_s(folder) -> float:
    """The median of five real steps of the model (forward, backward, AdamW) on this CPU, after a warm-up."""
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(folder)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (2, 128))
    times = []
    for _ in range(6):
        start = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


@pytest.mark.slow
def test_calibrating_gives_fit_a_step_time_on_this_cpu_near_a_real_one(invoke, tmp_path):
    folder, db = tiny_llama(tmp_path / "llama"), tmp_path / "kb.sqlite"
    before = _fit(folder, db)
    assert before.rows[0].predicted_step_s is None  # a CPU states no peak: nothing to price a step from
    result = invoke("calibrate", "--device", "cpu", "--db", db, "--json")
    assert result.exit_code == 0, result.output
    rates = {r["name"]: r["value"] for r in json.loads(result.output)["rates"]}
    assert set(rates) == {"speed_matmul_flops", "speed_stream_bytes", "speed_micro_batch_s"}
    assert all(v > 0 for v in rates.values())
    after = _fit(folder, db)
    assert after.mfu_source.startswith("calibrated on this device")
    predicted, real = after.rows[0].predicted_step_s, _real_step_s(folder)
    assert 1 / 5 < predicted / real < 5, (predicted, real)  # a 5M-parameter model: small products


def test_validate_does_not_count_calibrations_as_its_checks(invoke, tmp_path):
    """The rates share `validations` with advisor validate's checks; its summary leaves them out."""
    from advisor.kb import store
    from advisor.kb.reader import speed_calibrations, validation
    from advisor.kb.store import Check

    db = tmp_path / "kb.sqlite"
    with store.writing(db) as conn:
        machine = {"hardware": "cpu", "device": "CPU: test", "software": {}}
        store.add_validations(conn, machine, "", [Check("speed_matmul_flops", None, True, 1e10, None, "x")])
        assert validation(conn, "cpu") is None
        assert speed_calibrations(conn)["cpu"]["speed_matmul_flops"] == 1e10


@pytest.mark.parametrize(
    "args,says",
    [
        (["--db", "."], "is a directory"),
        (["--device", "tpu"], "'tpu' is not one of"),
    ],
)
def test_bad_calibrate_input_is_one_sentence_and_exit_code_2(invoke, args, says):
    result = invoke("calibrate", *args)
    assert result.exit_code == 2 and says in result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_calibrating_a_gpu_this_machine_lacks_says_so(invoke, tmp_path):
    result = invoke("calibrate", "--device", "cuda", "--db", tmp_path / "kb.sqlite")
    assert result.exit_code == 2 and "sees no CUDA GPU" in result.output and "Traceback" not in result.output
