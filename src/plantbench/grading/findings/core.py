"""The findings' core: verdict rules, the registry and the pieces the seeds' measures share.

A finding is one :class:`Finding`, registered by decorating its measure with :func:`finding` in
its seed's module (``seed003`` … ``seed002``); :func:`registered` gives them in registration
order. :func:`verdict` and :func:`combine` judge measurements against the finding's line;
:func:`_boot` is the seeded percentile bootstrap of facts within cells that measures without an
interval of their own use. Nothing here knows any one seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from plantbench.grading import metrics
from plantbench.markdown import method_label

Side = Literal["above", "below", "within"]
Line = float | tuple[float, float]  # a threshold, or a band (for ``within``)
REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)
CELLS = ["domain", "n_docs", "position"]
# the seed's eight methods (seed 003's tables); EK-FAC, TrackStar and plug-ins are not the seed's
SEED_METHODS = (
    "bm25",
    "embedding",
    "hidden",
    "grad_dot",
    "grad_cos",
    "tracin_dot",
    "tracin_influence",
    "influence",
)
GRADIENT_METHODS = ("grad_dot", "grad_cos", "tracin_dot", "tracin_influence", "influence")
PLAIN_GRADIENT = ("grad_dot", "grad_cos")

# the tables the findings read, by name, and the file each is read from (the folder:
# :data:`plantbench.grading.findings.tables._ARTIFACTS`). The columns each table needs
# (hand-made tables for evaluate_tables need only these):
# facts: fact_id, domain, n_docs, position, learned; correlations: method and, per statistic
# (raw, vs_length, vs_difficulty, controlled), its value, _lo and _hi; per_fact: method, fact_id,
# domain, n_docs, position, ap, mass, effect, answer_tokens, difficulty, final_loss, learned;
# context_ssp: method, ssp, lo, hi; context_metrics: metric, method, setting, value, lo, hi;
# membership: model, crm_lr(_lo, _hi), best_baseline, best_baseline_auc, best_baseline_lo, _hi;
# grounding: fact_id, role, condition, cell, ck, cr_0 … cr_<k-1>
TABLES: dict[str, str] = {
    "facts": "facts.parquet",
    "correlations": "correlations.csv",
    "per_fact": "per_fact.parquet",
    "context_ssp": "ssp.csv",
    "context_metrics": "metrics.csv",
    "membership": "table1.csv",
    "grounding": "responses.csv",
}


class NotTestable(Exception):
    """A finding cannot be checked on this run; the message says why."""


@dataclass(frozen=True)
class Measurement:
    on: str  # what the number is of: a method, a twin, a gap
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class RunTables:
    """The run's tables by name (:data:`TABLES`) and, for each one absent, why."""

    tables: Mapping[str, pd.DataFrame]
    absent: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    n_boot: int = 1000
    alpha: float = 0.05

    def get(self, name: str) -> pd.DataFrame:
        if name in self.tables:
            return self.tables[name]
        raise NotTestable(self.absent.get(name, f"this run has no {TABLES[name]}"))


Measure = Callable[[RunTables], list[Measurement]]


@dataclass(frozen=True)
class Finding:
    id: str
    statement: str
    seed_number: str
    line: Line
    side: Side
    line_from: str  # the line's derivation from the seed's words
    interval: str  # how the interval is formed
    measure: Measure
    fmt: str = "{:+.2f}"

    @property
    def seed(self) -> str:
        return self.id.split(".")[0]


_REGISTRY: list[Finding] = []


def finding(
    id: str,
    statement: str,
    seed_number: str,
    line: Line,
    side: Side,
    line_from: str,
    interval: str,
    fmt: str = "{:+.2f}",
) -> Callable[[Measure], Measure]:
    """Register the decorated measure function as one finding."""

    def register(fn: Measure) -> Measure:
        _REGISTRY.append(
            Finding(id, statement, seed_number, line, side, line_from, interval, fn, fmt)
        )
        return fn

    return register


def registered() -> tuple[Finding, ...]:
    """Every finding registered so far, in registration order (the package imports the seeds'
    modules, so through it: all of them, :data:`plantbench.grading.findings.FINDINGS`)."""
    return tuple(_REGISTRY)


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


def _band(line: Line, side: Side) -> tuple[float, float]:
    """The finding's side of its line as an open interval (a, b)."""
    if isinstance(line, tuple):
        return line
    return (line, math.inf) if side == "above" else (-math.inf, line)


def verdict(low: float, high: float, line: Line, side: Side) -> str:
    """One interval against the line: reproduced when it lies strictly on the finding's side,
    not reproduced when wholly off it, else (straddling or touching) inconclusive."""
    a, b = _band(line, side)
    if a < low and high < b:
        return REPRODUCED
    return NOT_REPRODUCED if high < a or low > b else INCONCLUSIVE


