"""The grading: the seed's tables as data, from the score artifacts and the causal answer key.

Inputs (per graded method and model) are the score folders ``{results}/scores/{method}/{model}/``
written by ``plantbench score`` (or any tool that honours the same contract):

* ``queries.parquet``: per query the pool ``mean`` and population ``std`` of its scores, the
  pool size and a ``degenerate`` flag ("" | "nan" | "constant");
* ``own.parquet``: per (query, own window) the score, ``n_greater`` (pool windows with a strictly
  greater score) and ``n_ties`` (other pool windows with exactly the same score); NaN scores
  rank below every number;
* ``haystack.parquet``: the same counts and per-query statistics in nested sub-pools (every
  planted and distractor window and a growing seeded share of the background, the shares of
  ``analysis.haystack``), graded by the same code into ``haystack.csv``.

Definitions (``../shared/DESIGN.md``; conventions of :mod:`plantbench.grading.metrics`):

* AP is computed for every query on the model that read its fact, over that model's pool, ties
  pessimistic: an own window's rank is 1 + (non-own windows with a greater score) + (non-own
  windows tied with it) + (own windows ranked before it). This is exactly the rank
  :func:`plantbench.grading.metrics.relevant_ranks` gives on the full score vector, but needs only the
  own rows. Recall@10 = |own ranked <= 10| / |own| under the same ranks.
* Attributed mass of a query = mean over its own windows of (score - mean) / std; a fact's mass
  is the mean over its two query forms (NaN if either form is degenerate).
* Within-cell analysis over the 24 cells domain x n_docs x position (both models pooled):
  Pearson correlations of within-cell ranks, the partial correlation given length and
  difficulty, percentile bootstrap intervals over facts resampled within cells.
* Current loss: ``vs_final_loss`` is the plain Pearson correlation of mass and the reading
  model's final per-token loss on the fact across all facts (the seed's "+0.73 across all 528
  facts"); ``vs_final_loss_within`` is the same on within-cell ranks.

Every output column is documented in ``results/README.md``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.config import config_hash, haystack_fractions
from plantbench.errors import ArtifactError, ConfigError
from plantbench.grading import metrics
from plantbench.hashing import hash_file
from plantbench.paths import MODELS, Paths

log = logging.getLogger(__name__)

FORMS: tuple[str, ...] = ("completion", "question")
CELL_COLS: list[str] = ["domain", "n_docs", "position"]
RECALL_K = 10
SCORE_FILES: tuple[str, ...] = ("queries.parquet", "own.parquet")
QUERY_COLUMNS: dict[str, str] = {
    "query_id": "string",
    "fact_id": "string",
    "form": "string",
    "mean": "float",
    "std": "float",
    "n_pool": "integer",
    "degenerate": "string",
}
OWN_COLUMNS: dict[str, str] = {
    "query_id": "string",
    "fact_id": "string",
    "window": "integer",
    "score": "float",
    "n_greater": "integer",
    "n_ties": "integer",
}
HAYSTACK_FILE = "haystack.parquet"
HAYSTACK_COLUMNS: dict[str, str] = {
    **OWN_COLUMNS,
    "fraction": "float",
    "n_background": "integer",
    "n_pool": "integer",
    "mean": "float",
    "std": "float",
    "degenerate": "string",
}
FACT_KEEP = [
    "fact_id",
    "domain",
    "n_docs",
    "position",
    "reader",
    "answer_tokens",
    "effect",
    "difficulty",
    "final_loss",
    "learned",
]
OUTPUT_FILES = [
    "retrieval.csv",
    "correlations.csv",
    "learned_grid.csv",
    "per_fact.parquet",
    "per_query.parquet",
    "haystack.csv",
]


# --------------------------------------------------------------------------------------------
# Which methods, where their scores live
# --------------------------------------------------------------------------------------------


def method_names(cfg: dict[str, Any]) -> list[str]:
    """The graded methods in config order: ``methods.enabled`` then the plug-ins' names."""
    from plantbench.attribution.methods import registry

    registry.load_plugins(cfg)  # their code hashes are checked against their scores
    names = list(cfg["methods"]["enabled"]) + [p["name"] for p in cfg["methods"]["plugins"]]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(
            f"config key 'methods.plugins' reuses the method name(s) {dup}; "
            "give every plug-in a name not in 'methods.enabled'"
        )
    return names


