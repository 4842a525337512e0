"""Every method graded against the random twins: its within-cell correlation with the
random-twin effect, and its linear datamodeling score (LDS) on the same models.

LDS of a query (a fact's form, on the twin that read the fact, whose pool the method scored):
the Spearman correlation across the random twins between the method's summed scores over the
pool windows that twin read and the twin's answer log p. Every twin reads the pool's
background and distractor windows, so only the planted windows of the facts it read move the
sum. A method's LDS is the mean over queries with a percentile bootstrap interval over queries
(``analysis.bootstrap`` resamples, seeded), and by cell (domain x n_docs x position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from plantbench import io
from plantbench.errors import ArtifactError
from plantbench.grading import analysis, metrics
from plantbench.paths import MODELS, Paths
from plantbench.rng import rng

write_csv = analysis.write_csv
CORR_KEYS = ("raw", "controlled")


@dataclass
class Graded:
    grades: pd.DataFrame
    by_cell: pd.DataFrame
    per_query: pd.DataFrame
    inputs: dict[str, str]
    ranking: dict[str, Any]


def rowwise_spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of ``x`` with the same row of ``y`` (average ranks;
    NaN where a row is constant)."""
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(axis=1) / den, np.nan)


def summed_scores(scores: np.ndarray, window_fact: np.ndarray, read: np.ndarray) -> np.ndarray:
    """``[n_queries, n_draws]``: each query's scores summed over the planted pool windows each
    draw read (``scores`` over those windows, ``window_fact`` their facts' columns of
    ``read``)."""
    return scores.astype(np.float64) @ read[:, window_fact].T.astype(np.float64)


def _full_matrix(s: analysis.Scores) -> np.ndarray:
    if not s.meta.get("info", {}).get("full_matrix"):
        raise ArtifactError(
            f"'{s.folder}' has no scores.npy (the full score matrix): LDS sums a query's scores "
            "over every planted window; lower the pool or the queries below the full-matrix limit"
        )
    analysis.check_score_file(s.folder, s.meta, "scores.npy")
    return np.load(s.folder / "scores.npy")


def method_lds(
    paths: Paths,
    s: analysis.Scores,
    facts: pd.DataFrame,
    qdf: pd.DataFrame,
    read: np.ndarray,
    logp: np.ndarray,
) -> pd.DataFrame:
    """Per query of the facts ``s.model`` read: its LDS under method ``s.method``."""
    pool = io.read_parquet(paths.pool(s.model) / "pool.parquet")
    planted = pool[pool["kind"] == "planted"]
    fact_col = pd.Index(facts["fact_id"]).get_indexer(planted["fact_id"])
    readers = set(facts.loc[facts["reader"] == s.model, "fact_id"])
    q = s.queries.reset_index(drop=True)
    q = q[q["fact_id"].isin(readers)]
    mat = _full_matrix(s)[q.index.to_numpy()][:, planted["row"].to_numpy()]
    qcol = pd.Index(qdf["query_id"]).get_indexer(q["query_id"])
    values = rowwise_spearman(summed_scores(mat, fact_col, read), logp[:, qcol].T)
    cells = facts.set_index("fact_id").loc[q["fact_id"], analysis.CELL_COLS].reset_index(drop=True)
    out = pd.DataFrame(
        {"method": s.method, "model": s.model, "query_id": q["query_id"].to_numpy()}
    ).join(pd.concat([q[["fact_id"]].reset_index(drop=True), cells], axis=1))
    out["lds"] = values
    return out


def mean_interval(
    values: np.ndarray, n_boot: int, alpha: float, seed: int, tag: str
) -> tuple[float, float, float]:
    """Mean of the finite values and its percentile bootstrap interval over them."""
    v = values[np.isfinite(values)]
    if len(v) < 2:
        return (float(v.mean()) if len(v) else np.nan), np.nan, np.nan
    idx = rng(seed, "random-twins", "lds", tag).integers(0, len(v), size=(n_boot, len(v)))
    lo, hi = metrics.percentile_interval(v[idx].mean(axis=1), alpha)
    return float(v.mean()), lo, hi


