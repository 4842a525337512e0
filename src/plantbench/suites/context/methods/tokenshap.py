"""TokenSHAP: Monte Carlo Shapley values of the segments.

The value of a coalition S is v(S) = log p(response | S ⊕ query). ``settings.
shapley_permutations`` seeded permutations each add the segments one by one; a segment's value is
its mean marginal gain v(before ∪ {i}) - v(before). With every permutation of k segments the
values are the exact Shapley values and sum to v(C) - v(∅) (tested).

Scale and sign: nats of the response's log-probability added by the segment, averaged over
orders; positive = the segment supports the response.
"""

from __future__ import annotations

import numpy as np

from plantbench.suites.context.methods.registry import register


def shapley(oracle, perms: np.ndarray) -> np.ndarray:
    k = oracle.k
    prefix = np.zeros((len(perms), k + 1, k), dtype=bool)
    for p, order in enumerate(perms):
        for step, i in enumerate(order, start=1):
            prefix[p, step] = prefix[p, step - 1]
            prefix[p, step, i] = True
    v = oracle.logp(prefix.reshape(-1, k)).reshape(len(perms), k + 1)
    gains = np.diff(v, axis=1)
    out = np.zeros(k)
    for p, order in enumerate(perms):
        out[order] += gains[p]
    return out / len(perms)


@register(
    "tokenshap",
    "Monte Carlo Shapley values of the segments on the response's log-probability",
    scale="nats of log p(response) added by the segment, mean over orders; > 0 = supports",
    interface="mass",
)
def score(oracle, settings, gen: np.random.Generator) -> np.ndarray:
    perms = np.stack([gen.permutation(oracle.k) for _ in range(settings.shapley_permutations)])
    return shapley(oracle, perms)
