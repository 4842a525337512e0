"""The context suite's analysis: the seed's tables from both twins' passes.

For a query of fact f, the *base* twin is the one that never read f (the seed's p_base) and the
*reader* the one that did (p_ft). Every statistic is computed from per-fact sums (a fact's two
query forms together), so the 95% intervals resample facts within their grid cells
(:func:`plantbench.grading.metrics.resample_within_cells`, ``context.bootstrap`` resamples).

SSP follows the seed's definition (seed 000, eq. 10): the share of *answer-bearing* segments
whose interface label matches their source, over the facts the reader learned (the seed's
R_bench). In the seed every segment was retrieved for the question and its answer, so each one
carries the answer, from the weights (IW) or from the context only (ICL), balanced. Here only
the fact's own sentence carries the answer, so it is scored under both twins: under the reader
it is IW (the reader read and learned the fact), under the base twin ICL (it never read it),
balanced by construction, chance 0.5. The other segments (other facts' sentences) carry no part
of the answer, and their labels say nothing about how it was produced: counting them made SSP
a property of the context's layout (a method that puts the mass on the answer's sentence alone
scored exactly 0.25).

Outputs in ``context/analysis/`` (every column documented in results/README.md):
``table1.csv`` (the seed's Table 1: CAC, Util, RmI, BCS, APS per k), ``table2.csv`` (Drop@k, LDS),
``ssp.csv``, ``metrics.csv`` (every statistic with its interval), ``by_cell.csv`` (by documents
per fact and position in training), ``accuracy.csv`` (no-context and full-context accuracy by
role), ``shift.csv`` and ``shift.png`` (the score shift between the twins, the seed's Figure 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.grading import metrics as study_metrics
from plantbench.markdown import plt, save_figure
from plantbench.paths import MODELS, Paths
from plantbench.suites.context import metrics
from plantbench.suites.context.attribute import condition_ks
from plantbench.suites.context.methods import registry
from plantbench.suites.context.settings import Settings, settings, settings_hash

ROLES = ("base", "reader")
# the two readings of task accuracy: the answer ranks first of the candidates (the tables), and
# greedy decoding reproduces it exactly (metrics.csv, ``*_greedy``)
READINGS = {"": "correct", "_greedy": "greedy"}
FILES = [
    "table1.csv",
    "table2.csv",
    "ssp.csv",
    "metrics.csv",
    "by_cell.csv",
    "accuracy.csv",
    "shift.csv",
    "shift.png",
    "ssp.png",
]


def _read(paths: Paths) -> dict[str, Any]:
    data: dict[str, Any] = {"metas": {}}
    folder = paths.context("contexts")
    data["metas"]["contexts"] = io.read_meta(folder, "context_contexts")
    data["queries"] = io.read_parquet(folder / "queries.parquet")
    data["segments"] = io.read_parquet(folder / "segments.parquet")
    for m in MODELS:
        meta = io.read_meta(paths.context(m), "context_attribute")
        io.check_input(meta, "contexts", data["metas"]["contexts"], str(paths.context(m)))
        data["metas"][m] = meta
        for t in ("scores", "conditions", "queries", "lds"):
            data[f"{t}_{m}"] = io.read_parquet(paths.context(m) / f"{t}.parquet")
    return data


def role_frames(data: dict[str, Any], table: str) -> dict[str, pd.DataFrame]:
    """A twin table split by role: each query's rows from its base twin and its reader."""
    q = data["queries"][["query_id", "reader", "base"]]
    out = {}
    for role in ROLES:
        parts = []
        for m in MODELS:
            ids = q.loc[q[role] == m, "query_id"]
            t = data[f"{table}_{m}"]
            parts.append(t[t["query_id"].isin(ids)])
        out[role] = pd.concat(parts, ignore_index=True)
    return out


