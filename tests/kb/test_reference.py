"""The shipped reference measurements (kb/inputs/measured-cpu-*.json, `make reference`) obey physics, hold
the grid at two scales with the fine-tuning menu's optimizers at one, and say which test decided each
answer."""

import json
import sqlite3
from collections import defaultdict

import pytest

from ..conftest import RULES, SHIPPED_KB

GB = 1e9


def figures(sql: str, *params) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{SHIPPED_KB}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def per_run(*names: str) -> dict[tuple, dict[str, float]]:
    """{(family, optimizer, strategy, seed): {measure: value}} over the measured grid's ok runs."""
    marks = ", ".join("?" * len(names))
    out: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in figures(
        "SELECT r.family, r.optimizer, r.strategy, r.seed, m.name, m.value FROM runs r "
        f"JOIN metrics m ON m.run_id = r.id WHERE r.source = 'measured' AND r.preset = 'small' AND r.status = 'ok' "
        f"AND m.name IN ({marks})",
        *names,
    ):
        out[(r["family"], r["optimizer"], r["strategy"], r["seed"])][r["name"]] = r["value"]
    return out


FAMILIES = {"vision", "encoder", "decoder", "vlm"}


def grid(family: str) -> set[tuple[str, str]]:
    """The family's grid as the rules declare it (nanoVLM: no CGD, as the paper)."""
    fam = RULES.families[family]
    return {(o, s) for o in fam.grid_optimizers for s in fam.grid_strategies}


MENU = {(o, "standard") for o in ("lion_32bit", "schedule_free_adamw", "muon", "adamw_torch_8bit")} | {
    ("adamw", "selective-checkpointing")
}


LORA = {("adamw", "standard"), ("adamw", "lora")}  # full fine-tuning and LoRA of each family's base


def test_the_reference_grid_is_the_fair_protocol_with_tuned_rates_and_three_seeds():
    """The paper's grid at two scales (tiny and small), the menu's optimizers, selective checkpointing and
    accumulation at equal samples at small, full and LoRA fine-tuning of each family's base: every
    configuration with 3 seeds, at a rate tuned on its own seed."""
    runs = figures(
        "SELECT family, preset, optimizer, strategy, protocol, count(DISTINCT seed) AS seeds, "
        "min(json_extract(config, '$.lr_grid') IS NOT NULL) AS tuned FROM runs WHERE source = 'measured' "
        "GROUP BY family, preset, optimizer, strategy"
    )
    cells: dict[tuple, set] = defaultdict(set)
    for r in runs:
        assert (r["protocol"], r["seeds"], r["tuned"]) == ("fair", 3, 1), dict(r)
        cells[(r["family"], r["preset"])].add((r["optimizer"], r["strategy"]))
    assert set(cells) == {(f, p) for f in FAMILIES for p in ("tiny", "small", "custom")}
    for (family, preset), have in cells.items():
        arm = {(o, "accumulation-equal-samples") for o, _ in grid(family)}  # accumulation at equal samples
        expected = {"small": grid(family) | MENU | arm, "tiny": grid(family), "custom": LORA}[preset]
        assert have == expected, (family, preset)
    tuning = figures("SELECT count(*) AS n FROM runs WHERE source = 'measured:tuning'")[0]["n"]
    optimizers = sum(len({o for o, _ in c}) for c in cells.values())
    assert tuning >= 5 * optimizers  # five rates or more per optimizer and model (more: a grid extended)


def test_every_grid_rate_was_tuned_at_the_cells_own_effective_batch_and_lies_inside_its_grid():
    """Each measured run's rate is the best of tuning runs made with the strategy that makes its update
    (accumulation with accumulation, checkpointing with a plain step, LoRA with its adapters: rules/protocol.toml
    [tuning.with]), and no chosen rate sits on the edge of the rates tried, but Muon's on ViT (docs/measuring.md:
    a bound)."""
    from advisor.measuring.grid.tuning import tuning_strategy

    tuned = defaultdict(set)  # (model, preset, optimizer, strategy tuned with) -> rates tried
    for r in figures(
        "SELECT model, preset, optimizer, strategy, config FROM runs WHERE source = 'measured:tuning'"
    ):
        tuned[(r["model"], r["preset"], r["optimizer"], r["strategy"])].add(json.loads(r["config"])["lr"])
    edge = set()
    for r in figures("SELECT model, preset, optimizer, strategy, config FROM runs WHERE source = 'measured'"):
        config = json.loads(r["config"])
        key = (r["model"], r["preset"], r["optimizer"], tuning_strategy(r["strategy"], RULES))
        # the rates its tuning tried (a later re-measure may have widened the grid for its own runs)
        grid = set(config["lr_grid"])
        assert config["lr"] in grid and grid <= tuned[key], (key, config["lr"])
        if config["lr"] in (min(grid), max(grid)):
            edge.add(key[:3])
    assert edge <= {("vit", "small", "muon")}, edge


