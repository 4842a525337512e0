"""Seed 001's findings: memory vs context from hidden states (the membership suite).

One registered function per finding; each line (threshold) is derived beside its finding from
the seed's own words (``line_from``), here and nowhere else. The numbers are the suite's
``membership/analysis/table1.csv``, one per twin.
"""

from __future__ import annotations

from plantbench.grading.findings.core import (
    Measurement,
    RunTables,
    _finite,
    finding,
)


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
