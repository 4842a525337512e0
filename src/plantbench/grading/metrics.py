"""Pure statistics of the grading: retrieval metrics, attributed mass and within-cell correlations.

Everything here is deterministic given its inputs (the bootstrap given its seed) and knows
nothing about files, models or methods. Conventions, stated once:

Ranking
    A pool is ranked by descending score. NaN scores rank last, below every number (including
    ``-inf``). Items with equal scores (NaN counts as equal to NaN) form a tie group whose
    internal order is fixed by ``tie``:

    * ``"pessimistic"`` (the default): relevant items are placed *after* the non-relevant items
      of their tie group, so a tie never helps a method;
    * ``"optimistic"``: relevant items are placed *before* them.

    Relevant items tied with each other are interchangeable, so no further rule is needed. Use
    :func:`degenerate` to tell the caller that a score vector had NaNs or was constant (a
    constant vector puts every relevant item at the bottom under the pessimistic rule).

Standardisation
    z = (s - mean) / std over the whole pool with the population std (ddof=0). A pool whose
    values are all equal, or that contains a non-finite value, gives an all-NaN z.

Within-cell ranks
    Average ranks (ties get the mean of the ranks they span) within each cell, then centred and
    scaled: ``(rank - (n + 1) / 2) / (n - 1)``, a value in [-0.5, 0.5] with mean 0 in every
    cell; a cell of one fact gets 0 (it carries no within-cell information and adds nothing to
    any covariance). Scaling by ``n - 1`` gives every fact the same spread whatever its cell
    size. "Within-cell correlation" is the Pearson correlation of these values pooled over all
    cells; "controlled" is the partial correlation given the control variables' within-cell
    ranks.

Bootstrap
    Facts are resampled with replacement within each cell (cell sizes kept), ranks recomputed in
    every resample, and a percentile interval taken over the resamples whose statistic is
    finite; NaN resamples are dropped and counted (:func:`bootstrap_within_cells_many`).
    :func:`bootstrap_within_cell_correlations` does the four within-cell correlations on the
    same resamples, vectorised (about 1 s for 1000 resamples of 528 facts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt
import pandas as pd

from plantbench.rng import rng

Tie = Literal["pessimistic", "optimistic"]
POSITIONS: tuple[str, ...] = ("early", "middle", "late")
CORRELATION_KEYS: tuple[str, ...] = ("raw", "vs_length", "vs_difficulty", "controlled")


# --------------------------------------------------------------------------------------------
# Ranking metrics
# --------------------------------------------------------------------------------------------


def _scores_and_mask(scores: npt.ArrayLike, relevant: npt.ArrayLike) -> tuple[np.ndarray, ...]:
    s = np.asarray(scores, dtype=np.float64).ravel()
    r = np.asarray(relevant)
    if r.dtype != np.bool_:
        raise ValueError(f"relevant must be a boolean mask, got dtype {r.dtype}")
    r = r.ravel()
    if r.shape != s.shape:
        raise ValueError(f"scores has {s.size} items but relevant has {r.size}")
    if not r.any():
        raise ValueError("no relevant items: AP and recall are undefined")
    return s, r


def relevant_ranks(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, tie: Tie = "pessimistic"
) -> np.ndarray:
    """1-based ranks of the relevant items in the descending-score ranking, ascending.

    Cost is O(n log m) for n items of which m are relevant: the pool itself is never sorted.
    The j-th best relevant item (1-based) has rank ``j + N_j`` where ``N_j`` counts the
    non-relevant items ranked above it (those with a higher score, plus the tied ones under
    the pessimistic rule).
    """
    if tie not in ("pessimistic", "optimistic"):
        raise ValueError(f"tie must be 'pessimistic' or 'optimistic', got {tie!r}")
    s, r = _scores_and_mask(scores, relevant)
    rel = s[r]
    other = s[~r]
    rel_nan = np.isnan(rel)
    other_nan = np.isnan(other)
    other_num = other[~other_nan]
    # Relevant numbers, best first (descending); NaN relevant items come after them.
    rel_num_desc = -np.sort(-rel[~rel_nan])
    t = rel_num_desc[::-1]  # ascending thresholds for searchsorted
    m_num = t.size
    # For each non-relevant number x, how many thresholds it beats: x >= t_j (pessimistic) or
    # x > t_j (optimistic). x beats t_j (0-based, ascending) iff j < idx(x).
    side: Literal["left", "right"] = "right" if tie == "pessimistic" else "left"
    idx = np.searchsorted(t, other_num, side=side)
    counts = np.bincount(idx, minlength=m_num + 1)
    # above_asc[j] = #{x : idx(x) > j} for j = 0..m_num-1
    above_asc = counts[::-1].cumsum()[::-1][1:]
    above_desc = above_asc[::-1]
    ranks_num = np.arange(1, m_num + 1) + above_desc
    n_nan_rel = int(rel_nan.sum())
    if n_nan_rel:
        ahead = other_num.size + (int(other_nan.sum()) if tie == "pessimistic" else 0)
        ranks_nan = np.arange(m_num + 1, m_num + n_nan_rel + 1) + ahead
        return np.concatenate([ranks_num, ranks_nan]).astype(np.int64)
    return ranks_num.astype(np.int64)


def average_precision(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, tie: Tie = "pessimistic"
) -> float:
    """Mean, over the relevant items, of precision at each one's rank (ties per ``tie``).

    Raises ``ValueError`` if there is no relevant item or the shapes differ.
    """
    ranks = relevant_ranks(scores, relevant, tie)
    hits = np.arange(1, ranks.size + 1)
    return float(np.mean(hits / ranks))


def recall_at_k(
    scores: npt.ArrayLike, relevant: npt.ArrayLike, k: int = 10, tie: Tie = "pessimistic"
) -> float:
    """|relevant ∩ top k| / |relevant|, ties at the cut resolved per ``tie``."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    ranks = relevant_ranks(scores, relevant, tie)
    return float(np.mean(ranks <= k))


