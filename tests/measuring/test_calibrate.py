"""`advisor calibrate` (advisor/measuring/device_speed.py): this device's rates measured and recorded, and
`advisor fit --gpu cpu` pricing a step from them, near a real step of the same model."""

import json
import statistics
import time

import pytest
import torch

import advisor

from .tracer.distributed import tiny_llama

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
    from advisor.kb.open import writing
    from advisor.kb.queries.for_answers import validation
    from advisor.kb.queries.for_prediction import speed_calibrations
    from advisor.kb.store import Check

    db = tmp_path / "kb.sqlite"
    with writing(db) as conn:
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


# --- rounds until the figures agree; rates that price no step refused, flagged and ignored ---------------


def _spin():
    while True:
        pass


def test_calibrating_under_a_cpu_hog_agrees_or_says_by_how_much(invoke, tmp_path):
    """Another process spinning on a core: the rounds either agree within the tolerance, recorded so, or the
    command says they did not, with the spread; the figures kept are finite and positive either way."""
    import multiprocessing

    from advisor.kb.open import open_for_writing, release
    from advisor.kb.queries.for_prediction import speed_calibrations

    db = tmp_path / "kb.sqlite"
    hog = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
    hog.start()
    try:
        result = invoke("calibrate", "--device", "cpu", "--rounds", "3", "--db", db)
        assert hog.is_alive()  # it ran under load throughout
    finally:
        hog.kill()
        hog.join()
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console wraps its lines
    conn = open_for_writing(db)
    try:
        chosen = speed_calibrations(conn)["cpu"]
    finally:
        release(conn)
    assert chosen["calibrations"] == 1 and 1 <= chosen["rounds"] <= 3 and chosen["tolerance"] == 0.2
    for name in ("speed_matmul_flops", "speed_stream_bytes", "speed_micro_batch_s"):
        assert 0 < chosen[name] < float("inf")
    if chosen["agreed"]:
        assert chosen["rounds"] >= 3 and 0 <= chosen["spread"] <= 0.2
        assert f"agree within {chosen['spread']:.0%}" in said
    else:
        assert chosen["spread"] > 0.2 or chosen["rounds"] < 3  # the deadline: fewer rounds than compared
        assert "did not agree" in said and f"differ by up to {chosen['spread']:.0%}" in said


