"""Evidence: choosing the one group an answer ranks, and that group as a grid of configurations (optimizer ×
strategy) with their metric values, seeds and intervals, and which of them may be ranked at all."""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from advisor.answers import stats
from advisor.answers.stats import TTest, finite, paired_t, relative_difference, welch_t
from advisor.errors import NoEvidence
from advisor.kb.queries.for_answers import (
    Aggregate,
    Cell,
    PairSums,
    group_aggregates,
    group_cells,
    group_pairs,
    groups_measuring,
    rate_choice,
)
from advisor.kb.queries.groups import Group, evidence_groups, group_ref
from advisor.rules import Rules

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Selector:
    """Which evidence an answer may rank, beside --source: a preset, a hardware, one group's id (a row id;
    `group_id_of` reads the typed form), or the user's own runs alone (`--evidence mine`)."""

    preset: str | None = None
    hardware: str | None = None
    group: int | None = None
    mine: bool = False

    def keeps(self, g: Group) -> bool:
        return (
            (self.preset is None or g.preset == self.preset)
            and (self.hardware is None or g.hardware == self.hardware)
            and (self.group is None or g.id == self.group)
            and (not self.mine or g.own)
        )

    def __str__(self) -> str:
        flags = {"preset": self.preset, "hardware": self.hardware, "group": group_ref(self.group)}
        return " ".join(
            [f"--{k} {v}" for k, v in flags.items() if v is not None] + ["--evidence mine"] * self.mine
        )


@dataclass(frozen=True)
class Asked:
    """What an answer is about: the user's model (its name as the KB stores it, about how many parameters it
    has, the hash of its config.json), or, with none, the family at the scale of the evidence that answers
    without the user's runs."""

    model: str | None = None
    n_params: int | None = None
    config_hash: str | None = None

    def names(self, g: Group) -> bool:
        """Whether a group's runs are of the asked model: by its name, or by its config (the same config.json
        reached by another path: build/bases/vit-small-pretrained and vit-small-pretrained)."""
        return bool(self.model) and (
            g.model == self.model or (self.config_hash is not None and g.config_hash == self.config_hash)
        )


@dataclass(frozen=True)
class Selection:
    """The group an answer ranks, the others available (best first), why each of the user's groups that
    does not match the question was passed over (group id -> a sentence), and the question's scale."""

    group: Group
    others: list[Group]
    unmatched: dict[int, str]
    scale: int | None  # the parameters the question is about (None: not known)


def select_group(
    conn: sqlite3.Connection,
    rules: Rules,
    family: str,
    source: str | None = None,
    asked: Asked | None = None,
    selector: Selector | None = None,
    metric: str | tuple[str, ...] | None = None,
) -> Selection:
    """The best evidence group for a family (rules: flowchart.evidence) among those the selector keeps: for
    `metric` (or each of several), among those that measured it where any did (a published table of losses
    answers no time question); for no metric (a family's whole picture), among those that measured the most
    of the flowchart's metrics; at the question's scale the nearest in size first, where sizes decide
    nothing else.

    Shipped evidence is always eligible. The user's own runs answer only a question they match (`mismatch`):
    one smoke run never becomes the answer for a model a thousand times its size. Sources the rules never
    answer from (`--tune-lr`'s runs, which chose the rates) count only when asked for, as a named group."""
    prefs = rules.flowchart["evidence"]
    selector, asked = selector or Selector(), asked or Asked()
    never = prefs.get("answer_never", [])
    everything = evidence_groups(conn, family=family, source=source)
    everything = _measuring(conn, rules, everything, metric)
    kept = [
        g for g in everything if selector.keeps(g) and (source or selector.group or g.source not in never)
    ]
    shipped = [g for g in kept if not g.own] or [  # the shipped group that answers, within --source if any
        g for g in evidence_groups(conn, family=family) if not g.own and g.source not in never
    ]
    # a base's group, which steps aside for a family's grid below, sets no scale for the question either
    shipped = [g for g in shipped if not for_its_model_only(g, asked, selector, prefs)] or shipped
    scale = asked.n_params or _reference_scale(shipped, asked, prefs)
    unmatched = {
        g.id: why for g in kept if g.own and (why := mismatch(g, asked, scale, selector, rules)) is not None
    }
    matching = [g for g in kept if g.id not in unmatched]
    # a base's group steps aside for a family's grid, but answers when it is all the evidence there is (a file
    # read alone with --db, or --preset custom)
    groups = [g for g in matching if not for_its_model_only(g, asked, selector, prefs)] or matching
    if not groups:
        raise NoEvidence(
            _no_group(family, source, selector, [g for g in kept if g.id in unmatched], unmatched)
        )
    key = _rank_key(asked, prefs, scale)
    chosen = max(groups, key=key)
    others = [g for g in everything if g is not chosen and (g.source not in never or selector.group == g.id)]
    return Selection(chosen, sorted(others, key=key, reverse=True), unmatched, scale)


