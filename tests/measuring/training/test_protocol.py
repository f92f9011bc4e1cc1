"""The fair protocol and the honest measures: held-out loss, equal updates, time to target, "did not
train", tensor peaks that obey physics, CPU utilization that cannot exceed the cores, contention."""

import sqlite3
from dataclasses import replace

import pytest

from advisor.measuring.grid.runner import train_cell
from advisor.measuring.recipe.config import RunConfig
from advisor.measuring.training.protocol import TargetClock, Untrained, check_trained, contended

from ...conftest import RULES, one_cell, ref

TINY = RunConfig(preset="tiny", epochs=2, steps_per_epoch=3, device="cpu")


def run(**over):
    outcome = train_cell(one_cell(replace(TINY, **over).resolved()), RULES)
    assert outcome.status == "ok", outcome.error
    return outcome


def test_held_out_loss_is_evaluated_before_training_and_after_every_epoch():
    out = run(model="vit", optimizer="adam")
    f = out.figures
    assert [e["eval_loss"] is not None for e in out.epochs] == [True, True]
    assert f["eval_loss"] == out.epochs[-1]["eval_loss"] and f["eval_loss"] < f["eval_loss_initial"]
    assert 0 <= f["eval_accuracy"] <= 100
    again = run(
        model="vit", optimizer="adam", seed=1
    )  # another seed: another training set, same held-out set
    assert again.figures["eval_loss_initial"] != f["eval_loss_initial"]  # another init...
    assert again.epochs[0]["loss"] != out.epochs[0]["loss"]


def test_the_held_out_set_is_the_same_for_every_seed_and_never_trained_on():
    from advisor.measuring.data.corpus import _generated, load_heldout
    from advisor.measuring.model.builder import reference_shape
    from advisor.measuring.model.families import family

    fam, shape = reference_shape(ref("llama"), "tiny", RULES)
    a, _ = load_heldout(fam, shape, 8)
    b, _ = load_heldout(fam, shape, 8)
    assert [list(x) for x in a["ids"]] == [list(x) for x in b["ids"]]
    train_plots = set(_generated(64, 0)["plot"])
    from advisor.measuring.data.corpus import EVAL_SEED

    held_plots = _generated(8, EVAL_SEED)["plot"]
    assert family("decoder", RULES) is fam and not train_plots >= set(held_plots)
    validation, source = load_heldout(fam, shape, 8, "validation")
    assert "(validation)" in source and "(test)" in load_heldout(fam, shape, 8)[1]
    assert [list(x) for x in validation["ids"]] != [list(x) for x in a["ids"]]
    with pytest.raises(ValueError, match="validation, test|test, validation"):
        load_heldout(fam, shape, 8, "train")


def test_tuning_runs_choose_on_the_validation_set_and_grid_runs_report_the_test_set():
    grid_run = run(model="llama", optimizer="adam")
    tuning_run = run(model="llama", optimizer="adam", role="tuning")
    assert grid_run.figures["eval_loss_initial"] != tuning_run.figures["eval_loss_initial"]


def test_accumulation_makes_as_many_updates_as_standard_under_the_fair_protocol():
    std = run(model="llama", optimizer="sgd", strategy="standard")
    acc = run(model="llama", optimizer="sgd", strategy="accumulation", accumulation_steps=2)
    assert [e["steps"] for e in std.epochs] == [e["steps"] for e in acc.epochs] == [3, 3]
    assert [e["micro_batches"] for e in acc.epochs] == [6, 6]  # k micro-batches per update
    assert [e["micro_batches"] for e in std.epochs] == [3, 3]
    paper = run(
        model="llama", optimizer="sgd", strategy="accumulation", accumulation_steps=3, protocol="paper"
    )
    assert [e["steps"] for e in paper.epochs] == [
        1,
        1,
    ]  # the paper's: the same micro-batches, k times fewer updates
    assert paper.epochs[0]["eval_loss"] is None and "eval_loss" not in paper.figures


