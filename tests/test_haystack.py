"""The haystack: AP and mass in nested sub-pools of the pool's background (``analysis.haystack``).

A hand-made tile with known levels checks the scorer's sub-pool counts, statistics and the AP
the analysis derives from them against numbers worked out by hand; the seeded levels are nested;
the share 1.0 is exactly the whole pool; a bad ``analysis.haystack`` is refused with the key.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from plantbench import artifacts, config, io, runconfig
from plantbench.attribution import pool, scoring
from plantbench.errors import ArtifactError, ConfigError
from plantbench.grading import analysis
from plantbench.report import build, sections
from test_analysis import Study, cfg_for, make_facts, own_mask, random_method

NAN = float("nan")

# --------------------------------------------------------------------------------------------
# A hand-made tile: 2 queries x 10 pool rows, 3 haystack levels
# --------------------------------------------------------------------------------------------

# rows 0, 1: query 0's own windows; row 2: query 1's; row 3: a distractor (all level 0);
# rows 4..9: background, first in the sub-pool of share 1, 2, 2, 3, 1, 3
LEVELS = np.array([0, 0, 0, 0, 1, 2, 2, 3, 1, 3])
TILE = np.array(
    [
        [5.0, 2.0, 0.0, 1.0, 6.0, 2.0, 3.0, 2.0, 0.0, 7.0],
        [0.0, 0.0, 4.0, 4.0, 1.0, 9.0, 1.0, NAN, 4.0, 0.0],
    ]
)
OWN_Q = np.array([0, 0, 1])
OWN_P = np.array([0, 1, 2])
FRACTIONS = [0.25, 0.5, 1.0]
# by hand, per own window (rows) and sub-pool (columns)
GREATER = np.array([[1, 1, 2], [2, 3, 4], [0, 1, 1]])
TIES = np.array([[0, 0, 0], [0, 1, 2], [2, 2, 2]])
# pessimistic AP per query and sub-pool: query 0 ranks (2, 3), (2, 5), (3, 7); query 1 3, 4, 4
AP = {
    "q0": [(1 / 2 + 2 / 3) / 2, (1 / 2 + 2 / 5) / 2, (1 / 3 + 2 / 7) / 2],
    "q1": [1 / 3, 1 / 4, 1 / 4],
}


def hand_tile(tmp_path: Path, levels: Any = LEVELS, **kw: Any) -> scoring.TiledScores:
    """The hand-made tile scored with ``levels`` (None: no haystack)."""
    return scoring.score_tiled(
        lambda q, p: TILE[np.ix_(q, p)],
        *TILE.shape,
        query_block=kw.get("query_block", 1),
        pool_block=kw.get("pool_block", 3),
        top_k=3,
        own_query=OWN_Q,
        own_pool=OWN_P,
        scratch_dir=tmp_path,
        levels=levels,
        n_levels=3 if levels is not None else 1,
    )


def hand_table(res: scoring.TiledScores) -> pd.DataFrame:
    pairs = pd.DataFrame(
        {"q": OWN_Q, "query_id": ["q0", "q0", "q1"], "fact_id": ["f0", "f0", "f1"], "window": OWN_P}
    )
    assert res.haystack is not None
    return scoring.haystack_table(pairs, FRACTIONS, res.own_score, res.haystack)


def ap_by_query(own: pd.DataFrame) -> dict[str, float]:
    """AP from own rows with :func:`plantbench.grading.analysis.own_ranks` (the analysis' ranks)."""
    work = own.assign(rank=analysis.own_ranks(own)).sort_values(["query_id", "rank"])
    work["hit"] = work.groupby("query_id").cumcount() + 1
    return (work["hit"] / work["rank"]).groupby(work["query_id"]).mean().to_dict()


@pytest.mark.parametrize("qb,pb", [(1, 3), (2, 10), (2, 1)])
def test_hand_made_tile_counts_and_ap(tmp_path: Path, qb: int, pb: int) -> None:
    res = hand_tile(tmp_path, query_block=qb, pool_block=pb)
    hay = res.haystack
    assert hay is not None
    assert hay.n_pool.tolist() == [6, 8, 10] and hay.n_background.tolist() == [2, 4, 6]
    np.testing.assert_array_equal(hay.n_greater, GREATER)
    np.testing.assert_array_equal(hay.n_ties, TIES)
    # per-query statistics over the sub-pool; query 1 meets its NaN only in the whole pool
    sub1 = TILE[0, LEVELS <= 1]
    assert hay.mean[0, 0] == pytest.approx(sub1.mean()) and hay.std[0, 0] == pytest.approx(
        sub1.std()
    )
    assert hay.degenerate[1].tolist() == ["", "", "nan"]
    assert hay.mean[1, 1] == pytest.approx(np.mean(TILE[1, LEVELS <= 2]))
    table = hand_table(res)
    assert list(table.columns) == [
        *("query_id", "fact_id", "window", "fraction", "n_background", "n_pool", "score"),
        *("n_greater", "n_ties", "mean", "std", "degenerate"),
    ]
    assert table["fraction"].tolist() == FRACTIONS * 3  # sorted by query, window, share
    for j, f in enumerate(FRACTIONS):
        own = table[table["fraction"] == f].reset_index(drop=True)
        got = ap_by_query(own)
        assert got == pytest.approx({q: v[j] for q, v in AP.items()}), f


def test_share_one_is_the_whole_pool(tmp_path: Path) -> None:
    res = hand_tile(tmp_path)
    plain = hand_tile(tmp_path, levels=None)
    hay = res.haystack
    assert hay is not None and plain.haystack is None
    for name in ("mean", "std", "degenerate", "own_score", "n_greater", "n_ties", "top_rows"):
        np.testing.assert_array_equal(getattr(res, name), getattr(plain, name))
    np.testing.assert_array_equal(hay.n_greater[:, -1], plain.n_greater)
    np.testing.assert_array_equal(hay.n_ties[:, -1], plain.n_ties)
    np.testing.assert_array_equal(hay.mean[:, -1], plain.mean)
    np.testing.assert_array_equal(hay.std[:, -1], plain.std)
    assert hay.degenerate[:, -1].tolist() == plain.degenerate.tolist()


def test_own_windows_must_be_in_every_sub_pool(tmp_path: Path) -> None:
    levels = LEVELS.copy()
    levels[1] = 2
    with pytest.raises(Exception, match="level 0"):
        hand_tile(tmp_path, levels=levels)


# --------------------------------------------------------------------------------------------
# Seeded, nested levels
# --------------------------------------------------------------------------------------------


def pool_table(n_background: int = 37, seed: int = 4) -> pd.DataFrame:
    kinds = np.array(["planted"] * 9 + ["distractor"] * 5 + ["background"] * n_background)
    return pd.DataFrame({"kind": np.random.default_rng(seed).permutation(kinds)})


def cfg_with(fractions: list[float], seed: int = 7) -> dict[str, Any]:
    return {"seed": seed, "analysis": {"haystack": fractions}}


def test_levels_are_nested_and_seeded() -> None:
    table = pool_table()
    bg = (table["kind"] == "background").to_numpy()
    fractions = [0.1, 0.25, 0.5, 1.0]
    levels = pool.haystack_levels(cfg_with(fractions), table)
    assert (levels[~bg] == 0).all() and (levels[bg] >= 1).all()
    subs = [set(np.flatnonzero(levels <= j)) for j in range(1, len(fractions) + 1)]
    for small, big in zip(subs, subs[1:], strict=False):
        assert small < big  # each sub-pool a strict superset of the one before
    sizes = [int((levels[bg] <= j).sum()) for j in range(1, len(fractions) + 1)]
    assert sizes == [math.ceil(f * 37) for f in fractions] == [4, 10, 19, 37]
    assert subs[-1] == set(range(len(table)))
    again = pool.haystack_levels(cfg_with(fractions), table)
    np.testing.assert_array_equal(levels, again)
    other = pool.haystack_levels(cfg_with(fractions, seed=8), table)
    assert not np.array_equal(levels, other)
    # one seeded order: the half of [0.5, 1.0] is the half of [0.1, 0.25, 0.5, 1.0]
    half = pool.haystack_levels(cfg_with([0.5, 1.0]), table)
    assert set(np.flatnonzero(half <= 1)) == subs[2]


def test_cuts_round_before_ceil() -> None:
    assert pool.haystack_cuts([0.07, 0.29, 1.0], 100).tolist() == [7, 29, 100]
    assert pool.haystack_cuts([0.25, 1.0], 0).tolist() == [0, 0]
    assert pool.haystack_cuts([0.25, 0.5, 1.0], 1).tolist() == [1, 1, 1]


def test_default_shares() -> None:
    assert config.haystack_fractions({"analysis": {}}) == [0.25, 0.5, 1.0]
    assert config.haystack_fractions(cfg_with([0.5, 1.0])) == [0.5, 1.0]


# --------------------------------------------------------------------------------------------
# The config key
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,fix",
    [
        ([0.5, 0.25, 1.0], "ascending"),
        ([0.25, 0.5], "1.0 last"),
        ([0.0, 1.0], "must be > 0"),
        ([0.5, 1.5], "must be <= 1"),
        ([0.5, 0.5, 1.0], "list each one once"),
        ([], "at least 1"),
        (0.5, "expected array"),
    ],
)
def test_bad_haystack_is_refused(default_cfg: dict[str, Any], value: Any, fix: str) -> None:
    bad = config.deep_merge(default_cfg, {"analysis": {"haystack": value}})
    with pytest.raises(ConfigError) as err:
        config.validate(bad)
    msg = str(err.value)
    assert "analysis.haystack" in msg and fix in msg and "\n" not in msg


