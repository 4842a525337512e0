"""The seeds' findings, stated once and checked against every run's own tables.

Each finding is one registered entry (:func:`finding`): a stable id (``003.bm25_best_ap``), the
statement, the seed's number as the seed gives it, a line (threshold) with the side of it the
finding claims (``above``, ``below`` or ``within`` a band) and where the line comes from in the
seed's own words, and a function from the run's tables to one or more measurements (a number
with a low and a high end of its 95% interval). The lines are derived from the seeds' words,
here and nowhere else; none is fitted to this project's results.

Verdict of one measurement: ``reproduced`` when its whole interval is strictly on the finding's
side of the line, ``not reproduced`` when it is wholly on the other side, ``inconclusive`` when
it straddles or touches the line. A finding with several measurements (one per method, per twin)
claims them all: reproduced when every one is, not reproduced when any one is, else inconclusive;
the row shows the measurement that decides. ``not testable``: a table, suite or method it needs
is absent from the run (the row says which), or its number is undefined there.

Intervals: the analysis's own bootstrap where a table carries one (``correlations.csv``'s
``*_lo`` / ``*_hi``, the suites' ``lo`` / ``hi``); elsewhere a seeded percentile bootstrap of
facts resampled within their cells (:func:`plantbench.grading.metrics.resample_within_cells`,
the config's ``seed``, ``analysis.bootstrap`` resamples and ``analysis.alpha``, tag
``findings/<id>``), paired when a finding compares two methods on the same facts.

:func:`evaluate` reads a run (every replicate when the config has several: ``holds`` = in how
many the finding is reproduced); :func:`evaluate_tables` is the same on tables given directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from plantbench import io, replicates
from plantbench.grading import metrics
from plantbench.markdown import method_label
from plantbench.paths import Paths

Side = Literal["above", "below", "within"]
Line = float | tuple[float, float]  # a threshold, or a band (for ``within``)
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)
COLUMNS = [
    "id",
    "seed",
    "statement",
    "seed_number",
    "line",
    "line_from",
    "interval",
    "on",
    "ours",
    "low",
    "high",
    "this_run",
    "verdict",
    "why",
    "holds",
]
CELLS = ["domain", "n_docs", "position"]
# the seed's eight methods (seed 003's tables); EK-FAC, TrackStar and plug-ins are not the seed's
SEED_METHODS = (
    "bm25",
    "embedding",
    "hidden",
    "grad_dot",
    "grad_cos",
    "tracin_dot",
    "tracin_influence",
    "influence",
)
GRADIENT_METHODS = ("grad_dot", "grad_cos", "tracin_dot", "tracin_influence", "influence")
PLAIN_GRADIENT = ("grad_dot", "grad_cos")


class NotTestable(Exception):
    """A finding cannot be checked on this run; the message says why."""


@dataclass(frozen=True)
class Measurement:
    on: str  # what the number is of: a method, a twin, a gap
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class RunTables:
    """The run's tables by name (:data:`TABLES`) and, for each one absent, why."""

    tables: Mapping[str, pd.DataFrame]
    absent: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    n_boot: int = 1000
    alpha: float = 0.05

    def get(self, name: str) -> pd.DataFrame:
        if name in self.tables:
            return self.tables[name]
        raise NotTestable(self.absent.get(name, f"this run has no {TABLES[name]}"))


Measure = Callable[[RunTables], list[Measurement]]


@dataclass(frozen=True)
class Finding:
    id: str
    statement: str
    seed_number: str
    line: Line
    side: Side
    line_from: str  # the line's derivation from the seed's words
    interval: str  # how the interval is formed
    measure: Measure
    fmt: str = "{:+.2f}"

    @property
    def seed(self) -> str:
        return self.id.split(".")[0]


_REGISTRY: list[Finding] = []


def finding(
    id: str,
    statement: str,
    seed_number: str,
    line: Line,
    side: Side,
    line_from: str,
    interval: str,
    fmt: str = "{:+.2f}",
) -> Callable[[Measure], Measure]:
    """Register the decorated measure function as one finding."""

    def register(fn: Measure) -> Measure:
        _REGISTRY.append(
            Finding(id, statement, seed_number, line, side, line_from, interval, fn, fmt)
        )
        return fn

    return register


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


def _band(line: Line, side: Side) -> tuple[float, float]:
    """The finding's side of its line as an open interval (a, b)."""
    if isinstance(line, tuple):
        return line
    return (line, math.inf) if side == "above" else (-math.inf, line)


def verdict(low: float, high: float, line: Line, side: Side) -> str:
    """One interval against the line: reproduced when it lies strictly on the finding's side,
    not reproduced when wholly off it, else (straddling or touching) inconclusive."""
    a, b = _band(line, side)
    if a < low and high < b:
        return REPRODUCED
    return NOT_REPRODUCED if high < a or low > b else INCONCLUSIVE


def margin(m: Measurement, line: Line, side: Side) -> float:
    """How far the interval is inside the finding's side (negative: over the line)."""
    a, b = _band(line, side)
    return min(m.low - a, b - m.high)


