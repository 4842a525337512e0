"""`verify` judges reproduction, not only bits: on another float path a float difference with
intact lineage is no failure, and the verdict comes from the seeds' findings and the headline
numbers against the reference's replicate spread; damage still FAILs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from plantbench import config
from plantbench.grading import findings
from plantbench.ops import reproduce, verify
from plantbench.paths import Paths

# --------------------------------------------------------------------------- hand-made verdicts


def _table(**verdicts: str) -> pd.DataFrame:
    return pd.DataFrame({"id": list(verdicts), "verdict": list(verdicts.values())})


def _ref(**verdicts: str) -> dict[str, Any]:
    return {reproduce.FINDINGS: {k: {"verdict": v} for k, v in verdicts.items()}}


R, N, U, T = (
    findings.REPRODUCED,
    findings.NOT_REPRODUCED,
    findings.INCONCLUSIVE,
    findings.NOT_TESTABLE,
)


@pytest.mark.parametrize(
    ("here", "there", "holds"),
    [
        (R, R, True),
        (U, R, True),  # an interval straddling the line does not contradict
        (R, U, True),
        (N, R, False),  # decided the other way
        (R, N, False),
        (T, R, False),  # the reference tested it, this run cannot
        (T, T, True),
    ],
)
def test_a_finding_departs_only_when_decided_otherwise(here: str, there: str, holds: bool) -> None:
    held, off = reproduce.judge_findings(_table(x=here), _ref(x=there))
    assert (held, bool(off)) == (int(holds), not holds)
    if not holds:
        assert off == [f"x ({here}; reference {there})"]


@pytest.mark.parametrize(
    ("here", "seen", "holds"),
    [
        (N, [R, N], True),  # the replicates themselves split: either decision reproduces
        (R, [R, N], True),
        (N, [R, U], False),  # no replicate decided it this way, one decided it the other
        (U, [R], True),
        (T, [R, U], False),
    ],
)
def test_a_finding_is_judged_against_every_verdict_its_replicates_gave(
    here: str, seen: list[str], holds: bool
) -> None:
    ref = {reproduce.FINDINGS: {"x": {"verdict": seen[0], "seen": seen}}}
    held, off = reproduce.judge_findings(_table(x=here), ref)
    assert held == int(holds)
    if not holds:
        assert off == [f"x ({here}; reference {'/'.join(seen)})"]


def _full(verdicts: dict[str, str]) -> pd.DataFrame:
    n = len(verdicts)
    return pd.DataFrame(
        {"id": list(verdicts), "verdict": list(verdicts.values()), "ours": [0.1] * n,
         "low": [0.0] * n, "high": [0.2] * n}
    )  # fmt: skip


def test_the_record_keeps_the_verdicts_every_replicate_gave() -> None:
    """``seen``: the verdicts of the replicates that could test a finding, in VERDICTS order;
    replicate 0's alone where no other replicate could (a suite: replicate 0 only)."""
    per = [
        _full({"a": R, "b": U, "suite": R}),
        _full({"a": N, "b": U, "suite": T}),
        _full({"a": R, "b": R, "suite": T}),
    ]
    rec = reproduce.findings_record(per[0], per)
    assert rec["a"]["seen"] == [R, N] and rec["b"]["seen"] == [R, U]
    assert rec["suite"]["seen"] == [R]
    assert "seen" not in reproduce.findings_record(per[0], per[:1])["a"]
    assert reproduce.problems({reproduce.FINDINGS: {"a": {"verdict": R, "seen": ["maybe"]}}})


def test_numbers_are_judged_against_the_spread_only_with_replicates() -> None:
    ref = {
        reproduce.NUMBERS: {
            "a": {"mean": 0.5, "min": 0.4, "max": 0.6, "n": 3},
            "b": {"mean": 0.5, "min": 0.4, "max": 0.6, "n": 3},
            "c": {"mean": 0.5, "min": 0.5, "max": 0.5, "n": 1},
        }
    }
    inside, judged, outside = reproduce.judge_numbers({"a": 0.6, "b": 0.61, "c": 9.0}, ref)
    assert (inside, judged) == (1, 2)
    assert outside == ["b 0.61 (spread [0.4, 0.6])"]


