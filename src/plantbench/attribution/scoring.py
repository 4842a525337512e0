"""Score every query against a model's pool with one method, in tiles, and store what the
analysis needs.

Tiles: the method is called on ``scoring.query_block`` queries x ``scoring.pool_block`` pool
windows at a time. Per-query statistics (mean, standard deviation, min/max, top-k) are merged
across pool blocks, and one query block's scores are kept in a float64 scratch memmap on disk
(``query_block x n_pool``) so that the own windows' ranks can be counted in a second sweep over
the same stored values; peak memory is ``O(query_block x (pool_block + top_k))`` whatever the
pool size.

Output: ``{results}/scores/{method}/{model}/`` (written whole or not at all)

``queries.parquet``: one row per query, in ``facts/queries.parquet`` order (every query of
every fact, both forms, also those of facts the model never read):
    query_id (str), fact_id (str), form (str),
    mean (float64: mean score over the pool), std (float64: population std over the pool),
    n_pool (int64), degenerate (str: ``""``; ``"nan"`` = some scores were not finite, mean and std
    are over the finite ones; ``"constant"`` = every score is equal, std = 0).
``own.parquet``: one row per (query, own window), own windows = this model's pool windows with
    kind ``planted`` and the query's fact_id (so only facts the model read have rows), sorted by
    query then window: query_id, fact_id, window (int64 manifest index), score (float64),
    n_greater (int64: pool windows with a strictly greater score), n_ties (int64: OTHER pool
    windows with exactly the same score). Non-finite scores are NaN and rank lowest (below every
    finite score, tied with each other). The pessimistic rank of an own window is
    ``n_greater + n_ties + 1``, the optimistic ``n_greater + 1``.
``topk.parquet``: query_id, rank (int64, 1..k), window (int64), score (float64): the
    ``scoring.top_k`` highest-scoring windows per query (ties broken by lower pool row).
``haystack.parquet``: the same counts in nested sub-pools, one row per (query, own window,
    share f of ``analysis.haystack``), sorted by query, window, share: query_id, fact_id, window,
    fraction (float64: f), n_background (int64: background windows in the sub-pool), n_pool
    (int64: its size), score, n_greater, n_ties (as in own.parquet, counted in the sub-pool),
    mean, std, degenerate (as in queries.parquet, over the sub-pool). The sub-pool at f holds
    every planted and distractor window and the first ceil(f x background) background windows of
    a seeded order (:func:`plantbench.attribution.pool.haystack_levels`), so each holds the one before; the
    rows with fraction 1.0 repeat own.parquet and queries.parquet exactly. Counted in the second
    sweep, per query block, by exact level (then summed), so memory stays per block.
``scores.npy``: the full float32 matrix ``[n_queries (queries.parquet order), n_pool
    (pool.parquet row order)]``, only when ``n_queries * n_pool <= 50,000,000``
    (``info.full_matrix`` says whether it was written).
``meta.json``: inputs = the pool, facts and every feature artifact hash the method read;
    info = method, model, n_queries, n_pool, top_k, description, scale (the score's scale and sign),
    haystack (fractions, n_pool and n_background per share).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from plantbench import floats, io
from plantbench.attribution import pool
from plantbench.config import config_hash, haystack_fractions
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.paths import MODELS, Paths

if TYPE_CHECKING:
    from plantbench.attribution.methods.registry import Method
    from plantbench.attribution.methods.scoring_context import Context

log = logging.getLogger(__name__)

FULL_MATRIX_LIMIT = 50_000_000
FILES = ("queries.parquet", "own.parquet", "topk.parquet", "haystack.parquet")
SCORES_NPY = "scores.npy"

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class HaystackScores:
    """What :func:`score_tiled` counts per nested sub-pool (column ``j`` = the ``j + 1``-th
    haystack share; the last column = the whole pool, equal to :class:`TiledScores`' own)."""

    n_pool: np.ndarray  # [J] int64 windows in the sub-pool
    n_background: np.ndarray  # [J] int64 of them with level > 0
    mean: np.ndarray  # [n_q, J] float64 (NaN for queries without own windows, below the last)
    std: np.ndarray  # [n_q, J] float64
    degenerate: np.ndarray  # [n_q, J] str
    n_greater: np.ndarray  # [n_own, J] int64
    n_ties: np.ndarray  # [n_own, J] int64


@dataclass
class TiledScores:
    mean: np.ndarray  # [n_q] float64
    std: np.ndarray  # [n_q] float64
    degenerate: np.ndarray  # [n_q] str
    own_score: np.ndarray  # [n_own] float64
    n_greater: np.ndarray  # [n_own] int64
    n_ties: np.ndarray  # [n_own] int64
    top_rows: np.ndarray  # [n_q, k] int64 pool rows
    top_scores: np.ndarray  # [n_q, k] float64
    haystack: HaystackScores | None = None  # only when score_tiled was given levels


class _Running:
    """Per query: count, mean and M2 of the finite scores (merged block by block, Chan et al.),
    their min and max, and whether any score that counts was not finite."""

    def __init__(self, nb: int) -> None:
        self.cnt = np.zeros(nb)
        self.mu = np.zeros(nb)
        self.m2 = np.zeros(nb)
        self.lo = np.full(nb, np.inf)
        self.hi = np.full(nb, -np.inf)
        self.bad = np.zeros(nb, dtype=bool)

    def add(self, s: np.ndarray, fin: np.ndarray, inside: np.ndarray | None = None) -> None:
        """Merge the block ``s`` (NaN where not finite; ``fin`` its finite entries), only its
        columns ``inside`` when given."""
        if inside is None:
            self.bad |= ~fin.all(1)
        else:
            self.bad |= (~fin[:, inside]).any(1)
            fin = fin & inside
        nb = self.cnt.size
        c_b = fin.sum(1).astype(np.float64)
        z = np.where(fin, s, 0.0)
        mu_b = z.sum(1) / np.maximum(c_b, 1)
        m2_b = (np.where(fin, s - mu_b[:, None], 0.0) ** 2).sum(1)
        n_new = self.cnt + c_b
        delta = mu_b - self.mu
        w = np.divide(c_b, n_new, out=np.zeros(nb), where=n_new > 0)
        self.mu = self.mu + delta * w
        self.m2 = self.m2 + m2_b + delta**2 * self.cnt * w
        self.cnt = n_new
        self.lo = np.minimum(self.lo, np.where(fin, s, np.inf).min(1))
        self.hi = np.maximum(self.hi, np.where(fin, s, -np.inf).max(1))

    def finish(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean, population std and degenerate flag ("", "nan", "constant") per query."""
        cnt = self.cnt
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(cnt > 0, self.mu, np.nan)
            std = np.where(cnt > 0, np.sqrt(np.maximum(self.m2, 0) / cnt), np.nan)
        const = (cnt > 0) & (self.hi == self.lo)
        mean = np.where(const, self.hi, mean)
        std = np.where(const, 0.0, std)
        return mean, std, np.where(self.bad, "nan", np.where(const, "constant", ""))


def _merge_topk(
    top_s: np.ndarray, top_r: np.ndarray, s: np.ndarray, rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    cand_s = np.concatenate([top_s, s], axis=1)
    cand_r = np.concatenate([top_r, np.broadcast_to(rows, s.shape)], axis=1)
    nan = np.isnan(cand_s)
    neg = np.where(nan, np.inf, -cand_s)
    order = np.lexsort(np.stack([cand_r.astype(np.float64), neg, nan.astype(np.float64)]), axis=-1)[
        :, :k
    ]
    return np.take_along_axis(cand_s, order, 1), np.take_along_axis(cand_r, order, 1)


def _count_against(row: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entries of ``row`` strictly greater than / equal to each value of ``v`` (NaN lowest,
    NaN equal to NaN); the value itself is counted among the equal ones when in ``row``."""
    srt = np.sort(row[~np.isnan(row)])
    isn = np.isnan(v)
    r = np.searchsorted(srt, v, side="right")
    left = np.searchsorted(srt, v, side="left")
    return np.where(isn, srt.size, srt.size - r), np.where(isn, row.size - srt.size, r - left)


@dataclass
class _Sweep2:
    """One query block's second sweep: per own window (rows of ``local``) its greater and equal
    counts by exact haystack level ``[n_sel, n_levels + 1]``; per sub-pool below the whole pool
    the running statistics of every query of the block."""

    greater: np.ndarray
    equal: np.ndarray
    stats: list[_Running]


def _sweep2(
    scratch: np.ndarray,
    local: np.ndarray,
    v: np.ndarray,
    levels: np.ndarray,
    n_levels: int,
    pool_block: int,
) -> _Sweep2:
    """Count, block by block over the stored scores, each own window's rivals per level."""
    nb, n_pool = scratch.shape
    by_query = {int(u): np.flatnonzero(local == u) for u in np.unique(local)}
    out = _Sweep2(
        np.zeros((v.size, n_levels + 1), dtype=np.int64),
        np.zeros((v.size, n_levels + 1), dtype=np.int64),
        [_Running(nb) for _ in range(n_levels - 1)],
    )
    for p0 in range(0, n_pool, pool_block):
        blk = np.asarray(scratch[:, p0 : min(p0 + pool_block, n_pool)])
        lev = levels[p0 : p0 + blk.shape[1]]
        present = np.unique(lev)
        for lv in present:
            part = blk if present.size == 1 else blk[:, lev == lv]
            for u, idx in by_query.items():
                g, t = _count_against(part[u], v[idx])
                out.greater[idx, lv] += g
                out.equal[idx, lv] += t
        if out.stats:
            fin = ~np.isnan(blk)
            for j, run in enumerate(out.stats, start=1):
                run.add(blk, fin, lev <= j)
    return out


def _check_levels(levels: np.ndarray, n_levels: int, n_pool: int, own_pool: np.ndarray) -> None:
    if levels.shape != (n_pool,) or n_levels < 1:
        raise PlantbenchError(f"haystack levels must be one per pool row ({n_pool}), n_levels >= 1")
    if levels.min(initial=0) < 0 or levels.max(initial=0) > n_levels:
        raise PlantbenchError(f"haystack levels must lie in 0..{n_levels}")
    if (levels[own_pool] != 0).any():
        raise PlantbenchError("own windows must be in every haystack sub-pool (level 0)")


def _empty_haystack(
    levels: np.ndarray, n_levels: int, n_queries: int, n_own: int
) -> HaystackScores:
    n_pool = np.array([(levels <= j).sum() for j in range(1, n_levels + 1)], dtype=np.int64)
    return HaystackScores(
        n_pool,
        n_pool - int((levels == 0).sum()),
        np.full((n_queries, n_levels), np.nan),
        np.full((n_queries, n_levels), np.nan),
        np.full((n_queries, n_levels), "", dtype=object),
        np.zeros((n_own, n_levels), dtype=np.int64),
        np.zeros((n_own, n_levels), dtype=np.int64),
    )


@dataclass(frozen=True)
class _Tiling:
    """What :func:`score_tiled` scores every query block with: the method, the pool's tiles, the
    own (query row, pool row) pairs and each pool row's haystack level (all 0 without levels)."""

    fn: ScoreFn
    n_pool: int
    pool_block: int
    own_query: np.ndarray  # [n_own] int64
    own_pool: np.ndarray  # [n_own] int64
    levels: np.ndarray  # [n_pool] int64
    n_levels: int
    full: np.ndarray | None
    name: str


def _empty_scores(n_queries: int, n_own: int, k: int, hay: HaystackScores | None) -> TiledScores:
    """The result, to be filled block by block (``degenerate`` an object array until the end)."""
    return TiledScores(
        np.zeros(n_queries),
        np.zeros(n_queries),
        np.full(n_queries, "", dtype=object),
        np.full(n_own, np.nan),
        np.zeros(n_own, dtype=np.int64),
        np.zeros(n_own, dtype=np.int64),
        np.zeros((n_queries, k), dtype=np.int64),
        np.zeros((n_queries, k)),
        hay,
    )


def _sweep1(
    t: _Tiling, scratch: np.ndarray, q0: int, k: int
) -> tuple[_Running, np.ndarray, np.ndarray]:
    """Sweep 1 over the query block starting at ``q0``: every tile's scores (non-finite ones NaN)
    into ``scratch`` (and ``full``), the running statistics and the top-k scores and rows."""
    nb = scratch.shape[0]
    q1 = q0 + nb
    qrows = np.arange(q0, q1, dtype=np.int64)
    run = _Running(nb)
    ts = np.zeros((nb, 0))
    tr = np.zeros((nb, 0), dtype=np.int64)
    for p0 in range(0, t.n_pool, t.pool_block):
        p1 = min(p0 + t.pool_block, t.n_pool)
        prows = np.arange(p0, p1, dtype=np.int64)
        s = np.asarray(t.fn(qrows, prows), dtype=np.float64)
        if s.shape != (nb, p1 - p0):
            raise PlantbenchError(
                f"method '{t.name}' returned scores of shape {s.shape} for a tile of "
                f"{nb} queries x {p1 - p0} windows"
            )
        fin = np.isfinite(s)
        s = np.where(fin, s, np.nan)
        scratch[:, p0:p1] = s
        if t.full is not None:
            t.full[q0:q1, p0:p1] = s.astype(np.float32)
        run.add(s, fin)
        ts, tr = _merge_topk(ts, tr, s, prows, k)
    scratch.flush()
    return run, ts, tr


def _store_sweep1(
    res: TiledScores, q0: int, q1: int, run: _Running, ts: np.ndarray, tr: np.ndarray
) -> None:
    """Queries ``q0:q1``' statistics and top-k into ``res`` (the whole pool's haystack column)."""
    res.mean[q0:q1], res.std[q0:q1], res.degenerate[q0:q1] = run.finish()
    res.top_scores[q0:q1], res.top_rows[q0:q1] = ts, tr
    hay = res.haystack
    if hay is not None:
        hay.mean[q0:q1, -1] = res.mean[q0:q1]
        hay.std[q0:q1, -1] = res.std[q0:q1]
        hay.degenerate[q0:q1, -1] = res.degenerate[q0:q1]


def _rank_own(t: _Tiling, scratch: np.ndarray, q0: int, res: TiledScores) -> None:
    """Sweep 2 over the query block starting at ``q0``: the ranks of its own windows against the
    stored scores, per haystack level, into ``res`` (with the smaller sub-pools' statistics)."""
    q1 = q0 + scratch.shape[0]
    sel = np.flatnonzero((t.own_query >= q0) & (t.own_query < q1))
    if not sel.size:
        return
    local = t.own_query[sel] - q0
    res.own_score[sel] = scratch[local, t.own_pool[sel]]
    sw = _sweep2(scratch, local, res.own_score[sel], t.levels, t.n_levels, t.pool_block)
    res.n_greater[sel] = sw.greater.sum(1)
    res.n_ties[sel] = sw.equal.sum(1) - 1  # the window itself
    hay = res.haystack
    if hay is not None:
        hay.n_greater[sel] = np.cumsum(sw.greater, 1)[:, 1:]
        hay.n_ties[sel] = np.cumsum(sw.equal, 1)[:, 1:] - 1
        for j, sub in enumerate(sw.stats):
            m, sd, d = sub.finish()
            hay.mean[q0:q1, j], hay.std[q0:q1, j], hay.degenerate[q0:q1, j] = m, sd, d


def score_tiled(
    fn: ScoreFn,
    n_queries: int,
    n_pool: int,
    *,
    query_block: int,
    pool_block: int,
    top_k: int,
    own_query: np.ndarray,
    own_pool: np.ndarray,
    full: np.ndarray | None = None,
    scratch_dir: str | Path | None = None,
    name: str = "method",
    levels: np.ndarray | None = None,
    n_levels: int = 1,
) -> TiledScores:
    """Score ``fn(query_rows, pool_rows)`` over all tiles; see the module docstring.

    ``own_query[i]``, ``own_pool[i]``: the (query row, pool row) pairs whose scores and ranks
    are wanted. ``full``: an optional ``[n_queries, n_pool]`` array filled with float32 scores.
    ``levels``: optional haystack level per pool row (0..``n_levels``, own windows 0, see
    :func:`plantbench.attribution.pool.haystack_levels`); then the result's ``haystack`` holds the own
    windows' counts and the queries' statistics in each sub-pool ``levels <= j``.
    """
    if n_pool < 1:
        raise PlantbenchError("cannot score an empty pool")
    own_query = np.asarray(own_query, dtype=np.int64)
    own_pool = np.asarray(own_pool, dtype=np.int64)
    hay = None
    if levels is not None:
        levels = np.asarray(levels, dtype=np.int64)
        _check_levels(levels, n_levels, n_pool, own_pool)
        hay = _empty_haystack(levels, n_levels, n_queries, len(own_query))
    lev = levels if levels is not None else np.zeros(n_pool, dtype=np.int64)
    n_lev = n_levels if levels is not None else 1
    t = _Tiling(fn, n_pool, pool_block, own_query, own_pool, lev, n_lev, full, name)
    k = min(int(top_k), n_pool)
    res = _empty_scores(n_queries, len(own_query), k, hay)
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=scratch_dir, prefix=".scratch.") as tmp:
        for q0 in range(0, n_queries, query_block):
            q1 = min(q0 + query_block, n_queries)
            scratch = np.lib.format.open_memmap(
                Path(tmp) / f"q{q0}.npy", mode="w+", dtype=np.float64, shape=(q1 - q0, n_pool)
            )
            _store_sweep1(res, q0, q1, *_sweep1(t, scratch, q0, k))
            _rank_own(t, scratch, q0, res)
            del scratch
            log.info(
                "%s: queries %d/%d scored against %d windows (%.1fs)",
                name,
                q1,
                n_queries,
                n_pool,
                time.time() - t0,
            )
    if hay is not None:
        hay.degenerate = hay.degenerate.astype(str)
    res.degenerate = res.degenerate.astype(str)
    return res


def own_pairs(queries: pd.DataFrame, pool: pd.DataFrame) -> pd.DataFrame:
    """(query row, pool row) of every query's own windows, sorted by query then window."""
    q = pd.DataFrame(
        {
            "q": np.arange(len(queries)),
            "query_id": queries["query_id"].to_numpy(),
            "fact_id": queries["fact_id"].to_numpy(),
        }
    )
    planted = pool.loc[pool["kind"] == "planted", ["row", "window", "fact_id"]]
    pairs = q.merge(planted, on="fact_id", how="inner")
    return pairs.sort_values(["q", "window"]).reset_index(drop=True)


def haystack_table(
    pairs: pd.DataFrame, fractions: list[float], own_score: np.ndarray, hay: HaystackScores
) -> pd.DataFrame:
    """haystack.parquet: one row per (query, own window, share), sorted by query, window and
    share (so each share's rows are in own.parquet order)."""
    n_f = len(fractions)
    rep = np.repeat(np.arange(len(pairs)), n_f)
    col = np.tile(np.arange(n_f), len(pairs))
    q = pairs["q"].to_numpy(np.int64)[rep]
    return pd.DataFrame(
        {
            "query_id": pairs["query_id"].astype(str).to_numpy()[rep],
            "fact_id": pairs["fact_id"].astype(str).to_numpy()[rep],
            "window": pairs["window"].to_numpy(np.int64)[rep],
            "fraction": np.asarray(fractions, dtype=np.float64)[col],
            "n_background": hay.n_background[col].astype(np.int64),
            "n_pool": hay.n_pool[col].astype(np.int64),
            "score": own_score.astype(np.float64)[rep],
            "n_greater": hay.n_greater.ravel().astype(np.int64),
            "n_ties": hay.n_ties.ravel().astype(np.int64),
            "mean": hay.mean[q, col].astype(np.float64),
            "std": hay.std[q, col].astype(np.float64),
            "degenerate": hay.degenerate[q, col].astype(str),
        }
    )


def _blas_threads(threads: int | None) -> Any:
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=max(1, int(threads or 1)))
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()