def score_dir(paths: Paths, method: str, model: str) -> Path:
    return paths.scores(method, model)


def pool_dir(paths: Paths, model: str) -> Path:
    return paths.pool(model)


def analysis_dir(paths: Paths) -> Path:
    return paths.analysis


# --------------------------------------------------------------------------------------------
# Lineage: scores and causal table must come from the same twins
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lineage:
    """The hashes the causal table was made from, per model."""

    facts: str | None
    model: dict[str, str]
    stream: dict[str, str]


def causal_lineage(paths: Paths, causal_meta: dict[str, Any]) -> Lineage:
    model_hash: dict[str, str] = {}
    stream_hash: dict[str, str] = {}
    for m in MODELS:
        model_meta = io.read_meta(paths.model(m), "pretrain", verify=False)
        io.check_input(causal_meta, f"model_{m}", model_meta, str(paths.causal))
        model_hash[m] = model_meta["hash"]
        stream_hash[m] = model_meta["inputs"]["stream"]
    return Lineage(causal_meta["inputs"].get("facts"), model_hash, stream_hash)


def _recorded(inputs: dict[str, Any], model: str, *names: str) -> tuple[str, str] | None:
    for name in names:
        for key in (f"{name}_{model}", name):
            if key in inputs:
                return key, str(inputs[key])
    return None


def _mismatch(where: Path, what: str, recorded: str, expected: str) -> ArtifactError:
    return ArtifactError(
        f"'{where}' was made from {what} {recorded}, but the causal table's twins used "
        f"{expected} (scores and causal table come from different runs); rerun the scoring "
        "steps (snakemake --forcerun pool)"
    )


def check_score_lineage(
    paths: Paths, method: str, model: str, meta: dict[str, Any], lineage: Lineage
) -> None:
    """Refuse scores whose pool, stream, model or facts differ from the causal table's.

    The chain checked: score meta inputs -> (pool meta -> stream) and/or stream / model / facts
    hashes recorded directly; at least one link to the twins must be verifiable.
    """
    where = score_dir(paths, method, model) / io.META
    info = meta.get("info", {})
    for key, want in (("method", method), ("model", model)):
        if key in info and str(info[key]) != want:
            raise ArtifactError(f"'{where}' holds scores of {key} {info[key]!r}, expected {want!r}")
    inputs: dict[str, Any] = meta.get("inputs", {})
    checked = 0
    pool = _recorded(inputs, model, "pool")
    if pool is not None:
        pdir = pool_dir(paths, model)
        pool_meta = io.read_meta(pdir, "pool", verify=False)
        if pool[1] != pool_meta["hash"]:
            raise ArtifactError(
                f"'{where}' was made from pool {pool[1]}, not the one on disk "
                f"('{pdir / io.META}', {pool_meta['hash']}); rerun the scoring steps"
            )
        stream = _recorded(pool_meta.get("inputs", {}), model, "stream")
        if stream is not None:
            if stream[1] != lineage.stream[model]:
                raise _mismatch(pdir / io.META, "stream", stream[1], lineage.stream[model])
            checked += 1
        mdl = _recorded(pool_meta.get("inputs", {}), model, "model", "pretrain")
        if mdl is not None:
            if mdl[1] != lineage.model[model]:
                raise _mismatch(pdir / io.META, "model", mdl[1], lineage.model[model])
            checked += 1
    stream = _recorded(inputs, model, "stream")
    if stream is not None:
        if stream[1] != lineage.stream[model]:
            raise _mismatch(where, "stream", stream[1], lineage.stream[model])
        checked += 1
    mdl = _recorded(inputs, model, "model", "pretrain")
    if mdl is not None:
        if mdl[1] != lineage.model[model]:
            raise _mismatch(where, "model", mdl[1], lineage.model[model])
        checked += 1
    facts = inputs.get("facts")
    if facts is not None and lineage.facts is not None and facts != lineage.facts:
        raise _mismatch(where, "facts", str(facts), lineage.facts)
    if not checked:
        raise ArtifactError(
            f"'{where}' records no pool, stream or model input, so its lineage cannot be "
            "checked against the causal table; rerun the scoring step"
        )


# --------------------------------------------------------------------------------------------
# Reading one score artifact
# --------------------------------------------------------------------------------------------


