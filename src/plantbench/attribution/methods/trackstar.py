"""TrackStar (Chang et al. 2024): the cosine of optimizer-corrected, projected gradients whitened
by a mixed pool + query Fisher, ``f_q . f_d`` with ``f = unit(R^{-1/2} P (g / (sqrt(v) + eps)))``
(:mod:`plantbench.attribution.trackstar`). Off by default (``methods.enabled``): its features cost
one more gradient pass over the pool and the queries at the final checkpoint."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


@register(
    "trackstar",
    "TrackStar: cosine of Adam-corrected, projected, mixed-Fisher-whitened gradients",
    needs=("trackstar",),
    scale="cosine in [-1, 1] of whitened corrected gradients; > 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    pool, queries = ctx.trackstar()
    return queries[np.asarray(query_rows)] @ pool[np.asarray(pool_rows)].T
