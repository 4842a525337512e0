"""The likelihood baselines on the document text alone (the seed's Tier 1).

Each is a score where larger means "member":

- PPL: ``-mean log p`` negated (a lower perplexity scores higher);
- Zlib (Carlini et al.): the ratio of the log-perplexity to the zlib-compressed length of the
  text's UTF-8 bytes, negated;
- Min-K% Prob (Shi et al.): the mean of the ``k`` share of lowest token log-probabilities;
- Min-K%++ (Zhang et al.): the same mean over ``(log p(x_t) - mu_t) / sigma_t``, with mu_t and
  sigma_t the mean and standard deviation of log p(z) under the model's own distribution at t.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

NAMES = ("ppl", "zlib", "min_k", "min_k_pp")


def _lowest_mean(x: np.ndarray, k: float) -> float:
    if x.size == 0:
        raise ValueError("a document with no scored token has no likelihood score")
    n = max(1, math.floor(k * x.size))
    return float(np.sort(x)[:n].mean())


def ppl_score(logp: Sequence[float]) -> float:
    """Minus the mean negative log-likelihood: ``log(1 / PPL)``."""
    return float(np.mean(np.asarray(logp, dtype=np.float64)))


def zlib_score(logp: Sequence[float], text: str) -> float:
    """Minus log-perplexity over the zlib-compressed length (bytes) of ``text``."""
    log_ppl = -float(np.mean(np.asarray(logp, dtype=np.float64)))
    return -log_ppl / len(zlib.compress(text.encode("utf-8")))


def min_k_score(logp: Sequence[float], k: float) -> float:
    """The mean of the ``k`` share (at least one) of lowest token log-probabilities."""
    return _lowest_mean(np.asarray(logp, dtype=np.float64), k)


def min_k_pp_score(
    logp: Sequence[float], mu: Sequence[float], sigma: Sequence[float], k: float
) -> float:
    """Min-K%++: the lowest-k mean of the standardized token log-probabilities."""
    z = (np.asarray(logp, np.float64) - np.asarray(mu, np.float64)) / np.asarray(sigma, np.float64)
    return _lowest_mean(z, k)