def test_accumulation_at_equal_samples_sees_a_plain_steps_data_in_k_times_fewer_updates():
    """The arm that tells accumulation's effect from its data budget: as many micro-batches per epoch as a
    plain step (the same samples), k times fewer updates."""
    std = run(model="llama", optimizer="sgd", strategy="standard")
    arm = run(model="llama", optimizer="sgd", strategy="accumulation-equal-samples", accumulation_steps=3)
    assert [e["micro_batches"] for e in arm.epochs] == [e["micro_batches"] for e in std.epochs] == [3, 3]
    assert [e["steps"] for e in arm.epochs] == [1, 1]
    cfg = replace(
        TINY, model="llama", optimizer="sgd", strategy="accumulation-equal-samples", accumulation_steps=2
    )
    dropped = train_cell(one_cell(cfg.resolved()), RULES)  # 3 micro-batches cannot make whole windows of 2
    assert dropped.status == "failed" and "must be a multiple of the accumulation steps" in dropped.error


def test_checkpointing_trains_identically_and_holds_fewer_activation_bytes():
    std = run(model="llama", optimizer="sgd", strategy="standard")
    ckpt = run(model="llama", optimizer="sgd", strategy="checkpointing")
    assert [e["loss"] for e in std.epochs] == [e["loss"] for e in ckpt.epochs]  # bit-identical, dropout off
    assert ckpt.figures["eval_loss"] == std.figures["eval_loss"]
    assert ckpt.figures["forward_activations_gb"] < 0.5 * std.figures["forward_activations_gb"]
    assert ckpt.figures["tensor_peak_gb"] < std.figures["tensor_peak_gb"]


def test_adams_tensor_peak_exceeds_sgds_by_its_two_state_buffers():
    sgd = run(model="llama", optimizer="sgd")
    adam = run(model="llama", optimizer="adam")
    params = sgd.figures["tensor_parameters_gb"]
    assert sgd.figures["tensor_optimizer_gb"] == 0
    assert adam.figures["tensor_optimizer_gb"] == pytest.approx(2 * params, rel=0.01)  # exp_avg, exp_avg_sq
    extra = adam.figures["tensor_peak_gb"] - sgd.figures["tensor_peak_gb"]
    assert 2 * params * 0.95 <= extra <= 4 * params  # the two buffers (and the step's temporaries)


def test_utilization_and_throughput_are_honest():
    out = run(model="modernbert", optimizer="adam")
    f = out.figures
    assert all(0 < e["cpu_util"] <= 100 for e in out.epochs)
    assert 0 < f["cpu_util"] <= 100
    assert f["samples_per_s"] > 0 and f["tokens_per_s"] > f["samples_per_s"]
    assert f["achieved_gflops"] > 0 and 0 < f["mfu"] < 100
    assert f["peak_gflops"] > f["achieved_gflops"]
    assert f["contended"] in (0.0, 1.0) and f["others_cpu"] >= 0


def test_bf16_mixed_trains_on_the_cpu():
    out = run(model="vit", optimizer="adam", dtype="bf16-mixed")
    assert out.figures["eval_loss"] < out.figures["eval_loss_initial"]


def test_a_run_that_does_not_learn_did_not_train():
    outcome = train_cell(one_cell(replace(TINY, model="vit", optimizer="sgd", lr=1e-9).resolved()), RULES)
    assert outcome.status == "untrained"
    assert "did not train" in outcome.error and "held-out loss" in outcome.error
    assert "eval_loss" in outcome.figures  # its figures are kept: it is an outcome, not a crash


def test_time_to_target_is_reached_or_not():
    reached = run(model="vit", optimizer="adam", target_loss=10.0)
    f = reached.figures
    assert f["target_reached"] == 1 and f["steps_to_target"] == 3 and f["time_to_target"] > 0
    missed = run(model="vit", optimizer="adam", target_loss=0.001)
    assert missed.figures["target_reached"] == 0 and "time_to_target" not in missed.figures