def margin(m: Measurement, line: Line, side: Side) -> float:
    """How far the interval is inside the finding's side (negative: over the line)."""
    a, b = _band(line, side)
    return min(m.low - a, b - m.high)


def combine(f: Finding, ms: list[Measurement]) -> tuple[str, Measurement]:
    """The finding's verdict over all its measurements and the one that decides it."""
    verdicts = [verdict(m.low, m.high, f.line, f.side) for m in ms]
    if NOT_REPRODUCED in verdicts:
        overall = NOT_REPRODUCED
    elif all(v == REPRODUCED for v in verdicts):
        overall = REPRODUCED
    else:
        overall = INCONCLUSIVE
    deciding = [m for m, v in zip(ms, verdicts, strict=True) if v == overall]
    return overall, min(deciding, key=lambda m: margin(m, f.line, f.side))


# --------------------------------------------------------------------------------------------
# Shared pieces of the measures
# --------------------------------------------------------------------------------------------


def _need_methods(
    t: RunTables, wanted: tuple[str, ...], least: int = 1, table: str = "correlations"
) -> list[str]:
    """The ``wanted`` methods this run graded (in ``table``; at least ``least`` of them, else
    not testable, naming the ones missing)."""
    graded = set(t.get(table)["method"])
    have = [m for m in wanted if m in graded]
    if len(have) < least:
        names = ", ".join(method_label(m) for m in wanted if m not in graded)
        raise NotTestable(f"not graded in this run (methods.enabled): {names}")
    return have


def _finite(ms: list[Measurement], what: str) -> list[Measurement]:
    """``ms``, or not testable when a number or interval end is undefined (NaN)."""
    bad = [m.on for m in ms if not all(map(math.isfinite, (m.value, m.low, m.high)))]
    if bad:
        raise NotTestable(f"{what} undefined in this run ({', '.join(bad)})")
    return ms


def _resamples(t: RunTables, df: pd.DataFrame, tag: str, cells: str | list[str]) -> np.ndarray:
    return metrics.resample_within_cells(df, cells, t.n_boot, seed=t.seed, tag=f"findings/{tag}")


Stat = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def _boot(
    t: RunTables, df: pd.DataFrame, tag: str, stat: Stat, on: str, cells: Any = CELLS
) -> Measurement:
    """A statistic of ``df``'s numeric columns (arrays of shape (resamples, rows)) with its
    seeded percentile interval over resamples of rows within cells."""
    num = df.select_dtypes(include=["number", "bool"])
    cols = {c: num[c].to_numpy(dtype=np.float64) for c in num.columns}
    with np.errstate(invalid="ignore", divide="ignore"):
        point = float(stat({c: v[None, :] for c, v in cols.items()})[0])
        idx = _resamples(t, df, tag, cells)
        reps = stat({c: v[idx] for c, v in cols.items()})
    lo, hi = metrics.percentile_interval(reps, t.alpha)
    return Measurement(on, point, lo, hi)


def _mean(v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Per resample (row) the mean of the finite values (where ``mask``)."""
    ok = np.isfinite(v) if mask is None else np.isfinite(v) & (mask > 0)
    return np.where(ok, v, 0.0).sum(axis=1) / ok.sum(axis=1)


def _pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per resample (row) the Pearson correlation of x and y."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    return (xc * yc).sum(1) / np.sqrt((xc * xc).sum(1) * (yc * yc).sum(1))


def _corr(t: RunTables, methods: list[str], key: str) -> list[Measurement]:
    """Each method's ``key`` column of correlations.csv with its bootstrap interval."""
    c = t.get("correlations").set_index("method")
    ms = [
        Measurement(method_label(m), *(float(c.loc[m, k]) for k in (key, f"{key}_lo", f"{key}_hi")))
        for m in methods
    ]
    return _finite(ms, key.replace("_", " "))


def _ap_by_fact(t: RunTables, methods: list[str]) -> pd.DataFrame:
    """Per fact (with its cell) the mean AP over its two forms, one column per method."""
    pf = t.get("per_fact")
    pf = pf[pf["method"].isin(methods)]
    wide = pf.pivot_table(index=["fact_id", *CELLS], columns="method", values="ap")
    return wide.reset_index()


def _ap_methods(t: RunTables, wanted: tuple[str, ...], least: int = 1) -> list[str]:
    return _need_methods(t, wanted, least, table="per_fact")


def _facts(t: RunTables) -> pd.DataFrame:
    f = t.get("facts")
    return f.assign(learned=f["learned"].astype(float))


def _rate(v: Mapping[str, np.ndarray], mask: str) -> np.ndarray:
    return _mean(v["learned"], v[mask])
