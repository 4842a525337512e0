"""AT2 (Cohen-Wang, Chuang and Madry 2025, "Learning to attribute with attention"): a segment's
score is a learned linear combination of per-head attention features, the weights learned from
ablation outcomes of held-out contexts.

Features: with the full context, for every layer and head h and every segment j,
``a_h(j)`` = the attention weight that the positions predicting the response put on segment j's
tokens (summed over those tokens, averaged over the positions; :meth:`Oracle.attention`).
A segment's score is ``s(j) = sum_h theta_h a_h(j)``.

Training labels: the suite's own ablations. Per context, ``settings.ablations`` seeded masks
(each segment kept with probability 1/2) and the response's logit-probability under each
(ContextCite's target). The surrogate of an ablation is the sum of the kept segments' scores;
``theta`` minimises the squared error of the surrogate against the target, both centred within
each context (the intercept of each context drops out), plus a ridge ``settings.at2_ridge``
(1e-4) x the normal equations' mean diagonal: a closed-form, deterministic stand-in for the
published SGD on a correlation loss, with the same linear model over the same features (the
``at2`` package's trainer on the same records ranks segments alike: ``tests/test_at2_peer.py``).

No leakage: the facts are split into two seeded folds, and a context's scores use the weights
learned on the other fold's contexts only (its own masks and its fact's other query form are
never in its training set). With no context in the other fold the weights are uniform (the
plain attention mass).

Scale and sign: nats of the response's logit-probability a kept segment adds, as predicted from
attention; > 0 = the segment supports the response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from plantbench.suites.context.methods.contextcite import logit_prob
from plantbench.suites.context.methods.registry import register


@dataclass(frozen=True)
class Record:
    features: np.ndarray  # [heads, k] attention on each segment, full context
    masks: np.ndarray  # [m, k] training ablations
    target: np.ndarray  # [m] the response's logit-probability under each


def head_features(att: np.ndarray, owner: np.ndarray, k: int) -> np.ndarray:
    """``[layers * heads, k]``: each head's attention on each segment, summed over the
    segment's tokens, averaged over the response-predicting positions."""
    mean = att.mean(axis=2)  # [L, H, S]
    out = np.zeros((mean.shape[0] * mean.shape[1], k))
    flat = mean.reshape(out.shape[0], -1)
    for j in range(k):
        out[:, j] = flat[:, owner == j].sum(axis=1)
    return out


def design(rec: Record) -> tuple[np.ndarray, np.ndarray]:
    """Per context the centred design ``[m, heads]`` (the kept segments' features summed) and
    the centred target."""
    x = rec.masks.astype(np.float64) @ rec.features.T
    return x - x.mean(axis=0), rec.target - rec.target.mean()


def fit(records: list[Record], ridge: float, heads: int) -> np.ndarray:
    """The ridge weights of the centred surrogate over ``records`` (uniform when none)."""
    if not records:
        return np.ones(heads) / heads
    xtx, xty = np.zeros((heads, heads)), np.zeros(heads)
    for rec in records:
        x, y = design(rec)
        xtx += x.T @ x
        xty += x.T @ y
    lam = ridge * max(float(np.trace(xtx)) / heads, np.finfo(float).tiny)
    return np.linalg.solve(xtx + lam * np.eye(heads), xty)


def learn(records: dict[str, Any], folds: dict[str, int], settings: Any) -> dict[str, np.ndarray]:
    """Every query's segment scores, with weights fitted on the other folds' records."""
    out = {}
    heads = next(iter(records.values())).features.shape[0] if records else 0
    for fold in sorted(set(folds.values())):
        train = [r for q, r in records.items() if folds[q] != fold]
        theta = fit(train, settings.at2_ridge, heads)
        for q, r in records.items():
            if folds[q] == fold:
                out[q] = r.features.T @ theta
    return out


@register(
    "at2",
    "learned per-head attention weights (AT2), fitted on held-out contexts' ablations",
    scale="nats of logit-probability a kept segment adds, predicted from attention; > 0 supports",
    interface="contrastive",
    learn=learn,
)
def score(oracle, settings, gen: np.random.Generator) -> Record:
    att, owner = oracle.attention(oracle.full())
    masks = gen.random((settings.ablations, oracle.k)) < 0.5
    return Record(head_features(att, owner, oracle.k), masks, logit_prob(oracle.logp(masks)))
