"""EK-FAC influence at the final checkpoint: ``g_q^T (F_EK + lambda)^-1 g_d`` with the
eigenvalue-corrected Kronecker-factored Fisher of the block linears, unprojected
(:mod:`plantbench.attribution.ekfac`; the ``ekfac`` feature step computes every query x window score)."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


@register(
    "ekfac",
    "EK-FAC influence g_q (F_EK + lambda)^-1 g_d at the final checkpoint, unprojected",
    needs=("ekfac",),
    scale="g_q (F_EK + lambda)^-1 g_d over all block linears (first-order loss decrease per "
    "unit of upweighting d); > 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    return np.asarray(ctx.ekfac()[np.asarray(query_rows)][:, np.asarray(pool_rows)])