def for_its_model_only(g: Group, asked: Asked, selector: Selector, prefs: dict) -> bool:
    """Whether a shipped group is left to the questions about its own model: one of rules' `only_for_their_model`
    presets (the bases advisor pretrain made, fine-tuned full and LoRA: two configurations of one model, not a
    family's grid), unless the question names that model or the group (--group)."""
    return (
        not g.own
        and g.preset in prefs.get("only_for_their_model", [])
        and not asked.names(g)
        and selector.group != g.id
    )


def _measuring(conn, rules: Rules, groups: list[Group], metric) -> list[Group]:
    """The groups that measured `metric` (each of a tuple), or with none asked, the flowchart's metrics most;
    all of them where none qualifies (the answer then says what is missing)."""
    wanted = (metric,) if isinstance(metric, str) else metric or tuple(rules.flowchart["metrics"])
    among = [g.id for g in groups]
    ids = [groups_measuring(conn, rules.metric(m).measures, among) for m in wanted]
    covers = {g.id: sum(g.id in i for i in ids) for g in groups}
    most = max(covers.values(), default=0)
    needed = len(wanted) if metric else most
    return [g for g in groups if covers[g.id] >= needed and needed > 0] or groups


def _rank_key(asked: Asked, prefs: dict, scale: int | None = None):
    def nearness(g: Group) -> float:
        """How close the group's size is to the question's (0 at the same size; sizes unknown: neutral)."""
        if not scale or scale < 0 or not g.n_params:
            return 0.0
        return -abs(math.log(g.n_params / scale))

    def rank(g: Group):
        return (
            asked.names(g),
            g.own,  # the user's own runs that match the question, over anything shipped
            g.own and g.data not in ("generated", ""),  # of those, on their own (real) data over generated
            prefs["preset_rank"].get(g.preset, 1),
            prefs["protocol_rank"].get(g.protocol, 0),
            prefs["source_rank"].get(g.source, prefs["source_rank"].get(g.kind, 0)),
            nearness(g),
            g.n_seeds,
            g.n_runs,
            g.n_params or 0,  # of published sizes otherwise alike, the largest
        )

    return rank


def _reference_scale(shipped: list[Group], asked: Asked, prefs: dict) -> int | None:
    """The question's scale when the user's model does not state it: that of the shipped group that would
    answer without the user's runs (within --source and --preset where they keep one; else whatever they
    narrow the answer to, so that `--source trainer` never lets a smoke run answer), else the largest a
    shipped group of the family states; None when nothing shipped is there to weigh the user's runs against."""
    if not shipped:
        return None
    best = max(shipped, key=_rank_key(asked, prefs)).n_params
    return best or max((g.n_params or 0 for g in shipped), default=0) or UNKNOWN_SCALE


UNKNOWN_SCALE = -1  # shipped evidence that states no size: the user's runs match it by identity alone


def mismatch(g: Group, asked: Asked, scale: int | None, selector: Selector, rules: Rules) -> str | None:
    """None when the user's group `g` matches the question: selected by name (--group, --evidence mine), the
    same model, or the same family at the question's scale or within rules' `match_scale_ratio` below it
    (or no shipped evidence to weigh it against). Else why it was passed over, with the flag that selects it."""
    ratio = rules.flowchart["evidence"]["match_scale_ratio"]
    if selector.mine or selector.group == g.id or asked.names(g) or scale is None:
        return None
    if scale == UNKNOWN_SCALE:
        return (
            "not the model asked about, and the evidence it would replace states no size to weigh it against; "
            f"select it with --group {g.ref} or --evidence mine"
        )
    if g.n_params and g.n_params * ratio >= scale:
        return None
    size = (
        f"{params_text(g.n_params)} parameters, {scale / g.n_params:,.0f}× smaller than"
        if g.n_params
        else ("its runs state no parameter count, against")
    )
    return (
        f"not the model asked about, and {size} the question's {params_text(scale)} (your runs answer a "
        f"question about the same model, or of the family within {ratio:g}× of its scale); "
        f"select it with --group {g.ref} or --evidence mine"
    )


