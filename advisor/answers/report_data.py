"""What `advisor report` shows, gathered from a KB before anything is drawn (advisor.render.site formats it, and
reads nothing more): the flowchart's paths, each family's answers with the evidence groups that give them and
their provenance, its frontiers, the claims' verdicts, the scale transfers, the KB's groups, and advisor fit's
answers for the traces the KB holds (given by the caller: the Python API's traced_fits)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from advisor.answers.claims import Verdict, check_all
from advisor.answers.flowchart import BestPath, summary, walk
from advisor.answers.frontier import Frontier, frontier
from advisor.answers.recommendation import Answer
from advisor.answers.transfer import Transfer, transfers
from advisor.errors import Error, NoEvidence
from advisor.kb.queries.for_answers import group_settings
from advisor.kb.queries.for_report import group_span, group_statuses, stats
from advisor.kb.queries.groups import Group
from advisor.rules import Rules


class NothingToReport(Error):
    """The KB holds no evidence the report could show."""


@dataclass
class Provenance:
    """Where an evidence group's numbers come from, as the KB holds them."""

    group: Group
    span: dict  # group_span: device, memory, software, when its runs started and finished
    statuses: list  # (status, runs) of its runs
    settings: list[str]  # group_settings: what its runs were run with


@dataclass
class FrontierData:
    """Loss against another metric the flowchart walks (`x`), in a family's main group: the frontier, or
    (`note`) why the KB holds no evidence for it."""

    x: str
    front: Frontier | None = None
    note: str | None = None


@dataclass
class FamilyData:
    """One family: its answers, the groups that give them (the one answering most of its metrics first: a
    published table of losses answers the loss alone) with their provenance, and its frontiers."""

    name: str
    answers: list[Answer]
    groups: list[Group]
    provenance: list[Provenance]  # of each of `groups`, in their order
    frontiers: list[FrontierData]

    @property
    def group(self) -> Group | None:
        """The family's main group: the one beside its name on the page."""
        return self.groups[0] if self.groups else None


@dataclass
class ReportData:
    """Everything the report's page shows, read once."""

    source: str | None
    paths: list[BestPath]
    summary: dict  # answers.flowchart.summary of the paths
    families: list[FamilyData]
    verdicts: list[Verdict]
    fits: list  # advisor fit's answers: [(traced model, [(accelerator, FitAnswer or why none)])]
    transfers: list[Transfer]
    groups: list[dict]  # the KB's evidence groups (kb stats)


def gather_report(
    conn: sqlite3.Connection, rules: Rules, source: str | None, fits: Callable[[], list] = list
) -> ReportData:
    """What the report shows, from the KB at `conn` (`fits`: what gives advisor fit's answers for the fit
    section, the Python API's traced_fits; called once the KB is known to hold evidence to report)."""
    paths = walk(conn, rules, source=source)
    if not any(p.answer for p in paths):
        where = f" from source {source!r}" if source else ""
        raise NothingToReport(
            f"the knowledge base has no runs{where}: nothing to report. "
            "Measure some with `advisor measure`, or drop --source (see `advisor kb stats`)."
        )
    families = [family_data(conn, rules, f, paths, source) for f in dict.fromkeys(p.family for p in paths)]
    return ReportData(
        source=source,
        paths=paths,
        summary=summary(paths),
        families=families,
        verdicts=check_all(conn, source, rules),
        fits=fits(),
        transfers=transfers(conn, rules),
        groups=stats(conn)["groups"],
    )


def answering_groups(paths: list[BestPath], family: str) -> list[Group]:
    """The groups that answer the family's metrics, the one answering most of them first (stable: the first
    answer's group among equals)."""
    counts = Counter(p.answer.group for p in paths if p.family == family and p.answer)
    return sorted(counts, key=lambda g: -counts[g])


def family_data(
    conn: sqlite3.Connection, rules: Rules, family: str, paths: list[BestPath], source: str | None
) -> FamilyData:
    """One family's answers, groups with their provenance, and frontiers (in its main group)."""
    groups = answering_groups(paths, family)
    group = groups[0] if groups else None
    return FamilyData(
        name=family,
        answers=[p.answer for p in paths if p.family == family and p.answer],
        groups=groups,
        provenance=[provenance(conn, g) for g in groups],
        frontiers=frontiers(conn, rules, family, source, group) if group else [],
    )


def provenance(conn: sqlite3.Connection, group: Group) -> Provenance:
    """Where the group's numbers come from: hardware, software, settings, when, and how its runs ended."""
    return Provenance(
        group, group_span(conn, group), group_statuses(conn, group), group_settings(conn, group)
    )


def frontiers(
    conn: sqlite3.Connection, rules: Rules, family: str, source: str | None, group: Group | None = None
) -> list[FrontierData]:
    """Loss against each other metric the flowchart walks, in `group`; one without evidence says why."""
    out = []
    for x in [m for m in rules.flowchart["metrics"] if m != "loss"]:
        try:
            out.append(FrontierData(x, front=frontier(conn, family, x, "loss", rules, source, group)))
        except NoEvidence as e:
            out.append(FrontierData(x, note=str(e)))
    return out
