"""Seed 003's findings: the paired-model study (which documents taught a model a fact).

One registered function per finding; each line (threshold) is derived beside its finding from
the seed's own words (``line_from``), here and nowhere else. The seed's numbers: its AP, learned
rates and within-cell correlations of eight attribution methods against the causal effect.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from plantbench.grading import metrics
from plantbench.grading.findings.core import (
    CELLS,
    GRADIENT_METHODS,
    PLAIN_GRADIENT,
    SEED_METHODS,
    Measurement,
    NotTestable,
    RunTables,
    Stat,
    _ap_by_fact,
    _ap_methods,
    _boot,
    _corr,
    _facts,
    _finite,
    _mean,
    _need_methods,
    _pearson,
    _rate,
    _resamples,
    finding,
)
from plantbench.markdown import method_label


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