@dataclass(frozen=True)
class _Job:
    """One :func:`run`: ``method`` (the registry's entry ``m``) against ``model``'s pool."""

    method: str
    model: str
    m: Method
    ctx: Context
    pairs: pd.DataFrame  # :func:`own_pairs` of the queries and the pool
    fractions: list[float]  # haystack shares
    n_q: int
    n_p: int
    write_full: bool  # scores.npy is written


def _score_job(cfg: dict[str, Any], sc: dict[str, Any], job: _Job, tmp: Path) -> TiledScores:
    """Every tile scored with the method (into ``scores.npy`` too when it is written)."""
    m, ctx, pairs, n_q, n_p = job.m, job.ctx, job.pairs, job.n_q, job.n_p
    full = (
        np.lib.format.open_memmap(tmp / SCORES_NPY, mode="w+", dtype="<f4", shape=(n_q, n_p))
        if job.write_full
        else None
    )
    res = score_tiled(
        lambda q, p: m.score(ctx, q, p),
        n_q,
        n_p,
        query_block=int(sc["query_block"]),
        pool_block=int(sc["pool_block"]),
        top_k=int(sc["top_k"]),
        own_query=pairs["q"].to_numpy(),
        own_pool=pairs["row"].to_numpy(),
        full=full,
        scratch_dir=tmp,
        name=f"{job.method}/{job.model}",
        levels=pool.haystack_levels(cfg, ctx.pool),
        n_levels=len(job.fractions),
    )
    if full is not None:
        full.flush()
        del full
    return res