def score_matrix(scores: pd.DataFrame, method: str, query_ids: pd.Series, k: int) -> np.ndarray:
    s = scores[scores["method"] == method].sort_values(["query_id", "segment"])
    mat = s.pivot(index="query_id", columns="segment", values="score")
    return mat.loc[query_ids].to_numpy(dtype=np.float64).reshape(len(query_ids), k)


@dataclass
class _Frames:
    """Both twins' tables aligned on the query order, by role."""

    q: pd.DataFrame  # the contexts' query table, in query-id order
    queries: dict[str, pd.DataFrame]  # per role, indexed by query id in that order
    conditions: dict[str, pd.DataFrame]
    lds: dict[str, pd.DataFrame]
    scores: dict[str, pd.DataFrame]
    own: np.ndarray  # [queries]: the position of the fact's own (answer-bearing) segment
    own_icl: dict[str, np.ndarray]  # per role, [queries]: True where that segment is ICL


def _frames(data: dict[str, Any]) -> _Frames:
    q = data["queries"].sort_values("query_id").reset_index(drop=True)
    ids = q["query_id"]
    seg = data["segments"]
    own_seg = seg[seg["relevant"]].set_index("query_id").loc[ids]
    twin = {"reader": q["reader"].to_numpy(), "base": q["base"].to_numpy()}
    own_icl = {
        r: np.where(
            twin[r] == MODELS[0], own_seg[f"label_{MODELS[0]}"], own_seg[f"label_{MODELS[1]}"]
        )
        == "icl"
        for r in ROLES
    }
    return _Frames(
        q=q,
        queries={
            r: f.set_index("query_id").loc[ids] for r, f in role_frames(data, "queries").items()
        },
        conditions=role_frames(data, "conditions"),
        lds=role_frames(data, "lds"),
        scores=role_frames(data, "scores"),
        own=own_seg["segment"].to_numpy(dtype=np.int64),
        own_icl=own_icl,
    )


def _condition_columns(fr: _Frames, st: Settings, name: str, out: dict[str, Any]) -> None:
    """Top-k-only / rm-top-k accuracy on the base twin (both readings) and Drop@k per role."""
    ids = fr.q["query_id"]
    c = {r: t[t["method"] == name].set_index(["query_id", "k"]) for r, t in fr.conditions.items()}
    for kk in condition_ks(st):
        b = c["base"].xs(kk, level="k").loc[ids]
        for reading, col in READINGS.items():
            out[f"{name}|top{kk}{reading}"] = b[f"topk_only_{col}"].to_numpy(dtype=float)
            out[f"{name}|rm{kk}{reading}"] = b[f"rm_topk_{col}"].to_numpy(dtype=float)
        for r in ROLES:
            rm = c[r].xs(kk, level="k").loc[ids, "rm_topk_logp"].to_numpy()
            out[f"{name}|drop{kk}|{r}"] = fr.queries[r]["full_logp"].to_numpy() - rm


def _ranking_columns(fr: _Frames, st: Settings, name: str, out: dict[str, Any]) -> None:
    """CAC per persistence, SSP hits of the reader on learned facts, LDS per role."""
    ids = fr.q["query_id"]
    mat = {r: score_matrix(fr.scores[r], name, ids, st.segments) for r in ROLES}
    for rho in st.rbo:
        out[f"{name}|cac{rho}"] = [
            metrics.rbo(metrics.ranking(a), metrics.ranking(b), rho)
            for a, b in zip(mat["base"], mat["reader"], strict=True)
        ]
    out[f"{name}|ssp_hit"] = np.where(fr.q["learned"], _ssp_hits(fr, mat, name), 0.0)
    for r in ROLES:
        t = fr.lds[r]
        v = t[t["method"] == name].set_index("query_id").loc[ids, "lds"].to_numpy()
        out[f"{name}|lds|{r}"] = np.nan_to_num(v)
        out[f"{name}|lds_n|{r}"] = np.isfinite(v).astype(float)


