"""TracIn with influence: ``sum_c lr_c g_q^cT (F_c + lambda_c I)^-1 g_d^c``, the curvature of
each TracIn checkpoint (curvature.mode, damping curvature.damping_ratio x mean eigenvalue)."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


def preconditioned(ctx: Any, ckpt: str) -> np.ndarray:
    """``(F_c + lambda I)^-1 g_q`` for every query (computed once per checkpoint)."""
    key = f"precond_{ckpt}"
    if key not in ctx.cache:
        ctx.cache[key] = ctx.curvature(ckpt).apply_inverse(ctx.query_grads(ckpt))
    return ctx.cache[key]


@register(
    "tracin_influence",
    "TracIn with the curvature-preconditioned gradient product at each checkpoint",
    needs=("grads_tracin", "curvature_tracin"),
    scale="sum_c lr_c g_q (F_c + lambda I)^-1 g_d; > 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    q_rows = np.asarray(query_rows)
    out = np.zeros((len(q_rows), len(pool_rows)))
    for ckpt, lr in ctx.tracin():
        out += lr * (preconditioned(ctx, ckpt)[q_rows] @ ctx.pool_grads(ckpt, pool_rows).T)
    return out
