"""Hidden-state similarity: cosine of the final checkpoint's pooled last-layer hidden states
(features.hidden_pooling) of the query (prompt + answer) and the window, with faiss."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods._vectors import cosine
from plantbench.attribution.methods.registry import register


@register(
    "hidden",
    "cosine of the model's pooled last-layer hidden states (faiss inner product, normalised)",
    needs=("hidden",),
    scale="cosine similarity in [-1, 1]; larger = closer in the model's representation",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    return cosine(ctx, "hidden", query_rows, pool_rows)