def test_the_target_is_checked_between_epochs_every_few_updates():
    """rules/protocol.toml [target_checks] every = 1: a target the first update reaches is reached at
    update 1, not at the end of the epoch (update 3), and the checks' time is not training time."""
    import copy

    rules = copy.deepcopy(RULES)
    rules.protocol["target_checks"] = {"every": 1}
    outcome = train_cell(
        one_cell(replace(TINY, model="vit", optimizer="adam", target_loss=10.0).resolved()), rules
    )
    assert outcome.status == "ok" and outcome.figures["steps_to_target"] == 1
    assert 0 < outcome.figures["time_to_target"]


def test_target_clock_and_trained_check_in_isolation():
    clock = TargetClock(2.0)
    clock.check(2.5, 10, 1.0)
    clock.check(1.9, 20, 2.0)
    clock.check(1.0, 30, 3.0)  # the first time counts
    assert (clock.steps, clock.seconds) == (20, 2.0)
    assert TargetClock(None).metrics() == []
    check_trained(3.0, 2.9)
    with pytest.raises(Untrained, match="did not train"):
        check_trained(3.0, 3.0)


def test_contention_is_flagged_from_other_processes_or_spread():
    assert not contended([{"others_cpu": 0.05, "step_time_cv": 0.1}], RULES)
    assert contended([{"others_cpu": 0.05, "step_time_cv": 0.1}, {"others_cpu": 0.9}], RULES)
    assert contended([{"others_cpu": None, "step_time_cv": 0.8}], RULES)
    assert not contended([{"others_cpu": None, "step_time_cv": 0.8}], RULES, steps_vary=True)  # a line search


def test_the_paper_protocol_runs_cgd_as_the_paper_did():
    fair, paper = TINY.resolved(), replace(TINY, protocol="paper").resolved()
    assert (fair.cgd_line_search, fair.cgd_restart_every, fair.cgd_beta_max) == ("armijo", 10, 1.0)
    assert (paper.cgd_line_search, paper.cgd_restart_every) == ("fixed", 0)
    assert paper.as_dict()["cgd_beta_max"] == "inf"
    paper_vit = replace(TINY, protocol="paper", preset="paper", model="vit").resolved()
    assert paper_vit.lr == 3e-4  # the paper's one rate per model, under its protocol only
    assert replace(TINY, preset="paper", model="vit", optimizer="sgd").resolved().lr == 0.1


def test_each_rate_is_tuned_with_the_strategy_that_makes_the_cells_update():
    """Checkpointing computes a plain step's update and shares its rate; accumulation (and checkpointing with
    it) is tuned at its own k-times larger batch; the equal-samples arm, k times fewer of those updates, on
    its own (issue 22: a rate tuned at one batch and reused at 4x decides the comparison)."""
    from advisor.measuring.grid.tuning import tuning_key

    with_ = {
        s: tuning_key(replace(TINY, model="llama", optimizer="adam", strategy=s), RULES).strategy
        for s in RULES.strategies
    }
    assert with_ == {
        "standard": "standard",
        "checkpointing": "standard",
        "selective-checkpointing": "standard",
        "accumulation": "accumulation",
        "checkpointing+accumulation": "accumulation",
        "accumulation-equal-samples": "accumulation-equal-samples",
        "lora": "lora",
    }


def fake_tuning(db, best: dict[str, float], tried: list):
    """A grid runner that stores each tuning run as the grid would, its held-out loss a parabola in log rate
    with its minimum at `best[strategy]`; every rate it trains is appended to `tried` as (strategy, rate)."""
    import math

    from advisor.kb import store
    from advisor.kb.open import open_for_writing
    from advisor.measuring.grid.runner import TUNING_SOURCE
    from advisor.measuring.machine.hardware import describe, resolve_device

    open_for_writing(db).close()

    def fake_run(cells):
        conn = open_for_writing(db)
        runs = []
        for c in cells:
            cfg = replace(c.config.resolved(), device=resolve_device(c.config.device))
            tried.append((cfg.strategy, cfg.lr) if len(best) < 3 else (cfg.optimizer, cfg.lr, cfg.adamw_lr))
            at = best.get(cfg.optimizer, best.get(cfg.strategy))  # by optimizer where given, else strategy
            loss = 1.0 + (math.log10(cfg.lr) - math.log10(at)) ** 2
            runs.append(
                dict(
                    source=TUNING_SOURCE,
                    cell_key=cfg.cell_key(),
                    model="llama",
                    family="decoder",
                    optimizer=cfg.optimizer,
                    strategy=cfg.strategy,
                    preset="tiny",
                    seed=cfg.seed,
                    protocol="fair",
                    hardware=describe(cfg.device)["hardware"],
                    status="ok",
                    config={"lr": cfg.lr},
                    metrics=[dict(name="eval_loss", value=loss, unit="nats/target")],
                )
            )
        store.write_runs(conn, runs)
        conn.close()

    return fake_run


