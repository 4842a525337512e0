"""Did this run reproduce the study? The reference's findings, numbers and first steps.

Bits answer the question only where the float path is the reference's. Elsewhere (another CPU
vendor, a GPU, other kernels) a float hash cannot match and a difference with intact lineage is
no failure; what must hold is the study: the seeds' findings
(:mod:`plantbench.grading.findings`) and the headline numbers within the spread that replicate
pairs showed. A reference written from a run (``plantbench verify --write-reference``) records,
beside its hashes:

* ``findings``: per finding id its verdict, number and interval on the reference run;
* ``numbers``: the headline numbers (learned rate, every method's AP per twin and its within-cell
  correlations, every finding's number) as ``mean``, ``min``, ``max`` over the reference's
  ``n`` replicates (min = max with one);
* ``first_steps``: the first training steps' loss and gradient norm of the first model trained
  (the shared prefix, else twin A) at full precision, so any machine can tell the first step
  where its floats depart.

:func:`judge` compares a run with them: a finding holds unless this run decides it the other way
(``reproduced`` against ``not reproduced``) or cannot test what the reference tested; numbers are
judged against the spread only when the reference has two replicates or more.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from plantbench import io
from plantbench.grading import findings
from plantbench.paths import Paths

FINDINGS = "findings"
NUMBERS = "numbers"
FIRST_STEPS = "first_steps"
N_FIRST_STEPS = 32
DECISIVE = {findings.REPRODUCED: findings.NOT_REPRODUCED}
DECISIVE.update({v: k for k, v in DECISIVE.items()})
CORRELATIONS = ("raw", "vs_length", "vs_difficulty", "controlled", "vs_final_loss")


# --------------------------------------------------------------------------- what is recorded


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def findings_record(
    table: pd.DataFrame, per_replicate: list[pd.DataFrame] | None = None
) -> dict[str, dict[str, Any]]:
    """Per finding: its verdict and this run's number with its interval (None where undefined);
    over several replicates also ``seen``, every verdict a replicate that could test it gave."""
    out = {
        str(r["id"]): {
            "verdict": str(r["verdict"]),
            "value": _finite(r["ours"]),
            "low": _finite(r["low"]),
            "high": _finite(r["high"]),
        }
        for _, r in table.iterrows()
    }
    if per_replicate and len(per_replicate) > 1:
        for fid, f in out.items():
            f["seen"] = _seen(fid, f["verdict"], per_replicate)
    return out


def _seen(fid: str, verdict: str, per_replicate: list[pd.DataFrame]) -> list[str]:
    """The verdicts finding ``fid`` got over the replicates that could test it (in the order of
    :data:`findings.VERDICTS`); replicate 0's alone when none other could."""
    got = {verdict}
    for df in per_replicate:
        v = str(df.loc[df["id"] == fid, "verdict"].iloc[0])
        if v != findings.NOT_TESTABLE:
            got.add(v)
    if len(got) > 1:
        got.discard(findings.NOT_TESTABLE)
    return [v for v in findings.VERDICTS if v in got]


def headline_numbers(cfg: dict[str, Any], paths: Paths, table: pd.DataFrame) -> dict[str, float]:
    """One replicate's headline numbers by name: the learned rate, every method's AP and
    Recall@10 per twin, its within-cell correlations, and every finding's number."""
    out: dict[str, float] = {}
    causal = io.read_meta(paths.causal, "causal")
    out["learned_rate"] = float(causal["info"]["learned_rate"])
    analysis = paths.analysis
    io.read_meta(analysis, "analysis")
    for _, r in pd.read_csv(analysis / "retrieval.csv").iterrows():
        out[f"ap/{r['method']}/{r['model']}"] = float(r["ap"])
        out[f"recall_at_10/{r['method']}/{r['model']}"] = float(r["recall_at_10"])
    for _, r in pd.read_csv(analysis / "correlations.csv").iterrows():
        out.update({f"{c}/{r['method']}": float(r[c]) for c in CORRELATIONS if c in r})
    for _, r in table.iterrows():
        out[f"finding/{r['id']}"] = float(r["ours"])
    return {k: v for k, v in out.items() if math.isfinite(v)}


def numbers_record(
    cfg: dict[str, Any], paths: Paths, runs: list[findings.Run] | None = None
) -> dict[str, dict[str, float]]:
    """The headline numbers over every replicate of the run: mean, min, max and ``n``, the
    replicates that have the number (the suites' numbers come from replicate 0 alone)."""
    per = [headline_numbers(*run) for run in runs or findings.replicate_runs(cfg, paths)]
    out = {}
    for k in sorted(set().union(*(set(p) for p in per))):
        xs = [p[k] for p in per if k in p]
        out[k] = {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "n": len(xs)}
    return out


def _first_model(paths: Paths) -> Path:
    prefix = paths.model("prefix")
    return prefix if (prefix / "loss.csv").is_file() else paths.model("A")


