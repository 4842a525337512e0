"""Our AT2 (the context suite's ``at2``) against the AT2 package (MadryLab, ``at2`` 0.0.1, installed
without its dependencies by the ``peers`` step: what ``at2.attribution`` imports, torch,
transformers, datasets, huggingface_hub, tqdm, pandas, nltk and spacy, the rest of the extra
already brings). Skipped when the package is not installed.

Both learn one weight per attention head, a segment's score being the heads' attention on it
weighted by them; both learn the weights from ablations of training contexts. The package's
trainer (``LinearScoreEstimatorTrainer.train``: Adam on the negative Pearson correlation between
the surrogate and the ablation outcomes, per context, a batch of contexts per step, cosine
schedule, weights L1-normalised at the end) is given here exactly what our ``at2`` fits: per
context the heads' attention on each segment with the full context (``head_features``), the
ablation masks and the response's logit-probability under each (its store takes the masks as
+-1, ``masks * 2 - 1``, as its ``compute_features_and_outputs_for_example`` does: a shift and a
scale of the 0/1 design, which a correlation does not see). Ours fits a closed-form ridge on the
centred squared error instead. Both are fitted on one fold of contexts and score the other's, as
``at2.learn`` cross-fits.

Measured (Spearman of a context's segment scores, ours against the package's, mean over the 24
held-out contexts of 4 segments and 32 ablations each; cosine of the two weight vectors, per
fold):

* outcomes additive in the attention (planted head weights): at a vanishing ridge (``at2_ridge``
  1e-9: plain least squares) and at the suite's default (1e-4 x the mean diagonal of the normal
  equations) both recover the planted weights, cosines 0.99998 and 0.99997, Spearman 0.99;
* a random tiny Llama's own attention and ablations (our ``at2.score`` on the suite's oracle):
  vanishing ridge, cosines 0.78 and 0.96, Spearman 0.79; the suite's default, cosines 0.89 and
  0.98, Spearman 0.78. Its heads' features are nearly collinear (the normal equations'
  eigenvalues: 120 along the uniform direction, under 1e-3 across it). The suite's first default,
  1 x the mean diagonal (30), left ours at the uniform weights, the plain attention mass
  (cosines 0.01 and 0.02, Spearman 0.13), while the package's correlation fit (no ridge) follows
  the small directions; over ridges 1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1 the Spearman was 0.79,
  0.78, 0.78, 0.28, 0.23, 0.13, hence the default 1e-4.

The package's trainer runs here with 300 steps at learning rate 1e-2 and every training context
in each batch (its defaults: 1,000 steps at 1e-3, batches of 512 contexts, recover the planted
weights at cosine 0.9985 against 0.99997 here); its sampling is seeded (``np.random``) and restored.
"""

from __future__ import annotations

import importlib.util
import string
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from tokenizers import Tokenizer, models

from plantbench.suites.context.methods import at2
from plantbench.suites.context.oracle import Oracle
from plantbench.suites.context.settings import DEFAULTS
from tiny_models import tiny_llama

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("at2") is None, reason="the at2 package is not installed (peers)"
)

K, ABLATIONS, CONTEXTS = 4, 32, 24
RIDGE = DEFAULTS["at2_ridge"]  # the suite's default at2_ridge
LEAST_SQUARES = 1e-9  # a vanishing ridge: the plain least-squares fit


def _package() -> Any:
    """``at2.attribution``, imported without the ``nltk.download("punkt_tab")`` that
    ``at2.utils`` runs at import (a network fetch for sentence splitting, unused here)."""
    if "at2.attribution" not in sys.modules:
        import nltk

        download = nltk.download
        nltk.download = lambda *a, **k: True
        try:
            import at2.attribution  # noqa: F401
        finally:
            nltk.download = download
    return sys.modules["at2.attribution"]


def _theirs(records: list[at2.Record], layers: int, heads: int, tmp: Path) -> np.ndarray:
    """The package's trainer on these records: its L1-normalised weights, one per head."""
    pkg = _package()
    trainer = pkg.LinearScoreEstimatorTrainer(
        tmp,
        dataset=list(range(len(records))),
        model=None,
        tokenizer=None,
        task_from_example=None,
        feature_extractor=pkg.AttentionFeatureExtractor(layers, heads),
        num_masks=ABLATIONS,
    )
    trainer._task_datas = {i: {"num_sources": K, "num_targets": 1} for i in range(len(records))}
    features, outputs, completed, _ = trainer.get_store_for_job(job_index=0, num_jobs=1)
    for i, r in enumerate(records):
        signed = r.masks.astype(np.float64) * 2 - 1
        features[i] = signed @ r.features.T  # one target per context: row i
        outputs[i] = r.target
        completed[i] = True
    for a in (features, outputs, completed):
        a.flush()
    state = np.random.get_state()
    np.random.seed(0)  # its trainer samples the contexts of a batch with np.random
    try:
        est = trainer.train(
            num_iterations=300,
            learning_rate=1e-2,
            batch_size=len(records),
            device="cpu",
            print_every=10**9,
        )
    finally:
        np.random.set_state(state)
    return est.linear.weight.detach().double().numpy()[0]