def test_a_rate_chosen_at_the_edge_of_the_grid_extends_it_until_the_best_lies_inside(tmp_path):
    """--tune-lr on a held-out loss whose best rate lies two grid steps above the top of the grid: the grid
    grows a step at a time past that edge, and the rate chosen is inside what was tried."""
    from advisor.measuring.grid.tuning import rates, tune, tuning_key
    from advisor.measuring.recipe.config import GridCell

    db = tmp_path / "tuning.sqlite"
    cell = GridCell(RunConfig(model="llama", preset="tiny", optimizer="sgd", device="cpu"), ref("llama"))
    top = max(rates(tuning_key(cell.config, RULES), RULES))
    best = top * 10  # two half-decade steps beyond the grid
    tried = []
    fake_run = fake_tuning(db, {"standard": best}, tried)

    (tuned_cell,), (chosen,) = tune([cell], db, fake_run, RULES)
    assert len(tried) == 5 + 3  # the grid, two steps up to the best, and one past it to see it is
    assert chosen.lr == pytest.approx(best, rel=0.01) and not chosen.at_edge
    assert tuned_cell.config.lr == chosen.lr and max(tuned_cell.config.lr_grid) > chosen.lr


def test_every_optimizer_tries_as_many_rates_and_muons_adamw_part_takes_adamws_rate(tmp_path):
    """Muon's best lies two steps above its grid (extended to 8 rates), AdamW's inside (5): AdamW is widened
    to 8 too, alternately above and below, and Muon's runs train their AdamW part at AdamW's choice."""
    from advisor.measuring.grid.tuning import rates, tune, tuning_key
    from advisor.measuring.recipe.config import GridCell

    db = tmp_path / "tuning.sqlite"
    cells = [
        GridCell(RunConfig(model="llama", preset="tiny", optimizer=o, device="cpu"), ref("llama"))
        for o in ("muon", "adamw")
    ]
    muon_grid = rates(tuning_key(cells[0].config, RULES), RULES)
    adamw_grid = rates(tuning_key(cells[1].config, RULES), RULES)
    tried = []
    best = {"muon": max(muon_grid) * 10, "adamw": adamw_grid[1], "unused": 1.0}
    (muon, adamw), chosen = tune(cells, db, fake_tuning(db, best, tried), RULES)
    by = {t.optimizer: t for t in chosen}
    assert len(by["muon"].tried) == len(by["adamw"].tried) == 8  # one width for both
    assert by["adamw"].lr == adamw_grid[1] and by["muon"].lr == pytest.approx(best["muon"], rel=0.01)
    widened = sorted(lr for o, lr, _ in tried if o == "adamw")
    assert widened[0] < min(adamw_grid) and widened[-1] > max(adamw_grid)  # both ends
    assert {a for o, _, a in tried if o == "muon"} == {by["adamw"].lr}  # Muon's AdamW part at AdamW's rate
    assert {a for o, _, a in tried if o == "adamw"} == {None}
    assert muon.config.adamw_lr == by["adamw"].lr and adamw.config.adamw_lr is None
    assert "adamw_lr" in muon.config.as_dict() and "adamw_lr" not in adamw.config.as_dict()


