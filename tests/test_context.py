"""The context suite (seed 000): metrics, methods and the builder on cases with known answers."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from plantbench.errors import ConfigError
from plantbench.model import queries
from plantbench.model.queries import batch_candidate_logprobs
from plantbench.suites import common
from plantbench.suites.context import contexts, metrics
from plantbench.suites.context.methods import attribot, contextcite, registry, tokenshap, tracllm
from plantbench.suites.context.oracle import Oracle, mask_key
from plantbench.suites.context.settings import settings


class FakeOracle:
    """An oracle whose log-probability is a known function of the kept segments."""

    def __init__(self, k, logp_fn, correct_fn=None):
        self.k, self.fn, self.correct_fn, self.calls = k, logp_fn, correct_fn, 0

    def logp(self, masks):
        masks = np.asarray(masks, dtype=bool).reshape(-1, self.k)
        self.calls += len(masks)
        return np.array([self.fn(m) for m in masks], dtype=np.float64)

    def correct(self, masks):
        return np.array([self.correct_fn(m) for m in np.asarray(masks, bool).reshape(-1, self.k)])

    def full(self):
        return np.ones(self.k, dtype=bool)

    def empty(self):
        return np.zeros(self.k, dtype=bool)


ST = SimpleNamespace(
    ablations=256,
    lasso_alpha=1e-4,
    shapley_permutations=24,
    tracllm_top=2,
    tracllm_loo_weight=2.0,
)


# ---- RBO ----------------------------------------------------------------------------------


def test_rbo_identical_is_one_and_reversed_matches_closed_form():
    for k in (2, 4, 6):
        for p in (0.5, 0.8):
            assert metrics.rbo(list(range(k)), list(range(k)), p) == pytest.approx(1.0)
    # reversed [0..3] vs [3..0]: overlaps X_d = 0, 0, 2, 4 at depths 1..4
    p, x = 0.5, [0, 0, 2, 4]
    closed = x[3] / 4 * p**4 + (1 - p) / p * sum(x[d] / (d + 1) * p ** (d + 1) for d in range(4))
    assert metrics.rbo([0, 1, 2, 3], [3, 2, 1, 0], p) == pytest.approx(closed)
    assert metrics.rbo([0, 1, 2, 3], [3, 2, 1, 0], p) < 1
    with pytest.raises(ValueError):
        metrics.rbo([0, 1], [0, 1], 1.0)


# ---- BCS / APS / interfaces -----------------------------------------------------------------


def test_oracle_attribution_of_the_only_informative_segment_gives_util_rmi_one():
    k, informative = 4, 2
    rows = []
    for _ in range(10):
        o = FakeOracle(k, lambda m: 0.0, lambda m: bool(m[informative]))
        scores = np.eye(k)[informative]  # the oracle attribution
        only, rm = metrics.top_masks(scores, 1)
        rows.append(
            (o.correct(o.empty())[0], o.correct(o.full())[0], o.correct(only)[0], o.correct(rm)[0])
        )
    acc = np.mean(np.array(rows, dtype=float), axis=0)
    util, rmi, bcs = metrics.util_rmi(*acc)
    assert (util, rmi, bcs) == (1.0, 1.0, 1.0)
    assert metrics.aps(bcs, 1.0) == 1.0
    assert np.isnan(metrics.util_rmi(0.5, 0.5, 1.0, 0.0)[0])  # no gain from the context


def test_interfaces_label_by_their_rules():
    # mass: shares 0.6, 0.3, 0.1, 0 against the uniform 0.25
    assert metrics.mass_labels([6, 3, 1, -2]).tolist() == [True, True, False, False]
    assert not metrics.mass_labels([-1, 0, -3, 0]).any()
    # contrastive: ICL = s+/max s+ = 1, 0.25, 0; IW = p0 (1 - ICL): ICL wins when p0 is small
    assert metrics.contrastive_labels([4, 1, -1], 0.2).tolist() == [True, True, False]
    assert metrics.contrastive_labels([4, 1, -1], 0.9).tolist() == [True, False, False]


def test_lds_of_an_additive_model_is_one():
    w = np.array([3.0, -1.0, 0.5, 2.0])
    masks = np.array(list(itertools.product([0, 1], repeat=4)), dtype=bool)
    assert metrics.lds(w, masks, masks @ w + 7.0) == pytest.approx(1.0)


# ---- methods ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["contextcite", "attribot", "attribot_pruned", "tracllm", "tokenshap"]
)
def test_a_model_that_ignores_its_context_gets_all_zeros(name):
    o = FakeOracle(4, lambda m: -5.0)
    s = registry.get(name).fn(o, ST, np.random.default_rng(0))
    assert np.allclose(s, 0.0)


def test_leave_one_out_is_the_drop_of_each_removal():
    w = np.array([1.0, -2.0, 0.0, 4.0])
    o = FakeOracle(4, lambda m: float(m @ w) + 0.1 * m.sum() ** 2)
    full = float(w.sum()) + 1.6
    expected = [full - (float(w.sum() - w[i]) + 0.9) for i in range(4)]
    assert attribot.leave_one_out(o) == pytest.approx(expected)
    assert attribot.pruned(o, threshold=0.0) == pytest.approx(expected)  # always refines


def test_contextcite_recovers_a_linear_models_weights():
    w, b = np.array([1.5, 0.0, -0.7, 0.3, 0.0]), -2.0

    def logp(m):  # logit(p) = w . m + b exactly
        t = float(m @ w) + b
        return -np.log1p(np.exp(-t))

    s = contextcite.score(FakeOracle(5, logp), ST, np.random.default_rng(3))
    assert s == pytest.approx(w, abs=0.02)


def test_exact_shapley_is_efficient_and_additive_models_get_their_weights():
    k = 4
    perms = np.array(list(itertools.permutations(range(k))))
    v = lambda m: float(np.sin(m @ np.arange(1, k + 1)) + m[0] * m[3])  # noqa: E731
    phi = tokenshap.shapley(FakeOracle(k, v), perms)
    assert phi.sum() == pytest.approx(v(np.ones(k)) - v(np.zeros(k)))
    w = np.array([0.5, -1.0, 2.0, 0.0])
    assert tokenshap.shapley(FakeOracle(k, lambda m: float(m @ w)), perms) == pytest.approx(w)


def test_tracllm_finds_the_supporting_segment_and_scores_it_by_max_of_loo_and_stc():
    k = 4
    o = FakeOracle(k, lambda m: 3.0 * m[1])
    s = tracllm.search(o, top=1, w_loo=2.0)
    assert int(np.argmax(s)) == 1
    assert s[1] == pytest.approx(6.0)  # max(2 * LOO = 6, STC = 3)


# ---- the oracle against the unbatched scorer -------------------------------------------------


def test_batched_candidates_agree_with_one_prompt_at_a_time():
    from plantbench.model.modeling import build_model, llama_config

    conf = llama_config(
        {
            "n_layer": 2,
            "n_embd": 32,
            "n_head": 4,
            "intermediate": 64,
            "tie_embeddings": True,
            "rope_theta": 10000.0,
        },
        64,
        64,
        bos=0,
        eos=1,
        pad=2,
    )
    model = build_model(conf, seed=1).eval()
    gen = np.random.default_rng(0)
    prefixes = [[0, *gen.integers(5, 64, size=n).tolist()] for n in (7, 19, 3, 12)]
    decoded = model.generate(
        torch.tensor([prefixes[1]]), max_new_tokens=3, do_sample=False, pad_token_id=2
    )[0, len(prefixes[1]) :].tolist()
    cands = [gen.integers(5, 64, size=n).tolist() for n in (1, 3, 2)] + [decoded, decoded[:2]]
    got, greedy = batch_candidate_logprobs(model, prefixes, cands)
    want = np.stack([queries.candidate_logprobs(model, p, cands) for p in prefixes])
    assert got == pytest.approx(want, abs=1e-4)
    assert greedy[1, 3] and greedy[1, 4]  # the greedy continuation (and its first 2 tokens)
    for i, p in enumerate(prefixes):  # greedy = every token is the argmax after the one before
        for j, c in enumerate(cands):
            seq, ok = list(p), True
            for t in c:
                with torch.no_grad():
                    ok &= int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()) == t
                seq.append(t)
            assert greedy[i, j] == ok


def test_the_oracle_memo_runs_each_mask_once():
    assert mask_key(np.array([True, False, True])) == 5

    o = Oracle.__new__(Oracle)
    o.k, o.memo, o.passes, o.target = 2, {0: np.array([0.0, -1.0]), 3: np.array([-2.0, -1.0])}, 0, 0
    o.batch = 4
    assert o.correct(np.array([[False, False], [True, True]])).tolist() == [True, False]
    assert o.passes == 0  # everything was memoized


# ---- the builder and bad input ------------------------------------------------------------


def _facts(n=12):
    rows = []
    for i in range(n):
        rows.append(
            {
                "fact_id": f"F{i:04d}",
                "reader": "AB"[i % 2],
                "n_docs": 4,
                "position": "early",
                "cell": "c",
                "sentence": f"Fact {i} is {i}.",
                "answer": str(i),
            }
        )
    facts = pd.DataFrame(rows)
    causal = pd.DataFrame({"fact_id": facts["fact_id"], "learned": [i % 3 != 2 for i in range(n)]})
    qs = pd.DataFrame(
        {
            "query_id": facts["fact_id"] + ":q",
            "fact_id": facts["fact_id"],
            "form": "q",
            "prompt": "What is it?",
            "answer": facts["answer"],
        }
    )
    return facts, causal, qs


def test_contexts_hold_the_own_fact_once_and_balance_the_readers_labels():
    facts, causal, qs = _facts()
    qdf, seg = contexts.build(facts, causal, qs, 4, seed=7)
    q2, s2 = contexts.build(facts, causal, qs, 4, seed=7)
    pd.testing.assert_frame_equal(seg, s2)  # seeded
    for q in qdf.itertuples():
        s = seg[seg["query_id"] == q.query_id]
        assert s["relevant"].sum() == 1 and len(s) == 4
        assert set(s.loc[s["relevant"], "segment_fact"]) == {q.fact_id}
        if q.learned:
            labels = s[f"label_{q.reader}"]
            assert (labels == "iw").sum() == 2 and (labels == "icl").sum() == 2


def test_bad_context_settings_fail_with_one_line_naming_the_key():
    facts, causal, qs = _facts(3)
    with pytest.raises(ConfigError, match="context.segments"):
        contexts.build(facts, causal, qs, 4, seed=0)
    base = {"seed": 1, "causal": {"context_segments": 4}}
    with pytest.raises(ConfigError, match="context.top_k"):
        settings({**base, "context": {"top_k": [1, 4]}})
    assert settings(base).top_k == (1, 2, 3)
    assert settings({**base, "context": {"segments": 2}}).top_k == (1,)
    with pytest.raises(ConfigError, match="context.methods"):
        registry.get("no_such_method")


def test_a_context_longer_than_the_window_is_refused():
    class Tok:
        def encode_batch_fast(self, texts, add_special_tokens=False):
            return [SimpleNamespace(ids=list(range(len(t)))) for t in texts]  # a token per char

    facts, causal, qs = _facts()
    qdf, seg = contexts.build(facts, causal, qs, 4, seed=7)
    cands = pd.DataFrame({"candidate": ["1", "22"]})
    tok = Tok()
    with pytest.raises(ConfigError, match="context.segments"):
        contexts.check_fits(tok, qdf, seg, cands, window=20)
    contexts.check_fits(tok, qdf, seg, cands, window=10_000)


def test_twins_without_the_in_context_check_are_refused(tmp_path):
    from plantbench import io
    from plantbench.errors import ArtifactError

    causal = tmp_path / "causal"
    causal.mkdir()
    io.write_parquet(causal / "facts.parquet", pd.DataFrame({"fact_id": ["F0"]}))
    io.write_meta(causal, "causal", ["facts.parquet"], config_hash="x")
    paths = SimpleNamespace(causal=causal)
    with pytest.raises(ArtifactError, match="in_context.parquet"):
        common.causal_table(paths)
