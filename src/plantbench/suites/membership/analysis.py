"""The membership suite's analysis: the seed's Tables 1 and 2 and the per-layer figure from both
twins' passes.

Outputs in ``membership/analysis/`` (every column documented in results/README.md):
``table1.csv`` (CRM-LR, CRM-XGB, the best likelihood baseline, the gain, the L3 dimension, per
twin), ``table2.csv`` (with and without L1 + L2), ``aucs.csv`` (every AUC of both twins: CRM,
ablations, baselines, controls, noise), ``layers.csv`` and ``layers.png`` (AUC per layer),
``cells.csv`` (by documents per fact and position in training; learned vs unlearned members),
``distractors.csv`` (the distractor control).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from plantbench import io
from plantbench.markdown import plt, save_figure
from plantbench.paths import MODELS, Paths
from plantbench.suites.membership.probe import auc
from plantbench.suites.membership.settings import settings, settings_hash

FILES = [
    "table1.csv",
    "table2.csv",
    "aucs.csv",
    "layers.csv",
    "cells.csv",
    "distractors.csv",
    "layers.png",
]


def _read(paths: Paths) -> dict[str, Any]:
    data: dict[str, Any] = {
        "metas": {"samples": io.read_meta(paths.membership("samples"), "membership_samples")}
    }
    for t in ("aucs", "layers", "cells", "features"):
        data[t] = []
    for m in MODELS:
        meta = io.read_meta(paths.membership(m), "membership_detect")
        io.check_input(meta, "samples", data["metas"]["samples"], str(paths.membership(m)))
        data["metas"][m] = meta
        for t in ("aucs", "layers", "cells", "features"):
            data[t].append(io.read_parquet(paths.membership(m) / f"{t}.parquet").assign(model=m))
    return {
        k: (pd.concat(v, ignore_index=True) if isinstance(v, list) else v) for k, v in data.items()
    }


def _auc(a: pd.DataFrame, model: str, name: str) -> pd.Series:
    return a[(a["model"] == model) & (a["name"] == name)].iloc[0]


def table1(a: pd.DataFrame, metas: dict[str, Any]) -> pd.DataFrame:
    rows = []
    for m in MODELS:
        lr, xgb = _auc(a, m, "CRM-LR"), _auc(a, m, "CRM-XGB")
        lik = (
            a[(a["model"] == m) & (a["group"] == "likelihood")]
            .sort_values("auc", ascending=False)
            .iloc[0]
        )
        rows.append(
            {
                "model": m,
                "crm_lr": lr["auc"],
                "crm_lr_lo": lr["lo"],
                "crm_lr_hi": lr["hi"],
                "crm_xgb": xgb["auc"],
                "crm_xgb_lo": xgb["lo"],
                "crm_xgb_hi": xgb["hi"],
                "best_baseline": lik["name"],
                "best_baseline_auc": lik["auc"],
                "best_baseline_lo": lik["lo"],
                "best_baseline_hi": lik["hi"],
                "gain": lr["auc"] - lik["auc"],
                "l3_dimension": 2 * len(metas[m]["info"]["layers"]),
            }
        )
    return pd.DataFrame(rows)


def table2(a: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for m in MODELS:
        for clf in ("LR", "XGB"):
            w, wo = _auc(a, m, f"CRM-{clf}"), _auc(a, m, f"CRM-{clf} without L1+L2")
            rows.append(
                {
                    "model": m,
                    "classifier": clf,
                    "with_l1_l2": w["auc"],
                    "without_l1_l2": wo["auc"],
                    "delta": wo["auc"] - w["auc"],
                }
            )
    return pd.DataFrame(rows)


def distractors(feats: pd.DataFrame) -> pd.DataFrame:
    """Mean P(member) by kind, and the distractors' AUC against non-members and members."""
    rows = []
    for m in MODELS:
        f = feats[feats["model"] == m]
        p = {
            k: f.loc[f["kind"] == k, "p_crm_lr"].to_numpy()
            for k in ("member", "non_member", "distractor")
        }
        rows.append(
            {
                "model": m,
                "p_member": float(p["member"].mean()),
                "p_non_member": float(p["non_member"].mean()),
                "p_distractor": float(p["distractor"].mean()),
                "auc_distractor_vs_non_member": auc(
                    np.r_[np.ones(len(p["distractor"])), np.zeros(len(p["non_member"]))],
                    np.r_[p["distractor"], p["non_member"]],
                ),
                "auc_member_vs_distractor": auc(
                    np.r_[np.ones(len(p["member"])), np.zeros(len(p["distractor"]))],
                    np.r_[p["member"], p["distractor"]],
                ),
            }
        )
    return pd.DataFrame(rows)


def layers_figure(layers: pd.DataFrame, out: Any) -> None:
    """AUC per layer for each twin, the CRM-selected layers marked (the seed's per-layer plot)."""
    fig, ax = plt.subplots(figsize=(5, 3))
    for m in MODELS:
        t = layers[layers["model"] == m]
        line = ax.plot(t["layer"], t["auc"], marker="o", label=f"twin {m}")[0]
        sel = t[t["selected"]]
        ax.scatter(sel["layer"], sel["auc"], s=90, facecolors="none", edgecolors=line.get_color())
        ax.fill_between(t["layer"], t["lo"], t["hi"], alpha=0.15, color=line.get_color())
    ax.axhline(0.5, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("layer (0 = embeddings; circled: CRM-selected)")
    ax.set_ylabel("ROC-AUC (LTS of the layer, 5-fold CV)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    save_figure(fig, out)


def run(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    st = settings(cfg)
    data = _read(paths)
    t1 = table1(data["aucs"], data["metas"])
    tables = {
        "table1.csv": t1,
        "table2.csv": table2(data["aucs"]),
        "aucs.csv": data["aucs"],
        "layers.csv": data["layers"],
        "cells.csv": data["cells"],
        "distractors.csv": distractors(data["features"]),
    }
    out = paths.membership("analysis")
    with io.atomic_dir(out) as tmp:
        for name, df in tables.items():
            io.write_csv(tmp / name, df)
        layers_figure(data["layers"], tmp / "layers.png")
        return io.write_meta(
            tmp,
            "membership_analysis",
            FILES,
            config_hash=settings_hash(st),
            inputs={k: v["hash"] for k, v in data["metas"].items()},
            info={
                "crm_lr_auc": {m: float(x) for m, x in zip(t1["model"], t1["crm_lr"], strict=True)}
            },
        )
