"""How rankings carry across scale: Kendall's tau-b against scipy, a bootstrap over seeds, two presets of one
grid compared, and the answer, report and command that say it."""

import json
import random

import pytest
from scipy import stats

from advisor.answers.transfer import bootstrap_tau, kendall_tau_b, transfers
from advisor.kb.open import open_for_reading, open_for_writing
from advisor.kb.store import write_runs
from advisor.rules import load_rules


@pytest.mark.parametrize("seed", range(10))
def test_tau_b_is_scipys_with_ties(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 15)
    x = [rng.choice([1.0, 2.0, 3.0, rng.random()]) for _ in range(n)]  # ties on both sides
    y = [v + rng.gauss(0, 0.5) if rng.random() < 0.7 else 2.0 for v in x]
    expected = stats.kendalltau(x, y, variant="b").statistic
    assert kendall_tau_b(x, y) == pytest.approx(0.0 if expected != expected else expected, abs=1e-12)


def test_the_bootstrap_interval_holds_the_estimate_and_narrows_with_agreement():
    clean = [
        [[float(i) + 0.01 * s for s in range(3)] for i in range(6)]
    ] * 2  # both scales: the same clear order
    lo, hi = bootstrap_tau(clean)
    assert lo == hi == 1.0
    rng = random.Random(1)
    noisy = [[[i + rng.gauss(0, 3) for _ in range(3)] for i in range(6)] for _ in range(2)]
    lo, hi = bootstrap_tau(noisy)
    assert -1 <= lo < hi <= 1 and bootstrap_tau(noisy) == (lo, hi)  # fixed seed: the same interval


def grid_runs(preset, n_params, losses, seeds=3):
    """A vit grid of one preset: per configuration, a loss (ordered as given) plus seed noise."""
    runs = []
    for (opt, strat), loss in losses.items():
        for seed in range(seeds):
            runs.append(
                dict(
                    source="measured",
                    model="vit",
                    family="vision",
                    optimizer=opt,
                    strategy=strat,
                    preset=preset,
                    protocol="fair",
                    data="generated",
                    seed=seed,
                    hardware="CPU: test",
                    device="cpu",
                    status="ok",
                    n_params=n_params,
                    config={},
                    software={},
                    started_at="2026-12-01",
                    metrics=[
                        dict(name="eval_loss", value=loss + 0.001 * seed, unit="nats/target"),
                        dict(name="epoch_time", value=10 * loss, unit="s"),
                    ],
                )
            )
    return runs


CONFIGS = [("sgd", "standard"), ("adam", "standard"), ("adamw", "standard"), ("adagrad", "standard")]


@pytest.fixture
def two_scales(tmp_path):
    """tiny and small grids: loss in the same order at both scales; time reversed at the larger one."""
    path = tmp_path / "scales.sqlite"
    db = open_for_writing(path)
    write_runs(db, grid_runs("tiny", 100_000, {c: 3.0 + i for i, c in enumerate(CONFIGS)}))
    small = {c: 2.0 + i for i, c in enumerate(CONFIGS)}
    runs = grid_runs("small", 2_700_000, small)
    for r in runs:  # time: the opposite order at the larger scale
        m = r["metrics"][1]
        m["value"] = 100 - m["value"]
    write_runs(db, runs)
    db.close()
    return path


def test_two_presets_of_one_grid_are_compared_per_metric(two_scales):
    found = {t.metric: t for t in transfers(open_for_reading(two_scales), load_rules())}
    assert set(found) == {"loss", "time"}
    loss, time = found["loss"], found["time"]
    assert loss.tau == pytest.approx(1.0) and loss.held and loss.configurations == 4
    assert loss.smaller.preset == "tiny" and loss.larger.preset == "small"
    assert time.tau == pytest.approx(-1.0) and not time.held and time.interval[1] < 0
    assert time.pick_smaller == "sgd + standard" and time.pick_larger == "adagrad + standard"


def test_the_command_and_its_json(invoke, two_scales):
    out = json.loads(invoke("transfer", "--db", two_scales, "--json").output)
    assert [(t["family"], t["metric"], t["held"]) for t in out["transfers"]] == [
        ("vision", "loss", True),
        ("vision", "time", False),
    ]
    text = invoke("transfer", "--db", two_scales).output
    assert "How rankings carry across scale" in text and "+1.00" in text and "100 k → 2.7 M" in text
    empty = invoke("transfer", "--arch", "decoder", "--db", two_scales)
    assert empty.exit_code == 0 and "No evidence of the decoder family measured at two scales" in " ".join(
        empty.output.split()
    )
    assert invoke("transfer", "--arch", "nope").exit_code == 2


def test_an_answer_far_from_its_evidence_says_how_rankings_carried(invoke, two_scales, tmp_path):
    folder = tmp_path / "big-vit"
    folder.mkdir()
    config = dict(model_type="vit", hidden_size=768, num_hidden_layers=12, num_attention_heads=12)
    (folder / "config.json").write_text(json.dumps(config | dict(intermediate_size=3072, patch_size=16)))
    out = json.loads(invoke("recommend", "--model", folder, "--db", two_scales, "--json").output)
    scale = out["scale"]
    assert scale["warning"] and scale["evidence"] == 2_700_000
    assert "τ = +1.00" in scale["transfer"] and "the pick held in 1 of 1" in scale["transfer"]