def _ssp_hits(fr: _Frames, mat: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Per query, how many of the own segment's two labels (under the reader, under the base
    twin) the method's interface gets right (0, 1 or 2)."""
    interface = registry.get(name).interface
    hits = np.zeros(len(fr.q))
    rows = np.arange(len(fr.q))
    for r in ROLES:
        p_empty = fr.queries[r]["p_empty"]
        pred = np.stack(
            [metrics.source_labels(s, interface, p) for s, p in zip(mat[r], p_empty, strict=True)]
        )
        hits += pred[rows, fr.own] == fr.own_icl[r]
    return hits


def per_query(data: dict[str, Any], st: Settings) -> pd.DataFrame:
    """One row per query: everything the statistics sum over facts."""
    fr = _frames(data)
    out: dict[str, Any] = {}
    for r in ROLES:
        for reading, col in READINGS.items():
            out[f"none{reading}|{r}"] = fr.queries[r][f"none_{col}"].to_numpy(dtype=float)
            out[f"full{reading}|{r}"] = fr.queries[r][f"full_{col}"].to_numpy(dtype=float)
    for name in st.methods:
        _condition_columns(fr, st, name, out)
        _ranking_columns(fr, st, name, out)
    out["ssp_n"] = np.where(fr.q["learned"], len(ROLES), 0).astype(float)
    out["n"] = 1.0
    base = fr.q[["query_id", "fact_id", "learned", "n_docs", "position", "cell"]]
    return pd.concat([base, pd.DataFrame(out)], axis=1)


def per_fact(pq: pd.DataFrame) -> pd.DataFrame:
    num = [c for c in pq.columns if "|" in c or c in ("ssp_n", "n")]
    keys = ["fact_id", "learned", "n_docs", "position", "cell"]
    return pq.groupby(keys, sort=True)[num].sum().reset_index()


def _ratio(a: float, b: float) -> float:
    return float(a / b) if b > 0 else float("nan")


def _bcs_stats(s: pd.Series, st: Settings, name: str, cac: float, out: dict[str, float]) -> None:
    """Util, RmI, BCS and APS of one method at every k, under both readings of accuracy."""
    n = s["n"]
    for kk in st.top_k:
        kk = min(kk, st.segments)
        for g in READINGS:
            none, full = out[f"acc_none{g}|||base"], out[f"acc_full{g}|||base"]
            top, rm = s[f"{name}|top{kk}{g}"] / n, s[f"{name}|rm{kk}{g}"] / n
            u, r, b = metrics.util_rmi(none, full, top, rm)
            out[f"util{g}|{name}|k={kk}"], out[f"rmi{g}|{name}|k={kk}"] = u, r
            out[f"bcs{g}|{name}|k={kk}"] = b
            out[f"aps{g}|{name}|k={kk}"] = metrics.aps(b, cac)


def _likelihood_stats(s: pd.Series, st: Settings, name: str, out: dict[str, float]) -> None:
    """Drop@k and LDS of one method under each role."""
    for r in ROLES:
        for d in st.drop_k:
            kk = min(d, st.segments)
            out[f"drop|{name}|k={d}|{r}"] = _ratio(s[f"{name}|drop{kk}|{r}"], s["n"])
        out[f"lds|{name}||{r}"] = _ratio(s[f"{name}|lds|{r}"], s[f"{name}|lds_n|{r}"])


def statistics(f: pd.DataFrame, st: Settings) -> dict[str, float]:
    """Every statistic of one (possibly resampled) per-fact frame, keyed ``metric|method|...``."""
    s = f.sum(numeric_only=True)
    n = s["n"]
    out: dict[str, float] = {}
    for r in ROLES:
        for g in READINGS:
            out[f"acc_none{g}|||{r}"] = _ratio(s[f"none{g}|{r}"], n)
            out[f"acc_full{g}|||{r}"] = _ratio(s[f"full{g}|{r}"], n)
    for name in st.methods:
        cac = {rho: _ratio(s[f"{name}|cac{rho}"], n) for rho in st.rbo}
        for rho, v in cac.items():
            out[f"cac|{name}|rho={rho}"] = v
        _bcs_stats(s, st, name, cac[st.rbo[0]], out)
        out[f"ssp|{name}|"] = _ratio(s[f"{name}|ssp_hit"], s["ssp_n"])
        _likelihood_stats(s, st, name, out)
    return out