def degenerate(scores: npt.ArrayLike) -> Literal["nan", "constant"] | None:
    """Why a score vector cannot be graded normally, or None.

    ``"nan"`` if any value is non-finite (NaN or ±inf); ``"constant"`` if all values are equal
    (or there are fewer than two); else None.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    if not np.isfinite(s).all():
        return "nan"
    if s.size < 2 or s.min() == s.max():
        return "constant"
    return None


def standardize(scores: npt.ArrayLike) -> np.ndarray:
    """z-scores over the pool (population std); all NaN if constant or any value non-finite."""
    s = np.asarray(scores, dtype=np.float64)
    if degenerate(s) is not None:
        return np.full(s.shape, np.nan)
    mu = s.mean()
    sd = s.std()
    return (s - mu) / sd


def attributed_mass(pool_scores: npt.ArrayLike, own_mask: npt.ArrayLike) -> float:
    """Mean standardized score (z over the whole pool) of the fact's own windows.

    NaN when :func:`degenerate` flags the pool; ``ValueError`` if ``own_mask`` is not a boolean
    mask of the pool's length or selects nothing.
    """
    s, own = _scores_and_mask(pool_scores, own_mask)
    return float(standardize(s)[own].mean())


# --------------------------------------------------------------------------------------------
# Correlations
# --------------------------------------------------------------------------------------------


def _centred_corr(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two already centred vectors; NaN if either has zero norm."""
    den = np.sqrt(float(a @ a) * float(b @ b))
    if den == 0.0 or not np.isfinite(den):
        return float("nan")
    return float(np.clip((a @ b) / den, -1.0, 1.0))