def combine(f: Finding, ms: list[Measurement]) -> tuple[str, Measurement]:
    """The finding's verdict over all its measurements and the one that decides it."""
    verdicts = [verdict(m.low, m.high, f.line, f.side) for m in ms]
    if NOT_REPRODUCED in verdicts:
        overall = NOT_REPRODUCED
    elif all(v == REPRODUCED for v in verdicts):
        overall = REPRODUCED
    else:
        overall = INCONCLUSIVE
    deciding = [m for m, v in zip(ms, verdicts, strict=True) if v == overall]
    return overall, min(deciding, key=lambda m: margin(m, f.line, f.side))


# --------------------------------------------------------------------------------------------
# Shared pieces of the measures
# --------------------------------------------------------------------------------------------


def _need_methods(
    t: RunTables, wanted: tuple[str, ...], least: int = 1, table: str = "correlations"
) -> list[str]:
    """The ``wanted`` methods this run graded (in ``table``; at least ``least`` of them, else
    not testable, naming the ones missing)."""
    graded = set(t.get(table)["method"])
    have = [m for m in wanted if m in graded]
    if len(have) < least:
        names = ", ".join(method_label(m) for m in wanted if m not in graded)
        raise NotTestable(f"not graded in this run (methods.enabled): {names}")
    return have


def _finite(ms: list[Measurement], what: str) -> list[Measurement]:
    """``ms``, or not testable when a number or interval end is undefined (NaN)."""
    bad = [m.on for m in ms if not all(map(math.isfinite, (m.value, m.low, m.high)))]
    if bad:
        raise NotTestable(f"{what} undefined in this run ({', '.join(bad)})")
    return ms


def _resamples(t: RunTables, df: pd.DataFrame, tag: str, cells: str | list[str]) -> np.ndarray:
    return metrics.resample_within_cells(df, cells, t.n_boot, seed=t.seed, tag=f"findings/{tag}")


Stat = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def _boot(
    t: RunTables, df: pd.DataFrame, tag: str, stat: Stat, on: str, cells: Any = CELLS
) -> Measurement:
    """A statistic of ``df``'s numeric columns (arrays of shape (resamples, rows)) with its
    seeded percentile interval over resamples of rows within cells."""
    num = df.select_dtypes(include=["number", "bool"])
    cols = {c: num[c].to_numpy(dtype=np.float64) for c in num.columns}
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float(stat({c: v[None, :] for c, v in cols.items()})[0])
        idx = _resamples(t, df, tag, cells)
        reps = stat({c: v[idx] for c, v in cols.items()})
    lo, hi = metrics.percentile_interval(reps, t.alpha)
    return Measurement(on, point, lo, hi)


