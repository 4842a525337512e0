"""TracLLM: informed binary search over the context with leave-one-out-style node scores.

Starting from the whole context, every node of more than one segment is split in two halves;
each child S is scored s(S) = max(w_loo * LOO(S), STC(S)), with

- STC(S) = log p(response | S ⊕ query) - log p(response | query) (the node alone),
- LOO(S) = log p(response | C ⊕ query) - log p(response | C minus S ⊕ query),

and only the ``settings.tracllm_top`` highest-scoring nodes are searched further (ties: the
earlier node). A pruned node's segments inherit its score; the search ends when every kept node
is one segment (``settings.tracllm_loo_weight`` = w_loo, 2 as in the seed).

Scale and sign: nats of the response's log-probability (the larger of the weighted removal drop
and the standalone gain); positive = the segment (or its node) supports the response.
"""

from __future__ import annotations

import numpy as np

from plantbench.suites.context.methods.registry import register


def node_scores(oracle, nodes: list[list[int]], w_loo: float) -> np.ndarray:
    k = oracle.k
    alone = np.zeros((len(nodes), k), dtype=bool)
    without = np.ones((len(nodes), k), dtype=bool)
    for row, n in enumerate(nodes):
        alone[row, n] = True
        without[row, n] = False
    base = oracle.logp(np.stack([oracle.full(), oracle.empty()]))
    stc = oracle.logp(alone) - base[1]
    loo = base[0] - oracle.logp(without)
    return np.maximum(w_loo * loo, stc)


def search(oracle, top: int, w_loo: float) -> np.ndarray:
    out = np.zeros(oracle.k)
    frontier = [list(range(oracle.k))]
    while any(len(n) > 1 for n in frontier):
        children = []
        for n in frontier:
            children += [n] if len(n) == 1 else [n[: len(n) // 2], n[len(n) // 2 :]]
        s = node_scores(oracle, children, w_loo)
        order = np.argsort(-s, kind="stable")
        for c in order:
            out[children[c]] = s[c]
        frontier = [children[c] for c in order[:top]]
    return out


@register(
    "tracllm",
    "binary search with top-K pruning, nodes scored max(2 LOO, STC)",
    scale="nats of log p(response): max(w_loo x removal drop, standalone gain); > 0 = supports",
    interface="contrastive",
)
def score(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    return search(oracle, settings.tracllm_top, settings.tracllm_loo_weight)
