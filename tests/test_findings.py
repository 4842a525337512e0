"""The seeds' findings (plantbench.grading.findings) on hand-made analysis tables: a verdict
flips exactly where the number crosses its line, an interval over the line is inconclusive, a
missing method, suite or number is not testable; and on the smoke run's real tables, every
finding yields a row the report opens with."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plantbench.grading import findings as F

DOMAINS = ("world", "python")
N_DOCS = (2, 64)
POSITIONS = ("early", "middle", "late")
GRADIENT = ("grad_dot", "grad_cos", "tracin_dot", "tracin_influence", "influence")


def by_id(fid: str) -> F.Finding:
    (f,) = [f for f in F.FINDINGS if f.id == fid]
    return f


def run(**tables: pd.DataFrame) -> F.RunTables:
    return F.RunTables(tables, {}, seed=7, n_boot=200, alpha=0.05)


def row(fid: str, t: F.RunTables) -> pd.Series:
    return F.evaluate_tables(t, (by_id(fid),)).iloc[0]


def cells() -> list[tuple[str, int, str]]:
    return list(itertools.product(DOMAINS, N_DOCS, POSITIONS))


def facts_table(learned: dict[tuple[str, int, str], float], per_cell: int = 4) -> pd.DataFrame:
    """``per_cell`` facts in every cell; in cell c the first ``learned[c] * per_cell`` are
    learned (0 where not given)."""
    rows = []
    for d, n, p in cells():
        k = round(learned.get((d, n, p), 0.0) * per_cell)
        for i in range(per_cell):
            rows.append((f"{d}{n}{p}{i}", d, n, p, i < k))
    return pd.DataFrame(rows, columns=["fact_id", "domain", "n_docs", "position", "learned"])


def correlations(values: dict[str, tuple[float, float, float]], key: str) -> pd.DataFrame:
    """correlations.csv with ``key`` (and its interval) per method; 0.5 [0.4, 0.6] elsewhere."""
    rows = []
    for m, (v, lo, hi) in values.items():
        r: dict[str, object] = {"method": m}
        for k in ("raw", "vs_length", "vs_difficulty", "controlled"):
            val = (v, lo, hi) if k == key else (0.5, 0.4, 0.6)
            r.update({k: val[0], f"{k}_lo": val[1], f"{k}_hi": val[2]})
        rows.append(r)
    return pd.DataFrame(rows)


def per_fact_ap(ap: dict[str, float]) -> pd.DataFrame:
    """per_fact.parquet's AP columns: every fact of the grid with the same AP per method."""
    f = facts_table({})
    return pd.concat([f.assign(method=m, ap=a) for m, a in ap.items()], ignore_index=True)


# --------------------------------------------------------------------------------------------
# The verdict rule
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["above", "below"])
def test_verdict_flips_exactly_at_the_line(side: str) -> None:
    line, eps = 0.1, 1e-9
    above = F.verdict(line + eps, line + eps, line, side)  # type: ignore[arg-type]
    below = F.verdict(line - eps, line - eps, line, side)  # type: ignore[arg-type]
    assert {above, below} == {F.REPRODUCED, F.NOT_REPRODUCED}
    assert above == (F.REPRODUCED if side == "above" else F.NOT_REPRODUCED)
    assert F.verdict(line, line, line, side) == F.INCONCLUSIVE  # type: ignore[arg-type]
    assert F.verdict(line - 0.2, line + 0.2, line, side) == F.INCONCLUSIVE  # type: ignore[arg-type]


def test_band_verdict() -> None:
    band = (0.48, 0.52)
    assert F.verdict(0.5, 0.5, band, "within") == F.REPRODUCED
    assert F.verdict(0.25, 0.25, band, "within") == F.NOT_REPRODUCED
    assert F.verdict(0.53, 0.6, band, "within") == F.NOT_REPRODUCED
    assert F.verdict(0.45, 0.55, band, "within") == F.INCONCLUSIVE
    assert F.verdict(0.5, 0.52, band, "within") == F.INCONCLUSIVE  # touches


