"""Reading a run's tables and evaluating the registered findings on them.

:func:`read_tables` reads the tables of one replicate (:data:`_ARTIFACTS`: where each lives and
why it may be absent); :func:`evaluate_tables` gives one row per finding (:data:`COLUMNS`);
:func:`evaluate` does both for every replicate of the run (``holds``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io, replicates
from plantbench.grading.findings.core import (
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    TABLES,
    VERDICTS,
    Finding,
    Measurement,
    NotTestable,
    RunTables,
    combine,
    registered,
)
from plantbench.paths import Paths
from plantbench.stages import BY_RULE

COLUMNS = [
    "id",
    "seed",
    "statement",
    "seed_number",
    "line",
    "line_from",
    "interval",
    "on",
    "ours",
    "low",
    "high",
    "this_run",
    "verdict",
    "why",
    "holds",
]


@dataclass(frozen=True)
class _Artifact:
    """A finished artifact the findings read: its folder, stage, tables and, when it is
    absent, why the findings that need it cannot be tested."""

    folder: Callable[[Paths], Path]
    stage: str
    tables: tuple[str, ...]  # the tables (:data:`TABLES`) in the folder
    why: str


SUITES_ON_ZERO = "the suites run on replicate 0's twins only"

# the folder of each table (:data:`TABLES`: its file, the columns it needs)
_ARTIFACTS = (
    _Artifact(
        lambda p: p.causal,
        "causal",
        ("facts",),
        "the run has no answer key yet (no causal/meta.json)",
    ),
    _Artifact(
        lambda p: p.analysis,
        "analysis",
        ("correlations", "per_fact"),
        "the methods are not graded yet (no analysis/meta.json)",
    ),
    _Artifact(
        lambda p: p.context("analysis"),
        "context_analysis",
        ("context_ssp", "context_metrics"),
        "the context suite has not run (seed 000)",
    ),
    _Artifact(
        lambda p: p.membership("analysis"),
        "membership_analysis",
        ("membership",),
        "the membership suite has not run (seed 001)",
    ),
    _Artifact(
        lambda p: p.grounding("analysis"),
        "grounding_analysis",
        ("grounding",),
        "the grounding suite has not run (seed 002)",
    ),
)
assert sorted(n for a in _ARTIFACTS for n in a.tables) == sorted(TABLES)


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return io.read_parquet(path)
    opts: dict[str, Any] = {"keep_default_na": False, "na_values": [""]}
    return pd.read_csv(path, dtype={"method": str, "degenerate": str, "setting": str}, **opts)


def read_tables(cfg: dict[str, Any], paths: Paths) -> RunTables:
    """The tables of ``paths``' replicate the findings read (each artifact's files checked
    against its meta.json); an artifact not made yet leaves its tables absent, with why."""
    tables: dict[str, pd.DataFrame] = {}
    absent: dict[str, str] = {}
    for a in _ARTIFACTS:
        if paths.replicate and not BY_RULE[a.stage].per_replicate:  # made on replicate 0 only
            absent.update(dict.fromkeys(a.tables, SUITES_ON_ZERO))
            continue
        folder = a.folder(paths)
        if not (folder / io.META).is_file():
            absent.update(dict.fromkeys(a.tables, a.why))
            continue
        io.read_meta(folder, a.stage)
        tables.update({n: _read_table(folder / TABLES[n]) for n in a.tables})
    acfg = cfg["analysis"]
    return RunTables(tables, absent, int(cfg["seed"]), int(acfg["bootstrap"]), float(acfg["alpha"]))


def _num(f: Finding, x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f.fmt.replace("+", "").format(x) if "%" in f.fmt else f"{x:g}"


def line_text(f: Finding) -> str:
    """The line as the report shows it: ``> 0``, ``< 0.1``, ``in [0.48, 0.52]``."""
    if isinstance(f.line, tuple):
        return f"in [{_num(f, f.line[0])}, {_num(f, f.line[1])}]"
    return f"{'>' if f.side == 'above' else '<'} {_num(f, f.line)}"


def this_run(f: Finding, m: Measurement) -> str:
    """``+0.12 [-0.05, +0.30]`` in the finding's format."""
    return f"{f.fmt.format(m.value)} [{f.fmt.format(m.low)}, {f.fmt.format(m.high)}]"


