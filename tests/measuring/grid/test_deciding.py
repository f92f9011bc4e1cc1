"""--decide: more seeds where a few more decide a close call, both sides of it, up to rules' max_seeds."""

import json
from dataclasses import replace

import pytest

from advisor.measuring.grid.deciding import CloseCall, _of, more_seeds
from advisor.measuring.recipe.config import RunConfig
from tests.conftest import RULES, grid, measured_run

MAX = RULES.protocol["deciding"]["max_seeds"]


def entry(optimizer, strategy, seeds, reading=None, needed=None):
    test = None if reading is None else {"reading": reading, "seeds_needed": needed}
    return {"optimizer": optimizer, "strategy": strategy, "seeds": seeds, "test": test}


def test_a_close_call_is_an_undecided_runner_up_and_only_that():
    pick = entry("adam", "standard", 3)
    further = [entry("sgd", "standard", 3, "undecided", 4), entry("adagrad", "standard", 3, "undecided", 4)]
    answer = {
        "recommendation": pick,
        "alternatives": [entry("adamw", "standard", 3, "undecided", 5), *further],
    }
    (call,) = _of(answer, "vit", "vision", "loss")  # the configurations further down change no pick
    assert (call.model, call.pick, call.other, call.seeds, call.needed) == (
        "vit",
        ("adam", "standard"),
        ("adamw", "standard"),
        3,
        5,
    )
    assert call.decidable(RULES) and not replace(call, needed=MAX + 1).decidable(RULES)
    for reading in ("different", "equivalent"):
        decided = {"recommendation": pick, "alternatives": [entry("adamw", "standard", 3, reading), *further]}
        assert _of(decided, "vit", "vision", "loss") == []
    assert _of({"recommendation": None, "alternatives": []}, "vit", "vision", "loss") == []


def test_both_sides_of_a_decidable_call_get_the_seeds_it_needs_at_their_tuned_rates():
    base = RunConfig(preset="tiny", protocol="fair", lr=0.003)
    cells = grid(["vit"], {"vit": ["adam", "adamw", "sgd"]}, {"vit": ["standard"]}, range(3), base)
    calls = [
        CloseCall("vit", "vision", "loss", ("adam", "standard"), ("adamw", "standard"), 3, MAX),
        CloseCall("vit", "vision", "time", ("adam", "standard"), ("sgd", "standard"), 3, MAX + 1),  # too dear
        CloseCall(
            "vit", "vision", "time", ("adam", "standard"), ("adamw", "standard"), 3, 4
        ),  # within the first
        CloseCall(
            "llama", "decoder", "loss", ("adam", "standard"), ("sgd", "standard"), 3, 4
        ),  # not this grid
    ]
    extra = more_seeds(cells, calls, RULES)
    got = sorted((c.config.optimizer, c.config.seed) for c in extra)
    assert got == sorted((o, s) for o in ("adam", "adamw") for s in range(3, MAX))
    assert {c.config.lr for c in extra} == {0.003}
    assert more_seeds(cells, [replace(calls[0], seeds=MAX)], RULES) == []  # decided: nothing to add


def test_close_calls_are_read_from_the_group_the_cells_wrote(tmp_path):
    """Three seeds a pair, the runner-up's loss higher by 6 % on average but spread: neither separated nor
    equivalent, and a few seeds more would decide it; a group of other data in the same KB is not read."""
    from advisor.kb.open import open_for_writing
    from advisor.kb.store import write_runs
    from advisor.measuring.grid.deciding import close_calls
    from advisor.measuring.machine.hardware import describe, resolve_device

    hardware = describe(resolve_device("cpu"))["hardware"]

    def run(seed, optimizer, loss, data="generated"):
        return measured_run(
            optimizer=optimizer,
            seed=seed,
            hardware=hardware,
            data=data,
            metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
        )

    db = tmp_path / "decide.sqlite"  # not kb.sqlite: conftest copies the shipped KB there
    conn = open_for_writing(db)
    losses = {"adam": (2.0, 2.1, 1.9), "adamw": (2.1, 2.3, 1.95)}
    runs = [run(s, o, v[s]) for o, v in losses.items() for s in range(3)]
    write_runs(conn, runs + [run(s, "sgd", 1.0, data="their.jsonl sha256:00") for s in range(3)])
    conn.close()
    base = RunConfig(preset="tiny", protocol="fair", device="cpu")
    cells = grid(["vit"], {"vit": ["adam", "adamw"]}, {"vit": ["standard"]}, range(3), base)
    (call,) = [c for c in close_calls(db, cells, RULES) if c.metric == "loss"]
    assert (call.pick, call.other, call.seeds) == (("adam", "standard"), ("adamw", "standard"), 3)
    assert call.decidable(RULES), call
    extra = more_seeds(cells, [call], RULES)
    assert sorted((c.config.optimizer, c.config.seed) for c in extra) == sorted(
        (o, s) for o in ("adam", "adamw") for s in range(3, call.needed)
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--seeds", "1"), "pass --seeds 2 or more"),
        (("--seeds", "3", "--plan"), "drop it with --plan"),
        (("--seeds", "3", "--shard", "1/2"), "run it unsharded"),
    ],
)
def test_decide_refuses_what_it_cannot_judge(extra, says, invoke, tmp_path):
    db = tmp_path / "x.sqlite"
    result = invoke("measure", "--model", "vit", "--preset", "tiny", "--decide", *extra, "--db", db)
    assert result.exit_code == 2 and says in result.output and "Traceback" not in result.output
    assert not db.exists()


def test_decide_runs_the_grid_then_lists_what_is_left(invoke, tmp_path):
    """A small grid of two close optimizers: --decide adds seeds only beyond the grid's, and the JSON lists
    the close calls left, each with the seeds it would need."""
    db = tmp_path / "d.sqlite"
    args = ("--model", "llama", "--preset", "tiny", "--optimizer", "adam", "--optimizer", "adamw")
    result = invoke(
        "measure", *args, "--strategy", "standard", "--seeds", "2", "--decide", "--db", db, "--json"
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    seeds = [r["seed"] for r in out["results"]]
    assert seeds[:4] == [0, 0, 1, 1]  # the grid, in planned order; then what --decide added
    assert all(s >= 2 for s in seeds[4:]) and max(seeds) < MAX
    for call in out["close_calls"]:  # what is left: each beyond what --decide may add, or still to see
        assert call["model"] == "llama" and call["metric"] in RULES.protocol["deciding"]["metrics"]
        assert call["seeds"] >= 2 and call["other"] != call["pick"]
        # left undecided: it would need more seeds than --decide adds, or it got all it may add
        assert call["seeds_needed"] > MAX or call["seeds"] == MAX, call