def test_good_haystack_is_taken(default_cfg: dict[str, Any]) -> None:
    good = config.validate(config.deep_merge(default_cfg, {"analysis": {"haystack": [0.1, 1]}}))
    assert config.haystack_fractions(good) == [0.1, 1.0]


def test_score_jobs_rerun_when_the_shares_change(default_cfg: dict[str, Any]) -> None:
    """The score rule hashes analysis.haystack only when set: configs without it are unchanged."""
    before = runconfig.rule_sections(default_cfg, "score")
    picked = {k: default_cfg[k] for k in ("scoring", "features", "curvature")}
    assert before == runconfig.hash_bytes(config.canonical_json(picked).encode())[:16]
    other = config.deep_merge(default_cfg, {"analysis": {"haystack": [0.5, 1.0]}})
    assert runconfig.rule_sections(other, "score") != before
    boot = config.deep_merge(default_cfg, {"analysis": {"bootstrap": 99}})
    assert runconfig.rule_sections(boot, "score") == before


# --------------------------------------------------------------------------------------------
# Through the analysis: haystack.csv, share 1.0 = the existing AP and mass exactly
# --------------------------------------------------------------------------------------------


def tied_method(model: str, qids: list[str], wf: np.ndarray) -> np.ndarray:
    """Own windows around the background's scores, rounded: many ties, some NaN."""
    gen = np.random.default_rng([3, ord(model)])
    s = np.round(gen.normal(size=(len(qids), wf.size)) + own_mask(qids, wf) * 0.8, 1)
    s[0, 3] = NAN
    return s


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Study:
    root = tmp_path_factory.mktemp("haystack study")
    st = Study(root, make_facts(n_per_cell=2), n_background=80)
    st.add_method("tied", tied_method)
    st.add_method("rnd", random_method)
    return st