def _mean(v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per resample (row) the mean of the finite values (where ``mask``)."""
    ok = np.isfinite(v) if mask is None else np.isfinite(v) & (mask > 0)
    return np.where(ok, v, 0.0).sum(axis=1) / ok.sum(axis=1)


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per resample (row) the Pearson correlation of x and y."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    return (xc * yc).sum(1) / np.sqrt((xc * xc).sum(1) * (yc * yc).sum(1))


def _corr(t: RunTables, methods: list[str], key: str) -> list[Measurement]:
    """Each method's ``key`` column of correlations.csv with its bootstrap interval."""
    c = t.get("correlations").set_index("method")
    ms = [
        Measurement(method_label(m), *(float(c.loc[m, k]) for k in (key, f"{key}_lo", f"{key}_hi")))
        for m in methods
    ]
    return _finite(ms, key.replace("_", " "))


def _ap_by_fact(t: RunTables, methods: list[str]) -> pd.DataFrame:
    """Per fact (with its cell) the mean AP over its two forms, one column per method."""
    pf = t.get("per_fact")
    pf = pf[pf["method"].isin(methods)]
    wide = pf.pivot_table(index=["fact_id", *CELLS], columns="method", values="ap")
    return wide.reset_index()


def _ap_methods(t: RunTables, wanted: tuple[str, ...], least: int = 1) -> list[str]:
    return _need_methods(t, wanted, least, table="per_fact")


def _facts(t: RunTables) -> pd.DataFrame:
    f = t.get("facts")
    return f.assign(learned=f["learned"].astype(float))


def _rate(v: Mapping[str, np.ndarray], mask: str) -> np.ndarray:
    return _mean(v["learned"], v[mask])


# --------------------------------------------------------------------------------------------
# Seed 003: the paired-model study
# --------------------------------------------------------------------------------------------


def _best_ap(v: Mapping[str, np.ndarray], methods: list[str]) -> np.ndarray:
    """Per resample, the highest mean AP among ``methods``."""
    return np.max([_mean(v[m]) for m in methods], axis=0)


@finding(
    "003.bm25_best_ap",
    "Keyword search (BM25) has the best AP of the seed's eight methods.",
    "AP 0.996 / 0.994; next best 0.821 / 0.826",
    0.0,
    "above",
    "“the best of eight methods”: BM25's AP minus the best other seed method's; best means "
    "ahead of every other, so the line is 0 (a tie is inconclusive).",
    "seeded bootstrap of facts within cells (AP per fact, both twins pooled), paired",
    "{:+.3f}",
)
def _bm25_best(t: RunTables) -> list[Measurement]:
    methods = _ap_methods(t, SEED_METHODS, least=2)
    if "bm25" not in methods:
        raise NotTestable("not graded in this run (methods.enabled): BM25 keyword search")
    others = [m for m in methods if m != "bm25"]
    wide = _ap_by_fact(t, methods)
    best = max(others, key=lambda m: float(wide[m].mean()))

    def stat(v: Mapping[str, np.ndarray]) -> np.ndarray:
        return _mean(v["bm25"]) - _best_ap(v, others)

    on = f"BM25 − best other, {method_label(best)}"
    return [_boot(t, wide, "003.bm25_best_ap", stat, on)]


@finding(
    "003.curvature_order",
    "Among gradient methods the curvature correction matters most: TracIn with influence > "
    "influence functions > plain gradient similarity (AP).",
    "AP 0.82 > 0.74 > 0.05–0.08",
    0.0,
    "above",
    "the order the seed states; it holds when both gaps are positive, so the line is 0 for "
    "each (plain gradient similarity = the better of the gradient dot product and cosine).",
    "seeded bootstrap of facts within cells (AP per fact, both twins pooled), paired",
    "{:+.3f}",
)
def _curvature_order(t: RunTables) -> list[Measurement]:
    methods = _ap_methods(t, ("tracin_influence", "influence"), least=2)
    plain = _ap_methods(t, PLAIN_GRADIENT)
    wide = _ap_by_fact(t, [*methods, *plain])
    best = max(plain, key=lambda m: float(wide[m].mean()))
    tag = "003.curvature_order"

    def first(v: Mapping[str, np.ndarray]) -> np.ndarray:
        return _mean(v["tracin_influence"]) - _mean(v["influence"])

    def second(v: Mapping[str, np.ndarray]) -> np.ndarray:
        return _mean(v["influence"]) - _best_ap(v, plain)

    return [
        _boot(t, wide, f"{tag}/1", first, "TracIn, influence − Influence functions"),
        _boot(
            t, wide, f"{tag}/2", second, f"Influence functions − best plain, {method_label(best)}"
        ),
    ]


@finding(
    "003.hidden_finds_nothing",
    "Hidden-state similarity finds almost nothing (AP).",
    "AP 0.003 / 0.003",
    0.05,
    "below",
    "“Hidden-state similarity found almost nothing”, beside plain gradient similarity, which "
    "“scored 0.05 to 0.08”: almost nothing is below the lowest AP the seed still calls a "
    "score, 0.05 (our smaller pools make AP easier, not harder).",
    "seeded bootstrap of facts within cells (AP per fact, both twins pooled)",
    "{:.3f}",
)
def _hidden_nothing(t: RunTables) -> list[Measurement]:
    _ap_methods(t, ("hidden",))
    wide = _ap_by_fact(t, ["hidden"])
    stat: Stat = lambda v: _mean(v["hidden"])  # noqa: E731
    return [_boot(t, wide, "003.hidden_finds_nothing", stat, method_label("hidden"))]


@finding(
    "003.late_learned_most",
    "Facts planted late in training are learned most often.",
    "learned: late 48%, middle 25%, early 9%",
    0.0,
    "above",
    "“Facts in the last 15% of training were learned most often”: the late learned rate "
    "minus each other position's (all documents per fact pooled), line 0.",
    "seeded bootstrap of facts within cells",
    "{:+.0%}",
)
def _late_most(t: RunTables) -> list[Measurement]:
    f = _facts(t)
    pos = f["position"].astype(str)
    f = f.assign(late=pos == "late", middle=pos == "middle", early=pos == "early")
    return [
        _boot(
            t,
            f,
            f"003.late_learned_most/{p}",
            lambda v, p=p: _rate(v, "late") - _rate(v, p),
            f"late − {p}",
        )
        for p in ("middle", "early")
    ]


@finding(
    "003.early_forgotten",
    "Facts planted early are mostly forgotten, even with the most documents per fact.",
    "12% learned at 128 documents",
    0.5,
    "below",
    "“facts from the first fifth were mostly forgotten, even with 128 documents”: mostly "
    "forgotten = fewer than half learned, at the grid's most documents per fact.",
    "seeded bootstrap of facts within cells",
    "{:.0%}",
)
def _early_forgotten(t: RunTables) -> list[Measurement]:
    f = _facts(t)
    most = int(f["n_docs"].max())
    f = f.assign(cell_in=(f["position"].astype(str) == "early") & (f["n_docs"] == most))
    stat: Stat = lambda v: _rate(v, "cell_in")  # noqa: E731
    return [_boot(t, f, "003.early_forgotten", stat, f"early, {most} documents")]


@finding(
    "003.more_docs_more_learned",
    "More documents per fact, more facts learned.",
    "learned 5% at 2 documents, 53% at 128",
    0.0,
    "above",
    "“Frequency and timing both mattered” (5% / 11% / 39% / 53% at 2 / 8 / 32 / 128 "
    "documents): the learned rate at the most documents minus at the fewest, line 0.",
    "seeded bootstrap of facts within cells",
    "{:+.0%}",
)
def _more_docs(t: RunTables) -> list[Measurement]:
    f = _facts(t)
    lo, hi = int(f["n_docs"].min()), int(f["n_docs"].max())
    if lo == hi:
        raise NotTestable("the grid has one number of documents per fact")
    f = f.assign(most=f["n_docs"] == hi, fewest=f["n_docs"] == lo)
    stat: Stat = lambda v: _rate(v, "most") - _rate(v, "fewest")  # noqa: E731
    return [_boot(t, f, "003.more_docs_more_learned", stat, f"{hi} − {lo} documents")]


@finding(
    "003.raw_positive",
    "Gradient methods' mass correlates positively with the causal effect within cells (raw).",
    "+0.32 to +0.41",
    0.0,
    "above",
    "“Gradient methods correlated with the causal effect at first (+0.32 to +0.41)”: "
    "positive, for each of the seed's five gradient methods.",
    "the analysis's bootstrap (correlations.csv raw_lo / raw_hi)",
)
def _raw_positive(t: RunTables) -> list[Measurement]:
    return _corr(t, _need_methods(t, GRADIENT_METHODS), "raw")


@finding(
    "003.mass_tracks_length_difficulty",
    "Gradient methods' mass tracks answer length and difficulty within cells.",
    "+0.54 to +0.78 (length), +0.47 to +0.71 (difficulty)",
    0.0,
    "above",
    "“their mass also tracked the length of the answer … and how hard the answer was”: a "
    "positive within-cell correlation with both, for each gradient method.",
    "the analysis's bootstrap (correlations.csv vs_length_lo / _hi, vs_difficulty_lo / _hi)",
)
def _length_difficulty(t: RunTables) -> list[Measurement]:
    methods = _need_methods(t, GRADIENT_METHODS)
    out = []
    for key, what in (("vs_length", "length"), ("vs_difficulty", "difficulty")):
        out += [
            Measurement(f"{m.on} vs {what}", m.value, m.low, m.high) for m in _corr(t, methods, key)
        ]
    return out


@finding(
    "003.controlled_below_01",
    "Controlled for answer length and difficulty, no gradient method's mass correlates with "
    "the causal effect above +0.1.",
    "at most +0.09 (only one interval cleared zero, by 0.001)",
    0.1,
    "below",
    "“holding both fixed, none exceeded +0.09”: the line is +0.1, the round value just above "
    "the seed's largest; each gradient method's whole interval below it to reproduce.",
    "the analysis's bootstrap (correlations.csv controlled_lo / controlled_hi)",
)
def _controlled_below(t: RunTables) -> list[Measurement]:
    return _corr(t, _need_methods(t, GRADIENT_METHODS), "controlled")


def _influence_facts(t: RunTables) -> pd.DataFrame:
    _need_methods(t, ("influence",))
    pf = t.get("per_fact")
    pf = pf[(pf["method"] == "influence") & np.isfinite(pf["mass"].astype(float))]
    return pf.assign(learned=pf["learned"].astype(float))


@finding(
    "003.influence_tracks_loss",
    "Influence-function mass tracks the finished model's current loss on the fact.",
    "+0.73 (Pearson, all facts)",
    0.0,
    "above",
    "“Influence computed on the finished model tracked how badly it still answered a fact "
    "(+0.73)”: tracking is a positive correlation across all facts; line 0.",
    "seeded bootstrap of facts within cells (Pearson of mass and final loss)",
)
def _influence_loss(t: RunTables) -> list[Measurement]:
    pf = _influence_facts(t)
    stat: Stat = lambda v: _pearson(v["mass"], v["final_loss"])  # noqa: E731
    return _finite(
        [_boot(t, pf, "003.influence_tracks_loss", stat, method_label("influence"))],
        "the correlation",
    )


@finding(
    "003.unlearned_more_mass",
    "Facts the model never learned get more influence-function mass than facts it learned.",
    "7.8 vs 6.2 (+1.6)",
    0.0,
    "above",
    "“facts the model never learned received more mass than facts it did (standardized 7.8 "
    "against 6.2)”: mean mass of not-learned minus learned facts, line 0.",
    "seeded bootstrap of facts within cells",
)
def _unlearned_more(t: RunTables) -> list[Measurement]:
    pf = _influence_facts(t)
    if not (pf["learned"] > 0).any() or (pf["learned"] > 0).all():
        raise NotTestable("needs both learned and not-learned facts")

    def stat(v: Mapping[str, np.ndarray]) -> np.ndarray:
        return _mean(v["mass"], 1.0 - v["learned"]) - _mean(v["mass"], v["learned"])

    return [_boot(t, pf, "003.unlearned_more_mass", stat, "not learned − learned")]


@finding(
    "003.embedding_small_signal",
    "Embedding search keeps a small controlled signal: its controlled correlation is positive.",
    "+0.15 [+0.07, +0.23]",
    0.0,
    "above",
    "“Embedding search kept a small real signal (+0.15)”, its interval clearing zero: the "
    "controlled correlation's interval above 0 (the size, small, is not a line).",
    "the analysis's bootstrap (correlations.csv controlled_lo / controlled_hi)",
)
def _embedding_signal(t: RunTables) -> list[Measurement]:
    return _corr(t, _need_methods(t, ("embedding",)), "controlled")


def _controlled_reps(df: pd.DataFrame, mass: str, idx: np.ndarray | None) -> np.ndarray:
    """The within-cell controlled correlation of ``mass`` with the effect, per resample."""
    codes = df.groupby(CELLS, sort=True).ngroup().to_numpy()
    idx = np.arange(len(df))[None, :] if idx is None else idx
    nb, n = idx.shape
    groups = (np.arange(nb)[:, None] * (int(codes.max()) + 1) + codes[idx]).ravel()
    cols = [mass, "effect", "answer_tokens", "difficulty"]
    ranks = np.stack(
        [
            metrics.centred_ranks(groups, df[c].to_numpy(dtype=np.float64)[idx].ravel()).reshape(
                nb, n
            )
            for c in cols
        ],
        axis=-1,
    )
    return metrics._correlations_batch(ranks)["controlled"]


@finding(
    "003.tracin_no_change",
    "TracIn over checkpoints does not change the picture: TracIn with influence gains less "
    "than +0.1 controlled correlation over influence functions.",
    "+0.04 vs +0.03 (+0.01)",
    0.1,
    "below",
    "“TracIn adds history by summing over checkpoints, but over four checkpoints it did not "
    "change the picture”: its controlled correlation minus influence functions' stays under "
    "+0.1, the line the seed draws for a signal (“none exceeded +0.09”).",
    "seeded bootstrap of facts within cells, both methods on the same resamples",
)
def _tracin_no_change(t: RunTables) -> list[Measurement]:
    a, b = _need_methods(t, ("tracin_influence", "influence"), least=2)
    pf = t.get("per_fact")
    keep = ["fact_id", *CELLS, "effect", "answer_tokens", "difficulty"]
    df = pf.loc[pf["method"] == a, [*keep, "mass"]].rename(columns={"mass": "mass_a"})
    df = df.merge(pf.loc[pf["method"] == b, ["fact_id", "mass"]], on="fact_id")
    df = df[np.isfinite(df[["mass_a", "mass"]].to_numpy(dtype=np.float64)).all(axis=1)]
    df = df.reset_index(drop=True)
    if len(df) < 5:
        raise NotTestable("fewer than 5 facts with a mass under both methods")
    point = float(_controlled_reps(df, "mass_a", None)[0] - _controlled_reps(df, "mass", None)[0])
    idx = _resamples(t, df, "003.tracin_no_change", CELLS)
    reps = _controlled_reps(df, "mass_a", idx) - _controlled_reps(df, "mass", idx)
    lo, hi = metrics.percentile_interval(reps, t.alpha)
    m = Measurement(f"{method_label(a)} − {method_label(b)}", point, lo, hi)
    return _finite([m], "the controlled correlation")


@finding(
    "003.bm25_no_signal",
    "Keyword search carries no information about which documents mattered: its controlled "
    "correlation stays below +0.1.",
    "−0.02 [−0.10, +0.06]",
    0.1,
    "below",
    "“a keyword index won that test and carried no information about which documents "
    "mattered”: no more than the +0.1 line the seed draws for a signal (“none exceeded "
    "+0.09”).",
    "the analysis's bootstrap (correlations.csv controlled_lo / controlled_hi)",
)
def _bm25_no_signal(t: RunTables) -> list[Measurement]:
    return _corr(t, _need_methods(t, ("bm25",)), "controlled")


# --------------------------------------------------------------------------------------------
# Seed 000: context attribution under in-weight overlap (the context suite)
# --------------------------------------------------------------------------------------------


@finding(
    "000.ssp_near_chance",
    "Context-attribution methods separate in-weight from in-context sources at chance: every "
    "method's source separation precision is near 0.5.",
    "0.50–0.52",
    (0.48, 0.52),
    "within",
    "“source separation precision stays close to chance … The best method, TokenShapley, "
    "reaches only 0.52”: near chance = within the seed's largest distance from 0.5, 0.02, "
    "on either side; each method.",
    "the suite's bootstrap (context/analysis/ssp.csv lo / hi)",
    "{:.2f}",
)
def _ssp(t: RunTables) -> list[Measurement]:
    s = t.get("context_ssp")
    ms = [Measurement(r.method, float(r.ssp), float(r.lo), float(r.hi)) for r in s.itertuples()]
    return _finite(ms, "SSP (on the learned facts)")


@finding(
    "000.cac_low",
    "Attribution rankings change once the knowledge is in the weights: cross-model "
    "consistency (CAC, RBO at ρ = 0.5) between the base model and the one that learned it "
    "stays low.",
    "0.34–0.56",
    0.56,
    "below",
    "“cross-model context attribution consistency remains low (0.34–0.56), showing that "
    "attribution rankings change”: low = at most the top of that range; each method, at the "
    "seed's ρ = 0.5.",
    "the suite's bootstrap (context/analysis/metrics.csv, metric cac)",
    "{:.2f}",
)
def _cac(t: RunTables) -> list[Measurement]:
    m = t.get("context_metrics")
    cac = m[(m["metric"] == "cac") & (m["setting"].astype(str) == "rho=0.5")]
    if cac.empty:
        raise NotTestable("no CAC at the seed's persistence ρ = 0.5 (context.rbo)")
    ms = [Measurement(r.method, float(r.value), float(r.lo), float(r.hi)) for r in cac.itertuples()]
    return _finite(ms, "CAC")


# --------------------------------------------------------------------------------------------
# Seed 001: memory vs context from hidden states (the membership suite)
# --------------------------------------------------------------------------------------------


def _membership(t: RunTables, col: str, lo: str, hi: str, on: str) -> list[Measurement]:
    """One AUC of membership/analysis/table1.csv per twin, with its interval."""
    ms = [
        Measurement(f"{on}, twin {r['model']}", r[col], r[lo], r[hi])
        for _, r in t.get("membership").iterrows()
    ]
    return _finite(ms, "the AUC")


@finding(
    "001.crm_distinguishes",
    "CRM tells generations with a member document from those with a non-member apart "
    "(CRM-LR ROC-AUC).",
    "AUC 0.71–0.95",
    0.60,
    "above",
    "“CRM consistently distinguishes member from non-member conditions (AUC 0.71–0.95)”, "
    "while the baselines at “AUC 0.55–0.60” are called near random: distinguishes = above "
    "0.60, the top of what the seed calls near random; each twin.",
    "the suite's bootstrap (membership/analysis/table1.csv crm_lr_lo / crm_lr_hi)",
    "{:.2f}",
)
def _crm(t: RunTables) -> list[Measurement]:
    return _membership(t, "crm_lr", "crm_lr_lo", "crm_lr_hi", "CRM-LR")


@finding(
    "001.baselines_near_random",
    "Likelihood baselines on the document alone (PPL, Zlib, Min-K%) stay near random.",
    "AUC 0.55–0.60",
    0.60,
    "below",
    "“Baselines stay near random (AUC 0.55–0.60)”: the best baseline's AUC at most 0.60, the "
    "top of that range; each twin.",
    "the suite's bootstrap (membership/analysis/table1.csv best_baseline_lo / _hi)",
    "{:.2f}",
)
def _baselines(t: RunTables) -> list[Measurement]:
    cols = ("best_baseline_auc", "best_baseline_lo", "best_baseline_hi")
    return _membership(t, *cols, "best likelihood baseline")


@finding(
    "001.crm_beats_baselines",
    "CRM beats the best likelihood baseline (CRM-LR AUC minus the best baseline's).",
    "gain +0.13 to +0.38",
    0.0,
    "above",
    "“Gain = CRM-LR − best likelihood BL” (+0.13 to +0.38): positive, line 0; each twin.",
    "conservative: CRM-LR's low minus the baseline's high to CRM-LR's high minus its low "
    "(table1.csv has no paired resamples)",
)
def _crm_gain(t: RunTables) -> list[Measurement]:
    t1 = t.get("membership")
    ms = [
        Measurement(
            f"twin {r['model']}, vs {r['best_baseline']}",
            r["crm_lr"] - r["best_baseline_auc"],
            r["crm_lr_lo"] - r["best_baseline_hi"],
            r["crm_lr_hi"] - r["best_baseline_lo"],
        )
        for _, r in t1.iterrows()
    ]
    return _finite(ms, "the gain")


# --------------------------------------------------------------------------------------------
# Seed 002: contextual vs parametric knowledge (the grounding suite)
# --------------------------------------------------------------------------------------------


def _responses(t: RunTables, condition: str) -> pd.DataFrame:
    """The grounding suite's responses in ``condition`` (not testable: none with an atom)."""
    r = t.get("grounding")
    if condition not in set(r["condition"]):
        raise NotTestable(f"the grounding suite has no {condition} condition")
    r = r[r["condition"] == condition]
    if not np.isfinite(r["ck"].to_numpy(dtype=np.float64)).any():
        raise NotTestable(f"no {condition} response has an atomic sentence (CK, CR undefined)")
    return r


@finding(
    "002.lost_in_the_later",
    "Lost in the later: the first segment of the context is recalled more than the last.",
    "first quartile most, last least (Fig. 4)",
    0.0,
    "above",
    "“the first quartile of the context receives the highest attention and grounding, while "
    "the final quartile contributes the least”: context recall of the first segment minus "
    "the last, factual contexts, line 0; each twin role.",
    "seeded bootstrap of facts within cells (responses.csv)",
    "{:+.1f}",
)
def _lost_later(t: RunTables) -> list[Measurement]:
    r = _responses(t, "factual")
    last = max(int(c[3:]) for c in r.columns if c.startswith("cr_") and c[3:].isdigit())
    stat: Stat = lambda v: _mean(v["cr_0"] - v[f"cr_{last}"])  # noqa: E731
    ms = [
        _boot(
            t,
            g.reset_index(drop=True),
            f"002.lost/{role}",
            stat,
            f"{role}: CR 0 − CR {last}",
            "cell",
        )
        for role, g in r.groupby("role", sort=True)
    ]
    return _finite(ms, "context recall")


@finding(
    "002.ck_below_plateau",
    "Models do not fully use the context: the CK score stays below the seed's plateau, about 70%.",
    "CK ≈ 70 (plateau 70–75)",
    75.0,
    "below",
    "“CK usage peaking at approximately 70%”, “most models' CK scores plateau around "
    "70–75”: factual CK below 75, the top of that plateau; each twin role.",
    "seeded bootstrap of facts within cells (responses.csv)",
    "{:.1f}",
)
def _ck_plateau(t: RunTables) -> list[Measurement]:
    r = _responses(t, "factual")
    stat: Stat = lambda v: _mean(v["ck"])  # noqa: E731
    ms = [
        _boot(t, g.reset_index(drop=True), f"002.ck/{role}", stat, f"{role}: CK", "cell")
        for role, g in r.groupby("role", sort=True)
    ]
    return _finite(ms, "CK")


@finding(
    "002.counterfactual_lowers_ck",
    "A contradicting context lowers the CK score (factual minus counterfactual context).",
    "CK drops, but not to zero",
    0.0,
    "above",
    "“In contradiction rich setting, CK drops as expected, but not completely”: CK with the "
    "factual context minus with the counterfactual one, paired by fact, line 0; each role.",
    "seeded bootstrap of facts within cells, both conditions on the same resamples",
    "{:+.1f}",
)
def _counterfactual(t: RunTables) -> list[Measurement]:
    keys = ["fact_id", "role", "cell"]
    fac = _responses(t, "factual")[[*keys, "ck"]]
    cf = _responses(t, "counterfactual")[[*keys, "ck"]].rename(columns={"ck": "ck_cf"})
    both = fac.merge(cf, on=keys)
    stat: Stat = lambda v: _mean(v["ck"]) - _mean(v["ck_cf"])  # noqa: E731
    ms = [
        _boot(
            t,
            g.reset_index(drop=True),
            f"002.cf/{role}",
            stat,
            f"{role}: factual − counterfactual",
            "cell",
        )
        for role, g in both.groupby("role", sort=True)
    ]
    return _finite(ms, "CK")


FINDINGS: tuple[Finding, ...] = tuple(_REGISTRY)


# --------------------------------------------------------------------------------------------
# Reading a run and evaluating the registry
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Artifact:
    """A finished artifact the findings read: its folder, stage, tables and, when it is
    absent, why the findings that need it cannot be tested."""

    folder: Callable[[Paths], Path]
    stage: str
    tables: dict[str, str]  # table name -> file in the folder
    why: str


# the columns each table needs (hand-made tables for evaluate_tables need only these):
# facts: fact_id, domain, n_docs, position, learned; correlations: method and, per statistic
# (raw, vs_length, vs_difficulty, controlled), its value, _lo and _hi; per_fact: method, fact_id,
# domain, n_docs, position, ap, mass, effect, answer_tokens, difficulty, final_loss, learned;
# context_ssp: method, ssp, lo, hi; context_metrics: metric, method, setting, value, lo, hi;
# membership: model, crm_lr(_lo, _hi), best_baseline, best_baseline_auc, best_baseline_lo, _hi;
# grounding: fact_id, role, condition, cell, ck, cr_0 … cr_<k-1>
_ARTIFACTS = (
    _Artifact(
        lambda p: p.causal,
        "causal",
        {"facts": "facts.parquet"},
        "the run has no answer key yet (no causal/meta.json)",
    ),
    _Artifact(
        lambda p: p.root / "analysis",
        "analysis",
        {"correlations": "correlations.csv", "per_fact": "per_fact.parquet"},
        "the methods are not graded yet (no analysis/meta.json)",
    ),
    _Artifact(
        lambda p: p.context("analysis"),
        "context_analysis",
        {"context_ssp": "ssp.csv", "context_metrics": "metrics.csv"},
        "the context suite has not run (seed 000)",
    ),
    _Artifact(
        lambda p: p.membership("analysis"),
        "membership_analysis",
        {"membership": "table1.csv"},
        "the membership suite has not run (seed 001)",
    ),
    _Artifact(
        lambda p: p.grounding("analysis"),
        "grounding_analysis",
        {"grounding": "responses.csv"},
        "the grounding suite has not run (seed 002)",
    ),
)
TABLES: dict[str, str] = {n: f for a in _ARTIFACTS for n, f in a.tables.items()}


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return io.read_parquet(path)
    opts: dict[str, Any] = {"keep_default_na": False, "na_values": [""]}
    return pd.read_csv(path, dtype={"method": str, "degenerate": str, "setting": str}, **opts)


def read_tables(cfg: dict[str, Any], paths: Paths) -> RunTables:
    """The tables of ``paths``' replicate the findings read (each artifact's files checked
    against its meta.json); an artifact not made yet leaves its tables absent, with why."""
    tables: dict[str, pd.DataFrame] = {}
    absent: dict[str, str] = {}
    for a in _ARTIFACTS:
        folder = a.folder(paths)
        if not (folder / io.META).is_file():
            absent.update(dict.fromkeys(a.tables, a.why))
            continue
        io.read_meta(folder, a.stage)
        tables.update({n: _read_table(folder / f) for n, f in a.tables.items()})
    acfg = cfg["analysis"]
    return RunTables(tables, absent, int(cfg["seed"]), int(acfg["bootstrap"]), float(acfg["alpha"]))


def _num(f: Finding, x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f.fmt.replace("+", "").format(x) if "%" in f.fmt else f"{x:g}"


def line_text(f: Finding) -> str:
    """The line as the report shows it: ``> 0``, ``< 0.1``, ``in [0.48, 0.52]``."""
    if isinstance(f.line, tuple):
        return f"in [{_num(f, f.line[0])}, {_num(f, f.line[1])}]"
    return f"{'>' if f.side == 'above' else '<'} {_num(f, f.line)}"


def this_run(f: Finding, m: Measurement) -> str:
    """``+0.12 [-0.05, +0.30]`` in the finding's format."""
    return f"{f.fmt.format(m.value)} [{f.fmt.format(m.low)}, {f.fmt.format(m.high)}]"


def _why(v: str, m: Measurement, n: int, f: Finding) -> str:
    where = {"above": "above", "below": "below", "within": "inside"}[f.side]
    if v == REPRODUCED:
        every = f"all {n} intervals lie" if n > 1 else "the interval lies"
        return f"{every} wholly {where} the line"
    if v == NOT_REPRODUCED:
        return f"{m.on}: the interval lies wholly on the other side of the line"
    ends = (m.low, m.high)
    lines = f.line if isinstance(f.line, tuple) else (f.line,)
    touches = any(x == e for x in lines for e in ends)
    return f"{m.on}: the interval {'touches' if touches else 'straddles'} the line"


def _row(f: Finding, t: RunTables) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": f.id,
        "seed": f.seed,
        "statement": f.statement,
        "seed_number": f.seed_number,
        "line": line_text(f),
        "line_from": f.line_from,
        "interval": f.interval,
        "holds": "",
    }
    try:
        ms = f.measure(t)
    except NotTestable as e:
        nan = float("nan")
        return {**row, **_result(Measurement("", nan, nan, nan), "n/a", NOT_TESTABLE, str(e))}
    v, m = combine(f, ms)
    return {**row, **_result(m, this_run(f, m), v, _why(v, m, len(ms), f))}


def _result(m: Measurement, text: str, v: str, why: str) -> dict[str, Any]:
    return {"on": m.on, "ours": m.value, "low": m.low, "high": m.high, "this_run": text,
            "verdict": v, "why": why}  # fmt: skip


def evaluate_tables(t: RunTables, findings: tuple[Finding, ...] = FINDINGS) -> pd.DataFrame:
    """One row per finding (columns :data:`COLUMNS`), from tables given directly (``holds``
    left empty)."""
    return pd.DataFrame([_row(f, t) for f in findings], columns=COLUMNS)


def holds(per_replicate: list[pd.DataFrame]) -> list[str]:
    """Per finding, ``k of N``: in how many replicates it is reproduced (and how many could
    not test it)."""
    verdicts = np.array([df["verdict"].to_numpy() for df in per_replicate])
    n = len(per_replicate)
    out = []
    for col in verdicts.T:
        k, untested = int((col == REPRODUCED).sum()), int((col == NOT_TESTABLE).sum())
        out.append(f"{k} of {n}" + (f" ({untested} not testable)" if untested else ""))
    return out


def evaluate(cfg: dict[str, Any], paths: Paths) -> pd.DataFrame:
    """Every registered finding on ``paths``' replicate of the run (columns :data:`COLUMNS`,
    one row per finding in registry order). With several replicates (config ``replicates``),
    ``holds`` says in how many the finding is reproduced, each judged on its own tables."""
    out = evaluate_tables(read_tables(cfg, paths))
    n = replicates.count(cfg)
    if n < 2:
        return out
    per = []
    for r in range(n):
        rcfg = replicates.select({**cfg, "results": str(paths.shared)}, r)
        per.append(out if r == paths.replicate else evaluate_tables(read_tables(rcfg, Paths(rcfg))))
    out["holds"] = holds(per)
    return out


def verdict_counts(df: pd.DataFrame) -> str:
    """``seed 003: 9 of 14 reproduced, 2 not reproduced, 3 inconclusive; seed 000: ...``."""
    parts = []
    for seed, g in df.groupby("seed", sort=False):
        counts = g["verdict"].value_counts()
        first = f"{int(counts.get(REPRODUCED, 0))} of {len(g)} {REPRODUCED}"
        rest = [f"{int(counts[v])} {v}" for v in VERDICTS[1:] if v in counts]
        parts.append(f"seed {seed}: " + ", ".join([first, *rest]))
    return "; ".join(parts)
