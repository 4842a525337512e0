"""AttriBoT: leave-one-out attribution, exact and with its hierarchical (pruning) approximation.

Exact leave-one-out: s_i = log p(response | C ⊕ query) - log p(response | C minus c_i ⊕ query),
log p summed over the response's tokens. The k + 1 contexts run as one batch, each ablation's
prefix pass (its key-value cache) shared by the candidates. ``attribot_pruned`` is AttriBoT's hierarchical approximation: leave-one-out of the two
halves of the context first, then exact leave-one-out only inside halves whose removal moved the
response (|drop| >= 1 nat); segments of the other half share its half-score / size.

Scale and sign: nats of the response's log-probability lost when the segment is removed;
positive = the segment supported the response.
"""

from __future__ import annotations

import numpy as np

from plantbench.suites.context.methods.registry import register


def leave_one_out(oracle, members: list[int] | None = None) -> np.ndarray:
    """s_i for the segments in ``members`` (default all); others 0."""
    k = oracle.k
    members = list(range(k)) if members is None else members
    masks = np.ones((1 + len(members), k), dtype=bool)
    for row, i in enumerate(members, start=1):
        masks[row, i] = False
    lp = oracle.logp(masks)
    out = np.zeros(k)
    out[members] = lp[0] - lp[1:]
    return out


@register(
    "attribot",
    "leave-one-out drop of the response's log-probability (exact, one batch)",
    scale="nats of log p(response) lost when the segment is removed; > 0 = supports",
    interface="mass",
)
def score(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    return leave_one_out(oracle)


def pruned(oracle, threshold: float = 1.0) -> np.ndarray:
    """The hierarchical approximation (see the module docstring)."""
    k = oracle.k
    halves = [list(range(k // 2)), list(range(k // 2, k))]
    masks = np.ones((3, k), dtype=bool)
    for row, h in enumerate(halves, start=1):
        masks[row, h] = False
    lp = oracle.logp(masks)
    out = np.zeros(k)
    for h, drop in zip(halves, lp[0] - lp[1:], strict=True):
        if not h:
            continue
        if abs(drop) >= threshold and len(h) > 1:
            out[h] = leave_one_out(oracle, h)[h]
        else:
            out[h] = drop / len(h)
    return out


@register(
    "attribot_pruned",
    "AttriBoT's hierarchical approximation of leave-one-out (halves first, refine where it moved)",
    scale="nats of log p(response) lost when the segment (or its half, shared) is removed",
    interface="mass",
)
def score_pruned(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    return pruned(oracle)
