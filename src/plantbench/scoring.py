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
``scores.npy``: the full float32 matrix ``[n_queries (queries.parquet order), n_pool
    (pool.parquet row order)]``, only when ``n_queries * n_pool <= 50,000,000``
    (``info.full_matrix`` says whether it was written).
``meta.json``: inputs = the pool, facts and every feature artifact hash the method read;
    info = method, model, n_queries, n_pool, top_k, description, scale (the score's scale and sign).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import io
from .config import config_hash
from .errors import ArtifactError, PlantbenchError
from .paths import MODELS, Paths

log = logging.getLogger(__name__)

FULL_MATRIX_LIMIT = 50_000_000
FILES = ("queries.parquet", "own.parquet", "topk.parquet")
SCORES_NPY = "scores.npy"

ScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


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
) -> TiledScores:
    """Score ``fn(query_rows, pool_rows)`` over all tiles; see the module docstring.

    ``own_query[i]``, ``own_pool[i]``: the (query row, pool row) pairs whose scores and ranks
    are wanted. ``full``: an optional ``[n_queries, n_pool]`` array filled with float32 scores.
    """
    if n_pool < 1:
        raise PlantbenchError("cannot score an empty pool")
    own_query = np.asarray(own_query, dtype=np.int64)
    own_pool = np.asarray(own_pool, dtype=np.int64)
    k = min(int(top_k), n_pool)
    mean = np.zeros(n_queries)
    std = np.zeros(n_queries)
    degenerate = np.full(n_queries, "", dtype=object)
    own_score = np.full(len(own_query), np.nan)
    n_greater = np.zeros(len(own_query), dtype=np.int64)
    n_ties = np.zeros(len(own_query), dtype=np.int64)
    top_rows = np.zeros((n_queries, k), dtype=np.int64)
    top_scores = np.zeros((n_queries, k))
    t0 = time.time()
    with tempfile.TemporaryDirectory(dir=scratch_dir, prefix=".scratch.") as tmp:
        for q0 in range(0, n_queries, query_block):
            q1 = min(q0 + query_block, n_queries)
            qrows = np.arange(q0, q1, dtype=np.int64)
            nb = q1 - q0
            scratch = np.lib.format.open_memmap(
                Path(tmp) / f"q{q0}.npy", mode="w+", dtype=np.float64, shape=(nb, n_pool)
            )
            cnt = np.zeros(nb)
            mu = np.zeros(nb)
            m2 = np.zeros(nb)
            lo = np.full(nb, np.inf)
            hi = np.full(nb, -np.inf)
            bad = np.zeros(nb, dtype=bool)
            ts = np.zeros((nb, 0))
            tr = np.zeros((nb, 0), dtype=np.int64)
            # sweep 1: scores, running statistics, top-k
            for p0 in range(0, n_pool, pool_block):
                p1 = min(p0 + pool_block, n_pool)
                prows = np.arange(p0, p1, dtype=np.int64)
                s = np.asarray(fn(qrows, prows), dtype=np.float64)
                if s.shape != (nb, p1 - p0):
                    raise PlantbenchError(
                        f"method '{name}' returned scores of shape {s.shape} for a tile of "
                        f"{nb} queries x {p1 - p0} windows"
                    )
                fin = np.isfinite(s)
                s = np.where(fin, s, np.nan)
                scratch[:, p0:p1] = s
                if full is not None:
                    full[q0:q1, p0:p1] = s.astype(np.float32)
                c_b = fin.sum(1).astype(np.float64)
                z = np.where(fin, s, 0.0)
                mu_b = z.sum(1) / np.maximum(c_b, 1)
                m2_b = (np.where(fin, s - mu_b[:, None], 0.0) ** 2).sum(1)
                n_new = cnt + c_b
                delta = mu_b - mu
                w = np.divide(c_b, n_new, out=np.zeros(nb), where=n_new > 0)
                mu = mu + delta * w
                m2 = m2 + m2_b + delta**2 * cnt * w
                cnt = n_new
                lo = np.minimum(lo, np.where(fin, s, np.inf).min(1))
                hi = np.maximum(hi, np.where(fin, s, -np.inf).max(1))
                bad |= ~fin.all(1)
                ts, tr = _merge_topk(ts, tr, s, prows, k)
            scratch.flush()
            with np.errstate(invalid="ignore", divide="ignore"):
                mean[q0:q1] = np.where(cnt > 0, mu, np.nan)
                std[q0:q1] = np.where(cnt > 0, np.sqrt(np.maximum(m2, 0) / cnt), np.nan)
            const = (cnt > 0) & (hi == lo)
            mean[q0:q1] = np.where(const, hi, mean[q0:q1])
            std[q0:q1] = np.where(const, 0.0, std[q0:q1])
            degenerate[q0:q1] = np.where(bad, "nan", np.where(const, "constant", ""))
            top_scores[q0:q1], top_rows[q0:q1] = ts, tr
            # sweep 2: ranks of the own windows against the stored scores
            sel = np.flatnonzero((own_query >= q0) & (own_query < q1))
            if sel.size:
                local = own_query[sel] - q0
                own_score[sel] = scratch[local, own_pool[sel]]
                by_query = {int(u): sel[local == u] for u in np.unique(local)}
                for p0 in range(0, n_pool, pool_block):
                    blk = np.asarray(scratch[:, p0 : min(p0 + pool_block, n_pool)])
                    for u, idx in by_query.items():
                        row = blk[u]
                        srt = np.sort(row[~np.isnan(row)])
                        n_nan = row.size - srt.size
                        v = own_score[idx]
                        isn = np.isnan(v)
                        r = np.searchsorted(srt, v, side="right")
                        left = np.searchsorted(srt, v, side="left")
                        n_greater[idx] += np.where(isn, srt.size, srt.size - r)
                        n_ties[idx] += np.where(isn, n_nan, r - left)
                n_ties[sel] -= 1  # the window itself
            del scratch
            log.info(
                "%s: queries %d/%d scored against %d windows (%.1fs)",
                name,
                q1,
                n_queries,
                n_pool,
                time.time() - t0,
            )
    return TiledScores(
        mean, std, degenerate.astype(str), own_score, n_greater, n_ties, top_rows, top_scores
    )


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