@pytest.mark.parametrize(
    "args,says",
    [
        (["--rounds", "2"], "2 is not in the range 3<=x<=100"),
        (["--rounds", "many"], "'many' is not a valid integer"),
        (["--tolerance", "0"], "0 is not in the range 0<x<=1"),
        (["--tolerance", "1.5"], "1.5 is not in the range 0<x<=1"),
        (["--tolerance", "nan"], "'nan' is not a finite number"),
    ],
)
def test_bad_rounds_or_tolerance_is_one_sentence_and_exit_code_2(invoke, args, says, tmp_path):
    result = invoke("calibrate", "--device", "cpu", "--db", tmp_path / "kb.sqlite", *args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Calibrated" not in result.output  # refused before anything was timed


BAD = [-1.0, 0.0, 1e-300, float("inf"), float("nan")]
RATES = {"speed_matmul_flops": 2e10, "speed_stream_bytes": 1e10, "speed_micro_batch_s": 0.002}
MACHINE = {"hardware": "cpu", "device": "CPU: test", "software": {}}


def _speed_rows(conn) -> int:
    return conn.execute("SELECT count(*) FROM validations WHERE name LIKE 'speed_%'").fetchone()[0]


@pytest.mark.parametrize(
    "name,bad",
    [(n, b) for n in [*RATES, "speed_rounds"] for b in BAD] + [("speed_spread", b) for b in (-1.0, *BAD[3:])],
)  # a spread of 0 is rounds that agreed exactly
def test_a_rate_that_prices_no_step_is_refused_and_nothing_written(tmp_path, name, bad):
    from advisor.errors import KBError
    from advisor.kb import store
    from advisor.kb.open import writing
    from advisor.kb.store import Check

    checks = [Check(n, None, True, v, None, "x") for n, v in {**RATES, name: bad}.items()]
    with writing(tmp_path / "kb.sqlite") as conn:
        with pytest.raises(
            KBError, match=f"cannot store the calibration: {name} = .* must .*nothing was written"
        ):
            store.add_validations(conn, MACHINE, "", checks)
        assert _speed_rows(conn) == 0
        bad_import = dict(
            hardware="cpu", name=name, passed=1, value=bad, detail="x", created_at="2026-01-01T00:00:00+00:00"
        )
        with pytest.raises(
            KBError, match="nothing was written"
        ):  # a KB file's validations (kb import, merge)
            store.write_runs(conn, [], [bad_import])
        assert _speed_rows(conn) == 0


def _record(conn, at: str, rates: dict, agreed=None, spread=0.05, rounds=3) -> None:
    """A calibration written straight into `validations` (as an older advisor, or a hand, could)."""
    rows = [(n, 1, v, None) for n, v in rates.items()]
    if agreed is not None:
        rows += [("speed_spread", int(agreed), spread, 0.2), ("speed_rounds", 1, rounds, None)]
    conn.executemany(
        "INSERT INTO validations (hardware, device, name, passed, value, tolerance, detail, created_at) "
        "VALUES ('cpu', 'CPU: test', ?, ?, ?, ?, 'x', ?)",
        [(*row, at) for row in rows],
    )


def test_kb_check_flags_stored_rates_that_price_no_step(invoke, tmp_path):
    from advisor.kb.open import writing

    db = tmp_path / "kb.sqlite"
    with writing(db) as conn:
        for i, bad in enumerate(BAD):
            _record(conn, f"2026-01-0{i + 1}T00:00:00+00:00", {**RATES, "speed_matmul_flops": bad})
    result = invoke("kb", "check", "--db", db)
    assert result.exit_code == 1 and "NOT USABLE" in result.output
    flagged = [line for line in result.output.splitlines() if "speed_matmul_flops: value =" in line]
    assert len(flagged) == len(BAD), result.output
    for shown in ("-1.0", "0.0", "1e-300", "inf", "None"):  # SQLite keeps a NaN as NULL
        assert any(f"value = {shown} breaks its rule" in line for line in flagged), (shown, result.output)


def test_the_latest_calibration_that_agreed_is_chosen_and_broken_ones_ignored(tmp_path):
    from advisor.kb.open import writing
    from advisor.kb.queries.for_answers import validation
    from advisor.kb.queries.for_prediction import speed_calibrations

    with writing(tmp_path / "kb.sqlite") as conn:
        _record(conn, "2026-01-01T00:00:00+00:00", {**RATES, "speed_matmul_flops": 1e9})  # before rounds
        assert speed_calibrations(conn)["cpu"] == {
            **{**RATES, "speed_matmul_flops": 1e9},
            "at": "2026-01-01T00:00:00+00:00",
            "device": "CPU: test",
            "spread": None,
            "rounds": None,
            "agreed": None,
            "tolerance": None,
            "calibrations": 1,
        }
        _record(conn, "2026-01-02T00:00:00+00:00", RATES, agreed=True, spread=0.05, rounds=3)
        _record(
            conn, "2026-01-03T00:00:00+00:00", {**RATES, "speed_matmul_flops": 9e9}, agreed=False, spread=1.4
        )
        _record(conn, "2026-01-04T00:00:00+00:00", {**RATES, "speed_stream_bytes": -1.0}, agreed=True)
        _record(
            conn, "2026-01-05T00:00:00+00:00", {**RATES, "speed_micro_batch_s": float("inf")}, agreed=True
        )
        chosen = speed_calibrations(conn)["cpu"]
        assert (
            chosen["at"] == "2026-01-02T00:00:00+00:00"
        )  # agreed, before one that did not; broken ones left out
        assert chosen["speed_matmul_flops"] == 2e10 and chosen["speed_stream_bytes"] == 1e10
        assert (chosen["agreed"], chosen["spread"], chosen["rounds"], chosen["tolerance"]) == (
            True,
            0.05,
            3,
            0.2,
        )
        assert chosen["calibrations"] == 3 and "speed_spread" not in chosen
        _record(
            conn, "2026-01-06T00:00:00+00:00", {**RATES, "speed_matmul_flops": 3e10}, agreed=True, spread=0.1
        )
        assert speed_calibrations(conn)["cpu"]["speed_matmul_flops"] == 3e10  # the latest that agreed
        conn.execute("UPDATE validations SET passed = 0 WHERE name = 'speed_spread'")
        chosen = speed_calibrations(conn)["cpu"]  # none agreed: the latest usable one
        assert chosen["at"] == "2026-01-06T00:00:00+00:00" and chosen["agreed"] is False
        assert validation(conn, "cpu") is None  # a spread that did not agree is no failed check of validate


def test_the_deadline_ends_the_rounds_and_the_calibration_says_it_did_not_agree(tmp_path):
    """Past its deadline no round starts (the first completes): too few rounds to compare is no agreement;
    an earlier calibration that agreed stays the one chosen."""
    from advisor.kb.open import writing
    from advisor.measuring.device_speed import calibrate_here

    db = tmp_path / "kb.sqlite"
    with writing(db) as conn:
        _record(conn, "2026-01-02T00:00:00+00:00", RATES, agreed=True, spread=0.05, rounds=3)
    result = calibrate_here(db, "cpu", deadline_s=0)
    assert (result.rounds, result.agreed) == (1, False)
    assert all(0 < r.value < float("inf") for r in result.rates)
    assert result.chosen["at"] == "2026-01-02T00:00:00+00:00" and result.chosen["calibrations"] == 2