def test_share_one_equals_the_whole_pool_grading(graded: Study, default_cfg: dict) -> None:
    cfg = cfg_for(default_cfg, graded.root, ["tied", "rnd"], boot=20)
    meta = analysis.run(cfg, graded.paths)
    assert "haystack.csv" in meta["files"] and meta["info"]["haystack"] == FRACTIONS
    out = graded.root / "analysis"
    hay = pd.read_csv(out / "haystack.csv", keep_default_na=False, na_values=[""])
    assert list(hay.columns) == [
        *("method", "model", "fraction", "n_background", "n_pool", "ap", "mass"),
        *("n_queries", "degenerate"),
    ]
    assert len(hay) == 2 * 2 * len(FRACTIONS)
    ret = pd.read_csv(out / "retrieval.csv").set_index(["method", "model"])
    pq = pd.read_parquet(out / "per_query.parquet")
    whole = hay[hay["fraction"] == 1.0].set_index(["method", "model"])
    for (method, model), row in whole.iterrows():
        assert row["ap"] == ret.loc[(method, model), "ap"]  # exactly, as written
        sub = pq[(pq["method"] == method) & (pq["model"] == model)]
        assert row["ap"] == float(f"{sub['ap'].mean():.10g}")
        assert row["mass"] == float(f"{sub['mass'].mean():.10g}")
        assert row["n_pool"] == len(graded.windows[model])
        assert row["n_background"] == 80
    for _, g in hay.groupby(["method", "model"]):
        assert g["n_background"].tolist() == [20, 40, 80] and g["fraction"].tolist() == FRACTIONS
    # the per-query grading at 1.0 is the whole-pool one, bit for bit
    lineage = analysis.causal_lineage(graded.paths, io.read_meta(graded.paths.causal, "causal"))
    for method in ("tied", "rnd"):
        for model in ("A", "B"):
            s = analysis.load_scores(graded.paths, method, model, lineage)
            per = analysis.grade_haystack(
                s, analysis.load_haystack(s, FRACTIONS), graded.facts, FRACTIONS
            )
            one = per[per["fraction"] == 1.0].drop(columns=["fraction", "n_background", "n_pool"])
            pd.testing.assert_frame_equal(
                one.reset_index(drop=True), analysis.grade_queries(s, graded.facts)
            )
            # more background, never a better pessimistic rank: AP does not rise with the share
            ap = per.pivot_table(index="query_id", columns="fraction", values="ap")
            assert (ap[0.25] >= ap[0.5] - 1e-12).all() and (ap[0.5] >= ap[1.0] - 1e-12).all()


