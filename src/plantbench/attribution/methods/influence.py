"""Influence functions at the final checkpoint: ``g_q^T (F + lambda I)^-1 g_d`` with F the
projected Gauss-Newton / empirical Fisher of the pool gradients."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register
from plantbench.attribution.methods.tracin_influence import preconditioned


@register(
    "influence",
    "influence function g_q (F + lambda I)^-1 g_d at the final checkpoint",
    needs=("grads", "curvature"),
    scale="g_q (F + lambda I)^-1 g_d (first-order loss decrease per unit of upweighting d); "
    "> 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    return (
        preconditioned(ctx, ctx.final)[np.asarray(query_rows)]
        @ ctx.pool_grads(ctx.final, pool_rows).T
    )
