"""Cosine similarity with faiss (inner product of L2-normalised float32 vectors)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def normalise(v: np.ndarray) -> np.ndarray:
    v = np.ascontiguousarray(v, dtype=np.float32)
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.divide(v, n, out=np.zeros_like(v), where=n > 0)


def cosine(ctx: Any, kind: str, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    os.environ.setdefault("FAISS_OPT_LEVEL", "generic")  # no probing for absent AVX builds
    import faiss

    key = f"cos_{kind}"
    if key not in ctx.cache:
        _, q = ctx.vectors(kind)
        ctx.cache[key] = normalise(q)
    q = ctx.cache[key][np.asarray(query_rows)]
    p_all, _ = ctx.vectors(kind)
    p = normalise(np.asarray(p_all[np.asarray(pool_rows)]))
    return faiss.pairwise_distances(q, p, metric=faiss.METRIC_INNER_PRODUCT).astype(np.float64)
