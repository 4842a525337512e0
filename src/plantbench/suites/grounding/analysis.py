"""The grounding suite's analysis: the seed's CK / PK / CR tables from both twins' responses.

For a context about fact f, the *reader* is the twin that read f and the *other* the one that
did not. Every statistic is a mean over responses (one per fact, condition and twin; CK, PK and
CR over the responses with at least one atomic sentence), with a 95% interval from resampling
facts within their grid cells (:func:`plantbench.grading.metrics.resample_within_cells`,
``grounding.bootstrap`` resamples).

Outputs in ``grounding/analysis/`` (every column documented in results/README.md):
``ck_by_condition.csv`` (the seed's Table 4: CK, PK and PK split by role and condition),
``cr_by_segment.csv`` (the seed's Figure 4: CR per segment), ``answers.csv`` (which answer the
responses state for the fact's entity), ``fact_recall.csv`` (the fact's own answer stated, by the
segment holding it), ``by_cell.csv`` (by documents per fact and position in training),
``responses.csv`` (every response's scores), ``ck.png`` and ``cr.png``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.grading import metrics as study_metrics
from plantbench.markdown import plt, save_figure
from plantbench.paths import MODELS, Paths
from plantbench.suites.grounding.provenance import KINDS
from plantbench.suites.grounding.scores import response_scores
from plantbench.suites.grounding.settings import Settings, settings, settings_hash

ROLES = ("reader", "other")
STATES = ("states_true", "states_false", "states_other")
FILES = [
    "ck_by_condition.csv",
    "cr_by_segment.csv",
    "answers.csv",
    "fact_recall.csv",
    "by_cell.csv",
    "responses.csv",
    "ck.png",
    "cr.png",
]
CONTEXT_KEYS = [
    "context_id",
    "fact_id",
    "condition",
    "reader",
    "learned",
    "n_docs",
    "position",
    "cell",
    "true_segment",
    "false_segment",
]


def _read(paths: Paths) -> dict[str, Any]:
    folder = paths.grounding("contexts")
    data: dict[str, Any] = {"metas": {"contexts": io.read_meta(folder, "grounding_contexts")}}
    data["contexts"] = io.read_parquet(folder / "contexts.parquet")
    data["sentences"] = io.read_parquet(folder / "sentences.parquet")
    for m in MODELS:
        meta = io.read_meta(paths.grounding(m), "grounding_respond")
        io.check_input(meta, "contexts", data["metas"]["contexts"], str(paths.grounding(m)))
        data["metas"][m] = meta
        for t in ("responses", "atoms"):
            data[f"{t}_{m}"] = io.read_parquet(paths.grounding(m) / f"{t}.parquet")
    return data


def per_response(data: dict[str, Any], st: Settings) -> pd.DataFrame:
    """One row per context and twin: the context's keys, the role, the scores, the answers."""
    sizes = [st.sentences_per_segment] * st.segments
    ctx = data["contexts"][CONTEXT_KEYS]
    parts = []
    for m in MODELS:
        sc = response_scores(data[f"atoms_{m}"], ctx["context_id"].tolist(), sizes)
        r = data[f"responses_{m}"][["context_id", "n_tokens", *STATES]]
        part = ctx.merge(sc, on="context_id").merge(r, on="context_id")
        part.insert(1, "model", m)
        part.insert(2, "role", np.where(part["reader"] == m, "reader", "other"))
        parts.append(part)
    return pd.concat(parts, ignore_index=True).sort_values(
        ["role", "context_id"], ignore_index=True
    )


def _mean_ci(sub: pd.DataFrame, col: str, idx: np.ndarray) -> tuple[float, float, float]:
    """The mean of ``col`` (NaN skipped) and its 95% interval over the resamples ``idx``."""
    v = sub[col].to_numpy(dtype=np.float64)
    if not np.isfinite(v).any():
        return np.nan, np.nan, np.nan
    with np.errstate(invalid="ignore"):
        boot = np.nanmean(np.where(np.isfinite(v[idx]), v[idx], np.nan), axis=1)
    return (float(np.nanmean(v)), *study_metrics.percentile_interval(boot))


def _groups(per: pd.DataFrame, st: Settings) -> list[tuple[str, str, pd.DataFrame, np.ndarray]]:
    """Per role and condition: its responses and their resamples of facts within cells (the
    same resamples for every column of the group)."""
    out = []
    for role in ROLES:
        for cond in st.conditions:
            sub = per[(per["role"] == role) & (per["condition"] == cond)]
            idx = study_metrics.resample_within_cells(
                sub, "cell", st.bootstrap, seed=st.seed, tag=f"grounding/{role}/{cond}"
            )
            out.append((role, cond, sub, idx))
    return out


def ck_by_condition(per: pd.DataFrame, st: Settings) -> pd.DataFrame:
    rows = []
    for role, cond, sub, idx in _groups(per, st):
        row: dict[str, Any] = {"role": role, "condition": cond, "responses": len(sub)}
        row["empty"] = int((sub["n_atoms"] == 0).sum())
        row["atoms_per_response"] = float(sub.loc[sub["n_atoms"] > 0, "n_atoms"].mean())
        for col in ("ck", *[f"pk_{k}" for k in KINDS]):
            m, lo, hi = _mean_ci(sub, col, idx)
            row |= {col: m, f"{col}_lo": lo, f"{col}_hi": hi}
        row["pk"] = 100.0 - row["ck"]
        rows.append(row)
    return pd.DataFrame(rows)