def test_each_family_has_a_base_pretrained_here_fine_tuned_in_full_and_with_lora():
    """One base per family (advisor pretrain: the recipe of rules/protocol.toml, recorded with every run), its
    runs pretrained; LoRA's optimizer state is its adapters' (and ViT's head's), a fraction of full's."""
    runs = figures(
        "SELECT r.family, r.model, r.strategy, r.pretrained, r.config, m.value AS state FROM runs r JOIN metrics m "
        "ON m.run_id = r.id AND m.name = 'tensor_optimizer_gb' WHERE r.source = 'measured' AND r.preset = 'custom'"
    )
    state: dict[tuple, list] = defaultdict(list)
    for r in runs:
        ref = RULES.families[r["family"]].reference_model
        config = json.loads(r["config"])
        assert r["model"] == f"{ref}-small-pretrained" and r["pretrained"] == 1
        assert (
            config["base"]["recipe"] == RULES.protocol["pretraining"] and config["base"]["preset"] == "small"
        )
        assert config["base"]["final"]["heldout_loss"] < config["base"]["final"]["task_loss"]  # its genres
        if r["strategy"] == "lora":
            assert (config["lora_r"], config["lora_alpha"]) == (16, 32)
        state[(r["family"], r["strategy"])].append(r["state"])
    assert {f for f, _ in state} == FAMILIES
    for family in FAMILIES:
        lora, full = max(state[(family, "lora")]), min(state[(family, "standard")])
        assert lora < 0.5 * full, (family, lora, full)


def test_a_base_answers_its_own_questions_and_fit_quotes_it_beside_lora(invoke):
    for family in FAMILIES:
        ref = RULES.families[family].reference_model
        default = json.loads(invoke("recommend", "--arch", family, "--json").output)
        assert default["evidence"]["model"] != f"{ref}-small-pretrained"
    import advisor

    rows = advisor.fit("llama-3.2-1b", gpu="RTX4090", adapters=("lora",), optimizers=("adamw",)).rows
    assert (
        "llama-small-pretrained" in rows[0].adapter_evidence
        and "against full fine-tuning's" in rows[0].adapter_evidence
    )


def test_adams_tensor_peak_exceeds_sgds_by_its_two_state_buffers():
    """Adam keeps two fp32 buffers per parameter (exp_avg, exp_avg_sq); SGD without momentum none."""
    runs = per_run("tensor_peak_gb", "tensor_parameters_gb", "tensor_optimizer_gb")
    compared = 0
    for (family, optimizer, strategy, seed), adam in runs.items():
        sgd = runs.get((family, "sgd", strategy, seed))
        if optimizer != "adam" or sgd is None:
            continue
        params = adam["tensor_parameters_gb"]
        assert adam["tensor_optimizer_gb"] == pytest.approx(2 * params, rel=0.01)
        assert sgd.get("tensor_optimizer_gb", 0.0) == pytest.approx(0.0, abs=1e-6)
        extra = adam["tensor_peak_gb"] - sgd["tensor_peak_gb"]
        # the two buffers, and at most as much again for the step's temporaries (torch's foreach Adam)
        assert 2 * params * 0.95 <= extra <= 4 * params, (family, strategy, seed, extra / params)
        compared += 1
    assert compared == 4 * 4 * 3  # every family, strategy (accumulation at equal samples too) and seed


def test_checkpointing_holds_fewer_activation_bytes_than_standard():
    runs = per_run("tensor_activations_gb", "forward_activations_gb")
    compared = 0
    for (family, optimizer, strategy, seed), ckpt in runs.items():
        standard = runs.get((family, optimizer, "standard", seed))
        if strategy != "checkpointing" or standard is None:
            continue
        assert ckpt["forward_activations_gb"] < standard["forward_activations_gb"], (family, optimizer, seed)
        compared += 1
    assert compared >= 4 * 6 * 3  # every family, optimizer and seed


def test_no_utilization_above_100_percent():
    worst = figures(
        "SELECT max(e.cpu_util) AS epoch, (SELECT max(value) FROM metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE r.source LIKE 'measured%' AND m.name = 'cpu_util') AS run FROM epochs e JOIN runs r ON "
        "r.id = e.run_id WHERE r.source LIKE 'measured%'"
    )[0]
    assert worst["epoch"] is not None and 0 < worst["epoch"] <= 100 and 0 < worst["run"] <= 100


