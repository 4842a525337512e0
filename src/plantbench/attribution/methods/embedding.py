"""Embedding search: cosine similarity of text-encoder embeddings (faiss inner product of
L2-normalised vectors) between the query text (prompt + answer) and the window text."""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.attribution.methods._vectors import cosine
from plantbench.attribution.methods.registry import register


@register(
    "embedding",
    "cosine of sentence-encoder embeddings (faiss inner product, normalised)",
    needs=("embed",),
    scale="cosine similarity in [-1, 1]; larger = semantically closer",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    return cosine(ctx, "embed", query_rows, pool_rows)