@dataclass
class Scores:
    method: str
    model: str
    folder: Path
    meta: dict[str, Any]
    queries: pd.DataFrame
    own: pd.DataFrame


def _check_columns(df: pd.DataFrame, spec: dict[str, str], path: Path) -> None:
    missing = [c for c in spec if c not in df.columns]
    if missing:
        raise ArtifactError(f"'{path}' lacks column(s) {missing}; rerun its scoring step")
    for col, kind in spec.items():
        dt = df[col].dtype
        ok = {
            "string": pd.api.types.is_string_dtype(dt) or pd.api.types.is_object_dtype(dt),
            "float": pd.api.types.is_float_dtype(dt),
            "integer": pd.api.types.is_integer_dtype(dt),
        }[kind]
        if not ok:
            raise ArtifactError(f"'{path}' column {col!r} has dtype {dt}, expected {kind}")


SCORE_STAGES = ("scores", "score")  # the scorer writes "scores"; "score" accepted too


def read_score_meta(folder: Path) -> dict[str, Any]:
    """A score artifact's meta.json (files not verified here)."""
    path = folder / io.META
    stage = SCORE_STAGES[0]
    if path.is_file():
        try:
            found = json.loads(path.read_text()).get("stage")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            found = None
        if found in SCORE_STAGES:
            stage = found
    return io.read_meta(folder, stage, verify=False)


def check_score_code(method: str, meta: dict[str, Any], folder: Path) -> None:
    """Scores made by another version of the method's code (an edited plug-in) are stale."""
    from plantbench.attribution.methods import registry

    if method not in registry.available():
        return  # graded from its scores alone (a synthetic method of the tests)
    recorded = meta.get("code", {}).get("method")
    if recorded is None:
        raise ArtifactError(
            f"'{folder / io.META}' does not record the code of method '{method}'; "
            f"rerun its scoring step (snakemake --forcerun score)"
        )
    now = registry.code_hash(method)
    if recorded != now:
        raise ArtifactError(
            f"scores in '{folder}' were made by another version of method '{method}' "
            f"('{registry.code_file(method)}' changed since); rerun its scoring step"
        )


def check_score_file(folder: Path, meta: dict[str, Any], name: str) -> None:
    """A file the score meta lists, on disk with its recorded hash."""
    expected = meta.get("files", {}).get(name)
    if expected is None:
        raise ArtifactError(f"'{folder / io.META}' does not list {name}; rerun its scoring step")
    f = folder / name
    if not f.is_file() or hash_file(f) != expected:
        raise ArtifactError(
            f"'{f}' is missing or does not match its recorded hash; rerun its scoring step"
        )


def load_scores(paths: Paths, method: str, model: str, lineage: Lineage) -> Scores:
    folder = score_dir(paths, method, model)
    meta = read_score_meta(folder)
    for name in SCORE_FILES:  # verify only what we read (scores.npy may be large)
        check_score_file(folder, meta, name)
    check_score_lineage(paths, method, model, meta, lineage)
    check_score_code(method, meta, folder)
    queries = io.read_parquet(folder / "queries.parquet")
    own = io.read_parquet(folder / "own.parquet")
    _check_columns(queries, QUERY_COLUMNS, folder / "queries.parquet")
    _check_columns(own, OWN_COLUMNS, folder / "own.parquet")
    if queries["query_id"].duplicated().any():
        raise ArtifactError(f"'{folder / 'queries.parquet'}' lists a query twice")
    return Scores(method, model, folder, meta, queries, own)


# --------------------------------------------------------------------------------------------
# Ranks of own windows, AP, recall and mass per query
# --------------------------------------------------------------------------------------------


