"""TracIn with EK-FAC: ``sum_c lr_c g_q^cT (F_EK,c + lambda_c)^-1 g_d^c``, the EK-FAC influence
(:mod:`plantbench.attribution.ekfac`, unprojected) at every TracIn checkpoint, weighted like TracIn by the
learning rate of the update that produced the checkpoint. Off by default (``methods.enabled``):
each checkpoint besides the final one costs another EK-FAC fit and scoring pass."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


@register(
    "tracin_ekfac",
    "TracIn with EK-FAC influence at each checkpoint, unprojected",
    needs=("ekfac_tracin",),
    scale="sum_c lr_c g_q (F_EK,c + lambda_c)^-1 g_d over all block linears; > 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    q, p = np.asarray(query_rows), np.asarray(pool_rows)
    out = np.zeros((len(q), len(p)))
    for ckpt, lr in ctx.tracin():
        out += lr * np.asarray(ctx.ekfac(ckpt)[q][:, p])
    return out