def first_steps(paths: Paths, n: int = N_FIRST_STEPS) -> dict[str, Any]:
    """The first ``n`` steps of the first model trained: loss and gradient norm as written
    (``repr``: every bit of the float)."""
    folder = _first_model(paths)
    with open(folder / "loss.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[:n]
    return {
        "model": folder.name,
        "loss": [r["loss"] for r in rows],
        "grad_norm": [r["grad_norm"] for r in rows],
    }


def record(cfg: dict[str, Any], paths: Paths) -> dict[str, Any]:
    """What a reference records beside its hashes (the keys :data:`FINDINGS`, :data:`NUMBERS`,
    :data:`FIRST_STEPS`), over every replicate of the run."""
    runs = findings.replicate_runs(cfg, paths)
    return {
        FINDINGS: findings_record(runs[0][2], [t for _, _, t in runs]),
        NUMBERS: numbers_record(cfg, paths, runs),
        FIRST_STEPS: first_steps(paths),
    }


# --------------------------------------------------------------------------- a reference's shape


def problems(ref: Mapping[str, Any]) -> list[str]:
    """What makes a reference's findings, numbers or first steps unfit to judge by (they are
    optional: a reference without them is judged on its hashes alone)."""
    out: list[str] = []
    for fid, f in (ref.get(FINDINGS) or {}).items():
        if not isinstance(f, Mapping) or f.get("verdict") not in findings.VERDICTS:
            out.append(f"findings['{fid}'] has no verdict of {', '.join(findings.VERDICTS)}")
        elif not isinstance(f.get("seen", []), list) or not set(f.get("seen", [])) <= set(
            findings.VERDICTS
        ):
            out.append(f"findings['{fid}'] has a 'seen' that is no list of verdicts")
    for name, v in (ref.get(NUMBERS) or {}).items():
        if not isinstance(v, Mapping) or any(
            _finite(v.get(k)) is None for k in ("min", "max", "n")
        ):
            out.append(f"numbers['{name}'] lacks a finite min, max or n")
    steps = ref.get(FIRST_STEPS)
    if steps is not None and not (
        isinstance(steps, Mapping) and isinstance(steps.get("loss"), list)
    ):
        out.append("first_steps has no list of losses")
    return out


# --------------------------------------------------------------------------- judging a run


def departure(paths: Paths, ref: Mapping[str, Any]) -> str | None:
    """Where this run's first training steps depart from the reference's (None: the recorded
    steps match bit for bit, or there is nothing to compare)."""
    want = ref.get(FIRST_STEPS)
    if not want:
        return None
    try:
        got = first_steps(paths, len(want["loss"]))
    except (OSError, KeyError):
        return None
    for i, (a, b) in enumerate(zip(got["loss"], want["loss"], strict=False)):
        if a != b:
            return f"the first training steps depart at step {i}: loss {a} (reference {b})"
    for i, (a, b) in enumerate(zip(got["grad_norm"], want.get("grad_norm", []), strict=False)):
        if a != b:
            return f"the first training steps depart at step {i}: gradient norm {a} (reference {b})"
    return None


def _departs(here: str, there: Mapping[str, Any]) -> bool:
    """This run's verdict contradicts the reference's: decided the other way from every verdict
    the reference's replicates gave (``seen``; its one verdict without replicates), or
    untestable where the reference tested it."""
    seen = set(there.get("seen") or [there["verdict"]])
    if here in seen:
        return False
    if here == findings.NOT_TESTABLE:
        return True
    return DECISIVE.get(here) in seen


def judge_findings(table: pd.DataFrame, ref: Mapping[str, Any]) -> tuple[int, list[str]]:
    """How many of the reference's findings hold here, and the ids (with both verdicts) of
    those that do not."""
    recorded = ref.get(FINDINGS) or {}
    here = dict(zip(table["id"], table["verdict"], strict=True))
    off = [
        f"{fid} ({here.get(fid, 'absent')}; reference {'/'.join(f.get('seen') or [f['verdict']])})"
        for fid, f in recorded.items()
        if _departs(here.get(fid, findings.NOT_TESTABLE), f)
    ]
    return len(recorded) - len(off), off


def judge_numbers(
    numbers: Mapping[str, float], ref: Mapping[str, Any]
) -> tuple[int, int, list[str]]:
    """(inside, judged, names outside with value and spread) against the reference's spread;
    nothing is judged when the reference has fewer than two replicates."""
    spread = {k: v for k, v in (ref.get(NUMBERS) or {}).items() if int(v["n"]) >= 2}
    judged = [k for k in spread if k in numbers]
    outside = [
        f"{k} {numbers[k]:.3g} (spread [{spread[k]['min']:.3g}, {spread[k]['max']:.3g}])"
        for k in judged
        if not spread[k]["min"] <= numbers[k] <= spread[k]["max"]
    ]
    return len(judged) - len(outside), len(judged), outside


def verdict(cfg: dict[str, Any], paths: Paths, ref: Mapping[str, Any]) -> tuple[bool, str]:
    """(reproduced?, one line): the findings against the reference's, the numbers against its
    replicate spread."""
    table = findings.evaluate_tables(findings.read_tables(cfg, paths))
    held, off = judge_findings(table, ref)
    line = f"{held} of {held + len(off)} findings as in the reference"
    inside, judged, outside = judge_numbers(headline_numbers(cfg, paths, table), ref)
    if judged:
        line += f", {inside} of {judged} numbers within the replicate spread"
    else:
        line += ", numbers not judged (the reference has one replicate: no spread)"
    if off or outside:
        line += "; outside: " + "; ".join([*off, *outside[:5]])
        if len(outside) > 5:
            line += f" (and {len(outside) - 5} more numbers)"
    ok = not off
    return ok, f"{'reproduced' if ok else 'not reproduced'}: {line}"