def test_a_malformed_findings_record_is_a_reference_problem() -> None:
    assert reproduce.problems({reproduce.FINDINGS: {"x": {"verdict": "maybe"}}})
    assert reproduce.problems({reproduce.NUMBERS: {"x": {"min": None, "max": 1, "n": 1}}})
    assert not reproduce.problems(_ref(x=R))


# --------------------------------------------------------------------------- on the smoke run


@pytest.fixture
def judged_run(smoke_run: Path, tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    """A copy of the smoke run and a reference written from it (findings, numbers, steps)."""
    dst = tmp_path / "results"
    shutil.copytree(smoke_run, dst, symlinks=True)
    raw = json.loads((dst / "config.json").read_text())
    raw["results"] = str(dst)
    (dst / "config.json").write_text(json.dumps(raw))
    cfg = config.load([dst / "config.json"])
    ref = verify.write_reference(cfg, Paths(cfg), "mine", tmp_path / "reference")
    return cfg, dst, ref


def _verify(cfg: dict[str, Any], ref: Path, edit: Any = None) -> dict[str, verify.Check]:
    if edit is not None:
        data = json.loads(ref.read_text())
        edit(data)
        ref.write_text(json.dumps(data))
    return {c.artifact: c for c in verify.run(cfg, Paths(cfg), ref_dir=ref.parent)}


def _other_vendor(data: dict[str, Any]) -> None:
    for rec in data["float_platforms"].values():
        rec["cpu_vendor"] = "GenuineIntel"


def test_a_reference_records_findings_numbers_and_first_steps(judged_run: Any) -> None:
    _, _, ref = judged_run
    data = json.loads(ref.read_text())
    assert set(data[reproduce.FINDINGS]) == {f.id for f in findings.FINDINGS}
    assert data[reproduce.NUMBERS]["ap/bm25/A"]["n"] == 1
    assert len(data[reproduce.FIRST_STEPS]["loss"]) == reproduce.N_FIRST_STEPS


def test_the_same_platform_is_judged_by_its_bits(judged_run: Any) -> None:
    cfg, _, ref = judged_run
    got = _verify(cfg, ref)
    assert got["reference models/A"].status == "PASS"
    assert got["reference first steps"].status == "PASS"
    assert got["reproduction"].status == "PASS"
    assert not [c for c in got.values() if c.status == "FAIL"]


def test_another_platform_is_judged_by_the_findings(judged_run: Any) -> None:
    cfg, _, ref = judged_run
    got = _verify(cfg, ref, _other_vendor)
    assert got["reference models/A"].status == "SKIP"
    line = got["reproduction"]
    assert line.status == "PASS", line
    assert line.detail.startswith("floats from another platform (cpu_vendor ")
    assert "reproduced: " in line.detail and " findings as in the reference" in line.detail
    assert not [c for c in got.values() if c.status == "FAIL"]


def test_findings_that_do_not_hold_fail_on_another_platform(judged_run: Any) -> None:
    cfg, _, ref = judged_run
    data = json.loads(ref.read_text())
    decided = next(k for k, v in data[reproduce.FINDINGS].items() if v["verdict"] in (R, N))
    flip = {R: N, N: R}

    def edit(d: dict[str, Any]) -> None:
        _other_vendor(d)
        f = d[reproduce.FINDINGS][decided]
        f["verdict"] = flip[f["verdict"]]

    line = _verify(cfg, ref, edit)["reproduction"]
    assert line.status == "FAIL"
    assert line.detail.split(": ", 2)[1].startswith("not reproduced")
    assert f"outside: {decided} (" in line.detail


def test_damage_still_fails_on_another_platform(judged_run: Any) -> None:
    cfg, results, ref = judged_run
    (results / "causal" / "facts.parquet").write_bytes(b"damaged")
    got = _verify(cfg, ref, _other_vendor)
    assert got["causal"].status == "FAIL"


def test_the_first_step_that_departs_is_named(judged_run: Any) -> None:
    cfg, _, ref = judged_run

    def edit(d: dict[str, Any]) -> None:
        d[reproduce.FIRST_STEPS]["loss"][3] = "1.0"

    line = _verify(cfg, ref, edit)["reference first steps"]
    assert line.status == "SKIP"
    assert line.detail.startswith("the first training steps depart at step 3: loss ")