def _queries_table(job: _Job, res: TiledScores) -> pd.DataFrame:
    """queries.parquet: one row per query, in the queries' order."""
    qs = job.ctx.queries
    return pd.DataFrame(
        {
            "query_id": qs["query_id"].astype(str).to_numpy(),
            "fact_id": qs["fact_id"].astype(str).to_numpy(),
            "form": qs["form"].astype(str).to_numpy(),
            "mean": res.mean.astype(np.float64),
            "std": res.std.astype(np.float64),
            "n_pool": np.full(job.n_q, job.n_p, dtype=np.int64),
            "degenerate": res.degenerate.astype(str),
        }
    )


def _own_table(pairs: pd.DataFrame, res: TiledScores) -> pd.DataFrame:
    """own.parquet: one row per (query, own window), in ``pairs`` order."""
    return pd.DataFrame(
        {
            "query_id": pairs["query_id"].astype(str).to_numpy(),
            "fact_id": pairs["fact_id"].astype(str).to_numpy(),
            "window": pairs["window"].to_numpy(np.int64),
            "score": res.own_score.astype(np.float64),
            "n_greater": res.n_greater.astype(np.int64),
            "n_ties": res.n_ties.astype(np.int64),
        }
    )


def _topk_table(job: _Job, res: TiledScores) -> pd.DataFrame:
    """topk.parquet: the ``k`` best windows of every query, by rank."""
    qs = job.ctx.queries
    k = res.top_rows.shape[1]
    windows = job.ctx.pool["window"].to_numpy(np.int64)
    return pd.DataFrame(
        {
            "query_id": np.repeat(qs["query_id"].astype(str).to_numpy(), k),
            "rank": np.tile(np.arange(1, k + 1, dtype=np.int64), job.n_q),
            "window": windows[res.top_rows.ravel()],
            "score": res.top_scores.ravel().astype(np.float64),
        }
    )