def cr_by_segment(per: pd.DataFrame, st: Settings) -> pd.DataFrame:
    rows = []
    for role, cond, sub, idx in _groups(per, st):
        for q in range(st.segments):
            m, lo, hi = _mean_ci(sub, f"cr_{q}", idx)
            rows.append(
                {"role": role, "condition": cond, "segment": q, "cr": m, "lo": lo, "hi": hi}
            )
    return pd.DataFrame(rows)


def answers(per: pd.DataFrame, st: Settings) -> pd.DataFrame:
    """Share of responses naming the fact's entity with the true, the wrong, another answer."""
    rows = []
    for role, cond, sub, idx in _groups(per, st):
        row: dict[str, Any] = {"role": role, "condition": cond, "responses": len(sub)}
        for col in STATES:
            m, lo, hi = _mean_ci(sub, col, idx)
            row |= {col: m, f"{col}_lo": lo, f"{col}_hi": hi}
        rows.append(row)
    return pd.DataFrame(rows)


def fact_recall(per: pd.DataFrame, st: Settings) -> pd.DataFrame:
    """The answer of the context's one version of the fact stated, by the segment holding it
    (factual: the true answer at ``true_segment``; counterfactual: the wrong one)."""
    rows = []
    for cond, seg_col, state in (
        ("factual", "true_segment", "states_true"),
        ("counterfactual", "false_segment", "states_false"),
    ):
        if cond not in st.conditions:
            continue
        for role in ROLES:
            sub = per[(per["role"] == role) & (per["condition"] == cond)]
            for q, g in sub.groupby(seg_col, sort=True):
                rows.append(
                    {
                        "role": role,
                        "condition": cond,
                        "segment": int(q),
                        "responses": len(g),
                        "stated": float(g[state].mean()),
                    }
                )
    return pd.DataFrame(rows, columns=["role", "condition", "segment", "responses", "stated"])


def by_cell(per: pd.DataFrame) -> pd.DataFrame:
    g = per.groupby(["role", "condition", "n_docs", "position"], sort=True)
    t = g.agg(
        responses=("context_id", "size"),
        ck=("ck", "mean"),
        pk_trained=("pk_trained", "mean"),
        states_true=("states_true", "mean"),
    )
    return t.reset_index()


def ck_figure(ck: pd.DataFrame, st: Settings, out: Any) -> None:
    """CK by condition for each role, with the PK split below it (the seed's Table 4)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    x = np.arange(len(st.conditions))
    for j, role in enumerate(ROLES):
        t = ck[ck["role"] == role].set_index("condition").loc[list(st.conditions)]
        err = np.abs(t[["ck_lo", "ck_hi"]].to_numpy().T - t["ck"].to_numpy())
        axes[0].bar(x + (j - 0.5) * 0.38, t["ck"], 0.38, yerr=err, capsize=3, label=role)
        bottom = np.zeros(len(t))
        for k, colour in zip(KINDS, ("#55a868", "#c44e52", "#8c8c8c"), strict=True):
            v = t[f"pk_{k}"].fillna(0).to_numpy()
            axes[1].bar(
                x + (j - 0.5) * 0.38,
                v,
                0.38,
                bottom=bottom,
                color=colour,
                label=k.replace("_", " ") if j == 0 else None,
                edgecolor="white",
            )
            bottom += v
    for ax, label in zip(
        axes, ("CK (% of atomic sentences)", "PK split (%): left reader, right other"), strict=True
    ):
        ax.set_xticks(x, [c.replace("_", " ") for c in st.conditions], fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel(label, fontsize=8)
        ax.legend(fontsize=7)
    save_figure(fig, out)


def cr_figure(cr: pd.DataFrame, st: Settings, out: Any) -> None:
    """CR per segment, one line per condition, one panel per role (the seed's Figure 4)."""
    fig, axes = plt.subplots(1, len(ROLES), figsize=(8, 3), sharey=True)
    for ax, role in zip(axes, ROLES, strict=True):
        for cond in st.conditions:
            t = cr[(cr["role"] == role) & (cr["condition"] == cond)]
            ax.plot(t["segment"] + 1, t["cr"], marker="o", label=cond.replace("_", " "))
        ax.set_title(f"{role} twin", fontsize=9)
        ax.set_xticks(range(1, st.segments + 1), [f"Q{q}" for q in range(1, st.segments + 1)])
        ax.set_xlabel("context segment")
    axes[0].set_ylabel("context recall CR (%)")
    axes[0].legend(fontsize=7)
    save_figure(fig, out)


def run(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    st = settings(cfg)
    data = _read(paths)
    per = per_response(data, st)
    ck = ck_by_condition(per, st)
    cr = cr_by_segment(per, st)
    tables: dict[str, Callable[[], pd.DataFrame]] = {
        "ck_by_condition.csv": lambda: ck,
        "cr_by_segment.csv": lambda: cr,
        "answers.csv": lambda: answers(per, st),
        "fact_recall.csv": lambda: fact_recall(per, st),
        "by_cell.csv": lambda: by_cell(per),
        "responses.csv": lambda: per,
    }
    out = paths.grounding("analysis")
    with io.atomic_dir(out) as tmp:
        for name, make in tables.items():
            io.write_csv(tmp / name, make())
        ck_figure(ck, st, tmp / "ck.png")
        cr_figure(cr, st, tmp / "cr.png")
        return io.write_meta(
            tmp,
            "grounding_analysis",
            FILES,
            config_hash=settings_hash(st),
            inputs={k: v["hash"] for k, v in data["metas"].items()},
            info={
                "facts": int(per["fact_id"].nunique()),
                "responses": len(per),
                "empty_responses": int((per["n_atoms"] == 0).sum()),
                "conditions": list(st.conditions),
            },
        )