def test_every_measured_flowchart_path_says_which_test_decided_it(invoke):
    """Each path names the test against its runner-up: separated ones at Holm-adjusted p < 0.05, tied ones
    not. The physically determined paths (memory: checkpointing holds fewer bytes, SGD no state) separate
    in every family; most others are true ties at 3 seeds (Adam vs AdamW over 32 updates, per-step times
    of optimizers within a few % of each other at this size): see docs/claims.md and the issue note."""
    out = json.loads(invoke("flowchart", "--source", "measured", "--json").output)
    paths = [p for p in out["paths"] if p["optimizer"]]
    assert len(paths) == 16
    for p in paths:
        test = p["separated_by"]
        assert test["kind"] == "paired t" and test["n"] == 3, p
        # separated from the runner-up when not tied (a tied pick may be tied with a configuration further
        # down that no test can separate, e.g. one with a failed seed, while the runner-up is separated)
        assert p["tied"] or test["p_holm"] < 0.05 or test["decided_by"], p
        if test["p_holm"] >= 0.05 and not test["decided_by"]:
            assert p["tied"], p
    memory = [p for p in paths if p["metric"] == "memory"]
    assert [(p["optimizer"], p["strategy"], p["tied"]) for p in memory] == [
        ("sgd", "checkpointing", False)
    ] * 4


def test_the_shipped_groups_are_numbered_in_the_order_of_their_inputs():
    """Ids people type follow the inputs' order (kb/inputs/ORDER): the paper's four, then each grid's tuning and
    measured groups by family, small before tiny (tuning from each host that chose a rate: the plain step's on
    the AMD EPYC, the accumulated ones' on the Xeon that measured the grid), then the parts added later: LoRA's
    bases, the published tables (Wen et al.'s four sizes, QLoRA's RoBERTa-large), Muon re-measured against
    AdamW on the AMD EPYC. A new input never renumbers the groups before it."""
    from itertools import groupby

    paper = [RULES.families[f].reference_model for f in ("encoder", "decoder", "vlm", "vision")]
    grid = ["vit", "modernbert", "llama", "nanovlm"]
    bases = [f"{m}-small-pretrained" for m in grid]
    rows = figures("SELECT id, source, hardware, model, preset FROM groups ORDER BY id")
    assert [r["id"] for r in rows] == list(range(1, len(rows) + 1))
    blocks = [
        (k, [(r["hardware"], r["model"]) for r in g])
        for k, g in groupby(rows, lambda r: (r["source"], r["preset"]))
    ]
    assert [k for k, _ in blocks] == [
        ("paper:2608.08961", "paper"),
        *[(source, preset) for preset in ("small", "tiny") for source in ("measured:tuning", "measured")],
        ("measured:tuning", "custom"),
        ("measured", "custom"),
        ("paper:2509.02046", "paper"),
        ("paper:2305.14314", "paper"),
        ("measured", "small"),
    ]
    published = {
        "paper:2509.02046": [f"llama-{size}-wen" for size in ("130m", "300m", "520m", "1.2b")],
        "paper:2305.14314": ["roberta-large-qlora"],
    }
    for (source, preset), members in blocks:
        models = published.get(source) or {"paper": paper, "custom": bases}.get(preset, grid)
        hosts = list(dict.fromkeys(h for h, _ in members))
        assert members == [(h, m) for h in hosts for m in models], preset  # each host's groups by family


def test_the_muon_re_measure_gave_adamw_and_muon_one_grid_width_and_muon_adamws_rate():
    """The re-measure under one protocol (kb/inputs/measured-cpu-epyc-muon*.json): per model, AdamW and Muon
    tried as many rates on the tuning seed, and Muon's AdamW part trained at the rate chosen for AdamW."""
    widths = defaultdict(dict)
    for r in figures(
        "SELECT model, optimizer, count(DISTINCT json_extract(config, '$.lr')) AS n FROM runs "
        "WHERE source = 'measured:tuning' AND hardware LIKE '%EPYC%' AND preset = 'small' AND strategy = 'standard' "
        "AND (optimizer = 'adamw' OR (optimizer = 'muon' AND json_extract(config, '$.adamw_lr') IS NOT NULL)) "
        "GROUP BY model, optimizer"
    ):
        widths[r["model"]][r["optimizer"]] = r["n"]
    assert set(widths) == {"vit", "modernbert", "llama", "nanovlm"}
    assert all(w["adamw"] == w["muon"] >= 6 for w in widths.values()), widths
    chosen = {
        r["model"]: json.loads(r["config"])["lr"]
        for r in figures(
            "SELECT model, config FROM runs WHERE source = 'measured' AND optimizer = 'adamw' "
            "AND hardware LIKE '%EPYC%'"
        )
    }
    for r in figures(
        "SELECT model, config FROM runs WHERE source = 'measured' AND optimizer = 'muon' "
        "AND hardware LIKE '%EPYC%'"
    ):
        assert json.loads(r["config"])["adamw_lr"] == chosen[r["model"]]