def pearson(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Pearson correlation; NaN if fewer than 2 points, either is constant, or any non-finite."""
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    if xa.shape != ya.shape:
        raise ValueError(f"x has {xa.size} values but y has {ya.size}")
    if xa.size < 2 or not (np.isfinite(xa).all() and np.isfinite(ya).all()):
        return float("nan")
    if xa.min() == xa.max() or ya.min() == ya.max():
        return float("nan")
    return _centred_corr(xa - xa.mean(), ya - ya.mean())


def _residualize(v: np.ndarray, design: np.ndarray) -> np.ndarray | None:
    """Residual of v after OLS on ``design``; None if v is (numerically) explained exactly."""
    beta, *_ = np.linalg.lstsq(design, v, rcond=None)
    res = v - design @ beta
    scale = np.linalg.norm(v - v.mean())
    if scale == 0.0 or np.linalg.norm(res) <= 1e-6 * scale:
        return None
    return res


def partial_corr(x: npt.ArrayLike, y: npt.ArrayLike, controls: npt.ArrayLike) -> float:
    """Correlation of the residuals of x and y after OLS on [1, controls].

    ``controls`` is (n,) or (n, k). NaN if any input is non-finite, there are fewer than
    k + 3 points, or x or y is explained by the controls (residual norm at most 1e-6 of its
    centred norm).
    """
    xa = np.asarray(x, dtype=np.float64).ravel()
    ya = np.asarray(y, dtype=np.float64).ravel()
    z = np.asarray(controls, dtype=np.float64)
    if z.ndim == 1:
        z = z[:, None]
    if not (xa.shape == ya.shape and z.ndim == 2 and z.shape[0] == xa.size):
        raise ValueError(
            f"shapes do not match: x {xa.shape}, y {ya.shape}, controls {np.shape(controls)}"
        )
    n, k = z.shape
    if n < k + 3:
        return float("nan")
    if not (np.isfinite(xa).all() and np.isfinite(ya).all() and np.isfinite(z).all()):
        return float("nan")
    design = np.column_stack([np.ones(n), z])
    rx = _residualize(xa, design)
    ry = _residualize(ya, design)
    if rx is None or ry is None:
        return float("nan")
    return _centred_corr(rx - rx.mean(), ry - ry.mean())


# --------------------------------------------------------------------------------------------
# Within-cell ranks and correlations
# --------------------------------------------------------------------------------------------


def _cell_codes(df: pd.DataFrame, cell_col: str | Sequence[str]) -> np.ndarray:
    if isinstance(cell_col, str):
        col = df[cell_col]
        if col.isna().any():
            raise ValueError(f"cell column {cell_col!r} has missing values")
        codes, _ = pd.factorize(col, sort=True)
        return np.asarray(codes, dtype=np.int64)
    cols = list(cell_col)
    if df[cols].isna().any().any():
        raise ValueError(f"cell columns {cols!r} have missing values")
    return df.groupby(cols, sort=True).ngroup().to_numpy(dtype=np.int64)


def sorted_runs(
    groups: np.ndarray, *keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For rows sorted by group, then by ``keys``: per row, the position where its group
    starts, the group's size, the position where its tie (same group, equal keys) starts and
    the tie's size."""
    n = len(groups)
    pos = np.arange(n)
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = groups[1:] != groups[:-1]
    new_tie = new_group.copy()
    for k in keys:
        new_tie[1:] |= k[1:] != k[:-1]
    group_id = np.cumsum(new_group) - 1
    tie_id = np.cumsum(new_tie) - 1
    return (
        pos[new_group][group_id],
        np.bincount(group_id)[group_id],
        pos[new_tie][tie_id],
        np.bincount(tie_id)[tie_id],
    )


def centred_ranks(codes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Within-cell average ranks, centred and scaled by (n - 1); see the module docstring.

    ``codes`` are integer cell labels; NaN values get NaN and are left out of their cell's n.
    """
    codes = np.asarray(codes)
    values = np.asarray(values, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    keep = ~np.isnan(values)
    if not keep.all():
        out[keep] = centred_ranks(codes[keep], values[keep])
        return out
    n = values.size
    if n == 0:
        return out
    order = np.lexsort((values, codes))
    cell_start, size, tie_start, tie_size = sorted_runs(codes[order], values[order])
    rank = tie_start + (tie_size - 1) / 2.0 - cell_start + 1.0
    centred = rank - (size + 1) / 2.0
    out[order] = np.where(size > 1, centred / np.maximum(size - 1, 1), 0.0)
    return out


def within_cell_ranks(
    df: pd.DataFrame, cell_col: str | Sequence[str], cols: Sequence[str]
) -> pd.DataFrame:
    """Centred, scaled within-cell average ranks of ``cols`` (index kept; NaN stays NaN).

    A fact's value is ``(rank - (n + 1) / 2) / (n - 1)`` with rank its average rank among the n
    non-missing values of its cell: in [-0.5, 0.5], mean 0 per cell, 0 in a singleton cell.
    ``cell_col`` may be one column or several (their combination is the cell).
    """
    codes = _cell_codes(df, cell_col)
    data = {c: centred_ranks(codes, df[c].to_numpy(dtype=np.float64)) for c in cols}
    return pd.DataFrame(data, index=df.index, columns=list(cols))


def _correlations(codes: np.ndarray, values: np.ndarray) -> dict[str, float]:
    """The four within-cell correlations from cell codes and an (n, 4) array of mass, effect,
    length, difficulty; rows with any NaN dropped before ranking."""
    keep = ~np.isnan(values).any(axis=1)
    if not keep.all():
        codes, values = codes[keep], values[keep]
    m, e, ln, d = (centred_ranks(codes, values[:, j]) for j in range(4))
    return {
        "raw": pearson(m, e),
        "vs_length": pearson(m, ln),
        "vs_difficulty": pearson(m, d),
        "controlled": partial_corr(m, e, np.column_stack([ln, d])),
    }


def within_cell_correlations(
    df: pd.DataFrame,
    cell_col: str | Sequence[str],
    mass_col: str,
    effect_col: str,
    length_col: str,
    difficulty_col: str,
) -> dict[str, float]:
    """Pearson correlations on within-cell ranks.

    Keys: ``raw`` (mass vs effect), ``vs_length`` (mass vs length), ``vs_difficulty`` (mass vs
    difficulty), ``controlled`` (partial correlation of mass and effect given length and
    difficulty). Rows with a missing value in any of the four columns are dropped before
    ranking, so every statistic uses the same facts.
    """
    cols = [mass_col, effect_col, length_col, difficulty_col]
    return _correlations(_cell_codes(df, cell_col), df[cols].to_numpy(dtype=np.float64))


# --------------------------------------------------------------------------------------------
# Bootstrap over facts within cells
# --------------------------------------------------------------------------------------------


def resample_within_cells(
    df: pd.DataFrame, cell_col: str | Sequence[str], n_boot: int, *, seed: int, tag: str = ""
) -> np.ndarray:
    """(n_boot, len(df)) positional row indices: each row a resample with replacement within
    every cell (cell sizes kept). Drawn from ``rng(seed, "bootstrap", tag)``, cells in sorted
    label order, so the result depends only on the frame, the seed and the tag."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    codes = _cell_codes(df, cell_col)
    gen = rng(seed, "bootstrap", tag)
    parts = []
    for c in np.unique(codes):
        members = np.flatnonzero(codes == c)
        parts.append(members[gen.integers(0, members.size, size=(n_boot, members.size))])
    if not parts:
        return np.empty((n_boot, 0), dtype=np.int64)
    return np.concatenate(parts, axis=1)


def percentile_interval(values: npt.ArrayLike, alpha: float = 0.05) -> tuple[float, float]:
    """(alpha/2, 1 - alpha/2) quantiles of the finite values; (NaN, NaN) if there are none."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(v, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


class Interval(NamedTuple):
    lo: float
    hi: float
    n_nan: int  # resamples whose statistic was not finite (left out of the interval)


def bootstrap_within_cells_many(
    df: pd.DataFrame,
    cell_col: str | Sequence[str],
    stat_fn: Callable[[pd.DataFrame], Mapping[str, float]],
    n_boot: int = 1000,
    *,
    seed: int,
    alpha: float = 0.05,
    tag: str = "",
) -> dict[str, Interval]:
    """Percentile intervals for several statistics from the same resamples.

    ``stat_fn`` gets each resampled frame (rows repeated, index reset, cell column intact) and
    returns a mapping of statistic name to value; it must recompute anything within-cell (ranks)
    itself, as :func:`within_cell_correlations` does.
    """
    idx = resample_within_cells(df, cell_col, n_boot, seed=seed, tag=tag)
    base = df.reset_index(drop=True)
    reps: dict[str, np.ndarray] = {}
    for b in range(n_boot):
        stats = stat_fn(base.take(idx[b]))
        for key, value in stats.items():
            if key not in reps:
                if b:
                    raise ValueError(f"stat_fn returned a new key {key!r} at resample {b}")
                reps[key] = np.full(n_boot, np.nan)
            reps[key][b] = value
    out = {}
    for key, values in reps.items():
        lo, hi = percentile_interval(values, alpha)
        out[key] = Interval(lo, hi, int((~np.isfinite(values)).sum()))
    return out


def bootstrap_within_cells(
    df: pd.DataFrame,
    cell_col: str | Sequence[str],
    stat_fn: Callable[[pd.DataFrame], float],
    n_boot: int = 1000,
    *,
    seed: int,
    alpha: float = 0.05,
    tag: str = "",
) -> tuple[float, float]:
    """Percentile interval (lo, hi) of one statistic over within-cell resamples of facts.

    NaN statistics are left out; use :func:`bootstrap_within_cells_many` to get their count.
    """
    res = bootstrap_within_cells_many(
        df, cell_col, lambda d: {"stat": stat_fn(d)}, n_boot, seed=seed, alpha=alpha, tag=tag
    )
    return res["stat"].lo, res["stat"].hi


def _correlations_batch(ranks: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`_correlations` for a (B, n, 4) stack of within-cell centred ranks (no NaN).

    Centred ranks have mean 0 in every cell, hence overall, so with G = X'X per resample:
    Pearson is G_ij / sqrt(G_ii G_jj), and the partial correlation of mass and effect is the
    same ratio on the Schur complement of the controls' block (the residual Gram matrix after
    OLS on [1, controls]; the intercept is redundant). Degenerate cases follow
    :func:`pearson` and :func:`partial_corr`.
    """
    g = np.einsum("bni,bnj->bij", ranks, ranks)
    diag = np.einsum("bii->bi", g)

    def ratio(num: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ok = (a > 0) & (b > 0)
        den = np.sqrt(np.where(ok, a * b, 1.0))
        return np.where(ok, np.clip(num / den, -1.0, 1.0), np.nan)

    gc_inv = np.linalg.pinv(g[:, 2:, 2:])
    cross = g[:, :2, 2:]
    schur = g[:, :2, :2] - cross @ gc_inv @ np.swapaxes(cross, 1, 2)
    s00, s11, s01 = schur[:, 0, 0], schur[:, 1, 1], schur[:, 0, 1]
    explained = (s00 <= 1e-12 * diag[:, 0]) | (s11 <= 1e-12 * diag[:, 1])
    controlled = np.where(explained, np.nan, ratio(s01, s00, s11))
    if ranks.shape[1] < 5:
        controlled = np.full(ranks.shape[0], np.nan)
    return {
        "raw": ratio(g[:, 0, 1], diag[:, 0], diag[:, 1]),
        "vs_length": ratio(g[:, 0, 2], diag[:, 0], diag[:, 2]),
        "vs_difficulty": ratio(g[:, 0, 3], diag[:, 0], diag[:, 3]),
        "controlled": controlled,
    }


def bootstrap_within_cell_correlations(
    df: pd.DataFrame,
    cell_col: str | Sequence[str],
    mass_col: str,
    effect_col: str,
    length_col: str,
    difficulty_col: str,
    n_boot: int = 1000,
    *,
    seed: int,
    alpha: float = 0.05,
    tag: str = "",
    block: int = 250,
) -> dict[str, Interval]:
    """Intervals for the four :func:`within_cell_correlations` statistics.

    Same resamples and (to rounding) the same result as ``bootstrap_within_cells_many(df,
    cell_col, lambda d: within_cell_correlations(d, ...), ...)``, but vectorised over ``block``
    resamples at a time. Rows with a missing value are dropped before resampling here (the
    generic route resamples them and drops them afterwards), so give it complete rows.
    """
    cols = [mass_col, effect_col, length_col, difficulty_col]
    if df[cols].isna().any().any():
        df = df.dropna(subset=cols)
    idx = resample_within_cells(df, cell_col, n_boot, seed=seed, tag=tag)
    codes = _cell_codes(df, cell_col)
    values = df[cols].to_numpy(dtype=np.float64)
    n = codes.size
    n_cells = int(codes.max()) + 1 if n else 1
    reps = {key: np.full(n_boot, np.nan) for key in CORRELATION_KEYS}
    for start in range(0, n_boot, block):
        rows = idx[start : start + block]
        nb = rows.shape[0]
        # One ranking call for the whole block: resample b, cell c is group b * n_cells + c.
        groups = (np.arange(nb)[:, None] * n_cells + codes[rows]).ravel()
        ranks = np.empty((nb, n, 4))
        for j in range(4):
            ranks[:, :, j] = centred_ranks(groups, values[rows, j].ravel()).reshape(nb, n)
        for key, v in _correlations_batch(ranks).items():
            reps[key][start : start + nb] = v
    out = {}
    for key, v in reps.items():
        lo, hi = percentile_interval(v, alpha)
        out[key] = Interval(lo, hi, int((~np.isfinite(v)).sum()))
    return out


# --------------------------------------------------------------------------------------------
# Learned-rate grid
# --------------------------------------------------------------------------------------------


class LearnedGrid(NamedTuple):
    rates: pd.DataFrame  # learned / facts, NaN where a cell has no facts
    n_learned: pd.DataFrame
    n_facts: pd.DataFrame


def learned_grid(
    df: pd.DataFrame,
    n_docs_col: str = "n_docs",
    position_col: str = "position",
    learned_col: str = "learned",
) -> LearnedGrid:
    """The learned-rate table: rows n_docs ascending then "All", columns early, middle, late,
    All. Margins pool facts (they are not means of the cell rates)."""
    pos = df[position_col]
    bad = sorted(str(p) for p in set(pos.dropna().unique()) - set(POSITIONS))
    if pos.isna().any():
        bad.append("<missing>")
    if bad:
        raise ValueError(f"unknown position values {bad!r}; expected one of {list(POSITIONS)}")
    learned = df[learned_col]
    if learned.isna().any() or not learned.isin([True, False]).all():
        raise ValueError(f"column {learned_col!r} must be boolean with no missing values")
    n_docs = df[n_docs_col]
    if n_docs.isna().any():
        raise ValueError(f"column {n_docs_col!r} has missing values")
    frame = pd.DataFrame(
        {"n_docs": n_docs.to_numpy(), "position": pos.to_numpy(), "learned": learned.astype(int)}
    )
    docs_levels = sorted(frame["n_docs"].unique().tolist())
    rows: list[object] = [*docs_levels, "All"]
    cols = [*POSITIONS, "All"]
    n_learned = pd.DataFrame(0, index=pd.Index(rows, dtype=object, name="n_docs"), columns=cols)
    n_facts = n_learned.copy()
    grouped = frame.groupby(["n_docs", "position"])["learned"].agg(["sum", "size"])
    for (d, p), row in grouped.iterrows():
        n_learned.loc[d, p] = int(row["sum"])
        n_facts.loc[d, p] = int(row["size"])
    for table in (n_learned, n_facts):
        table.loc[docs_levels, "All"] = table.loc[docs_levels, list(POSITIONS)].sum(axis=1)
        table.loc["All", :] = table.loc[docs_levels, :].sum(axis=0)
    rates = n_learned.astype(float) / n_facts.where(n_facts > 0).astype(float)
    n_learned.columns.name = n_facts.columns.name = rates.columns.name = "position"
    return LearnedGrid(rates, n_learned.astype(np.int64), n_facts.astype(np.int64))