def test_scores_of_other_shares_are_refused(graded: Study, default_cfg: dict) -> None:
    cfg = cfg_for(default_cfg, graded.root, ["tied"], boot=20)
    cfg["analysis"]["haystack"] = [0.5, 1.0]
    with pytest.raises(ArtifactError, match=r"haystack shares.*analysis.haystack.*rerun"):
        analysis.run(cfg, graded.paths)


def test_report_section(graded: Study, default_cfg: dict) -> None:
    cfg = cfg_for(default_cfg, graded.root, ["tied", "rnd"], boot=20)
    analysis.run(cfg, graded.paths)
    text = build.run(cfg, graded.paths).read_text()
    assert "## AP as the haystack grows" in text and "100,000-window pool" in text
    header = (
        "| Method | 25% of the background (20 windows) | 50% of the background (40 windows) "
        "| 100% of the background (80 windows) |"
    )
    assert header in text
    hay = pd.read_csv(graded.root / "analysis" / "haystack.csv").set_index(
        ["method", "model", "fraction"]
    )
    cell = f"{hay.loc[('tied', 'A', 0.25), 'ap']:.3f} / {hay.loc[('tied', 'B', 0.25), 'ap']:.3f}"
    assert f"| tied (plug-in) | {cell} |" in text


def test_report_refuses_an_analysis_without_haystack(graded: Study, default_cfg: dict) -> None:
    cfg = cfg_for(default_cfg, graded.root, ["tied"], boot=20)
    analysis.run(cfg, graded.paths)
    folder = graded.root / "analysis"
    meta = io.read_meta(folder, "analysis")
    files = [f for f in meta["files"] if f != "haystack.csv"]
    io.write_meta(folder, "analysis", files, config_hash=meta["config_hash"], inputs=meta["inputs"])
    with pytest.raises(ArtifactError, match="haystack.csv.*rerun the analysis"):
        sections.read_analysis(graded.paths)
    analysis.run(cfg, graded.paths)


# --------------------------------------------------------------------------------------------
# The real scorer on the micro study (BM25: no features needed)
# --------------------------------------------------------------------------------------------


def test_score_folder_holds_the_haystack() -> None:
    from micro_study import build_upstream

    cfg, p = build_upstream()
    meta = scoring.run(cfg, p, "bm25", "A")
    folder = p.scores("bm25", "A")
    assert "haystack.parquet" in meta["files"]
    hay = io.read_parquet(folder / "haystack.parquet")
    own = io.read_parquet(folder / "own.parquet")
    queries = io.read_parquet(folder / "queries.parquet").set_index("query_id")
    table, _ = artifacts.load_pool(p, "A")
    n_bg = int((table["kind"] == "background").sum())
    assert meta["info"]["haystack"]["n_background"] == [math.ceil(f * n_bg) for f in FRACTIONS]
    assert len(hay) == len(own) * len(FRACTIONS)
    whole = hay[hay["fraction"] == 1.0].reset_index(drop=True)
    pd.testing.assert_frame_equal(whole[list(own.columns)], own)
    stats = queries.loc[whole["query_id"], ["mean", "std", "n_pool", "degenerate"]]
    pd.testing.assert_frame_equal(
        whole[["mean", "std", "n_pool", "degenerate"]], stats.reset_index(drop=True)
    )
    by = hay.groupby("fraction")["n_greater"].sum()
    assert by.is_monotonic_increasing  # more windows, never fewer above


@pytest.mark.slow
def test_smoke_run_haystack(smoke_run: Path) -> None:
    """The whole DAG: haystack.csv at share 1.0 repeats retrieval.csv's AP for every method."""
    hay = pd.read_csv(smoke_run / "analysis" / "haystack.csv")
    ret = pd.read_csv(smoke_run / "analysis" / "retrieval.csv").set_index(["method", "model"])
    assert set(hay["fraction"]) == set(FRACTIONS)
    whole = hay[hay["fraction"] == 1.0]
    assert len(whole) == len(ret) - ret.index.get_level_values("method").nunique()  # no "all"
    for r in whole.itertuples():
        assert r.ap == ret.loc[(r.method, r.model), "ap"], (r.method, r.model)
    text = (smoke_run / "report" / "report.md").read_text()
    assert "## AP as the haystack grows" in text
