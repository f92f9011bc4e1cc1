"""The code's shape, as the design promises it: one write path, one name per module across both packages."""

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def sources(*packages):
    return [p for pkg in packages for p in (REPO / pkg).rglob("*.py")]


def test_every_insert_and_transaction_is_in_the_store():
    writers = {
        p.relative_to(REPO).as_posix()
        for p in sources("advisor", "measure")
        if re.search(r"INSERT INTO|BEGIN IMMEDIATE|INSERT OR REPLACE", p.read_text())
    }
    # the store; the summaries it maintains inside its transactions; the migrations' own SQL
    assert writers == {"advisor/store.py", "advisor/summaries.py", "advisor/schema.py"}
    users = {
        p.relative_to(REPO).as_posix()
        for p in sources("advisor", "measure", "bench")
        if re.search(r"import summaries|from advisor.summaries|advisor import .*summaries", p.read_text())
    }
    assert users == {"advisor/store.py"}  # summaries change only with the runs they summarise


def test_no_two_modules_share_a_name_across_advisor_and_measure():
    names = Counter(
        p.name for p in sources("advisor", "measure") if p.name not in ("__init__.py", "__main__.py")
    )
    assert [n for n, k in names.items() if k > 1] == []


def test_no_family_dispatch_outside_the_family_modules():
    chains = [
        p.relative_to(REPO).as_posix()
        for p in sources("measure", "bench")
        if re.search(r"family\s*==\s*['\"]|family\s+in\s+\(['\"]", p.read_text())
    ]
    assert chains == []