def test_a_finding_over_several_methods_is_decided_by_the_worst() -> None:
    """One method wholly over the line fails it even when another straddles more widely; the
    row names the method that decides."""
    fid = "003.controlled_below_01"
    ok = dict.fromkeys(GRADIENT, (0.0, -0.05, 0.05))
    assert row(fid, run(correlations=correlations(ok, "controlled")))["verdict"] == F.REPRODUCED
    wide = {**ok, "grad_cos": (0.1, -0.5, 0.7), "influence": (0.3, 0.2, 0.4)}
    r = row(fid, run(correlations=correlations(wide, "controlled")))
    assert (r["verdict"], r["on"], r["ours"]) == (F.NOT_REPRODUCED, "Influence functions", 0.3)
    only_wide = {**ok, "grad_cos": (0.1, -0.5, 0.7)}
    r = row(fid, run(correlations=correlations(only_wide, "controlled")))
    assert (r["verdict"], r["on"]) == (F.INCONCLUSIVE, "Gradient cosine")


# --------------------------------------------------------------------------------------------
# Findings on hand-made tables
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fid", "key", "line"),
    [
        ("003.controlled_below_01", "controlled", 0.1),
        ("003.raw_positive", "raw", 0.0),
        ("003.mass_tracks_length_difficulty", "vs_length", 0.0),
    ],
)
def test_correlation_findings_flip_at_their_line(fid: str, key: str, line: float) -> None:
    f = by_id(fid)
    safe = line - 0.3 if f.side == "below" else line + 0.3
    base = dict.fromkeys(GRADIENT, (safe, safe - 0.05, safe + 0.05))

    def verdict_at(v: float, half: float = 0.0) -> str:
        t = run(correlations=correlations({**base, "tracin_dot": (v, v - half, v + half)}, key))
        return str(row(fid, t)["verdict"])

    good = line - 1e-6 if f.side == "below" else line + 1e-6
    bad = line + 1e-6 if f.side == "below" else line - 1e-6
    assert (verdict_at(good), verdict_at(bad)) == (F.REPRODUCED, F.NOT_REPRODUCED)
    assert verdict_at(line) == F.INCONCLUSIVE
    assert verdict_at(good, half=0.1) == F.INCONCLUSIVE  # the interval straddles the line


def test_a_missing_method_is_not_testable() -> None:
    corr = correlations(dict.fromkeys(["bm25", "embedding"], (0.2, 0.1, 0.3)), "controlled")
    r = row("003.controlled_below_01", run(correlations=corr))
    assert r["verdict"] == F.NOT_TESTABLE and "Gradient dot product" in r["why"]
    r = row("003.hidden_finds_nothing", run(per_fact=per_fact_ap({"bm25": 1.0})))
    assert r["verdict"] == F.NOT_TESTABLE and "Hidden-state similarity" in r["why"]
    assert np.isnan(r["ours"]) and r["this_run"] == "n/a"
    assert (
        row("003.bm25_best_ap", run(per_fact=per_fact_ap({"bm25": 1.0})))["verdict"]
        == F.NOT_TESTABLE
    )


def test_an_absent_suite_or_table_is_not_testable_with_its_reason() -> None:
    why = "the context suite has not run (seed 000)"
    t = F.RunTables({}, {"context_ssp": why, "context_metrics": why})
    out = F.evaluate_tables(t)
    assert list(out["id"]) == [f.id for f in F.FINDINGS]
    assert set(out["verdict"]) == {F.NOT_TESTABLE}
    assert (out.loc[out["seed"] == "000", "why"] == why).all()
    assert out["why"].str.len().gt(10).all()


def test_bm25_best_flips_where_its_lead_crosses_zero() -> None:
    def verdict(bm25: float, embedding: float) -> str:
        pf = per_fact_ap({"bm25": bm25, "embedding": embedding, "hidden": 0.01})
        return str(row("003.bm25_best_ap", run(per_fact=pf))["verdict"])

    assert verdict(0.95, 0.94) == F.REPRODUCED
    assert verdict(0.94, 0.95) == F.NOT_REPRODUCED
    assert verdict(0.95, 0.95) == F.INCONCLUSIVE  # a tie is not "best"
    # facts that disagree: the bootstrap interval straddles the line
    pf = per_fact_ap({"bm25": 0.9, "embedding": 0.9})
    noisy = np.where(np.arange(len(pf)) % 2 == 0, 0.5, 1.0)
    pf.loc[pf["method"] == "embedding", "ap"] = noisy[: int((pf["method"] == "embedding").sum())]
    pf.loc[pf["method"] == "bm25", "ap"] = 0.75 + 1e-3
    r = row("003.bm25_best_ap", run(per_fact=pf))
    assert r["verdict"] == F.INCONCLUSIVE and r["low"] < 0 < r["high"]