def _write_tables(job: _Job, res: TiledScores, tmp: Path) -> None:
    """queries, own, haystack and topk parquet files into ``tmp``."""
    io.write_parquet(tmp / "queries.parquet", _queries_table(job, res))
    io.write_parquet(tmp / "own.parquet", _own_table(job.pairs, res))
    assert res.haystack is not None
    io.write_parquet(
        tmp / "haystack.parquet",
        haystack_table(job.pairs, job.fractions, res.own_score, res.haystack),
    )
    io.write_parquet(tmp / "topk.parquet", _topk_table(job, res))


def _meta_info(
    job: _Job, res: TiledScores, degenerate: dict[str, int], t0: float
) -> dict[str, Any]:
    """meta.json's info (``seconds``: since ``t0``, counted now)."""
    n_q, n_p, write_full = job.n_q, job.n_p, job.write_full
    assert res.haystack is not None
    return {
        "method": job.method,
        "model": job.model,
        "description": job.m.description,
        "scale": job.m.scale or "see the method's documentation; larger = more attributed",
        "sign": "larger score = the method attributes more of the query to the window",
        "n_queries": n_q,
        "n_pool": n_p,
        "n_own": len(job.pairs),
        "top_k": res.top_rows.shape[1],
        "full_matrix": write_full,
        "full_matrix_note": (
            "scores.npy float32 [n_queries, n_pool] written "
            f"(n_queries*n_pool = {n_q * n_p} "
            f"<= {FULL_MATRIX_LIMIT})"
            if write_full
            else f"scores.npy not written: n_queries*n_pool = {n_q * n_p} > {FULL_MATRIX_LIMIT}"
        ),
        "degenerate": degenerate,
        "haystack": {
            "fractions": job.fractions,
            "n_pool": res.haystack.n_pool.tolist(),
            "n_background": res.haystack.n_background.tolist(),
        },
        "seconds": round(time.time() - t0, 3),
    }


