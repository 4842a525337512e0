"""BM25 (Okapi, rank-bm25 defaults k1=1.5, b=0.75, epsilon=0.25) over the pool windows' text.

Text: a window's tokens decoded with special tokens dropped; a query is its prompt, a space and
its answer. Tokenization: lowercase, then every maximal run of Unicode word characters
(regex ``\\w+``) is a term; punctuation and whitespace separate terms. The index (term
frequencies, document lengths, idf) is built once over the model's whole pool.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from plantbench.attribution.methods.registry import register

TOKEN = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def _index(ctx: Any) -> Any:
    if "bm25" not in ctx.cache:
        from rank_bm25 import BM25Okapi

        ctx.cache["bm25"] = (
            BM25Okapi([tokenize(t) for t in ctx.texts()]),
            [tokenize(t) for t in ctx.query_texts()],
        )
    return ctx.cache["bm25"]


@register(
    "bm25",
    "Okapi BM25 (rank-bm25) over decoded window text, lowercase \\w+ terms",
    needs=("text",),
    scale="BM25 score >= 0 (sum of idf-weighted saturated term frequencies); "
    "larger = more lexical overlap",
)
def score(ctx: Any, query_rows: np.ndarray, pool_rows: np.ndarray) -> np.ndarray:
    index, qtoks = _index(ctx)
    ids = [int(i) for i in pool_rows]
    return np.stack(
        [
            np.asarray(index.get_batch_scores(qtoks[int(q)], ids), dtype=np.float64)
            for q in query_rows
        ]
    )
