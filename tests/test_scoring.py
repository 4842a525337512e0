"""The tiled scoring engine against brute force, the score folder contract, and bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from micro_study import build_grad_features, build_upstream
from plantbench import io, layout
from plantbench.attribution import features, scoring
from plantbench.errors import ArtifactError, ConfigError
from plantbench.paths import MODELS


def brute(S: np.ndarray, own_q: np.ndarray, own_p: np.ndarray, k: int):
    """Reference: everything from the full matrix at once."""
    fin = np.isfinite(S)
    mean = np.array([S[i, fin[i]].mean() if fin[i].any() else np.nan for i in range(len(S))])
    std = np.array([S[i, fin[i]].std() if fin[i].any() else np.nan for i in range(len(S))])
    deg = np.where(
        ~fin.all(1), "nan", np.where(np.ptp(np.where(fin, S, 0), 1) == 0, "constant", "")
    )
    own = S[own_q, own_p]
    greater, ties = [], []
    for q, s in zip(own_q, own, strict=True):
        row = S[q]
        if np.isnan(s):
            greater.append(int((~np.isnan(row)).sum()))
            ties.append(int(np.isnan(row).sum()) - 1)
        else:
            greater.append(int((row > s).sum()))
            ties.append(int((row == s).sum()) - 1)
    top = []
    for i in range(len(S)):
        key = sorted(
            range(S.shape[1]), key=lambda j: (np.isnan(S[i, j]), -np.nan_to_num(S[i, j], nan=0), j)
        )
        top.append(key[:k])
    return mean, std, deg, own, np.array(greater), np.array(ties), np.array(top)


def matrix_with_ties(n_q=7, n_p=23, seed=0):
    g = np.random.default_rng(seed)
    S = g.integers(0, 5, size=(n_q, n_p)).astype(np.float64)  # many exact ties
    S[1, 3] = np.nan
    S[1, 10] = np.nan  # two NaNs in one row, one of them an own window below
    S[2, :] = 4.0  # constant row
    S[4, 5] = np.inf  # non-finite -> NaN
    S[5] = g.standard_normal(n_p)
    return S


@pytest.mark.parametrize("qb,pb", [(1, 1), (3, 3), (100, 100), (2, 5)])
def test_tiled_equals_brute_force(qb, pb, tmp_path):
    S = matrix_with_ties()
    own_q = np.array([0, 0, 1, 1, 2, 3, 4, 5, 6, 6])
    own_p = np.array([2, 7, 10, 4, 0, 22, 5, 11, 0, 1])
    calls = []

    def fn(q, p):
        calls.append((len(q), len(p)))
        return S[np.ix_(q, p)]

    full = np.zeros(S.shape, dtype=np.float32)
    res = scoring.score_tiled(
        fn,
        *S.shape,
        query_block=qb,
        pool_block=pb,
        top_k=6,
        own_query=own_q,
        own_pool=own_p,
        full=full,
        scratch_dir=tmp_path,
    )
    assert max(c[0] for c in calls) <= qb and max(c[1] for c in calls) <= pb
    clean = np.where(np.isfinite(S), S, np.nan)
    mean, std, deg, own, greater, ties, top = brute(clean, own_q, own_p, 6)
    np.testing.assert_allclose(res.mean, mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res.std, std, rtol=1e-10, atol=1e-12)
    assert res.degenerate.tolist() == deg.tolist()
    assert res.degenerate[2] == "constant" and res.std[2] == 0.0 and res.degenerate[1] == "nan"
    np.testing.assert_array_equal(res.own_score, own)
    np.testing.assert_array_equal(res.n_greater, greater)
    np.testing.assert_array_equal(res.n_ties, ties)
    np.testing.assert_array_equal(res.top_rows, top)
    np.testing.assert_array_equal(full, clean.astype(np.float32))
    assert not list(tmp_path.iterdir())  # scratch removed


def test_nan_own_window_ranks_below_every_finite_score(tmp_path):
    S = np.array([[1.0, np.nan, -5.0, np.nan, 2.0]])
    res = scoring.score_tiled(
        lambda q, p: S[np.ix_(q, p)],
        1,
        5,
        query_block=1,
        pool_block=2,
        top_k=5,
        own_query=np.array([0]),
        own_pool=np.array([1]),
    )
    assert res.n_greater.tolist() == [3] and res.n_ties.tolist() == [1]
    assert res.top_rows[0].tolist() == [4, 0, 2, 1, 3]


def test_wrong_tile_shape_is_an_error():
    with pytest.raises(Exception, match="shape"):
        scoring.score_tiled(
            lambda q, p: np.zeros((1, 1)),
            2,
            3,
            query_block=2,
            pool_block=3,
            top_k=1,
            own_query=np.array([], int),
            own_pool=np.array([], int),
        )


def worst_case_ap(scores: np.ndarray, is_own: np.ndarray) -> float:
    """AP with own windows placed after every tied non-own window (explicit ordering)."""
    order = np.lexsort((is_own, -np.nan_to_num(scores, nan=-np.inf)))
    hits, total = 0, 0.0
    for rank, j in enumerate(order, 1):
        if is_own[j]:
            hits += 1
            total += hits / rank
    return total / is_own.sum()


def test_average_precision_pessimistic_ties(tmp_path):
    g = np.random.default_rng(3)
    for trial in range(20):
        n = 15
        s = g.integers(0, 4, n).astype(float)
        if trial % 3 == 0:
            s[g.integers(0, n)] = np.nan
        own_rows = g.choice(n, size=g.integers(1, 5), replace=False)
        res = scoring.score_tiled(
            lambda q, p, s=s: s[None, p],
            1,
            n,
            query_block=1,
            pool_block=4,
            top_k=3,
            own_query=np.zeros(len(own_rows), int),
            own_pool=own_rows,
        )
        own = pd.DataFrame(
            {
                "query_id": "q",
                "score": res.own_score,
                "n_greater": res.n_greater,
                "n_ties": res.n_ties,
            }
        )
        is_own = np.zeros(n, bool)
        is_own[own_rows] = True
        assert scoring.average_precision(own)["q"] == pytest.approx(worst_case_ap(s, is_own))
    perfect = pd.DataFrame({"query_id": "q", "score": [3.0, 3.0], "n_greater": 0, "n_ties": 1})
    assert scoring.average_precision(perfect)["q"] == 1.0


# ----------------------------------------------------------------------------- end to end


def test_score_folder_contract_for_every_method():
    cfg, p = build_upstream()
    for m in MODELS:
        build_grad_features(m)
        features.hidden(cfg, p, m)
    for model in MODELS:
        qs = io.read_parquet(p.facts / "queries.parquet")
        facts = io.read_parquet(p.facts / "facts.parquet")
        table = io.read_parquet(p.pool(model) / "pool.parquet")
        for method in (
            "bm25",
            "hidden",
            "grad_dot",
            "grad_cos",
            "tracin_dot",
            "tracin_influence",
            "influence",
        ):
            meta = scoring.run(cfg, p, method, model)
            folder = p.scores(method, model)
            assert io.read_meta(folder, "scores")["hash"] == meta["hash"]
            q = io.read_parquet(folder / "queries.parquet")
            assert q["query_id"].tolist() == qs["query_id"].tolist()  # every query, both forms
            assert list(q.columns) == [
                "query_id",
                "fact_id",
                "form",
                "mean",
                "std",
                "n_pool",
                "degenerate",
            ]
            assert q["mean"].dtype == np.float64 and q["n_pool"].dtype == np.int64
            assert (q["n_pool"] == len(table)).all()
            own = io.read_parquet(folder / "own.parquet")
            assert list(own.columns) == [
                "query_id",
                "fact_id",
                "window",
                "score",
                "n_greater",
                "n_ties",
            ]
            read = set(facts.loc[facts["reader"] == model, "fact_id"])
            assert set(own["fact_id"]) == read
            planted = table[table["kind"] == "planted"]
            assert len(own) == 2 * len(planted)  # two forms per fact, every own window
            full = np.load(folder / "scores.npy")
            assert full.shape == (len(qs), len(table)) and full.dtype == np.float32
            # own.parquet agrees with the full matrix (ranks recomputed in float32-safe way)
            qi = {k: i for i, k in enumerate(qs["query_id"])}
            ri = {w: i for i, w in enumerate(table["window"])}
            for r in own.itertuples():
                assert full[qi[r.query_id], ri[r.window]] == np.float32(r.score)
            np.testing.assert_allclose(
                q["mean"], full.astype(np.float64).mean(1), rtol=1e-5, atol=1e-6
            )
            top = io.read_parquet(folder / "topk.parquet")
            assert top["rank"].max() == cfg["scoring"]["top_k"]
            assert meta["inputs"]["pool"] == io.read_meta(p.pool(model), "pool")["hash"]
            assert meta["info"]["full_matrix"] is True
    ap = scoring.retrieval_sanity(p, "bm25")
    assert ap["all"] > 0.5  # invented names are unique to their fact's documents


def test_unknown_method_leaves_no_output():
    cfg, p = build_upstream()
    with pytest.raises(ConfigError, match="unknown method 'nope'.*bm25"):
        scoring.run(cfg, p, "nope", "A")
    assert not p.scores("nope", "A").exists()


def _swap_field(path, key, value):
    m = json.loads(path.read_text())
    m[key] = value
    path.write_text(json.dumps(m))


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("projection_seed", 12345, "projection_seed"),
        ("manifest_hash", "0" * 32, "manifest_hash"),
    ],
)
def test_features_from_other_inputs_are_refused(tmp_path, key, value, match):
    cfg, p = build_upstream()
    build_grad_features("A")
    ck = layout.final_checkpoint(cfg)
    target = p.query_grads("A", ck) / "shard.json"
    backup = tmp_path / "shard.json"
    shutil.copy(target, backup)
    out = p.scores("grad_dot", "A")
    shutil.rmtree(out, ignore_errors=True)
    try:
        _swap_field(target, key, value)
        with pytest.raises(ArtifactError, match=match) as err:
            scoring.run(cfg, p, "grad_dot", "A")
        assert "\n" not in str(err.value)
        assert not out.exists()
    finally:
        shutil.copy(backup, target)


def test_missing_curvature_is_one_error(tmp_path):
    cfg, p = build_upstream()
    build_grad_features("A")
    ck = layout.final_checkpoint(cfg)
    f = p.curvature("A", ck)
    moved = tmp_path / f.name
    shutil.move(f, moved)
    try:
        with pytest.raises(ArtifactError, match="curvature"):
            scoring.run(cfg, p, "influence", "A")
        assert (
            not p.scores("influence", "A").exists()
            or (p.scores("influence", "A") / "meta.json").is_file()
        )
    finally:
        shutil.move(moved, f)
