"""Gradient dot product at the final checkpoint: ``g_q . g_d`` of projected loss gradients
(query loss on answer tokens, window loss over the whole window)."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


@register(
    "grad_dot",
    "dot product of projected loss gradients at the final checkpoint",
    needs=("grads",),
    scale="g_q . g_d (loss-gradient units squared, unbounded); "
    "> 0: a descent step on d lowers the query loss",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    q = ctx.query_grads(ctx.final)[np.asarray(query_rows)]
    return q @ ctx.pool_grads(ctx.final, pool_rows).T