def own_ranks(own: pd.DataFrame, where: str = "own.parquet") -> np.ndarray:
    """Pessimistic 1-based pool rank of every own row (same order as ``own``).

    For a query with own windows sorted best first (NaN last), the j-th (0-based) has rank
    ``j + 1 + (n_greater - own_greater) + (n_ties - own_tied)``, the two brackets being the
    non-own windows above it and tied with it.
    """
    n = len(own)
    if n == 0:
        return np.empty(0, dtype=np.int64)
    qcode, _ = pd.factorize(own["query_id"], sort=True)
    score = own["score"].to_numpy(dtype=np.float64)
    isnan = np.isnan(score)
    key = np.where(isnan, 0.0, -score)
    order = np.lexsort((key, isnan, qcode))
    q_start, _, tie_start, tie_size = metrics.sorted_runs(qcode[order], isnan[order], key[order])
    j = np.arange(n) - q_start  # own windows ranked before this one (ties in row order)
    own_greater = tie_start - q_start
    own_tied = tie_size - 1
    n_greater = own["n_greater"].to_numpy(dtype=np.int64)[order]
    n_ties = own["n_ties"].to_numpy(dtype=np.int64)[order]
    other_greater = n_greater - own_greater
    other_tied = n_ties - own_tied
    if (other_greater < 0).any() or (other_tied < 0).any():
        bad = own["query_id"].to_numpy()[order][(other_greater < 0) | (other_tied < 0)][0]
        raise ArtifactError(
            f"'{where}': n_greater / n_ties of query {bad!r} are smaller than its own windows "
            "alone imply (corrupt scores); rerun its scoring step"
        )
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = j + 1 + other_greater + other_tied
    return ranks


def _degenerate_label(queries: pd.DataFrame) -> pd.Series:
    """The scorer's flag, or our own reading of mean/std if the scorer missed one."""
    label = queries["degenerate"].fillna("").astype(str)
    mean = queries["mean"].to_numpy(dtype=np.float64)
    std = queries["std"].to_numpy(dtype=np.float64)
    missed = (label == "") & ~(np.isfinite(mean) & np.isfinite(std) & (std > 0))
    label = label.where(~missed, np.where(np.isfinite(mean) & np.isfinite(std), "constant", "nan"))
    bad = sorted(set(label) - {"", "nan", "constant"})
    if bad:
        raise ArtifactError(f"queries.parquet has unknown degenerate flag(s) {bad}")
    return label


def grade_queries(scores: Scores, facts: pd.DataFrame) -> pd.DataFrame:
    """One row per query of a fact this model read: AP, Recall@10, mass, degenerate flag."""
    readers = facts.loc[facts["reader"] == scores.model, ["fact_id", "n_docs"]]
    q = _reader_queries(scores, readers["fact_id"])
    own = _reader_own(scores, q["query_id"])
    ranks = own_ranks(own, str(scores.folder / "own.parquet"))
    label = _degenerate_label(q)
    q = q.assign(degenerate=label.to_numpy())
    per = _per_query(own, ranks, _own_z(own, q))
    out = q[["query_id", "fact_id", "form", "degenerate"]].merge(
        per.reset_index(), on="query_id", how="left", validate="1:1"
    )
    _warn_own_counts(scores, out, readers.set_index("fact_id")["n_docs"])
    out.insert(0, "model", scores.model)
    out.insert(0, "method", scores.method)
    return out.sort_values("query_id").reset_index(drop=True)


def _reader_queries(scores: Scores, fact_ids: pd.Series) -> pd.DataFrame:
    """The score artifact's queries of ``fact_ids`` (the facts its model read); refuses one
    that is missing."""
    q = scores.queries
    q = q[q["fact_id"].isin(fact_ids)].copy()
    expected = {f"{fid}:{form}" for fid in fact_ids for form in FORMS}
    missing = sorted(expected - set(q["query_id"]))
    if missing:
        raise ArtifactError(
            f"'{scores.folder / 'queries.parquet'}' lacks {len(missing)} queries of facts model "
            f"{scores.model} read (e.g. {missing[0]!r}); scores and causal table are from "
            "different fact sets; rerun the scoring step"
        )
    return q


def _reader_own(scores: Scores, query_ids: pd.Series) -> pd.DataFrame:
    """The own rows of ``query_ids``, checked: every query has some, no window twice for one
    query, every row's fact is its query's."""
    folder = scores.folder
    own = scores.own
    own = own[own["query_id"].isin(query_ids)]
    n_own = own.groupby("query_id").size()
    lacking = sorted(set(query_ids) - set(n_own.index))
    if lacking:
        raise ArtifactError(
            f"'{folder / 'own.parquet'}' has no own windows for query {lacking[0]!r} "
            f"({len(lacking)} queries in all); rerun the scoring step"
        )
    dup = own.duplicated(["query_id", "window"])
    if dup.any():
        raise ArtifactError(
            f"'{folder / 'own.parquet'}' lists window {int(own.loc[dup, 'window'].iloc[0])} "
            "twice for one query; rerun the scoring step"
        )
    wrong_fact = own["fact_id"].to_numpy() != own["query_id"].str.split(":").str[0].to_numpy()
    if wrong_fact.any():
        raise ArtifactError(f"'{folder / 'own.parquet'}' has rows whose fact_id is not the query's")
    return own