@pytest.mark.parametrize(
    ("share", "expected"),
    [
        (0.0, F.REPRODUCED),  # none of the early facts with the most documents learned
        (0.5, F.INCONCLUSIVE),  # exactly half: on the line
        (1.0, F.NOT_REPRODUCED),
    ],
)
def test_early_forgotten_flips_at_half(share: float, expected: str) -> None:
    """Every cell all learned or none (no spread within a cell, so no spread in the
    bootstrap): the early, most-documents rate is exactly ``share``."""
    learned = {("world", 64, "early"): 1.0} if share == 0.5 else {}
    if share == 1.0:
        learned = {(d, 64, "early"): 1.0 for d in DOMAINS}
    r = row("003.early_forgotten", run(facts=facts_table(learned)))
    assert r["verdict"] == expected
    assert r["ours"] == r["low"] == r["high"] == share


def test_learned_rate_findings_and_their_bootstrap() -> None:
    late = {(d, n, "late"): 1.0 for d in DOMAINS for n in N_DOCS}
    more = {(d, 64, p): 1.0 for d in DOMAINS for p in POSITIONS}
    assert row("003.late_learned_most", run(facts=facts_table(late)))["verdict"] == F.REPRODUCED
    assert row("003.late_learned_most", run(facts=facts_table({})))["verdict"] == F.INCONCLUSIVE
    assert row("003.more_docs_more_learned", run(facts=facts_table(more)))["ours"] == 1.0
    fewer = {(d, 2, p): 1.0 for d in DOMAINS for p in POSITIONS}
    r = row("003.more_docs_more_learned", run(facts=facts_table(fewer)))
    assert (r["verdict"], r["ours"]) == (F.NOT_REPRODUCED, -1.0)
    # half of every cell learned: a real spread, an interval over the line
    half = dict.fromkeys(cells(), 0.5)
    r = row("003.early_forgotten", run(facts=facts_table(half, per_cell=6)))
    assert r["verdict"] == F.INCONCLUSIVE and r["low"] < 0.5 < r["high"]
    again = row("003.early_forgotten", run(facts=facts_table(half, per_cell=6)))
    assert (again["low"], again["high"]) == (r["low"], r["high"])  # seeded


def test_tracin_no_change_is_paired() -> None:
    """Two methods with the same mass: the difference is 0 in every resample, so its interval
    is [0, 0], below the +0.1 line; a real gain above it is not reproduced."""
    rng = np.random.default_rng(0)
    f = facts_table({}, per_cell=5)
    n = len(f)
    f = f.assign(
        effect=rng.normal(size=n),
        answer_tokens=rng.integers(1, 6, n),
        difficulty=rng.normal(size=n),
    )
    noise = rng.normal(size=n)
    both = pd.concat(
        [f.assign(method="tracin_influence", mass=noise), f.assign(method="influence", mass=noise)]
    )
    corr = correlations(dict.fromkeys(["tracin_influence", "influence"], (0, 0, 0)), "raw")
    r = row("003.tracin_no_change", run(per_fact=both, correlations=corr))
    assert (r["verdict"], r["ours"], r["low"], r["high"]) == (F.REPRODUCED, 0.0, 0.0, 0.0)
    gain = both.assign(
        mass=np.where(both["method"] == "tracin_influence", both["effect"], both["mass"])
    )
    r = row("003.tracin_no_change", run(per_fact=gain, correlations=corr))
    assert r["verdict"] == F.NOT_REPRODUCED and r["low"] > 0.1


def test_ssp_near_chance_catches_an_impossible_value() -> None:
    """The seed's SSP sits at chance (0.50–0.52); 0.25 for every method is not near it."""

    def ssp(value: float, lo: float, hi: float) -> pd.DataFrame:
        return pd.DataFrame(
            {"method": ["contextcite", "attribot"], "ssp": value, "lo": lo, "hi": hi}
        )

    verdicts = {
        v: row("000.ssp_near_chance", run(context_ssp=ssp(v, lo, hi)))["verdict"]
        for v, lo, hi in ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25), (0.51, 0.4, 0.6))
    }
    assert verdicts == {0.5: F.REPRODUCED, 0.25: F.NOT_REPRODUCED, 0.51: F.INCONCLUSIVE}


def test_holds_counts_replicates() -> None:
    one = pd.DataFrame({"verdict": [F.REPRODUCED, F.REPRODUCED, F.NOT_TESTABLE]})
    two = pd.DataFrame({"verdict": [F.REPRODUCED, F.INCONCLUSIVE, F.NOT_TESTABLE]})
    assert F.holds([one, two]) == ["2 of 2", "1 of 2", "0 of 2 (2 not testable)"]