def _rt_correlations(
    cfg: dict[str, Any], method: str, per_fact: pd.DataFrame, eff: pd.DataFrame
) -> dict[str, Any]:
    """The method's within-cell correlations with the random-twin effect (difficulty: the
    non-readers' mean -log p), as :func:`plantbench.grading.analysis.correlation_row`."""
    pf = per_fact[per_fact["method"] == method].drop(columns=["effect", "difficulty"])
    pf = pf.merge(
        eff[["fact_id", "effect_rt", "difficulty_rt"]].rename(
            columns={"effect_rt": "effect", "difficulty_rt": "difficulty"}
        ),
        on="fact_id",
    )
    a = cfg["analysis"]
    return analysis.correlation_row(
        method, pf, "", n_boot=int(a["bootstrap"]), alpha=float(a["alpha"]), seed=int(cfg["seed"])
    )


def _grade_row(
    cfg: dict[str, Any],
    method: str,
    tables: dict[str, pd.DataFrame],
    eff: pd.DataFrame,
    lds_q: pd.DataFrame,
) -> dict[str, Any]:
    ret, corr = tables["retrieval"], tables["correlations"].set_index("method")
    a = cfg["analysis"]
    row: dict[str, Any] = {"method": method}
    row["ap"] = float(ret.loc[(ret["method"] == method) & (ret["model"] == "all"), "ap"].iloc[0])
    rt = _rt_correlations(cfg, method, tables["per_fact"], eff)
    for k in CORR_KEYS:
        for sfx in ("", "_lo", "_hi"):
            row[f"{k}_ab{sfx}"] = float(corr.loc[method, f"{k}{sfx}"])
    for k in CORR_KEYS:
        for sfx in ("", "_lo", "_hi"):
            row[f"{k}_rt{sfx}"] = float(rt[f"{k}{sfx}"])
    vals = lds_q.loc[lds_q["method"] == method, "lds"].to_numpy()
    mean, lo, hi = mean_interval(
        vals, int(a["bootstrap"]), float(a["alpha"]), int(cfg["seed"]), method
    )
    row.update(lds=mean, lds_lo=lo, lds_hi=hi, lds_queries=int(np.isfinite(vals).sum()))
    return row


def ranking(grades: pd.DataFrame) -> dict[str, Any]:
    """Where LDS and the causal grades agree on the order of the methods: Spearman across
    methods, and each order, best first."""
    out: dict[str, Any] = {}
    for other in ("raw_rt", "controlled_rt", "raw_ab", "controlled_ab", "ap"):
        out[f"lds_vs_{other}"] = metrics.pearson(grades["lds"].rank(), grades[other].rank())
    for col in ("lds", "raw_rt", "controlled_rt", "ap"):
        out[f"order_{col}"] = grades.sort_values(col, ascending=False)["method"].tolist()
    return out


def _read_analysis(paths: Paths) -> tuple[dict[str, pd.DataFrame], str]:
    meta = io.read_meta(paths.analysis, "analysis")
    tables = {
        "retrieval": pd.read_csv(paths.analysis / "retrieval.csv"),
        "correlations": pd.read_csv(paths.analysis / "correlations.csv"),
        "per_fact": io.read_parquet(paths.analysis / "per_fact.parquet"),
    }
    return tables, meta["hash"]


def grade(
    cfg: dict[str, Any],
    paths: Paths,
    facts: pd.DataFrame,
    qdf: pd.DataFrame,
    read: np.ndarray,
    logp: np.ndarray,
    eff: pd.DataFrame,
    causal_meta: dict[str, Any],
) -> Graded:
    """Every method of the attribution table: AP, correlations against the A/B and the
    random-twin effect, LDS (per query, by cell, overall)."""
    tables, analysis_hash = _read_analysis(paths)
    lineage = analysis.causal_lineage(paths, causal_meta)
    inputs = {"analysis": analysis_hash}
    parts = []
    methods = analysis.method_names(cfg)
    for method in methods:
        for m in MODELS:
            s = analysis.load_scores(paths, method, m, lineage)
            inputs[f"score_{method}_{m}"] = s.meta["hash"]
            parts.append(method_lds(paths, s, facts, qdf, read, logp))
    per_query = pd.concat(parts, ignore_index=True)
    grades = pd.DataFrame([_grade_row(cfg, m, tables, eff, per_query) for m in methods])
    by_cell = (
        per_query.groupby(["method", *analysis.CELL_COLS], sort=True)["lds"]
        .agg(lds="mean", n_queries="count")
        .reset_index()
    )
    return Graded(grades, by_cell, per_query, inputs, ranking(grades))
