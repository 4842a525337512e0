"""The membership suite's section of the study report (nothing when the suite has not run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from plantbench import io
from plantbench.markdown import markdown_table
from plantbench.paths import Paths

FIGURES = {"layers.png": "membership_layers.png"}
SEED = (
    "The seed's ranges for comparison (nine 7–32B models on WikiMIA): likelihood baselines "
    "0.55–0.60, CRM 0.71–0.95 (gain +0.13 to +0.38), removing L1 + L2 changes CRM-LR by less "
    "than 0.01, shuffled labels ≈ 0.5."
)


def _ci(m: float, lo: float, hi: float) -> str:
    return f"{m:.3f} [{lo:.3f}, {hi:.3f}]"


def _table1(t: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "twin": t["model"],
            "CRM-LR": [_ci(*r) for r in t[["crm_lr", "crm_lr_lo", "crm_lr_hi"]].to_numpy()],
            "CRM-XGB": [_ci(*r) for r in t[["crm_xgb", "crm_xgb_lo", "crm_xgb_hi"]].to_numpy()],
            "best likelihood baseline": [
                f"{n} {_ci(a, lo, hi)}"
                for n, a, lo, hi in t[
                    ["best_baseline", "best_baseline_auc", "best_baseline_lo", "best_baseline_hi"]
                ].to_numpy()
            ],
            "gain": [f"{g:+.3f}" for g in t["gain"]],
            "L3 dimension": t["l3_dimension"].astype(str),
        }
    )


def _others(a: pd.DataFrame) -> pd.DataFrame:
    rows = a[~a["group"].isin(["crm"]) | a["name"].str.contains("held-out")]
    wide = rows.pivot_table(index=["group", "name"], columns="model", values="auc", sort=False)
    wide.columns = [f"twin {c}" for c in wide.columns]
    return wide.reset_index().map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)


def section(paths: Paths, out_dir: Path) -> tuple[str, dict[str, str], list[str]]:
    """(markdown, input hashes, figures copied into the report folder)."""
    folder = paths.membership("analysis")
    if not (folder / io.META).is_file():
        return "", {}, []
    meta = io.read_meta(folder, "membership_analysis")
    sm = io.read_meta(paths.membership("samples"), "membership_samples")["info"]
    t1 = pd.read_csv(folder / "table1.csv")
    t2 = pd.read_csv(folder / "table2.csv")
    a = pd.read_csv(folder / "aucs.csv")
    cells = pd.read_csv(folder / "cells.csv")
    dis = pd.read_csv(folder / "distractors.csv")
    for src, dst in FIGURES.items():
        shutil.copyfile(folder / src, out_dir / dst)
    learned = cells[cells["subset"] != "cell"][
        ["model", "score", "subset", "members", "auc", "lo", "hi"]
    ]
    by_docs = (
        cells[cells["subset"] == "cell"]
        .assign(w=lambda d: d["auc"] * d["members"])
        .groupby(["model", "score", "n_docs"], sort=False)[["w", "members"]]
        .sum()
    )
    by_docs = (by_docs["w"] / by_docs["members"]).unstack("n_docs")
    by_docs.columns = [f"{c} docs" for c in by_docs.columns]
    text = [
        "## Memory or context? The reality-monitoring probe (seed 001)",
        "",
        f"Per twin {sm['samples_per_twin']} balanced samples: a planted document it read "
        "(member) or one only the other twin read (non-member), same text, template and "
        f"distribution; {sm['n_cal']} of them calibrate the layer selection and the directions, "
        f"and {sm['distractors_per_twin']} distractor documents (read by both) are a control. "
        "Query = the fact's question; CRM compares the twin with the document before the query "
        "against the query alone (`results/membership/`). ROC-AUC under 5-fold stratified CV "
        "(seed 42), 95% bootstrap intervals.",
        "",
        "Table 1 layout:",
        "",
        markdown_table(_table1(t1)),
        "",
        SEED,
        "",
        "Table 2 layout (CRM with and without the surface features L1 + L2):",
        "",
        markdown_table(t2.map(lambda v: f"{v:+.3f}" if isinstance(v, float) else v)),
        "",
        "Every other AUC (baselines, directions, controls, block noise):",
        "",
        markdown_table(_others(a)),
        "",
        "![membership AUC per layer](membership_layers.png)",
        "",
        "What no anchor can show: AUC by documents per fact (the cells' AUCs averaged over "
        "positions, weighted by members; `cells.csv` has each cell with its interval) and for "
        "learned vs unlearned members, for CRM-LR and the best baseline:",
        "",
        markdown_table(
            by_docs.reset_index().map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)
        ),
        "",
        markdown_table(learned.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)),
        "",
        "Distractor control (mean P(member) under the probe fitted on all samples):",
        "",
        markdown_table(dis.map(lambda v: f"{v:.3f}" if isinstance(v, float) else v)),
        "",
    ]
    return "\n".join(text), {"membership": meta["hash"]}, list(FIGURES.values())
