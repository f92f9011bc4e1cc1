"""The code's shape, as the design promises it: one write path, one name per module of advisor."""

import importlib.util
import re
from collections import Counter
from pathlib import Path

from advisor.places import shipped_rules_dir
from advisor.rules import load_rules

REPO = Path(__file__).resolve().parent.parent


def sources(*packages):
    return [p for pkg in packages for p in (REPO / pkg).rglob("*.py")]


def test_every_insert_and_transaction_is_in_the_store():
    writers = {
        p.relative_to(REPO).as_posix()
        for p in sources("advisor")
        if re.search(r"INSERT INTO|BEGIN IMMEDIATE|INSERT OR REPLACE", p.read_text())
    }
    # the store; the summaries it maintains inside its transactions; the migrations' own SQL
    assert writers == {"advisor/kb/store.py", "advisor/kb/summaries.py", "advisor/kb/migrations.py"}
    users = {
        p.relative_to(REPO).as_posix()
        for p in sources("advisor", "bench")
        if re.search(
            r"^\s*(from advisor\.kb import .*\bsummaries\b|from advisor\.kb\.summaries |import advisor\.kb\.summaries)",
            p.read_text(),
            re.M,
        )
    }
    # summaries change only with the runs they summarise, and when a migration rebuilds them
    assert users == {"advisor/kb/store.py", "advisor/kb/migrations.py"}


def _house():
    """bench/house.py, the house's figures (bench/ is no package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("house", REPO / "bench" / "house.py")
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    return house


def test_no_sql_outside_the_kb():
    """One door to SQL: every statement and `.execute*(` call is advisor/kb/'s."""
    assert _house().sql_outside_kb() == []


def test_the_sql_check_finds_a_query_and_a_call_outside_the_kb(tmp_path, monkeypatch):
    house = _house()
    (tmp_path / "kb").mkdir()
    (tmp_path / "kb" / "reader.py").write_text('Q = "SELECT a FROM runs"\n')
    (tmp_path / "site.py").write_text('Q = "SELECT id FROM runs WHERE grp = ?"\nW = "Select a colour"\n')
    (tmp_path / "page.py").write_text("def f(conn):\n    conn.execute(Q)\n")
    monkeypatch.setattr(house, "ROOT", tmp_path)
    assert [h.split("/")[-1] for h in house.sql_outside_kb()] == ["page.py:2", "site.py:1"]


def test_no_two_modules_of_advisor_share_a_name():
    names = Counter(p.name for p in sources("advisor") if p.name not in ("__init__.py", "__main__.py"))
    assert [n for n, k in names.items() if k > 1] == []


def test_no_family_dispatch_outside_the_family_modules():
    """What a family can do is declared by the family (rules/families.toml: its inputs; its module in
    advisor/measuring/model/families/): no code elsewhere compares a family's name to decide."""
    names = "|".join(sorted(load_rules(str(shipped_rules_dir())).families))
    compared = rf"""(==|!=)\s*['"]({names})['"]"""
    member = rf"""\b(if|and|or|return|=)\s[^\n]*\bin\s*[(\[{{]\s*['"]({names})['"]"""
    dispatch = re.compile(f"{compared}|{member}|family\\s*==\\s*['\"]")
    chains = [
        p.relative_to(REPO).as_posix()
        for p in sources("advisor", "bench")
        if "families" not in p.parts and dispatch.search(p.read_text())
    ]
    assert chains == []
