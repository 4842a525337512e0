"""AttnTrace (2025, TracLLM's successor): attention-based traceback with top-K token averaging
and context subsampling.

A token's score under one (sub)context is the attention weight it receives from the positions
that predict the response, averaged over those positions, every head and every layer
(:meth:`Oracle.attention`). A segment's score under that subcontext is the sum of its
``settings.attntrace_top_k`` highest-scoring tokens (all of them when it has fewer): a long
segment is not credited for its many weakly attended tokens, and attention noise on single
tokens is averaged out less than a plain sum would. Context subsampling: besides the full
context, ``settings.attntrace_subsamples`` seeded subcontexts keep each segment with probability
``settings.attntrace_keep``; a segment's score is its mean over the (sub)contexts that keep it
(the full context keeps every segment), so supporting segments do not dilute each other's
attention in every sample.

Scale and sign: attention mass (a sum of at most K token weights, each in [0, 1]); >= 0, larger
= more attended by the response.
"""

from __future__ import annotations

import numpy as np

from plantbench.suites.context.methods.registry import register


def token_scores(att: np.ndarray) -> np.ndarray:
    """``[S]``: each position's attention from the response, averaged over positions, heads and
    layers."""
    return att.mean(axis=(0, 1, 2))


def segment_scores(tokens: np.ndarray, owner: np.ndarray, k: int, top: int) -> np.ndarray:
    """Each segment's sum of its ``top`` highest token scores (NaN: not in this context)."""
    out = np.full(k, np.nan)
    for j in range(k):
        t = tokens[owner == j]
        if t.size:
            out[j] = np.sort(t)[::-1][:top].sum()
    return out


def subsample_masks(k: int, n: int, keep: float, gen: np.random.Generator) -> np.ndarray:
    """The full context, then ``n`` seeded subcontexts (each segment kept with ``keep``)."""
    return np.vstack([np.ones((1, k), dtype=bool), gen.random((n, k)) < keep])


@register(
    "attntrace",
    "attention traceback: top-K token attention per segment, averaged over context subsamples",
    scale="attention mass (sum of the K most attended tokens' weights); >= 0, larger = attended",
    interface="mass",
)
def score(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    masks = subsample_masks(oracle.k, settings.attntrace_subsamples, settings.attntrace_keep, gen)
    rows = []
    for m in masks:
        if m.any():
            att, owner = oracle.attention(m)
            rows.append(
                segment_scores(token_scores(att), owner, oracle.k, settings.attntrace_top_k)
            )
    return np.nan_to_num(np.nanmean(np.vstack(rows), axis=0), nan=0.0)