def params_text(n: int | None) -> str:
    """1.24 B, 4.07 M, 127 k: a parameter count as answers say it."""
    if not n:
        return "?"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def _no_group(family: str, source, selector: Selector, passed: list[Group], unmatched: dict[int, str]) -> str:
    if passed:
        shown = "; ".join(f"{g.label}: {unmatched[g.id]}" for g in passed[:3])
        return f"none of your {family} runs matches this question: {shown}."
    where = f" from source {source!r}" if source else ""
    where += f" matching {selector}" if str(selector) else ""
    return (
        f"the knowledge base has no runs of the {family} family{where}. "
        f"Measure some with `advisor measure`, or drop --source (see `advisor kb stats` for the groups)."
    )


@dataclass(frozen=True)
class Stat:
    """A metric of one configuration over its ok runs (seeds), in the metric's unit."""

    mean: float
    n: int
    spread: float | None  # sample standard deviation; None for a single run
    stated: str | None = None  # the stored figure as its source states it, when converted and single
    ci: tuple[float, float] | None = None  # 95 % Student-t interval of the mean; None for a single run
    predicted: bool = False  # a prediction (advisor fit), not a measurement


@dataclass(frozen=True)
class RateTie:
    """A configuration whose tuned rate beat the next rate tried by less than one run's spread of its held-out
    loss: at the other rate its loss could be lower by up to `reach`, so a comparison it loses by less than that
    rests on a choice the evidence cannot make. Gap and spread relative to its loss."""

    name: str
    rate: float
    other: float
    gap: float
    spread: float

    @property
    def reach(self) -> float:
        """How much lower (relative) the configuration's held-out loss could be at the other rate, at 95 %: the
        tuning seed compared the two rates in two runs, each off by one spread, so their true difference lies
        within 2·√2 spreads of the gap that favoured the chosen one."""
        return 2 * math.sqrt(2) * self.spread - self.gap

    @property
    def text(self) -> str:
        return (
            f"{self.name}'s rate {self.rate:g} beat {self.other:g} by {self.gap:.2%} on the tuning seed, "
            f"within one run's spread ({self.spread:.1%})"
        )


@dataclass(frozen=True)
class Comparison:
    """A test of configuration a against b on one metric: paired by seed where they share seeds, else
    Welch's. `difference` is a - b (paired: the mean per-seed difference), `relative` that as % of b."""

    a: tuple[str, str]
    b: tuple[str, str]
    test: TTest
    relative: float | None

    def as_dict(self) -> dict:
        t = self.test
        return dict(
            kind=t.kind,
            n=t.n,
            statistic=finite(t.statistic),  # null: the differences have no spread (p is then 0 or 1)
            dof=t.dof,
            p=t.p,
            difference=t.difference,
            relative=self.relative,
            effect_size=finite(t.effect_size),
            effect_name=t.effect_name,
        )


def _stat(agg: Aggregate, converted: bool) -> Stat:
    spread = ci = None
    if agg.n > 1:
        spread = math.sqrt(max(0.0, (agg.sum_sq - agg.n * agg.mean**2) / (agg.n - 1)))
        half = t_quantile(agg.n - 1) * spread / math.sqrt(agg.n)
        ci = (agg.mean - half, agg.mean + half)
    stated = f"{agg.first_value:g} {agg.first_unit}" if converted and agg.n == 1 else None
    return Stat(mean=agg.mean, n=agg.n, spread=spread, stated=stated, ci=ci)


def t_quantile(dof: int) -> float:
    """The two-sided 95 % Student-t quantile."""
    return stats.t_quantile(dof, 0.5 + CONFIDENCE / 2)