def _own_z(own: pd.DataFrame, q: pd.DataFrame) -> np.ndarray:
    """Every own row's score standardized by its query's pool mean and std; NaN where the
    query is degenerate."""
    stats = q.set_index("query_id")
    mean = stats.loc[own["query_id"], "mean"].to_numpy(dtype=np.float64)
    std = stats.loc[own["query_id"], "std"].to_numpy(dtype=np.float64)
    ok = (stats.loc[own["query_id"], "degenerate"] == "").to_numpy()
    z = np.full(len(own), np.nan)
    z[ok] = (own["score"].to_numpy(dtype=np.float64)[ok] - mean[ok]) / std[ok]
    return z


def _per_query(own: pd.DataFrame, ranks: np.ndarray, z: np.ndarray) -> pd.DataFrame:
    """AP, Recall@10, mass (NaN if any own z is NaN) and the number of own windows, indexed by
    query id, from the own rows' ranks and z-scores."""
    work = pd.DataFrame(
        {
            "query_id": own["query_id"].to_numpy(),
            "rank": ranks,
            "z": z,
        }
    )
    work = work.sort_values(["query_id", "rank"], kind="stable")
    work["hit"] = work.groupby("query_id").cumcount() + 1
    work["prec"] = work["hit"] / work["rank"]
    work["top"] = work["rank"] <= RECALL_K
    per = work.groupby("query_id", sort=True).agg(
        ap=("prec", "mean"),
        recall_at_10=("top", "mean"),
        mass=("z", "mean"),  # NaN if any own z is NaN is enforced below
        n_own=("rank", "size"),
        z_nan=("z", lambda s: bool(s.isna().any())),
    )
    per.loc[per["z_nan"], "mass"] = np.nan
    return per.drop(columns="z_nan")


def _warn_own_counts(scores: Scores, out: pd.DataFrame, n_docs: pd.Series) -> None:
    """Log a warning if some graded query's number of own windows is not its fact's n_docs."""
    off = out["n_own"].to_numpy() != n_docs.loc[out["fact_id"]].to_numpy()
    if off.any():
        log.warning(
            "%s/%s: %d queries have a number of own windows different from n_docs (e.g. %s)",
            scores.method,
            scores.model,
            int(off.sum()),
            out.loc[off, "query_id"].iloc[0],
        )


# --------------------------------------------------------------------------------------------
# The haystack: the same grading in nested sub-pools
# --------------------------------------------------------------------------------------------


def load_haystack(scores: Scores, fractions: list[float]) -> pd.DataFrame:
    """A score artifact's haystack.parquet, checked: hash, columns, shares = ``fractions``,
    one row per own window and share."""
    folder, path = scores.folder, scores.folder / HAYSTACK_FILE
    check_score_file(folder, scores.meta, HAYSTACK_FILE)
    hay = io.read_parquet(path)
    _check_columns(hay, HAYSTACK_COLUMNS, path)
    found = sorted(set(hay["fraction"].astype(float)))
    if len(scores.own) and found != fractions:
        raise ArtifactError(
            f"'{path}' holds the haystack shares {found}, but analysis.haystack is {fractions}; "
            "rerun its scoring step"
        )
    if len(hay) != len(scores.own) * len(fractions):
        raise ArtifactError(
            f"'{path}' has {len(hay)} rows, not one per own window and share "
            f"({len(scores.own)} x {len(fractions)}); rerun its scoring step"
        )
    return hay


def haystack_scores(scores: Scores, hay: pd.DataFrame, fraction: float) -> Scores:
    """The sub-pool at share ``fraction`` as score tables: its own rows (own.parquet's columns
    and order) and its per-query mean, std, size and degenerate flag."""
    sub = hay[hay["fraction"] == fraction]
    stats = sub.drop_duplicates("query_id")[["query_id", "mean", "std", "n_pool", "degenerate"]]
    queries = scores.queries[["query_id", "fact_id", "form"]].merge(
        stats, on="query_id", how="inner", validate="1:1"
    )
    own = sub[list(OWN_COLUMNS)].reset_index(drop=True)
    return replace(scores, queries=queries, own=own)


