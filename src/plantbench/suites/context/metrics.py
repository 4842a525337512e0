"""The seed's context-attribution metrics (BCS, CAC, APS, SSP) and the likelihood ones.

Rankings order segments by score, highest first, ties by segment position (stable).

- Util = (Acc_topk-only - Acc_no-ctx) / Δ and RmI = (Acc_full-ctx - Acc_rm-topk) / Δ, with
  Δ = Acc_full-ctx - Acc_no-ctx, all on the base model (undefined when Δ <= 0);
  BCS = sqrt(max(Util, 0) * max(RmI, 0)) (negative parts clipped: a top-k worse than none
  carries no sufficiency).
- CAC = extrapolated rank-biased overlap (Webber et al.'s RBO_ext) of the base and reader twins'
  rankings of the same context; identical rankings give 1.
- APS = harmonic mean of BCS and CAC (0 when both are 0).
- SSP = share of segments whose predicted source (the seed's disentanglement interface, by
  method) is their true one.
- Drop@k = log p(response | full) - log p(response | full minus the top k); LDS = Spearman of
  the surrogate sum of kept segments' scores against log p(response) over held-out ablations.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from scipy.stats import spearmanr


def ranking(scores: npt.ArrayLike) -> np.ndarray:
    """Segment indices by descending score, ties by position."""
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf)
    return np.argsort(-s, kind="stable")


def top_masks(scores: npt.ArrayLike, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(top-k only, full minus top-k) keep-masks of the ranking."""
    top = ranking(scores)[:k]
    only = np.zeros(len(np.asarray(scores)), dtype=bool)
    only[top] = True
    return only, ~only


def rbo(a: Sequence[int], b: Sequence[int], p: float) -> float:
    """Extrapolated rank-biased overlap of two rankings of the same items (1 = identical)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"RBO persistence must be in (0, 1), got {p}")
    k = len(a)
    if k != len(b) or k == 0:
        raise ValueError("RBO needs two non-empty rankings of the same length")
    seen_a: set[int] = set()
    seen_b: set[int] = set()
    overlap, total = 0, 0.0
    for d in range(1, k + 1):
        x, y = a[d - 1], b[d - 1]
        overlap += (x == y) + (x in seen_b) + (y in seen_a)
        seen_a.add(x)
        seen_b.add(y)
        total += overlap / d * p**d
    return float(overlap / k * p**k + (1 - p) / p * total)


def util_rmi(
    acc_none: float, acc_full: float, acc_top: float, acc_rm: float
) -> tuple[float, float, float]:
    """(Util, RmI, BCS); NaN when the full context gains nothing (Δ <= 0)."""
    delta = acc_full - acc_none
    if not delta > 0:
        return float("nan"), float("nan"), float("nan")
    util = (acc_top - acc_none) / delta
    rmi = (acc_full - acc_rm) / delta
    return float(util), float(rmi), float(np.sqrt(max(util, 0.0) * max(rmi, 0.0)))


def aps(bcs: float, cac: float) -> float:
    """Harmonic mean of BCS and CAC."""
    if not (np.isfinite(bcs) and np.isfinite(cac)):
        return float("nan")
    return 0.0 if bcs + cac == 0 else float(2 * bcs * cac / (bcs + cac))


def contrastive_labels(scores: npt.ArrayLike, p_empty: float) -> np.ndarray:
    """ContextCite / TracLLM's interface: True = in-context (ICL), False = in-weight (IW)."""
    pos = np.maximum(np.nan_to_num(np.asarray(scores, dtype=np.float64)), 0.0)
    icl = pos / pos.max() if pos.max() > 0 else np.zeros_like(pos)
    iw = p_empty * (1.0 - icl)
    return (icl > 0) & (icl >= iw)


def mass_labels(scores: npt.ArrayLike) -> np.ndarray:
    """AttriBoT / TokenSHAP's interface: ICL when a segment holds at least a uniform share."""
    pos = np.maximum(np.nan_to_num(np.asarray(scores, dtype=np.float64)), 0.0)
    total = pos.sum()
    if total <= 0:
        return np.zeros(len(pos), dtype=bool)
    return pos / total >= 1.0 / len(pos)


def source_labels(scores: npt.ArrayLike, interface: str, p_empty: float) -> np.ndarray:
    if interface == "contrastive":
        return contrastive_labels(scores, p_empty)
    if interface == "mass":
        return mass_labels(scores)
    raise ValueError(f"unknown interface {interface!r}")


def lds(scores: npt.ArrayLike, masks: np.ndarray, logp: npt.ArrayLike) -> float:
    """Spearman of the surrogate (sum of kept scores) with the actual log-probabilities."""
    pred = np.asarray(masks, dtype=np.float64) @ np.asarray(scores, dtype=np.float64)
    y = np.asarray(logp, dtype=np.float64)
    if np.ptp(pred) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(pred, y).statistic)
