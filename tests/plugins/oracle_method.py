"""A worked example of a plug-in attribution method: the oracle.

It reads the answer key the other methods have to guess: a pool window gets score 1 if it is
one of the query's own planted documents and 0 otherwise. Graded by the workflow it must reach
AP = 1 on both models (the ceiling every real method is measured against) and a positive
attributed mass for every fact; its within-cell correlations say how much "finding the right
documents" alone explains the causal effect.

Use it (or a copy of this file as a template) from the config::

    methods:
      plugins: [{name: oracle, path: tests/plugins/oracle_method.py}]

The interface is :mod:`plantbench.attribution.methods.registry`'s: ``score(ctx, query_rows, pool_rows)``
returns a ``[len(query_rows), len(pool_rows)]`` float array, larger = more attributed. ``ctx``
gives the model's pool (``ctx.pool``: row, window, kind, fact_id, doc_id, hash), the queries
(``ctx.queries``: query_id, fact_id, form, prompt, answer), lazily loaded features
(``ctx.texts()``, ``ctx.vectors("embed")``, ``ctx.query_grads(ckpt)``, ...) and ``ctx.cache``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DESCRIPTION = "oracle: 1 for the query's own planted windows, 0 elsewhere (test ceiling)"
NEEDS: list[str] = []  # no features: the pool table and the queries are always available
SCALE = "1 = one of the query's own planted documents, 0 = any other window"


def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    pool = ctx.pool
    planted = pool["kind"].to_numpy()[pool_rows] == "planted"
    window_fact = np.where(planted, pool["fact_id"].to_numpy(dtype=object)[pool_rows], None)
    query_fact = ctx.queries["fact_id"].to_numpy(dtype=object)[query_rows]
    return (query_fact[:, None] == window_fact[None, :]).astype(np.float64)