class GroupEvidence:
    """The runs of one group, arranged by configuration, with each metric read from one stored measure."""

    def __init__(self, conn: sqlite3.Connection, group: Group, rules: Rules):
        self.conn, self.group, self.rules = conn, group, rules
        self.cells: dict[tuple[str, str], Cell] = {
            (c.optimizer, c.strategy): c for c in group_cells(conn, group)
        }
        divergence = rules.flowchart["filters"]["divergence"]
        wanted = {x for m in rules.metrics.values() for x in m.measures} | {divergence["start"]}
        aggregates = group_aggregates(
            conn, group, {x: (rules.measures[x].factor, rules.measures[x].scale) for x in sorted(wanted)}
        )
        # One measure per metric and group: the first, in the rules' preference order, that the group has.
        self._measures = {
            name: next((x for x in m.measures if x in aggregates), None) for name, m in rules.metrics.items()
        }
        self._unusable: dict[bool, dict[tuple[str, str], str]] = {}
        self._starts = {k: a.mean for k, a in aggregates.get(divergence["start"], {}).items()}
        self._diverged: dict[tuple[str, str], str] | None = None
        self._stats: dict[str, dict[tuple[str, str], Stat]] = {}
        self._aggregates: dict[str, dict[tuple[str, str], Aggregate]] = {}
        for metric, measure in self._measures.items():
            spec = rules.measures.get(measure) if measure else None
            converted = spec is not None and (spec.factor != 1.0 or spec.scale is not None)
            self._aggregates[metric] = aggregates.get(measure, {})
            self._stats[metric] = {k: _stat(a, converted) for k, a in self._aggregates[metric].items()}
        # Seed-paired sums, for the measures read that a runs column does not scale (those have none): each
        # read when a test first asks for it (an answer tests one metric; a group holds thousands of pairs).
        self._pairable: dict[str, float] = {
            x: rules.measures[x].factor
            for x in self._measures.values()
            if x and rules.measures[x].scale is None and group.n_seeds > 1
        }
        self._pairs: dict[str, dict] = {}

    def use_prediction(self, metric: str, measure: str, values: dict[tuple[str, str], float]) -> None:
        """Rank `metric` by predicted values (advisor fit) instead of the stored figures: e.g. memory for the
        user's model on the user's accelerator, which no run of this group measured."""
        self._measures[metric] = measure
        self._stats[metric] = {
            k: Stat(mean=v, n=1, spread=None, predicted=True) for k, v in values.items() if k in self.cells
        }
        self._aggregates[metric] = {}  # a prediction per configuration: nothing to test
        self._unusable, self._diverged = {}, None

    def measure(self, metric: str) -> str | None:
        return self._measures.get(metric)

    def contended(self, key: tuple[str, str]) -> bool:
        """Whether an ok run of the configuration was timed under contention (measure `contended`)."""
        agg = group_aggregates(self.conn, self.group, {"contended": (1.0, None)}).get("contended", {})
        return key in agg and agg[key].mean > 0

    def stats(self, metric: str) -> dict[tuple[str, str], Stat]:
        """The metric of every configuration that has a figure for it."""
        return self._stats.get(metric, {})

    def pair(self, metric: str, a: tuple[str, str], b: tuple[str, str]) -> PairSums | None:
        """The seed-paired sums of a - b on the metric's measure, where both have ok runs of common seeds."""
        measure = self._measures.get(metric) or ""
        if measure not in self._pairs and measure in self._pairable:
            read = group_pairs(self.conn, self.group, {measure: self._pairable[measure]})
            self._pairs[measure] = read.get(measure, {})
        pairs = self._pairs.get(measure, {})
        if (a, b) in pairs:
            return pairs[(a, b)]
        return pairs[(b, a)].flipped() if (b, a) in pairs else None

    def compare(self, metric: str, a: tuple[str, str], b: tuple[str, str]) -> Comparison | None:
        """Test a against b: paired by seed when they share at least 2 seeds, else Welch's when each has at
        least 2 runs, else None (no test: e.g. one run per configuration)."""
        aggs = self._aggregates.get(metric, {})
        if a not in aggs or b not in aggs:
            return None
        pair = self.pair(metric, a, b)
        if pair is not None and pair.n >= 2:
            test = paired_t(pair.n, pair.sum_d, pair.sum_dd)
        else:
            test = welch_t(*((x.n, x.mean, x.sum_sq) for x in (aggs[a], aggs[b])))
        if test is None:
            return None
        return Comparison(a, b, test, relative_difference(test.difference, aggs[b].mean))

    def stat(self, cell: Cell, metric: str) -> Stat | None:
        return self.stats(metric).get((cell.optimizer, cell.strategy))

    def value(self, cell: Cell, metric: str) -> float | None:
        stat = self.stat(cell, metric)
        return stat.mean if stat else None

    def grid_gaps(self) -> list[tuple[str, str]]:
        """Configurations of the family's grid with no run at all in this group."""
        fam = self.rules.families.get(self.group.family)
        if fam is None:
            return []
        return [(o, s) for o in fam.grid_optimizers for s in fam.grid_strategies if (o, s) not in self.cells]

    def unusable(self, metric: str | None = None) -> dict[tuple[str, str], str]:
        """The one rule for which configurations may be ranked (recommend, frontier and claims alike): those
        with an ok run, less those their source calls unusable, less those whose own loss diverged where
        `metric` judges training quality (rules: the divergence filter's applies_to; None: as for every
        metric). Every other one, with the reason: a time or memory answer keeps a finished run whatever its
        loss (its answer flags it: `flagged`)."""
        judged = metric is None or metric in self.rules.flowchart["filters"]["divergence"]["applies_to"]
        if judged in self._unusable:
            return self._unusable[judged]
        out = {}
        for key, cell in sorted(self.cells.items()):
            if not cell.n_ok:
                statuses = "/".join(f"{n} {s}" if n > 1 else s for s, n in sorted(cell.statuses.items()))
                out[key] = statuses + (f": {sorted(cell.errors)[0]}" if cell.errors else "")
        out |= self.declared() | (self.diverged() if judged else {})
        self._unusable[judged] = dict(sorted(out.items()))
        return self._unusable[judged]

    def usable(self, metric: str | None = None) -> list[Cell]:
        """The configurations that may be ranked on `metric` (None: on every one), in name order."""
        unusable = self.unusable(metric)
        return [c for k, c in sorted(self.cells.items()) if k not in unusable]

    def diverged(self) -> dict[tuple[str, str], str]:
        """Configurations whose own loss diverged, with the reason (rules: flowchart.filters.divergence): not
        finite, or ended above where it started. Never by another optimizer's result: a run that improved
        stays, however far above the best it ended."""
        if self._diverged is not None:
            return self._diverged
        spec = self.rules.flowchart["filters"]["divergence"]
        like_with_like = self.measure(spec["metric"]) == spec["final"]
        out = self._diverged = {}
        for key, stat in self.stats(spec["metric"]).items():
            start = self._starts.get(key) if like_with_like else None
            if not math.isfinite(stat.mean):
                out[key] = f"diverged: its loss is {stat.mean}"
            elif start is not None and stat.mean > start:
                out[key] = (
                    f"diverged: its loss ended at {stat.mean:.4g}, above where it started ({start:.4g})"
                )
        return out

    def rate_tie(self, cell: Cell) -> RateTie | None:
        """Where --tune-lr chose the cell's rate by less than the noise of one run (the runner-up rate's
        held-out loss within the cell's seed spread of its held-out loss): which rates, by how much; else None.
        The rate was chosen on held-out loss, so that is the unit of both the gap and the spread, whatever the
        metric an answer ranks."""
        stat = self.stat(cell, "loss") if self.measure("loss") == "eval_loss" else None
        if stat is None or stat.spread is None or stat.mean == 0:
            return None
        tuned_with = self.rules.tuning_strategy(cell.strategy)
        lr, tried = rate_choice(self.conn, self.group, cell.optimizer, cell.strategy, tuned_with)
        if lr is None or lr not in tried or len(tried) < 2 or tried[lr] == 0:
            return None
        runner_up = min((r for r in tried if r != lr), key=lambda r: tried[r])
        gap = tried[runner_up] - tried[lr]
        if gap >= stat.spread:
            return None
        return RateTie(cell.name, lr, runner_up, gap / abs(tried[lr]), stat.spread / abs(stat.mean))

    def declared(self) -> dict[tuple[str, str], str]:
        """Configurations their own source calls unusable (rules: the divergence filter's `declared`): the rule
        for published figures, which carry no trajectory. Left out of every answer, as the source does."""
        out = {}
        for d in self.rules.flowchart["filters"]["divergence"].get("declared", []):
            if (self.group.source, self.group.family) != (d["source"], d["family"]):
                continue
            for (
                key,
                cell,
            ) in self.cells.items():  # a configuration with no ok run keeps its status as its reason
                if (
                    cell.n_ok
                    and cell.optimizer == d["optimizer"]
                    and d.get("strategy", cell.strategy) == cell.strategy
                ):
                    out[key] = f"diverged, in its source's own words: {d['reason']}"
        return out


def scale_statement(rules: Rules, asked: int | None, group: Group, predicted: bool) -> dict | None:
    """The scale of the question against the evidence's, always stated where both are known: the ratio, and
    what it means for this ranking (a warning beyond rules' `scale_warning_ratio`, unless the ranking is
    advisor fit's prediction for the user's model itself)."""
    if not asked or not group.n_params:
        return None
    ratio = asked / group.n_params
    far = max(ratio, 1 / ratio) >= rules.flowchart["evidence"]["scale_warning_ratio"]
    x = max(ratio, 1 / ratio)
    times = f"{x:,.0f}× " if x >= 10 else f"{x:.1f}× "
    times += "larger" if ratio >= 1 else "smaller"
    text = (
        f"Scale: the question is about {params_text(asked)} parameters, the evidence's {group.model} has "
        + (f"{params_text(group.n_params)} ({times})")
    )
    if predicted:
        text += ": this ranking is advisor fit's prediction for the model asked about, not the evidence's"
    elif far:
        text += ": a ranking measured at one scale need not hold at the other"
    return dict(
        question=asked, evidence=group.n_params, ratio=ratio, warning=far and not predicted, text=text
    )