def _why(v: str, m: Measurement, n: int, f: Finding) -> str:
    where = {"above": "above", "below": "below", "within": "inside"}[f.side]
    if v == REPRODUCED:
        every = f"all {n} intervals lie" if n > 1 else "the interval lies"
        return f"{every} wholly {where} the line"
    if v == NOT_REPRODUCED:
        return f"{m.on}: the interval lies wholly on the other side of the line"
    ends = (m.low, m.high)
    lines = f.line if isinstance(f.line, tuple) else (f.line,)
    touches = any(x == e for x in lines for e in ends)
    return f"{m.on}: the interval {'touches' if touches else 'straddles'} the line"


def _row(f: Finding, t: RunTables) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": f.id,
        "seed": f.seed,
        "statement": f.statement,
        "seed_number": f.seed_number,
        "line": line_text(f),
        "line_from": f.line_from,
        "interval": f.interval,
        "holds": "",
    }
    try:
        ms = f.measure(t)
    except NotTestable as e:
        nan = float("nan")
        return {**row, **_result(Measurement("", nan, nan, nan), "n/a", NOT_TESTABLE, str(e))}
    v, m = combine(f, ms)
    return {**row, **_result(m, this_run(f, m), v, _why(v, m, len(ms), f))}


def _result(m: Measurement, text: str, v: str, why: str) -> dict[str, Any]:
    return {"on": m.on, "ours": m.value, "low": m.low, "high": m.high, "this_run": text,
            "verdict": v, "why": why}  # fmt: skip


def evaluate_tables(t: RunTables, findings: tuple[Finding, ...] | None = None) -> pd.DataFrame:
    """One row per finding (columns :data:`COLUMNS`; by default every registered finding), from
    tables given directly (``holds`` left empty)."""
    rows = [_row(f, t) for f in (registered() if findings is None else findings)]
    return pd.DataFrame(rows, columns=COLUMNS)


def holds(per_replicate: list[pd.DataFrame]) -> list[str]:
    """Per finding, ``k of N``: in how many replicates it is reproduced (and how many could
    not test it)."""
    verdicts = np.array([df["verdict"].to_numpy() for df in per_replicate])
    n = len(per_replicate)
    out = []
    for col in verdicts.T:
        k, untested = int((col == REPRODUCED).sum()), int((col == NOT_TESTABLE).sum())
        out.append(f"{k} of {n}" + (f" ({untested} not testable)" if untested else ""))
    return out


Run = tuple[dict[str, Any], Paths, pd.DataFrame]  # a replicate's config, paths, findings


def replicate_runs(cfg: dict[str, Any], paths: Paths) -> list[Run]:
    """Every replicate of the run (config ``replicates``): its config, paths and findings
    table, each judged on its own tables."""
    out = []
    for r in range(replicates.count(cfg)):
        rcfg = replicates.select({**cfg, "results": str(paths.shared)}, r)
        rpaths = Paths(rcfg)
        out.append((rcfg, rpaths, evaluate_tables(read_tables(rcfg, rpaths))))
    return out


def evaluate(cfg: dict[str, Any], paths: Paths) -> pd.DataFrame:
    """Every registered finding on ``paths``' replicate of the run (columns :data:`COLUMNS`,
    one row per finding in registry order). With several replicates (config ``replicates``),
    ``holds`` says in how many the finding is reproduced, each judged on its own tables."""
    if replicates.count(cfg) < 2:
        return evaluate_tables(read_tables(cfg, paths))
    per = [table for _, _, table in replicate_runs(cfg, paths)]
    out = per[paths.replicate].copy()
    out["holds"] = holds(per)
    return out


def verdict_counts(df: pd.DataFrame) -> str:
    """``seed 003: 9 of 14 reproduced, 2 not reproduced, 3 inconclusive; seed 000: ...``."""
    parts = []
    for seed, g in df.groupby("seed", sort=False):
        counts = g["verdict"].value_counts()
        first = f"{int(counts.get(REPRODUCED, 0))} of {len(g)} {REPRODUCED}"
        rest = [f"{int(counts[v])} {v}" for v in VERDICTS[1:] if v in counts]
        parts.append(f"seed {seed}: " + ", ".join([first, *rest]))
    return "; ".join(parts)