def _compare(records: dict[str, at2.Record], layers: int, heads: int, tmp: Path, ridge: float):
    """Cross-fitted on two folds as ``at2.learn`` does: ours (``at2.learn``) and the package's
    segment scores of every context, and the cosine of the two weight vectors of each fold."""
    names = sorted(records)
    folds = {q: i % 2 for i, q in enumerate(names)}
    ours = at2.learn(records, folds, SimpleNamespace(at2_ridge=ridge))
    theirs, cosines = {}, []
    for fold in (0, 1):
        train = [records[q] for q in names if folds[q] != fold]
        theta = _theirs(train, layers, heads, tmp / f"fold{fold}")
        mine = at2.fit(train, ridge, layers * heads)
        cosines.append(theta @ mine / np.linalg.norm(theta) / np.linalg.norm(mine))
        for q in names:
            if folds[q] == fold:
                theirs[q] = records[q].features.T @ theta
    rho = [spearmanr(ours[q], theirs[q])[0] for q in names]
    return float(np.nanmean(rho)), cosines


def test_the_package_learns_our_weights_when_outcomes_are_additive_in_attention(tmp_path):
    """Outcomes = the kept segments' attention weighted by planted head weights, plus each
    context's own offset and a little noise: with a vanishing ridge and with the suite's both
    recover the weights (measured: cosines 0.99998, 0.99997; Spearman 0.99)."""
    gen = np.random.default_rng(0)
    layers, heads = 2, 2
    theta = np.array([2.0, 0.5, -1.0, 1.5])
    records = {}
    for q in range(CONTEXTS):
        feats = gen.dirichlet(np.ones(K + 1), size=layers * heads)[:, :K]  # attention shares
        masks = gen.random((ABLATIONS, K)) < 0.5
        target = masks @ (feats.T @ theta) + gen.normal() * 3 + gen.normal(size=ABLATIONS) * 0.05
        records[f"q{q:02d}"] = at2.Record(feats, masks, target)
    rho, cosines = _compare(records, layers, heads, tmp_path / "ls", LEAST_SQUARES)
    rho_d, cosines_d = _compare(records, layers, heads, tmp_path / "ridge", RIDGE)
    print(f"planted: Spearman {rho:.3f} / {rho_d:.3f} (ridge), cosines {cosines} / {cosines_d}")
    assert min(cosines) > 0.999 and rho > 0.95
    assert min(cosines_d) > 0.999 and rho_d > 0.95


def _contexts(gen: np.random.Generator) -> list[tuple[list[str], str]]:
    letters = string.ascii_lowercase[:12]

    def word() -> str:
        return "".join(gen.choice(list(letters), size=int(gen.integers(2, 5))))

    return [
        ([" ".join(word() for _ in range(3)) for _ in range(K)], word() + "?")
        for _ in range(CONTEXTS)
    ]


def test_the_package_and_ours_rank_segments_alike_on_a_tiny_models_ablations(tmp_path):
    """A random tiny Llama's own attention and ablation outcomes (our ``at2.score`` on the
    suite's oracle), fitted both ways (measured: Spearman 0.79 with a vanishing ridge, 0.78 with
    the suite's: see the module docstring)."""
    chars = sorted(set(string.ascii_lowercase[:12] + " ?\n"))
    tok = Tokenizer(models.BPE(vocab={c: i + 3 for i, c in enumerate(chars)}, merges=[]))
    model = tiny_llama(n_layer=2, vocab=32, window=128, seed=0)
    model.config._attn_implementation = "sdpa"
    gen = np.random.default_rng(0)
    settings = SimpleNamespace(ablations=ABLATIONS, at2_ridge=RIDGE)
    records = {}
    torch.manual_seed(0)
    for q, (segments, query) in enumerate(_contexts(gen)):
        oracle = Oracle(model, tok, segments, query, [[5, 6], [7, 8]], target=0, batch=ABLATIONS)
        records[f"q{q:02d}"] = at2.score(oracle, settings, np.random.default_rng(q))
    rho, cosines = _compare(records, 2, 2, tmp_path / "ls", LEAST_SQUARES)
    rho_d, cosines_d = _compare(records, 2, 2, tmp_path / "ridge", RIDGE)
    print(f"tiny model: Spearman {rho:.3f} / {rho_d:.3f} (ridge), cosines {cosines} / {cosines_d}")
    assert rho > 0.6 and rho_d > 0.6