def long_table(f: pd.DataFrame, st: Settings) -> pd.DataFrame:
    point = statistics(f, st)
    idx = study_metrics.resample_within_cells(f, "cell", st.bootstrap, seed=st.seed, tag="context")
    boots = np.full((st.bootstrap, len(point)), np.nan)
    keys = list(point)
    for b in range(st.bootstrap):
        stats = statistics(f.iloc[idx[b]], st)
        boots[b] = [stats[k] for k in keys]
    rows = []
    for j, key in enumerate(keys):
        metric, method, setting, *role = key.split("|")
        lo, hi = study_metrics.percentile_interval(boots[:, j])
        rows.append((metric, method, setting, role[0] if role else "", point[key], lo, hi))
    cols = ["metric", "method", "setting", "role", "value", "lo", "hi"]
    return pd.DataFrame(rows, columns=cols)


def table1(long: pd.DataFrame, st: Settings) -> pd.DataFrame:
    """The seed's Table 1 layout: CAC (first ρ), then Util, RmI, BCS, APS at each k."""
    v = long.set_index(["metric", "method", "setting"])["value"]
    rows = []
    for name in st.methods:
        row: dict[str, Any] = {"method": name, "cac": v[("cac", name, f"rho={st.rbo[0]}")]}
        for kk in st.top_k:
            kk = min(kk, st.segments)
            for m in ("util", "rmi", "bcs", "aps"):
                row[f"{m}_k{kk}"] = v[(m, name, f"k={kk}")]
        rows.append(row)
    return pd.DataFrame(rows)


def table2(long: pd.DataFrame, st: Settings) -> pd.DataFrame:
    """The seed's Table 2 layout: Drop@k and LDS, per method and twin role."""
    v = long.set_index(["metric", "method", "setting", "role"])["value"]
    rows = []
    for name in st.methods:
        for r in ROLES:
            row: dict[str, Any] = {"method": name, "role": r}
            for d in st.drop_k:
                row[f"drop{d}"] = v[("drop", name, f"k={d}", r)]
            row["lds"] = v[("lds", name, "", r)]
            rows.append(row)
    return pd.DataFrame(rows)


def ssp_table(long: pd.DataFrame, f: pd.DataFrame) -> pd.DataFrame:
    t = long[long["metric"] == "ssp"][["method", "value", "lo", "hi"]].rename(
        columns={"value": "ssp"}
    )
    t["segments"] = int(f["ssp_n"].sum())
    t["facts"] = int(f["learned"].sum())
    return t.reset_index(drop=True)


def by_cell(f: pd.DataFrame, st: Settings) -> pd.DataFrame:
    """Point statistics by documents per fact and position in training (no intervals)."""
    rows = []
    for (n_docs, pos), g in f.groupby(["n_docs", "position"], sort=True):
        s = statistics(g, st)
        for name in st.methods:
            kk = min(st.top_k[0], st.segments)
            rows.append(
                {
                    "method": name,
                    "n_docs": int(n_docs),
                    "position": pos,
                    "facts": len(g),
                    "learned": int(g["learned"].sum()),
                    "cac": s[f"cac|{name}|rho={st.rbo[0]}"],
                    f"bcs_k{kk}": s[f"bcs|{name}|k={kk}"],
                    f"aps_k{kk}": s[f"aps|{name}|k={kk}"],
                    "ssp": s[f"ssp|{name}|"],
                }
            )
    return pd.DataFrame(rows)


def accuracy(long: pd.DataFrame) -> pd.DataFrame:
    a = long[long["metric"].str.startswith("acc_")]
    cond = a["metric"].str.replace("acc_", "", regex=False)
    a = a.assign(
        condition=cond.str.replace("_greedy", "", regex=False),
        reading=np.where(cond.str.endswith("_greedy"), "greedy", "rank"),
    )
    return a[["role", "condition", "reading", "value", "lo", "hi"]].reset_index(drop=True)


