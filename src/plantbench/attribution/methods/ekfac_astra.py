"""EK-FAC influence with ASTRA: ``g_d^T v_q``, ``v_q`` EK-FAC's ``(F_EK + lambda)^-1 g_q`` refined
towards ``(G + lambda)^-1 g_q`` by preconditioned Richardson steps with the exact Gauss-Newton
Hessian ``G`` (:mod:`plantbench.attribution.ekfac.astra`). Off by default (``methods.enabled``):
the final checkpoint's ``ekfac`` step computes these scores beside EK-FAC's only when it is
enabled, at ``methods.astra.steps`` x ``windows`` windows' forward and backward per query."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register


def _scores(ctx: Any) -> np.ndarray:
    """ASTRA's ``[n_queries, n_pool]`` scores, opened once: ``ctx.ekfac()`` checks the artifact
    against the pool, the queries and the checkpoint and records its hash (which covers the ASTRA
    file); the file must have been made with the config's ``methods.astra``."""
    if "_ekfac_astra" not in ctx.cache:
        from plantbench import layout
        from plantbench.attribution.ekfac import store

        ctx.ekfac()
        ctx.cache["_ekfac_astra"] = store.load_astra(
            ctx.paths.ekfac(ctx.model),
            layout.astra_settings(ctx.cfg),
            (ctx.n_queries, ctx.n_pool),
        )
    return ctx.cache["_ekfac_astra"]


@register(
    "ekfac_astra",
    "EK-FAC influence refined by ASTRA with the exact Gauss-Newton Hessian, unprojected",
    needs=("ekfac",),
    scale="g_d (G + lambda)^-1 g_q over all block linears, approximately (methods.astra.steps "
    "Richardson steps from EK-FAC's solution); > 0 = proponent",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    return np.asarray(_scores(ctx)[np.asarray(query_rows)][:, np.asarray(pool_rows)])
