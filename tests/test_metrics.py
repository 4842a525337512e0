"""Tests for plantbench.grading.metrics against hand-computed answers and independent formulas."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import average_precision_score

from plantbench.grading import metrics as M

NAN = float("nan")


def brute_ranks(scores, relevant, tie):
    """Independent reference: sort the whole pool with an explicit tie key."""
    s = np.asarray(scores, dtype=float)
    r = np.asarray(relevant, dtype=bool)
    isnan = np.isnan(s)
    neg = np.where(isnan, 0.0, -s)
    tiekey = r if tie == "pessimistic" else ~r  # False sorts first
    order = np.lexsort((tiekey, neg, isnan))
    ranks = np.empty(s.size, dtype=int)
    ranks[order] = np.arange(1, s.size + 1)
    return np.sort(ranks[r])


def brute_ap(scores, relevant, tie):
    ranks = brute_ranks(scores, relevant, tie)
    return float(np.mean(np.arange(1, ranks.size + 1) / ranks))


# ------------------------------------------------------------------ average precision


def test_ap_perfect_ranking_is_one():
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    rel = np.array([True, True, False, False, False])
    assert M.average_precision(scores, rel) == 1.0
    assert M.average_precision(scores, rel, tie="optimistic") == 1.0


def test_ap_relevant_at_bottom():
    # 2 relevant of 5 at ranks 4 and 5: precision 1/4 and 2/5.
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    rel = np.array([False, False, False, True, True])
    assert M.average_precision(scores, rel) == pytest.approx((1 / 4 + 2 / 5) / 2)


def test_ap_ties_both_conventions():
    scores = np.array([3.0, 2.0, 2.0, 2.0, 1.0])
    rel = np.array([False, True, False, False, True])
    # pessimistic: 3F 2F 2F 2T 1T -> relevant at ranks 4, 5
    assert M.average_precision(scores, rel) == pytest.approx((1 / 4 + 2 / 5) / 2)
    # optimistic: 3F 2T 2F 2F 1T -> relevant at ranks 2, 5
    assert M.average_precision(scores, rel, tie="optimistic") == pytest.approx((1 / 2 + 2 / 5) / 2)


def test_ap_constant_scores():
    scores = np.zeros(4)
    rel = np.array([True, False, True, False])
    # pessimistic: ranks 3, 4 -> (1/3 + 2/4) / 2; optimistic: ranks 1, 2 -> 1
    assert M.average_precision(scores, rel) == pytest.approx((1 / 3 + 2 / 4) / 2)
    assert M.average_precision(scores, rel, tie="optimistic") == 1.0
    assert M.degenerate(scores) == "constant"


def test_ap_nan_ranks_last():
    # NaN below everything, including -inf.
    assert M.average_precision([NAN, 1.0, -np.inf], [True, False, False]) == pytest.approx(1 / 3)
    # NaN tied with NaN: pessimistic puts the relevant one after, optimistic before.
    scores = [NAN, NAN, 1.0]
    rel = [True, False, False]
    assert M.average_precision(scores, rel) == pytest.approx(1 / 3)
    assert M.average_precision(scores, rel, tie="optimistic") == pytest.approx(1 / 2)
    assert M.degenerate(scores) == "nan"


def test_ap_matches_sklearn_without_ties():
    gen = np.random.default_rng(0)
    for _ in range(20):
        n = int(gen.integers(5, 300))
        scores = gen.normal(size=n)
        rel = gen.random(n) < 0.2
        rel[0] = True
        expected = average_precision_score(rel, scores)
        for tie in ("pessimistic", "optimistic"):
            assert M.average_precision(scores, rel, tie=tie) == pytest.approx(expected)


def test_ranks_match_brute_force_with_ties_and_nans():
    gen = np.random.default_rng(1)
    for _ in range(200):
        n = int(gen.integers(1, 40))
        scores = gen.integers(0, 5, size=n).astype(float)
        scores[gen.random(n) < 0.15] = NAN
        scores[gen.random(n) < 0.05] = -np.inf
        rel = gen.random(n) < 0.4
        rel[gen.integers(0, n)] = True
        for tie in ("pessimistic", "optimistic"):
            np.testing.assert_array_equal(
                M.relevant_ranks(scores, rel, tie), brute_ranks(scores, rel, tie)
            )
            assert M.average_precision(scores, rel, tie) == pytest.approx(
                brute_ap(scores, rel, tie)
            )
            k = int(gen.integers(0, n + 1))
            assert M.recall_at_k(scores, rel, k, tie) == pytest.approx(
                np.mean(brute_ranks(scores, rel, tie) <= k)
            )


def test_ap_errors():
    with pytest.raises(ValueError, match="no relevant"):
        M.average_precision([1.0, 2.0], [False, False])
    with pytest.raises(ValueError, match="items"):
        M.average_precision([1.0, 2.0], [True])
    with pytest.raises(ValueError, match="boolean"):
        M.average_precision([1.0, 2.0], [1, 0])
    with pytest.raises(ValueError, match="tie"):
        M.average_precision([1.0, 2.0], [True, False], tie="random")


# ------------------------------------------------------------------ recall@k


def test_recall_at_k_ties_at_cut():
    scores = np.array([5.0, 3.0, 3.0, 3.0, 1.0])
    rel = np.array([False, True, False, False, True])
    # pessimistic: 5F 3F 3F 3T 1T ; optimistic: 5F 3T 3F 3F 1T
    assert M.recall_at_k(scores, rel, k=2) == 0.0
    assert M.recall_at_k(scores, rel, k=2, tie="optimistic") == 0.5
    assert M.recall_at_k(scores, rel, k=4) == 0.5
    assert M.recall_at_k(scores, rel, k=5) == 1.0
    assert M.recall_at_k(scores, rel, k=10) == 1.0


def test_recall_at_10_default():
    scores = -np.arange(20.0)  # item i has rank i + 1
    rel = np.zeros(20, dtype=bool)
    rel[[0, 9, 10, 19]] = True
    assert M.recall_at_k(scores, rel) == 0.5


# ------------------------------------------------------------------ standardize / mass


def test_standardize_population_std():
    z = M.standardize([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, population var = 1.25
    np.testing.assert_allclose(z, (np.array([1, 2, 3, 4]) - 2.5) / np.sqrt(1.25))
    assert M.degenerate([1.0, 2.0]) is None


def test_standardize_constant_and_nan():
    z = M.standardize(np.full(5, 0.1))
    assert np.isnan(z).all() and z.shape == (5,)
    assert M.degenerate(np.full(5, 0.1)) == "constant"
    assert M.degenerate([3.0]) == "constant"
    assert np.isnan(M.standardize([1.0, NAN, 2.0])).all()
    assert M.degenerate([1.0, np.inf]) == "nan"


def test_attributed_mass():
    scores = np.array([1.0, 2.0, 3.0, 4.0])
    own = np.array([False, False, True, True])
    z = (scores - 2.5) / np.sqrt(1.25)
    assert M.attributed_mass(scores, own) == pytest.approx((z[2] + z[3]) / 2)
    assert np.isnan(M.attributed_mass(np.ones(4), own))
    with pytest.raises(ValueError):
        M.attributed_mass(scores, np.zeros(4, dtype=bool))


# ------------------------------------------------------------------ correlations


def test_pearson():
    gen = np.random.default_rng(2)
    x, y = gen.normal(size=(2, 50))
    assert M.pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert M.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert np.isnan(M.pearson(x, np.ones(50)))
    assert np.isnan(M.pearson([1.0], [2.0]))
    assert np.isnan(M.pearson([1.0, NAN, 3.0], [1.0, 2.0, 3.0]))


def precision_matrix_partial(x, y, z):
    data = np.column_stack([x, y, z])
    p = np.linalg.inv(np.cov(data, rowvar=False))
    return -p[0, 1] / np.sqrt(p[0, 0] * p[1, 1])


def test_partial_corr_equals_precision_matrix_formula():
    gen = np.random.default_rng(3)
    for k in (1, 2, 3):
        z = gen.normal(size=(200, k))
        x = z @ gen.normal(size=k) + gen.normal(size=200)
        y = z @ gen.normal(size=k) + 0.5 * x + gen.normal(size=200)
        expected = precision_matrix_partial(x, y, z)
        assert M.partial_corr(x, y, z) == pytest.approx(expected, abs=1e-12)
    z1 = gen.normal(size=100)
    x, y = z1 + gen.normal(size=100), z1 + gen.normal(size=100)
    assert M.partial_corr(x, y, z1) == pytest.approx(precision_matrix_partial(x, y, z1))


def test_partial_corr_removes_common_cause():
    gen = np.random.default_rng(4)
    z = gen.normal(size=5000)
    x = z + gen.normal(size=5000)
    y = z + gen.normal(size=5000)
    assert M.pearson(x, y) > 0.4
    assert abs(M.partial_corr(x, y, z)) < 0.05


def test_partial_corr_degenerate():
    gen = np.random.default_rng(5)
    z = gen.normal(size=30)
    assert np.isnan(M.partial_corr(2 * z + 1, gen.normal(size=30), z))
    assert np.isnan(M.partial_corr(z[:3], z[:3], z[:3]))


# ------------------------------------------------------------------ within-cell ranks


def test_within_cell_ranks_ties_and_small_cells():
    df = pd.DataFrame(
        {
            "cell": ["A", "A", "A", "A", "B", "C", "C", "D", "D"],
            "v": [10, 20, 20, 30, 7, 5, 1, 3, 3],
        },
        index=list("abcdefghi"),
    )
    out = M.within_cell_ranks(df, "cell", ["v"])
    # A: ranks 1, 2.5, 2.5, 4 -> centred -1.5, 0, 0, 1.5 -> / (4 - 1)
    # B: singleton -> 0 ; C: ranks 2, 1 -> +0.5, -0.5 ; D: tie -> 0, 0
    expected = [-0.5, 0.0, 0.0, 0.5, 0.0, 0.5, -0.5, 0.0, 0.0]
    np.testing.assert_allclose(out["v"].to_numpy(), expected)
    assert list(out.index) == list(df.index)


def test_within_cell_ranks_match_pandas_and_handle_nan():
    gen = np.random.default_rng(6)
    n = 300
    df = pd.DataFrame(
        {
            "d": gen.integers(0, 2, n),
            "f": gen.integers(0, 6, n),
            "x": gen.integers(0, 4, n).astype(float),
            "y": gen.normal(size=n),
        }
    )
    df.loc[gen.random(n) < 0.1, "x"] = NAN
    out = M.within_cell_ranks(df, ["d", "f"], ["x", "y"])
    for col in ("x", "y"):
        g = df.groupby(["d", "f"])[col]
        rank = g.rank(method="average")
        size = g.transform("count")
        ref = ((rank - (size + 1) / 2) / (size - 1)).where(size > 1, 0.0).where(df[col].notna())
        np.testing.assert_allclose(out[col].to_numpy(), ref.to_numpy())
    assert out["x"].isna().sum() == df["x"].isna().sum()


def test_singleton_cells_add_no_spurious_correlation():
    gen = np.random.default_rng(7)
    big = pd.DataFrame({"cell": np.repeat([0, 1], 30), "x": gen.normal(size=60)})
    big["y"] = gen.normal(size=60)
    # Many singleton cells where x and y are both huge: must contribute nothing.
    singles = pd.DataFrame({"cell": np.arange(2, 40), "x": 1e6 + np.arange(38.0)})
    singles["y"] = singles["x"]
    both = pd.concat([big, singles], ignore_index=True)
    r_big = M.within_cell_ranks(big, "cell", ["x", "y"])
    r_both = M.within_cell_ranks(both, "cell", ["x", "y"])
    assert (r_both.iloc[60:] == 0).all().all()
    assert M.pearson(r_both["x"], r_both["y"]) == pytest.approx(M.pearson(r_big["x"], r_big["y"]))


# ------------------------------------------------------------------ within-cell correlations


def design_frame(gen, per_cell=22, n_cells=24, mass="effect"):
    """Facts in cells with large cell offsets (which ranking within cells must remove)."""
    n = per_cell * n_cells
    cell = np.repeat(np.arange(n_cells), per_cell)
    offset = gen.normal(scale=10.0, size=n_cells)[cell]
    length = gen.integers(1, 12, size=n).astype(float)
    difficulty = gen.normal(size=n) + 0.2 * length + offset
    effect = 0.5 * length + difficulty + gen.normal(size=n) + offset
    if mass == "effect":
        m = effect + gen.normal(size=n) + offset
    elif mass == "length":
        m = length + 0.1 * gen.normal(size=n) - 5 * offset
    else:
        m = length.copy()
    return pd.DataFrame(
        {"cell": cell, "mass": m, "effect": effect, "length": length, "difficulty": difficulty}
    )


def wcc(df):
    return M.within_cell_correlations(df, "cell", "mass", "effect", "length", "difficulty")


def test_mass_tracks_effect_gives_positive_controlled():
    res = wcc(design_frame(np.random.default_rng(8)))
    assert set(res) == set(M.CORRELATION_KEYS)
    assert res["raw"] > 0.5
    assert res["controlled"] > 0.3


def test_mass_equals_length_is_not_controlled_signal():
    res = wcc(design_frame(np.random.default_rng(9), mass="length"))
    assert res["raw"] > 0.3
    assert res["vs_length"] > 0.9
    assert abs(res["controlled"]) < 0.1
    # Exactly equal to a control: the residual is zero, so the partial correlation is undefined.
    exact = wcc(design_frame(np.random.default_rng(9), mass="exact"))
    assert exact["vs_length"] == pytest.approx(1.0)
    assert np.isnan(exact["controlled"])


def test_within_cell_correlations_drop_missing_rows():
    df = design_frame(np.random.default_rng(10))
    with_nan = df.copy()
    with_nan.loc[[3, 50], "mass"] = NAN
    res = wcc(with_nan)
    ref = wcc(df.drop(index=[3, 50]))
    for key in M.CORRELATION_KEYS:
        assert res[key] == pytest.approx(ref[key])


# ------------------------------------------------------------------ bootstrap


def test_resample_within_cells_keeps_cells():
    df = pd.DataFrame({"cell": list("aabbbc"), "x": range(6)})
    idx = M.resample_within_cells(df, "cell", 50, seed=1)
    assert idx.shape == (50, 6)
    cells = df["cell"].to_numpy()[idx]
    for row in cells:
        assert sorted(row) == sorted(df["cell"])
    np.testing.assert_array_equal(idx, M.resample_within_cells(df, "cell", 50, seed=1))


def test_bootstrap_interval_contains_estimate_and_is_deterministic():
    df = design_frame(np.random.default_rng(11))

    def stat(d):
        return wcc(d)["controlled"]

    point = stat(df)
    lo, hi = M.bootstrap_within_cells(df, "cell", stat, n_boot=300, seed=7)
    assert lo < point < hi
    assert (lo, hi) == M.bootstrap_within_cells(df, "cell", stat, n_boot=300, seed=7)
    assert (lo, hi) != M.bootstrap_within_cells(df, "cell", stat, n_boot=300, seed=8)
    assert (lo, hi) != M.bootstrap_within_cells(df, "cell", stat, n_boot=300, seed=7, tag="x")


def test_bootstrap_narrows_with_more_data():
    gen = np.random.default_rng(12)
    small = design_frame(gen, per_cell=8)
    large = design_frame(gen, per_cell=80)

    def stat(d):
        return wcc(d)["raw"]

    lo_s, hi_s = M.bootstrap_within_cells(small, "cell", stat, n_boot=300, seed=0)
    lo_l, hi_l = M.bootstrap_within_cells(large, "cell", stat, n_boot=300, seed=0)
    assert hi_l - lo_l < 0.6 * (hi_s - lo_s)


def test_bootstrap_fast_path_matches_generic_and_is_fast():
    df = design_frame(np.random.default_rng(13), per_cell=22)  # 528 facts, 24 cells
    res = M.bootstrap_within_cells_many(df, "cell", wcc, n_boot=300, seed=3)
    assert set(res) == set(M.CORRELATION_KEYS)
    point = wcc(df)
    for key, iv in res.items():
        assert iv.n_nan == 0
        assert iv.lo <= point[key] <= iv.hi
    # The single-statistic interval is the same resamples' interval.
    single = M.bootstrap_within_cells(df, "cell", lambda d: wcc(d)["raw"], n_boot=300, seed=3)
    assert single == (res["raw"].lo, res["raw"].hi)
    # The vectorised path gives the same intervals from the same resamples.
    fast = M.bootstrap_within_cell_correlations(
        df, "cell", "mass", "effect", "length", "difficulty", n_boot=300, seed=3
    )
    for key in M.CORRELATION_KEYS:
        assert fast[key].n_nan == 0
        assert fast[key].lo == pytest.approx(res[key].lo, abs=1e-12)
        assert fast[key].hi == pytest.approx(res[key].hi, abs=1e-12)


def test_bootstrap_counts_nan_resamples():
    # A statistic that is NaN in some resamples: they are left out and counted.
    tiny = pd.DataFrame(
        {"cell": [0, 0, 1, 1], "x": [1.0, 2.0, 3.0, 4.0], "y": [1.0, 2.0, 4.0, 3.0]}
    )

    def corr(d):
        r = M.within_cell_ranks(d, "cell", ["x", "y"])
        return {"r": M.pearson(r["x"], r["y"])}

    iv = M.bootstrap_within_cells_many(tiny, "cell", corr, n_boot=200, seed=0)["r"]
    assert 0 < iv.n_nan < 200  # both cells resampled to duplicates -> constant ranks -> NaN
    assert -1.0 <= iv.lo <= iv.hi <= 1.0


def test_percentile_interval():
    assert M.percentile_interval(np.arange(101.0), 0.1) == (5.0, 95.0)
    assert np.isnan(M.percentile_interval([NAN, NAN])[0])


# ------------------------------------------------------------------ learned grid


def test_learned_grid_counts():
    rows = [
        (2, "early", True),
        (2, "early", False),
        (2, "middle", False),
        (2, "late", True),
        (2, "late", True),
        (8, "early", False),
        (8, "middle", True),
        (8, "middle", True),
        (8, "middle", False),
    ]
    df = pd.DataFrame(rows, columns=["n_docs", "position", "learned"]).sample(
        frac=1.0, random_state=0
    )
    grid = M.learned_grid(df)
    assert list(grid.rates.index) == [2, 8, "All"]
    assert list(grid.rates.columns) == ["early", "middle", "late", "All"]
    n_facts = [[2, 1, 2, 5], [1, 3, 0, 4], [3, 4, 2, 9]]
    n_learned = [[1, 0, 2, 3], [0, 2, 0, 2], [1, 2, 2, 5]]
    np.testing.assert_array_equal(grid.n_facts.to_numpy(), n_facts)
    np.testing.assert_array_equal(grid.n_learned.to_numpy(), n_learned)
    expected = np.array(n_learned, dtype=float) / np.where(np.array(n_facts) > 0, n_facts, np.nan)
    np.testing.assert_allclose(grid.rates.to_numpy(dtype=float), expected)
    assert np.isnan(grid.rates.loc[8, "late"])
    assert grid.rates.loc["All", "All"] == pytest.approx(5 / 9)


def test_learned_grid_rejects_bad_input():
    df = pd.DataFrame({"n_docs": [2], "position": ["first"], "learned": [True]})
    with pytest.raises(ValueError, match="position"):
        M.learned_grid(df)
    df = pd.DataFrame({"n_docs": [2], "position": ["early"], "learned": [NAN]})
    with pytest.raises(ValueError, match="boolean"):
        M.learned_grid(df)
