"""The context suite's attention methods: the oracle's attention read-out on a real (tiny) model,
AT2's features, fit and cross-fitting, and AttnTrace's top-K subsampled attention."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from plantbench.data.tokenizer import BOS_ID
from plantbench.suites.context import attribute
from plantbench.suites.context.methods import at2, attntrace, registry
from plantbench.suites.context.oracle import Oracle
from tiny_models import tiny_llama

SEGMENTS = ["the sky is red", "cats eat fish", "a b c"]
QUERY = "sky colour?"


def _char_tokenizer() -> Tokenizer:
    chars = sorted(set("".join(SEGMENTS) + QUERY + "\n"))
    return Tokenizer(models.BPE(vocab={c: i + 3 for i, c in enumerate(chars)}, merges=[]))


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    tok = _char_tokenizer()
    model = tiny_llama(n_layer=2, vocab=64, window=128, seed=0)
    model.config._attn_implementation = "sdpa"
    return Oracle(model, tok, SEGMENTS, QUERY, [[7, 8, 9], [6, 7]], target=0)


def test_attention_rows_are_the_response_positions_and_owners_the_segments_tokens(oracle):
    mask = np.array([True, False, True])
    att, owner = oracle.attention(mask)
    n_prompt = len(oracle.tok.encode("the sky is red\na b c\nsky colour?").ids)
    assert att.shape == (2, 2, 3, 1 + n_prompt + 2)  # [L, H, response, <bos> prompt resp[:-1]]
    # softmax rows over the causal past: every row sums to 1
    assert np.allclose(att.sum(-1), 1.0)
    # the memo holds these rows only: not a view of the forward's [L, H, S, S] weights (at the
    # paper's 12 x 12 heads and 1,056 queries those would be about 100 GB)
    base = att.base
    held = base.untyped_storage().nbytes() if isinstance(base, torch.Tensor) else att.nbytes
    assert (base is None or isinstance(base, torch.Tensor)) and held == att.nbytes
    # owners: the kept segments' characters, in the full context's numbering
    assert (owner == 0).sum() == len(SEGMENTS[0]) and (owner == 2).sum() == len(SEGMENTS[2])
    assert (owner == 1).sum() == 0 and owner[0] == -1
    # the same weights as one eager forward of the whole sequence
    ids = [BOS_ID, *oracle.tok.encode("the sky is red\na b c\nsky colour?").ids, 7, 8]
    oracle.model.config._attn_implementation = "eager"
    with torch.no_grad():
        out = oracle.model(input_ids=torch.tensor([ids]), output_attentions=True)
    oracle.model.config._attn_implementation = "sdpa"
    want = torch.stack([a[0] for a in out.attentions]).double().numpy()[:, :, n_prompt:]
    assert np.allclose(att, want, atol=1e-6)
    assert oracle.model.config._attn_implementation == "sdpa"  # the kernel is restored
    before = oracle.attention_passes
    oracle.attention(mask)
    assert oracle.attention_passes == before  # memoized


def test_at2_head_features_sum_a_segments_tokens_and_average_the_positions():
    att = np.zeros((1, 2, 2, 5))
    att[0, 0, 0] = [0.1, 0.2, 0.3, 0.4, 0.0]
    att[0, 0, 1] = [0.0, 0.4, 0.4, 0.2, 0.0]
    att[0, 1, :, 4] = 1.0
    owner = np.array([-1, 0, 0, 1, 2])
    f = at2.head_features(att, owner, 3)
    assert np.allclose(f[0], [0.65, 0.3, 0.0]) and np.allclose(f[1], [0.0, 0.0, 1.0])


def _records(theta: np.ndarray, n: int, k: int, seed: int) -> dict[str, at2.Record]:
    gen = np.random.default_rng(seed)
    out = {}
    for q in range(n):
        feats = gen.random((len(theta), k))
        masks = gen.random((40, k)) < 0.5
        out[f"q{q}"] = at2.Record(feats, masks, masks @ (feats.T @ theta) + gen.normal() * 5)
    return out


def test_at2_recovers_the_head_weights_of_an_additive_model_whatever_each_contexts_offset():
    theta = np.array([2.0, -1.0, 0.0, 0.5])
    recs = list(_records(theta, 20, 5, 0).values())
    assert at2.fit(recs, 1e-9, 4) == pytest.approx(theta, abs=1e-5)
    assert np.allclose(at2.fit([], 1.0, 4), 0.25)  # no training data: the plain attention mass


def test_at2_scores_a_context_only_with_weights_from_the_other_fold():
    theta = np.array([1.0, 3.0])
    recs = _records(theta, 8, 3, 1)
    folds = {q: i % 2 for i, q in enumerate(recs)}
    st = SimpleNamespace(at2_ridge=1e-9)
    base = at2.learn(recs, folds, st)
    # corrupt one query's own labels: its scores (and its fold's) do not move
    bad = dict(recs)
    r = recs["q0"]
    bad["q0"] = at2.Record(r.features, r.masks, -100 * r.target)
    again = at2.learn(bad, folds, st)
    for q in recs:
        if folds[q] == folds["q0"]:
            assert np.allclose(again[q], base[q]), q
    assert not np.allclose(again["q1"], base["q1"])  # the other fold learned from q0
    assert np.allclose(base["q0"], r.features.T @ theta, atol=1e-4)


def test_folds_keep_a_facts_query_forms_together():
    st = SimpleNamespace(seed=7)
    fact_of = {f"F{i}:{form}": f"F{i}" for i in range(30) for form in ("a", "b")}
    split = attribute.folds(st, fact_of)
    assert all(split[f"F{i}:a"] == split[f"F{i}:b"] for i in range(30))
    assert set(split.values()) == {0, 1}
    assert attribute.folds(st, fact_of) == split  # seeded


def test_attntrace_sums_the_top_k_tokens_and_averages_over_subsamples():
    tokens = np.array([0.0, 0.5, 0.1, 0.1, 0.1, 0.3, 0.2])
    owner = np.array([-1, 0, 1, 1, 1, 0, 2])
    s = attntrace.segment_scores(tokens, owner, 4, top=2)
    assert np.allclose(s[:3], [0.8, 0.2, 0.2]) and np.isnan(s[3])
    masks = attntrace.subsample_masks(4, 5, 0.5, np.random.default_rng(0))
    assert masks.shape == (6, 4) and masks[0].all()


class AttentionOracle:
    """Every response position attends only to the tokens of segment ``hot`` (when kept)."""

    def __init__(self, k: int, hot: int, tokens: int = 3):
        self.k, self.hot, self.n = k, hot, tokens

    def attention(self, mask):
        owner = np.concatenate([[-1], np.repeat(np.arange(self.k), self.n)])
        owner = np.where((owner >= 0) & ~np.append(False, np.repeat(mask, self.n)), -2, owner)
        att = np.full((1, 1, 2, len(owner)), 1e-3)
        att[..., owner == (self.hot if mask[self.hot] else -1)] = 1.0
        return att / att.sum(-1, keepdims=True), owner


def test_attntrace_ranks_the_attended_segment_first():
    st = SimpleNamespace(attntrace_top_k=2, attntrace_subsamples=6, attntrace_keep=0.5)
    s = registry.get("attntrace").fn(AttentionOracle(4, hot=2), st, np.random.default_rng(0))
    assert np.argmax(s) == 2 and np.all(s >= 0)
    assert registry.get("attntrace").interface == "mass"
    assert registry.get("at2").interface == "contrastive" and registry.get("at2").learn