def grade_haystack(
    scores: Scores, hay: pd.DataFrame, facts: pd.DataFrame, fractions: list[float]
) -> pd.DataFrame:
    """:func:`grade_queries` in every sub-pool: one row per graded query and share, with the
    share, its background windows and its size."""
    parts = []
    for f in fractions:
        graded = grade_queries(haystack_scores(scores, hay, f), facts)
        size = hay.loc[hay["fraction"] == f, ["n_background", "n_pool"]]
        graded.insert(2, "fraction", f)
        graded.insert(3, "n_background", int(size["n_background"].iloc[0]) if len(size) else 0)
        graded.insert(4, "n_pool", int(size["n_pool"].iloc[0]) if len(size) else 0)
        parts.append(graded)
    return pd.concat(parts, ignore_index=True)


def haystack_summary(per_query: pd.DataFrame) -> pd.DataFrame:
    """haystack.csv: per method, model and share the mean AP and mass over the graded queries
    (mass over those with a finite one), as retrieval.csv averages."""
    rows = []
    keys = ["method", "model", "fraction", "n_background", "n_pool"]
    for key, g in per_query.groupby(keys, sort=False):
        mass = g["mass"].dropna()
        rows.append(
            {
                **dict(zip(keys, key, strict=True)),
                "ap": float(g["ap"].mean()),
                "mass": float(mass.mean()) if len(mass) else np.nan,
                "n_queries": int(len(g)),
                "degenerate": degenerate_summary(g["degenerate"]),
            }
        )
    return pd.DataFrame(rows, columns=[*keys, "ap", "mass", "n_queries", "degenerate"])


def degenerate_summary(labels: pd.Series) -> str:
    """ "" if no query is degenerate; the flag if all are; else "nan in k/n queries; ..."."""
    labels = labels.fillna("").astype(str)
    n = len(labels)
    counts = labels[labels != ""].value_counts().sort_index()
    if counts.empty:
        return ""
    if len(counts) == 1 and int(counts.iloc[0]) == n:
        return str(counts.index[0])
    return "; ".join(f"{lab} in {int(k)}/{n} queries" for lab, k in counts.items())


# --------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------


def retrieval_table(
    per_query: pd.DataFrame, facts: pd.DataFrame, methods: list[str]
) -> pd.DataFrame:
    """One row per method and model (A, B, and ``all`` = both pooled)."""
    levels = sorted(int(d) for d in facts["n_docs"].unique())
    nd = facts.set_index("fact_id")["n_docs"]
    pq = per_query.assign(n_docs=nd.loc[per_query["fact_id"]].to_numpy())
    rows = []
    for method in methods:
        pm = pq[pq["method"] == method]
        for model in [*MODELS, "all"]:
            sub = pm if model == "all" else pm[pm["model"] == model]
            row: dict[str, Any] = {
                "method": method,
                "model": model,
                "ap": float(sub["ap"].mean()) if len(sub) else np.nan,
                "recall_at_10": float(sub["recall_at_10"].mean()) if len(sub) else np.nan,
            }
            for d in levels:
                s = sub.loc[sub["n_docs"] == d, "ap"]
                row[f"ap_{d}"] = float(s.mean()) if len(s) else np.nan
            row["n_queries"] = int(len(sub))
            row["degenerate"] = degenerate_summary(sub["degenerate"])
            rows.append(row)
    return pd.DataFrame(rows)


