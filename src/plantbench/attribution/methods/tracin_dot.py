"""TracIn (checkpoint approximation): ``sum_c lr_c g_q^c . g_d^c`` over the TracIn checkpoints
(features.tracin_checkpoints), ``lr_c`` = learning rate of the update that produced checkpoint c."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


@register(
    "tracin_dot",
    "TracIn: sum over checkpoints of learning rate x gradient dot product",
    needs=("grads_tracin",),
    scale="sum_c lr_c g_q.g_d (first-order loss decrease of the query from training on d); "
    "> 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    q_rows = np.asarray(query_rows)
    out = np.zeros((len(q_rows), len(pool_rows)))
    for ckpt, lr in ctx.tracin():
        out += lr * (ctx.query_grads(ckpt)[q_rows] @ ctx.pool_grads(ckpt, pool_rows).T)
    return out
