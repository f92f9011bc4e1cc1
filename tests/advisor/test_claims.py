"""`advisor claims`: the paper's claims as data, re-checked against an evidence source."""

import json

from advisor.claims import FAILS, HOLDS, UNKNOWN, load_claims


def test_at_least_twelve_claims_with_the_papers_numbers():
    claims = load_claims()
    assert len(claims) >= 12
    assert len({c["id"] for c in claims}) == len(claims)
    assert all(c.get("paper") and c.get("text") for c in claims)
    kinds = {c["kind"] for c in claims}
    assert {"ratio", "ratio_all", "range", "best", "diverged", "never_best"} <= kinds


def test_every_claim_holds_on_the_papers_own_figures(invoke):
    out = json.loads(invoke("claims", "--source", "paper", "--json").output)
    verdicts = {c["id"]: c["verdict"] for c in out["claims"]}
    assert set(verdicts.values()) == {HOLDS}, {k: v for k, v in verdicts.items() if v != HOLDS}
    ratio = next(c for c in out["claims"] if c["id"] == "adam-vs-adadelta-encoder")
    assert "0.71" in ratio["found"] and "0.05" in ratio["found"] and "x14.2" in ratio["found"]


def test_a_claim_that_fails_and_one_without_evidence(invoke, tmp_path, kb_path):
    import sqlite3

    conn = sqlite3.connect(kb_path)  # make the paper say Adam beat Adadelta on ModernBERT
    conn.execute(
        "UPDATE metrics SET value = 0.01 WHERE name = 'loss' AND run_id = (SELECT id FROM runs WHERE "
        "model = 'modernbert' AND optimizer = 'adam' AND strategy = 'standard' AND source LIKE 'paper:%')"
    )
    conn.execute(
        "DELETE FROM metrics WHERE name = 'gpu_util' AND run_id IN (SELECT id FROM runs WHERE model = 'vit' "
        "AND source LIKE 'paper:%')"
    )
    conn.commit()
    out = json.loads(invoke("claims", "--json").output)
    verdicts = {c["id"]: c for c in out["claims"]}
    assert verdicts["adam-vs-adadelta-encoder"]["verdict"] == FAILS
    assert "x0.2" in verdicts["adam-vs-adadelta-encoder"]["found"]
    assert verdicts["gpu-utilization-vision"]["verdict"] == UNKNOWN
    assert verdicts["best-loss-paths"]["verdict"] == FAILS  # Adam now wins ModernBERT's loss


def test_markdown_report(invoke, tmp_path):
    path = tmp_path / "claims.md"
    result = invoke("claims", "--source", "paper", "--markdown", path)
    assert result.exit_code == 0 and "The paper's claims, re-checked" in result.output
    text = path.read_text()
    assert text.startswith("# The paper's claims against paper evidence")
    assert (
        "advisor claims --source paper --markdown" in text
        and "| claim | paper | found here | verdict |" in text
    )


def test_committed_reproduction_report_is_current(invoke, tmp_path):
    """docs/claims.md is what `make claims` writes from the shipped reference measurements."""
    from pathlib import Path

    from advisor.claims import check_all, markdown
    from advisor.kb import open_for_reading

    committed = Path(__file__).resolve().parents[2] / "docs" / "claims.md"
    verdicts = check_all(open_for_reading(None), "measured")
    expected = markdown(verdicts, "measured", "advisor claims --source measured --markdown docs/claims.md")
    assert committed.read_text() == expected, "docs/claims.md is stale: run `make claims`"