def own_scores(data: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """Per role, every segment score with whether the segment is the query's own fact's."""
    rel = data["segments"][["query_id", "segment", "relevant"]]
    return {
        r: s.merge(rel, on=["query_id", "segment"]) for r, s in role_frames(data, "scores").items()
    }


def shift(scored: dict[str, pd.DataFrame], st: Settings) -> pd.DataFrame:
    """Per method and role: the distribution of segment scores (all, and the fact's own)."""
    rows = []
    for r, s in scored.items():
        for name in st.methods:
            for kind, sub in (("all", s), ("own", s[s["relevant"]])):
                v = sub.loc[sub["method"] == name, "score"].to_numpy(dtype=np.float64)
                q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
                rows.append(
                    (name, r, kind, len(v), float(v.mean()), float(med), float(q1), float(q3))
                )
    return pd.DataFrame(
        rows, columns=["method", "role", "segments", "n", "mean", "median", "q25", "q75"]
    )


def shift_figure(scored: dict[str, pd.DataFrame], st: Settings, out: Any) -> None:
    """The own segment's score under each role, per method (the seed's Figure 3)."""
    fig, axes = plt.subplots(1, len(st.methods), figsize=(3 * len(st.methods), 3), squeeze=False)
    for ax, name in zip(axes[0], st.methods, strict=True):
        vals = [
            s.loc[(s["method"] == name) & s["relevant"], "score"].to_numpy()
            for s in (scored[r] for r in ROLES)
        ]
        ax.boxplot(vals, tick_labels=list(ROLES), showfliers=False)
        ax.set_title(name, fontsize=9)
        ax.axhline(0, color="grey", lw=0.5)
    axes[0][0].set_ylabel("score of the fact's own segment")
    save_figure(fig, out)


def ssp_figure(ssp: pd.DataFrame, out: Any) -> None:
    """SSP per method with its interval and chance (the seed's Figure 2)."""
    fig, ax = plt.subplots(figsize=(1.2 * len(ssp) + 1.5, 3))
    x = np.arange(len(ssp))
    err = np.abs(ssp[["lo", "hi"]].to_numpy().T - ssp["ssp"].to_numpy())
    ax.bar(x, ssp["ssp"], yerr=err, color="#4c72b0", capsize=3)
    ax.axhline(0.5, color="grey", ls="--", lw=0.8, label="chance")
    ax.set_xticks(x, ssp["method"], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("SSP (own segment, both twins)")
    ax.legend(fontsize=8)
    save_figure(fig, out)


def run(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    st = settings(cfg)
    data = _read(paths)
    f = per_fact(per_query(data, st))
    long = long_table(f, st)
    scored = own_scores(data)
    ssp = ssp_table(long, f)
    tables: dict[str, Callable[[], pd.DataFrame]] = {
        "table1.csv": lambda: table1(long, st),
        "table2.csv": lambda: table2(long, st),
        "ssp.csv": lambda: ssp,
        "metrics.csv": lambda: long,
        "by_cell.csv": lambda: by_cell(f, st),
        "accuracy.csv": lambda: accuracy(long),
        "shift.csv": lambda: shift(scored, st),
    }
    out = paths.context("analysis")
    with io.atomic_dir(out) as tmp:
        for name, make in tables.items():
            io.write_csv(tmp / name, make())
        shift_figure(scored, st, tmp / "shift.png")
        ssp_figure(ssp, tmp / "ssp.png")
        return io.write_meta(
            tmp,
            "context_analysis",
            FILES,
            config_hash=settings_hash(st),
            inputs={k: v["hash"] for k, v in data["metas"].items()},
            info={
                "facts": len(f),
                "learned_facts": int(f["learned"].sum()),
                "methods": list(st.methods),
            },
        )