def run(
    cfg: dict[str, Any], paths: Paths, method: str, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Score every query against ``model``'s pool with ``method``; write the score folder."""

    from plantbench.attribution.methods import registry
    from plantbench.attribution.methods.scoring_context import Context

    floats.set_threads(threads)
    registry.load_plugins(cfg)
    m = registry.get(method)
    ctx = Context(cfg, paths, model)
    ctx.prepare(m.needs)  # every feature opened and checked before any work
    pairs = own_pairs(ctx.queries, ctx.pool)
    n_q, n_p = ctx.n_queries, ctx.n_pool
    sc = cfg["scoring"]
    fractions = haystack_fractions(cfg)
    write_full = n_q * n_p <= FULL_MATRIX_LIMIT
    job = _Job(method, model, m, ctx, pairs, fractions, n_q, n_p, write_full)
    out = paths.scores(method, model)
    t0 = time.time()
    with _blas_threads(threads), io.atomic_dir(out) as tmp:
        res = _score_job(cfg, sc, job, tmp)
        _write_tables(job, res, tmp)
        files = [*FILES, *([SCORES_NPY] if write_full else [])]
        degenerate = {d: int((res.degenerate == d).sum()) for d in ("nan", "constant")}
        meta = io.write_meta(
            tmp,
            "scores",
            files,
            config_hash=config_hash(cfg, ["scoring"]),
            inputs=ctx.inputs,
            code={"method": registry.code_hash(method)},
            info=_meta_info(job, res, degenerate, t0),
        )
    log.info(
        "scores %s/%s: %d queries x %d windows in %.1fs -> %s",
        method,
        model,
        n_q,
        n_p,
        time.time() - t0,
        out,
    )
    return meta


# --------------------------------------------------------------------------- sanity numbers


def average_precision(own: pd.DataFrame) -> pd.Series:
    """Average precision of each query's own windows (from own.parquet), ties pessimistic: an
    own window tied with other windows is ranked after every tied non-own window."""
    out: dict[str, float] = {}
    for qid, g in own.groupby("query_id", sort=True):
        s = g["score"].to_numpy(np.float64)
        key = np.where(np.isnan(s), -np.inf, s)
        order = np.lexsort((np.isnan(s), -key))  # descending score, NaN last
        s, ng, nt = s[order], g["n_greater"].to_numpy()[order], g["n_ties"].to_numpy()[order]
        total, before, i = 0.0, 0, 0
        while i < len(s):
            j = i + 1
            while j < len(s) and (s[j] == s[i] or (np.isnan(s[j]) and np.isnan(s[i]))):
                j += 1
            a = j - i
            others = int(nt[i]) - (a - 1)  # tied windows that are not own windows
            for t in range(1, a + 1):
                total += (before + t) / (int(ng[i]) + others + t)
            before += a
            i = j
        out[str(qid)] = total / len(s)
    return pd.Series(out, name="ap", dtype=np.float64)


def retrieval_sanity(paths: Paths, method: str = "bm25") -> dict[str, float]:
    """Mean AP of own documents per model and over both (queries of facts the model read)."""
    aps = []
    res: dict[str, float] = {}
    for m in MODELS:
        folder = paths.scores(method, m)
        io.read_meta(folder, "scores", verify=False)
        ap = average_precision(io.read_parquet(folder / "own.parquet"))
        res[m] = float(ap.mean()) if len(ap) else float("nan")
        aps.append(ap)
    both = pd.concat(aps)
    res["all"] = float(both.mean()) if len(both) else float("nan")
    return res


def bm25_sanity(paths: Paths) -> float:
    """BM25 mean average precision of own documents over both models (expected near 1.0:
    invented entity names are unique to their fact's documents). Raises ArtifactError when the
    bm25 scores are missing."""
    if not all((paths.scores("bm25", m) / io.META).is_file() for m in MODELS):
        raise ArtifactError(
            f"BM25 scores are missing under '{paths.root / 'scores' / 'bm25'}'; run the score step"
        )
    return retrieval_sanity(paths, "bm25")["all"]
