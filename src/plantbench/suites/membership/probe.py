"""CRM's latent trajectory shift and the classifiers, in scikit-learn's estimator style.

:class:`LatentShift` fits, on the calibration samples' displacements d_l = h_l^c - h_l^0 (the
last token's hidden state at layer l with the document in context minus without it):

- the target layers: those whose displacements carry more than ``pca_ratio`` of the variance
  summed over layers (a layer whose displacement is always ~0, such as the embeddings of the same
  last token, carries none);
- per target layer the PC1 direction v_l (SVD of the centred displacements; the sign makes its
  largest component positive) and the supervised mean-difference direction (members' mean
  displacement minus non-members', unit length);

and transforms displacements into the seed's signed projections LTS_l = <d_l, v_l>, PC1 first,
then supervised. :func:`oof_scores` gives out-of-fold probabilities under stratified k-fold
cross-validation (logistic regression or xgboost), :func:`auc_interval` the ROC-AUC with a
bootstrap interval.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plantbench.errors import ConfigError
from plantbench.grading.metrics import percentile_interval
from plantbench.rng import rng


class LatentShift:
    def __init__(self, pca_ratio: float = 0.01):
        self.pca_ratio = pca_ratio

    def fit(self, d: np.ndarray, member: np.ndarray) -> LatentShift:
        d = np.asarray(d, dtype=np.float64)
        member = np.asarray(member, dtype=bool)
        var = d.var(axis=0).sum(axis=1)  # [L + 1]
        total = var.sum()
        self.variance_ratio_ = var / total if total > 0 else np.zeros_like(var)
        self.layers_ = np.flatnonzero(self.variance_ratio_ > self.pca_ratio)
        if not len(self.layers_):
            raise ConfigError(
                f"config key 'membership.pca_ratio' = {self.pca_ratio}: no layer's calibration "
                f"displacements carry that share of the variance (largest "
                f"{self.variance_ratio_.max():.3g}); lower membership.pca_ratio"
            )
        self.pc1_ = np.stack([_pc1(d[:, layer]) for layer in self.layers_])
        self.sup_ = np.stack([_mean_difference(d[:, layer], member) for layer in self.layers_])
        return self

    def transform(self, d: np.ndarray) -> np.ndarray:
        """``[n, 2 * len(layers_)]``: LTS along PC1 at each target layer, then supervised."""
        sel = np.asarray(d, dtype=np.float64)[:, self.layers_]  # [n, k, dim]
        return np.concatenate(
            [np.einsum("nkd,kd->nk", sel, self.pc1_), np.einsum("nkd,kd->nk", sel, self.sup_)],
            axis=1,
        )


def _pc1(x: np.ndarray) -> np.ndarray:
    c = x - x.mean(axis=0)
    if not np.any(c):
        return np.zeros(x.shape[1])
    v = np.linalg.svd(c, full_matrices=False)[2][0]
    return v if v[np.argmax(np.abs(v))] > 0 else -v


def _mean_difference(x: np.ndarray, member: np.ndarray) -> np.ndarray:
    v = x[member].mean(axis=0) - x[~member].mean(axis=0)
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


def classifier(kind: str, seed: int) -> Any:
    """A fresh classifier: ``lr`` (standardized logistic regression) or ``xgb`` (xgboost)."""
    if kind == "lr":
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    if kind == "xgb":
        from xgboost import XGBClassifier

        return XGBClassifier(
            n_estimators=200,
            max_depth=3,
            learning_rate=0.05,
            n_jobs=1,
            random_state=seed,
            tree_method="exact",
        )
    raise ValueError(f"unknown classifier {kind!r}")


def oof_scores(x: np.ndarray, y: np.ndarray, kind: str, folds: int, seed: int) -> np.ndarray:
    """Out-of-fold P(member) of every sample under stratified k-fold cross-validation."""
    from sklearn.model_selection import StratifiedKFold

    x = np.asarray(x, dtype=np.float64).reshape(len(y), -1)
    out = np.zeros(len(y))
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(x, y):
        model = classifier(kind, seed).fit(x[train], y[train])
        out[test] = model.predict_proba(x[test])[:, 1]
    return out


def auc(y: np.ndarray, s: np.ndarray) -> float:
    """ROC-AUC (ties count half); NaN when one class is missing."""
    y = np.asarray(y, dtype=bool)
    if y.all() or not y.any():
        return float("nan")
    from scipy.stats import rankdata

    r = rankdata(np.asarray(s, dtype=np.float64))
    n1, n0 = int(y.sum()), int((~y).sum())
    return float((r[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def auc_interval(
    y: np.ndarray, s: np.ndarray, n_boot: int, seed: int, tag: str
) -> tuple[float, float, float]:
    """AUC and its 95% bootstrap interval (samples resampled within each class)."""
    y = np.asarray(y, dtype=bool)
    s = np.asarray(s, dtype=np.float64)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    if not len(pos) or not len(neg):
        return float("nan"), float("nan"), float("nan")
    g = rng(seed, "membership-bootstrap", tag)
    boots = []
    for _ in range(n_boot):
        idx = np.concatenate([g.choice(pos, len(pos)), g.choice(neg, len(neg))])
        boots.append(auc(y[idx], s[idx]))
    return (auc(y, s), *percentile_interval(boots))
