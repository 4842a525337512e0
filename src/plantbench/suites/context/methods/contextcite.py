"""ContextCite: a sparse linear surrogate of the response's log-probability over ablations.

``settings.ablations`` masks keep each segment with probability 1/2 (seeded); the target is the
logit of the response's probability, log p - log(1 - p) with log p = log p(response | ablated
context ⊕ query). The fit follows the ContextCite package's solver: scikit-learn's Lasso
(``settings.lasso_alpha``, with an intercept) on the standardized masks and the target divided
by the response's token count, its weights mapped back to 0/1 masks and whole-response units
(tested against the package: the same masks give the same weights).

Scale and sign: a segment's weight is the change of the response's logit-probability (nats) when
the segment is kept, the other segments held as in the surrogate; positive = the segment raises
the response. Zero = the Lasso dropped it.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import Lasso

from plantbench.suites.context.methods.registry import register


def logit_prob(logp: np.ndarray) -> np.ndarray:
    """log p - log(1 - p) of log-probabilities, stable for p near 0 and near 1."""
    logp = np.minimum(np.asarray(logp, dtype=np.float64), -1e-12)
    return logp - np.log(-np.expm1(logp))


def fit(masks: np.ndarray, target: np.ndarray, alpha: float, n_tokens: int = 1) -> np.ndarray:
    """The Lasso weights of ``target`` on the 0/1 ``masks`` (per kept segment, target units)."""
    x = masks.astype(np.float64)
    mean, std = x.mean(axis=0), x.std(axis=0)
    std = np.where(std > 0, std, 1.0)  # a segment kept in every mask (or none) gets weight 0
    model = Lasso(alpha=alpha, fit_intercept=True, random_state=0)
    model.fit((x - mean) / std, np.asarray(target, dtype=np.float64) / n_tokens)
    return (model.coef_ / std * n_tokens).astype(np.float64)


@register(
    "contextcite",
    "Lasso surrogate of the response's logit-probability over random ablations",
    scale="nats of logit-probability per kept segment (Lasso weight); > 0 raises the response",
    interface="contrastive",
)
def score(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    masks = gen.random((settings.ablations, oracle.k)) < 0.5
    n_tokens = len(oracle.candidate_ids[oracle.target]) if hasattr(oracle, "candidate_ids") else 1
    return fit(masks, logit_prob(oracle.logp(masks)), settings.lasso_alpha, n_tokens)