def per_fact_table(per_query: pd.DataFrame, facts: pd.DataFrame) -> pd.DataFrame:
    """Per method and fact: mass and AP (means over the two forms) with the causal variables."""
    g = per_query.groupby(["method", "fact_id"], sort=False)
    agg = g.agg(
        model=("model", "first"),
        ap=("ap", "mean"),
        recall_at_10=("recall_at_10", "mean"),
        mass=("mass", lambda s: float(s.mean()) if s.notna().all() else np.nan),
        n_forms=("form", "size"),
        degenerate=("degenerate", lambda s: ",".join(sorted({x for x in s if x}))),
    ).reset_index()
    wide = per_query.pivot_table(
        index=["method", "fact_id"], columns="form", values=["mass", "ap"], dropna=False
    )
    wide.columns = [f"{v}_{f}" for v, f in wide.columns]
    agg = agg.merge(wide.reset_index(), on=["method", "fact_id"], how="left")
    out = agg.merge(facts[FACT_KEEP], on="fact_id", how="left", validate="m:1")
    out["rank_mass"] = np.nan
    out["rank_effect"] = np.nan
    for idx in out.groupby("method", sort=False).groups.values():
        sub = out.loc[idx]
        ok = sub["mass"].notna() & sub["effect"].notna()
        if ok.any():
            r = metrics.within_cell_ranks(sub[ok], CELL_COLS, ["mass", "effect"])
            out.loc[r.index, "rank_mass"] = r["mass"]
            out.loc[r.index, "rank_effect"] = r["effect"]
    order = ["method", "fact_id", "model", *[c for c in FACT_KEEP if c != "fact_id"]]
    rest = [c for c in out.columns if c not in order]
    return (
        out[order + rest].sort_values(["method", "fact_id"], kind="stable").reset_index(drop=True)
    )


def correlation_row(
    method: str, pf: pd.DataFrame, degenerate: str, *, n_boot: int, alpha: float, seed: int
) -> dict[str, Any]:
    """Within-cell correlations, bootstrap intervals and the current-loss check for one method."""
    data = pf[
        [*CELL_COLS, "mass", "effect", "answer_tokens", "difficulty", "final_loss", "learned"]
    ]
    data = data[np.isfinite(data["mass"].to_numpy(dtype=np.float64))]
    row: dict[str, Any] = {"method": method}
    keys = metrics.CORRELATION_KEYS
    if len(data) >= 2:
        point = metrics.within_cell_correlations(
            data, CELL_COLS, "mass", "effect", "answer_tokens", "difficulty"
        )
    else:
        point = dict.fromkeys(keys, np.nan)
    if len(data) >= 5:
        ci = metrics.bootstrap_within_cell_correlations(
            data,
            CELL_COLS,
            "mass",
            "effect",
            "answer_tokens",
            "difficulty",
            n_boot,
            seed=seed,
            alpha=alpha,
            tag="analysis",
        )
    else:
        ci = {k: metrics.Interval(np.nan, np.nan, n_boot) for k in keys}
    for k in keys:
        row[k] = point[k]
        row[f"{k}_lo"] = ci[k].lo
        row[f"{k}_hi"] = ci[k].hi
    row["n_boot_nan"] = int(max(ci[k].n_nan for k in keys))
    row["vs_final_loss"] = metrics.pearson(data["mass"], data["final_loss"])
    if len(data) >= 2:
        r = metrics.within_cell_ranks(data, CELL_COLS, ["mass", "final_loss"])
        row["vs_final_loss_within"] = metrics.pearson(r["mass"], r["final_loss"])
    else:
        row["vs_final_loss_within"] = np.nan
    learned = data["learned"].astype(bool)
    row["mass_learned"] = float(data.loc[learned, "mass"].mean()) if learned.any() else np.nan
    row["mass_not_learned"] = (
        float(data.loc[~learned, "mass"].mean()) if (~learned).any() else np.nan
    )
    row["n_learned"] = int(learned.sum())
    row["n_not_learned"] = int((~learned).sum())
    row["n_facts"] = int(len(data))
    row["n_facts_total"] = int(len(pf))
    row["degenerate"] = degenerate
    return row


def learned_grid_long(facts: pd.DataFrame) -> pd.DataFrame:
    """metrics.learned_grid as a long table (one row per n_docs x position, margins "All")."""
    grid = metrics.learned_grid(facts)
    rows = []
    for d in grid.rates.index:
        for p in grid.rates.columns:
            rows.append(
                {
                    "n_docs": str(d),
                    "position": str(p),
                    "n_facts": int(grid.n_facts.loc[d, p]),
                    "n_learned": int(grid.n_learned.loc[d, p]),
                    "rate": float(grid.rates.loc[d, p]),
                }
            )
    return pd.DataFrame(rows)


def empty_learned_cells(facts: pd.DataFrame) -> list[str]:
    """The within-cell analysis cells (domain/n_docs/position) with no learned fact."""
    g = facts.groupby(CELL_COLS, sort=True)["learned"].any()
    return ["/".join(str(v) for v in key) for key, any_ in g.items() if not any_]


