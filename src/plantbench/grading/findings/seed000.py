"""Seed 000's findings: context attribution under in-weight overlap (the context suite).

One registered function per finding; each line (threshold) is derived beside its finding from
the seed's own words (``line_from``), here and nowhere else. The intervals are the suite's own
bootstrap (``context/analysis/ssp.csv``, ``metrics.csv``).
"""

from __future__ import annotations

from plantbench.grading.findings.core import (
    Measurement,
    NotTestable,
    RunTables,
    _finite,
    finding,
)


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
