"""Seed 002's findings: contextual vs parametric knowledge (the grounding suite).

One registered function per finding; each line (threshold) is derived beside its finding from
the seed's own words (``line_from``), here and nowhere else. The numbers come from the suite's
``grounding/analysis/responses.csv``, one per twin role.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from plantbench.grading.findings.core import (
    Measurement,
    NotTestable,
    RunTables,
    Stat,
    _boot,
    _finite,
    _mean,
    finding,
)


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
