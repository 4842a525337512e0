"""Gradient cosine at the final checkpoint: ``g_q . g_d / (|g_q| |g_d|)`` of projected
gradients (NaN where a gradient is exactly zero)."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


def _unit(g: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(g, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, g / n, np.nan)


@register(
    "grad_cos",
    "cosine of projected loss gradients at the final checkpoint",
    needs=("grads",),
    scale="cosine in [-1, 1]; > 0: a descent step on d lowers the query loss",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    if "grad_cos_q" not in ctx.cache:
        ctx.cache["grad_cos_q"] = _unit(ctx.query_grads(ctx.final))
    q = ctx.cache["grad_cos_q"][np.asarray(query_rows)]
    return q @ _unit(ctx.pool_grads(ctx.final, pool_rows)).T