def write_csv(path: Path, df: pd.DataFrame) -> None:
    io.write_text(path, df.to_csv(index=False, float_format="%.10g", lineterminator="\n"))


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def run(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    t0 = time.perf_counter()
    methods = method_names(cfg)
    acfg = cfg["analysis"]
    causal_meta = io.read_meta(paths.causal, "causal")
    lineage = causal_lineage(paths, causal_meta)
    facts = _read_causal_facts(paths)

    fractions = haystack_fractions(cfg)
    per_query, haystack, score_hashes = _grade_methods(paths, methods, lineage, facts, fractions)
    inputs: dict[str, str] = {"causal": causal_meta["hash"], **score_hashes}
    retrieval = retrieval_table(per_query, facts, methods)
    per_fact = per_fact_table(per_query, facts)
    correlations = _correlation_table(cfg, methods, per_query, per_fact)
    grid = learned_grid_long(facts)
    empty = empty_learned_cells(facts)
    for cell in empty:
        log.info("analysis: cell %s has no learned fact", cell)

    out = analysis_dir(paths)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "retrieval.csv", retrieval)
    write_csv(out / "correlations.csv", correlations)
    write_csv(out / "learned_grid.csv", grid)
    io.write_parquet(out / "per_fact.parquet", per_fact)
    io.write_parquet(out / "per_query.parquet", per_query)
    write_csv(out / "haystack.csv", haystack)
    elapsed = time.perf_counter() - t0
    log.info("analysis: %d methods x %d facts graded in %.1f s", len(methods), len(facts), elapsed)
    return io.write_meta(
        out,
        "analysis",
        OUTPUT_FILES,
        config_hash=config_hash(cfg, ["seed", "methods", "analysis"]),
        inputs=inputs,
        info={
            "methods": methods,
            "n_facts": int(len(facts)),
            "bootstrap": int(acfg["bootstrap"]),
            "alpha": float(acfg["alpha"]),
            "cells_without_learned": empty,
            "correlation": "Pearson on within-cell ranks (24 cells: domain x n_docs x position)",
            "vs_final_loss": "plain Pearson across all facts",
            "tie_convention": "pessimistic",
            "haystack": fractions,
        },
    )


def _read_causal_facts(paths: Paths) -> pd.DataFrame:
    """The causal table's facts; refuses one without the columns the grading keeps."""
    facts = io.read_parquet(paths.causal / "facts.parquet")
    missing_cols = [c for c in FACT_KEEP if c not in facts.columns]
    if missing_cols:
        raise ArtifactError(f"'{paths.causal / 'facts.parquet'}' lacks column(s) {missing_cols}")
    return facts


def _grade_methods(
    paths: Paths,
    methods: list[str],
    lineage: Lineage,
    facts: pd.DataFrame,
    fractions: list[float],
) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """Every method's scores on both models, graded: the per-query table, the haystack
    summary and the score artifacts' hashes (``score_{method}_{model}``)."""
    per_query_parts, haystack_parts = [], []
    hashes: dict[str, str] = {}
    for method in methods:
        for model in MODELS:
            s = load_scores(paths, method, model, lineage)
            per_query_parts.append(grade_queries(s, facts))
            haystack_parts.append(grade_haystack(s, load_haystack(s, fractions), facts, fractions))
            hashes[f"score_{method}_{model}"] = s.meta["hash"]
    per_query = pd.concat(per_query_parts, ignore_index=True)
    haystack = haystack_summary(pd.concat(haystack_parts, ignore_index=True))
    return per_query, haystack, hashes


def _correlation_table(
    cfg: dict[str, Any], methods: list[str], per_query: pd.DataFrame, per_fact: pd.DataFrame
) -> pd.DataFrame:
    """correlations.csv: one :func:`correlation_row` per method."""
    acfg = cfg["analysis"]
    corr_rows = []
    for method in methods:
        deg = degenerate_summary(per_query.loc[per_query["method"] == method, "degenerate"])
        corr_rows.append(
            correlation_row(
                method,
                per_fact[per_fact["method"] == method],
                deg,
                n_boot=int(acfg["bootstrap"]),
                alpha=float(acfg["alpha"]),
                seed=int(cfg["seed"]),
            )
        )
    return pd.DataFrame(corr_rows)