def _blas_threads(threads: int | None) -> Any:
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=max(1, int(threads or 1)))
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()


def run(
    cfg: dict[str, Any], paths: Paths, method: str, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Score every query against ``model``'s pool with ``method``; write the score folder."""
    import torch

    from .methods import registry
    from .methods.context import Context

    torch.set_num_threads(max(1, int(threads or 1)))
    registry.load_plugins(cfg)
    m = registry.get(method)
    ctx = Context(cfg, paths, model)
    ctx.prepare(m.needs)  # every feature opened and checked before any work
    pairs = own_pairs(ctx.queries, ctx.pool)
    n_q, n_p = ctx.n_queries, ctx.n_pool
    sc = cfg["scoring"]
    write_full = n_q * n_p <= FULL_MATRIX_LIMIT
    out = paths.scores(method, model)
    t0 = time.time()
    with _blas_threads(threads), io.atomic_dir(out) as tmp:
        full = (
            np.lib.format.open_memmap(tmp / SCORES_NPY, mode="w+", dtype="<f4", shape=(n_q, n_p))
            if write_full
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
            name=f"{method}/{model}",
        )
        if full is not None:
            full.flush()
            del full
        qs = ctx.queries
        io.write_parquet(
            tmp / "queries.parquet",
            pd.DataFrame(
                {
                    "query_id": qs["query_id"].astype(str).to_numpy(),
                    "fact_id": qs["fact_id"].astype(str).to_numpy(),
                    "form": qs["form"].astype(str).to_numpy(),
                    "mean": res.mean.astype(np.float64),
                    "std": res.std.astype(np.float64),
                    "n_pool": np.full(n_q, n_p, dtype=np.int64),
                    "degenerate": res.degenerate.astype(str),
                }
            ),
        )
        io.write_parquet(
            tmp / "own.parquet",
            pd.DataFrame(
                {
                    "query_id": pairs["query_id"].astype(str).to_numpy(),
                    "fact_id": pairs["fact_id"].astype(str).to_numpy(),
                    "window": pairs["window"].to_numpy(np.int64),
                    "score": res.own_score.astype(np.float64),
                    "n_greater": res.n_greater.astype(np.int64),
                    "n_ties": res.n_ties.astype(np.int64),
                }
            ),
        )
        k = res.top_rows.shape[1]
        windows = ctx.pool["window"].to_numpy(np.int64)
        io.write_parquet(
            tmp / "topk.parquet",
            pd.DataFrame(
                {
                    "query_id": np.repeat(qs["query_id"].astype(str).to_numpy(), k),
                    "rank": np.tile(np.arange(1, k + 1, dtype=np.int64), n_q),
                    "window": windows[res.top_rows.ravel()],
                    "score": res.top_scores.ravel().astype(np.float64),
                }
            ),
        )
        files = [*FILES, *([SCORES_NPY] if write_full else [])]
        degenerate = {d: int((res.degenerate == d).sum()) for d in ("nan", "constant")}
        meta = io.write_meta(
            tmp,
            "scores",
            files,
            config_hash=config_hash(cfg, ["scoring"]),
            inputs=ctx.inputs,
            code={"method": registry.code_hash(method)},
            info={
                "method": method,
                "model": model,
                "description": m.description,
                "scale": m.scale or "see the method's documentation; larger = more attributed",
                "sign": "larger score = the method attributes more of the query to the window",
                "n_queries": n_q,
                "n_pool": n_p,
                "n_own": len(pairs),
                "top_k": k,
                "full_matrix": write_full,
                "full_matrix_note": (
                    "scores.npy float32 [n_queries, n_pool] written "
                    f"(n_queries*n_pool = {n_q * n_p} "
                    f"<= {FULL_MATRIX_LIMIT})"
                    if write_full
                    else "scores.npy not written: "
                    f"n_queries*n_pool = {n_q * n_p} > {FULL_MATRIX_LIMIT}"
                ),
                "degenerate": degenerate,
                "seconds": round(time.time() - t0, 3),
            },
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