def test_the_suites_are_tested_on_replicate_zero_only(tmp_path: Path) -> None:
    """The suites run on replicate 0's twins: another replicate's findings table has their
    tables absent, saying so, rather than counting replicate 0's tables again."""
    from plantbench import config, replicates
    from plantbench.grading.findings.tables import SUITES_ON_ZERO
    from plantbench.paths import Paths

    root = Path(__file__).resolve().parents[1]
    cfg = config.load([root / "config.yaml"], {"results": str(tmp_path), "replicates": 2})
    one = replicates.select(cfg, 1)
    absent = F.read_tables(one, Paths(one)).absent
    assert absent["context_ssp"] == absent["membership"] == absent["grounding"]
    assert absent["grounding"] == SUITES_ON_ZERO
    assert F.read_tables(cfg, Paths(cfg)).absent["grounding"] != SUITES_ON_ZERO


def test_registry_is_complete_and_stated_once() -> None:
    ids = [f.id for f in F.FINDINGS]
    assert len(ids) == len(set(ids))
    seeds = pd.Series([f.seed for f in F.FINDINGS]).value_counts()
    assert seeds["003"] >= 11 and all(seeds.get(s, 0) >= 1 for s in ("000", "001", "002"))
    for f in F.FINDINGS:
        assert f.seed_number and f.line_from and f.interval and f.statement.endswith(".")
        assert f.side in ("above", "below", "within")


# --------------------------------------------------------------------------------------------
# The smoke run's real tables
# --------------------------------------------------------------------------------------------


def check_report_findings(report: Path) -> None:
    """report/findings.csv has a valid row per registered finding; report.md opens with them."""
    found = pd.read_csv(report / "findings.csv", keep_default_na=False)
    assert list(found.columns) == F.COLUMNS
    assert list(found["id"]) == [f.id for f in F.FINDINGS]
    assert set(found["verdict"]) <= set(F.VERDICTS)
    assert (found["seed_number"] != "").all() and (found["why"] != "").all()
    testable = found[found["verdict"] != F.NOT_TESTABLE]
    assert (testable["this_run"].str.contains(r"\[.+, .+\]")).all()
    lo, hi = testable["low"].astype(float), testable["high"].astype(float)
    assert (lo <= hi).all()
    md = (report / "report.md").read_text()
    headings = [x for x in md.splitlines() if x.startswith("## ")]
    assert headings[0] == "## Findings against the papers"
    for f in F.FINDINGS:
        assert f"`{f.id}`" in md
    assert "seed 003: " in md


@pytest.mark.slow
def test_smoke_run_report_opens_with_the_findings(smoke_run: Path) -> None:
    check_report_findings(smoke_run / "report")


# --------------------------------------------------------------------------------------------
# The context suite's SSP, as the seed defines it
# --------------------------------------------------------------------------------------------


def test_ssp_scores_the_answer_bearing_segment_under_both_twins() -> None:
    """Seed 000's SSP counts segments that carry the answer, balanced IW / ICL. Here that is
    the fact's own sentence: IW under the reader, ICL under the base twin. A method whose mass
    sits on that sentence under both twins is at chance (0.5), not at the 0.25 that scoring the
    other facts' sentences gave; one whose reader mass leaves it (in-weight masks its effect)
    gets both right."""
    from plantbench.suites.context import analysis as ctx

    own = np.array([1, 3])
    q = pd.DataFrame({"query_id": ["F0:q", "F1:q"], "learned": [True, True]})
    p_empty = {r: pd.DataFrame({"p_empty": [0.9, 0.9]}) for r in ctx.ROLES}
    fr = ctx._Frames(
        q=q, queries=p_empty, conditions={}, lds={}, scores={}, own=own,
        own_icl={"reader": np.array([False, False]), "base": np.array([True, True])},
    )  # fmt: skip
    on_own = np.zeros((2, 4))
    on_own[[0, 1], own] = 1.0
    both = {"reader": on_own, "base": on_own}
    assert ctx._ssp_hits(fr, both, "attribot").tolist() == [1.0, 1.0]  # mass interface
    assert ctx._ssp_hits(fr, both, "contextcite").tolist() == [1.0, 1.0]  # contrastive
    elsewhere = np.roll(on_own, 1, axis=1)  # the reader's mass left the answer's sentence
    assert ctx._ssp_hits(fr, {"reader": elsewhere, "base": on_own}, "attribot").tolist() == [
        2.0,
        2.0,
    ]