def test_accumulation_is_tuned_at_its_own_batch_from_the_plain_steps_choice(tmp_path):
    """An accumulation cell's rate: the plain step's grid first (its choice is where accumulation starts),
    then accumulation's own runs at the rates within `around` steps of that choice, extended past the top
    where its best lies higher (a 4x batch takes a larger rate); the cell runs at accumulation's rate."""
    from advisor.measuring.grid.tuning import rates, tune, tuning_key
    from advisor.measuring.recipe.config import GridCell

    cfg = RunConfig(model="llama", preset="tiny", optimizer="sgd", strategy="accumulation", device="cpu")
    grid = rates(tuning_key(replace(cfg, strategy="standard"), RULES), RULES)  # 0.01 ... 1
    tried = []
    fake_run = fake_tuning(tmp_path / "t.sqlite", {"standard": grid[2], "accumulation": grid[4]}, tried)
    (cell,), chosen = tune([GridCell(cfg, ref("llama"))], tmp_path / "t.sqlite", fake_run, RULES)
    assert [lr for s, lr in tried if s == "standard"] == list(grid)  # inside: no extension
    own = [lr for s, lr in tried if s == "accumulation"]
    assert own[:3] == list(grid[1:4])  # around = 1: a step either side of the plain step's choice
    assert own[3] == pytest.approx(grid[4], rel=0.01) and len(own) == 5  # up to the best, and one past it
    by = {t.strategy: t for t in chosen}
    assert by["standard"].lr == grid[2] and by["accumulation"].lr == own[3] and not by["accumulation"].at_edge
    assert cell.config.lr == own[3] and set(cell.config.lr_grid) == set(own)


def test_a_tuning_run_that_trained_on_another_host_is_not_repeated_but_its_grid_runs_and_ooms_are(tmp_path):
    """A tuning run is read for its held-out loss, which reproduces across CPUs: --tune-lr on a new host
    chooses from what another host's runs found and claims none of them again; a grid run (its times are
    the host's) and a tuning run that ran out of memory there are this host's to run."""
    from advisor.kb import lease, store
    from advisor.kb.open import open_for_writing
    from advisor.measuring.grid.runner import TUNING_SOURCE
    from advisor.measuring.grid.tuning import _choose, rates, tuning_key
    from advisor.measuring.planning.history import cells_done
    from advisor.measuring.recipe.config import GridCell

    db = tmp_path / "t.sqlite"
    key = tuning_key(GridCell(replace(TINY, model="llama", optimizer="sgd"), ref("llama")).config, RULES)
    grid = rates(key, RULES)
    elsewhere = "CPU: Another (2 cores)"

    def stored(lr, source=TUNING_SOURCE, status="ok", loss=None):
        cfg = replace(key, lr=lr).resolved()
        metrics = [dict(name="eval_loss", value=loss, unit="nats/target")] if loss is not None else []
        return dict(
            **dict(source=source, cell_key=cfg.cell_key(), model="llama", family="decoder", optimizer="sgd"),
            **dict(strategy="standard", preset="tiny", seed=cfg.seed, protocol="fair", hardware=elsewhere),
            **dict(status=status, config={"lr": lr}, metrics=metrics),
        )

    conn = open_for_writing(db)
    store.write_runs(conn, [stored(lr, loss=1 + abs(i - 1)) for i, lr in enumerate(grid[:-1])])
    store.write_runs(conn, [stored(grid[-1], status="oom"), stored(grid[0], source="measured", loss=1.0)])
    here = replace(key, lr=grid[1]).resolved()
    assert _choose(key, grid, db).lr == grid[1]  # the other host's best, its oom not a loss
    run = dict(stored(grid[1]), hardware="CPU: This one (2 cores)", status="running")
    assert lease.claim_run(conn, run, lambda _: True) == (None, "ok")  # trained elsewhere: not again
    for lr, source in ((grid[-1], TUNING_SOURCE), (grid[0], "measured")):  # its oom, a grid run: run here
        run = dict(stored(lr, source=source), hardware="CPU: This one (2 cores)", status="running")
        assert lease.claim_run(conn, run, lambda _: True)[0] is not None, (lr, source)
    conn.close()
    done = cells_done(sqlite3.connect(db), "CPU: This one (2 cores)")
    assert (here.cell_key(), here.seed) in done and len(done) == len(grid) - 1
