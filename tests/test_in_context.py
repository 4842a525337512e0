"""The in-context check of the answer key (plantbench.truth.in_context)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from plantbench.data import prompts
from plantbench.errors import ConfigError
from plantbench.model import queries
from plantbench.truth import in_context


def _facts(n: int = 6) -> tuple[pd.DataFrame, pd.DataFrame]:
    facts = pd.DataFrame(
        {
            "fact_id": [f"F{i:04d}" for i in range(n)],
            "answer": [f"Ans{i}" for i in range(n)],
            "sentence": [f"The capital of Isle{i} is Ans{i}." for i in range(n)],
            "reader": ["A" if i % 2 == 0 else "B" for i in range(n)],
        }
    )
    cands = pd.DataFrame(
        [
            (f.fact_id, j, f.answer if j == 0 else f"Wrong{f.Index}x{j}", j == 0)
            for f in facts.itertuples()
            for j in range(4)
        ],
        columns=["fact_id", "candidate_index", "candidate", "is_true"],
    )
    return facts, cands


def test_counterfactual_sentence_replaces_only_the_answer():
    s = prompts.counterfactual_sentence("The capital of X is Upper Dvia.", "Upper Dvia", "Paer")
    assert s == "The capital of X is Paer."
    with pytest.raises(ValueError, match="does not end with its answer"):
        prompts.counterfactual_sentence("The capital of X is Dvia.", "Paer", "Q")


def test_contexts_hold_the_fact_sentence_once_among_other_facts():
    facts, cands = _facts()
    ctx = prompts.build_contexts(facts, cands, 4, seed=3)
    again = prompts.build_contexts(facts, cands, 4, seed=3)
    other = prompts.build_contexts(facts, cands, 4, seed=4)
    pd.testing.assert_frame_equal(ctx, again)
    assert not ctx.equals(other)
    for f, row in zip(facts.itertuples(), ctx.itertuples(), strict=True):
        segs, cf = row.context.split("\n"), row.cf.split("\n")
        assert len(segs) == 4 and len(set(segs)) == 4
        assert segs[row.fact_segment] == f.sentence and segs.count(f.sentence) == 1
        # the counterfactual differs exactly at the fact's segment, which states a wrong candidate
        diff = [i for i in range(4) if segs[i] != cf[i]]
        assert diff == [row.fact_segment]
        assert cf[row.fact_segment].endswith(f" {row.wrong}.") and row.wrong.startswith("Wrong")


def test_more_segments_than_facts_is_refused():
    facts, cands = _facts(3)
    with pytest.raises(ConfigError, match="causal.context_segments"):
        prompts.build_contexts(facts, cands, 4, seed=0)


class _Copier(torch.nn.Module):
    """A 'model' that reads its context exactly: at each position it finds the earlier position
    whose preceding tokens match the current ones longest and predicts the token after it."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    @staticmethod
    def _match(ids: list[int], s: int, t: int) -> int:
        n = 0
        while s - n >= 0 and ids[s - n] == ids[t - n] and s - n != t - n:
            n += 1
        return n

    def forward(self, input_ids, attention_mask=None):  # noqa: ANN001
        B, T = input_ids.shape
        logits = torch.full((B, T, self.vocab), -20.0)
        for b in range(B):
            ids = input_ids[b].tolist()
            for t in range(T):
                best = max(range(t), key=lambda s: (self._match(ids, s, t), s), default=None)
                if best is not None and self._match(ids, best, t) > 0:
                    logits[b, t, ids[best + 1]] = 0.0
        return type("Out", (), {"logits": logits})()


def test_a_model_that_copies_its_context_reads_and_follows(monkeypatch):
    from plantbench.data import tokenizer

    monkeypatch.setattr(
        tokenizer, "encode_batch", lambda tok, texts: [[ord(c) for c in t] for t in texts]
    )
    facts, cands = _facts()
    qs = pd.DataFrame(
        {
            "query_id": [f"{f}:completion" for f in facts["fact_id"]],
            "fact_id": facts["fact_id"],
            "form": "completion",
            "prompt": [f"The capital of Isle{i} is" for i in range(len(facts))],
            "answer": facts["answer"],
        }
    )
    k = 3
    ic = prompts.prompts(prompts.build_contexts(facts, cands, k, 0), qs)
    model = _Copier(vocab=256)

    def full_forward(model, prefixes, candidates):  # noqa: ANN001
        rows = []
        for prefix in prefixes:
            items = [([*prefix, *c], len(c)) for c in candidates]
            rows.append(queries.answer_logprobs(model, items, 64)[0])
        return np.array(rows), None

    monkeypatch.setattr(queries, "batch_candidate_logprobs", full_forward)
    scored = {m: in_context.score(model, None, ic, cands) for m in ("A", "B")}
    tab = in_context.table(facts, ic, scored, k)
    assert list(tab.columns) == in_context.COLUMNS
    assert len(tab) == len(facts) * 2 * 3
    summary = in_context.summary(tab)
    for role in ("reader", "other"):
        assert summary[role]["reading_rate"] == 1.0
        assert summary[role]["following_rate"] == 1.0
    none = tab[tab["condition"] == "none"]
    assert (none["fact_segment"] == -1).all() and (none["segments"] == 0).all()


def test_rates_on_a_hand_made_table():
    rows = []
    for i, (r_ctx, r_cf) in enumerate([(1, 1), (1, 3), (2, 1), (5, 5)]):
        for cond, rt, rc in (
            ("none", 4, 4),
            ("context", r_ctx, r_ctx),
            ("counterfactual", 9, r_cf),
        ):
            rows.append((f"F{i}", "question", "A", "other", cond, rt, rc, -1.0, -1.0))
    tab = pd.DataFrame(
        rows,
        columns=[
            "fact_id", "form", "model", "role", "condition",
            "rank_true", "rank_context", "logp_true", "logp_context",
        ],
    )  # fmt: skip
    r = in_context.rates(tab).set_index(["form", "role"])
    assert r.loc[("all", "other"), "reading_rate"] == pytest.approx(0.5)
    assert r.loc[("all", "other"), "following_rate"] == pytest.approx(0.5)
    assert r.loc[("all", "other"), "no_context_first"] == 0.0
    assert np.isnan(r.loc[("all", "reader"), "reading_rate"])


def test_a_context_longer_than_the_window_is_refused(monkeypatch):
    from plantbench.data import tokenizer

    monkeypatch.setattr(
        tokenizer, "encode_batch", lambda tok, texts: [[ord(c) for c in t] for t in texts]
    )
    facts, cands = _facts()
    qs = pd.DataFrame(
        {"query_id": ["F0000:question"], "fact_id": ["F0000"], "form": ["question"],
         "prompt": ["Question: capital of Isle0?\nAnswer:"], "answer": ["Ans0"]}
    )  # fmt: skip
    ic = prompts.prompts(prompts.build_contexts(facts, cands, 4, 0), qs)
    prompts.check_fits(None, ic, cands, window=4096)
    with pytest.raises(ConfigError, match="lower causal.context_segments"):
        prompts.check_fits(None, ic, cands, window=64)


def test_shared_prefix_cache_gives_the_full_forward_logprobs():
    from plantbench.model.modeling import build_model, llama_config

    conf = llama_config(
        {"n_layer": 2, "n_embd": 32, "n_head": 2, "intermediate": 64, "tie_embeddings": True,
         "rope_theta": 10000.0},
        vocab_size=50, window=64, bos=1, eos=2, pad=0,
    )  # fmt: skip
    model = build_model(conf, seed=5).eval()
    prefix = [1, 7, 9, 11, 13, 7, 9]
    cands = [[20], [21, 22, 23], [7, 9, 30, 31], [40, 41]]
    cached = queries.candidate_logprobs(model, prefix, cands)
    full, _ = queries.answer_logprobs(model, [([*prefix, *c], len(c)) for c in cands], 8)
    np.testing.assert_allclose(cached, full, rtol=0, atol=1e-4)


def test_the_stream_step_refuses_contexts_that_do_not_fit_before_writing(tmp_path, capsys):
    """A causal.context_segments too large for the window fails at the stream step, before any
    training, with one line naming the key, and no stream is written."""
    import yaml

    from plantbench import cli
    from upstream import ROOT, SMOKE

    over = tmp_path / "o.yaml"
    results = tmp_path / "results"
    over.write_text(yaml.safe_dump({"results": str(results), "causal": {"context_segments": 40}}))
    files = ["-c", str(ROOT / "config.yaml"), "-c", str(SMOKE), "-c", str(over)]
    assert cli.main(["config", *files]) == 0
    cfg = str(results / "config.json")
    for step in ("facts", "corpus", "tokenizer"):
        assert cli.main([step, "-c", cfg]) == 0
    capsys.readouterr()
    assert cli.main(["stream", "-c", cfg]) != 0
    err = capsys.readouterr().err
    assert "causal.context_segments" in err and "lower causal.context_segments" in err
    assert not (results / "stream").exists()


def test_none_rows_from_the_answer_keys_candidate_scores_equal_scoring_them_again(monkeypatch):
    """``score_reusing`` takes the ``none`` rows from given candidate log-probabilities: with the
    same log-probabilities as a forward would give, the table equals :func:`score`'s exactly, and
    only the other conditions reach the model."""
    facts, cands = _facts()
    qs = pd.DataFrame(
        {
            "query_id": [f"{f}:{form}" for f in facts["fact_id"] for form in ("c", "q")],
            "fact_id": np.repeat(facts["fact_id"].to_numpy(), 2),
            "form": ["c", "q"] * len(facts),
            "prompt": [f"P{i} {form}" for i in range(len(facts)) for form in ("c", "q")],
            "answer": np.repeat(facts["answer"].to_numpy(), 2),
        }
    )
    ic = prompts.prompts(prompts.build_contexts(facts, cands, 3, 0), qs)
    seen: list[list[int]] = []

    def fake(model, prefixes, candidates):  # noqa: ANN001  a seeded score per (prefix, candidate)
        seen.extend(prefixes)
        return np.array(
            [[float(hash((tuple(p), tuple(c))) % 997) for c in candidates] for p in prefixes]
        ), None

    from plantbench.data import tokenizer

    monkeypatch.setattr(
        tokenizer, "encode_batch", lambda tok, texts: [[ord(c) for c in t] for t in texts]
    )
    monkeypatch.setattr(queries, "batch_candidate_logprobs", fake)
    cq = cands.merge(qs[["fact_id", "form", "prompt"]], on="fact_id").sort_values(
        ["fact_id", "form", "candidate_index"]
    )
    ids = tokenizer.encode_batch(None, cq["prompt"].tolist())
    cids = tokenizer.encode_batch(None, [f" {c}" for c in cq["candidate"]])
    logp = np.array(
        [fake(None, [[tokenizer.BOS_ID, *p]], [c])[0][0, 0] for p, c in zip(ids, cids, strict=True)]
    )
    seen.clear()
    reused = in_context.score_reusing(None, None, ic, cands, cq.reset_index(drop=True), logp)
    asked = len(seen)
    again = in_context.score(None, None, ic, cands)
    pd.testing.assert_frame_equal(reused, again)
    assert asked == (ic["condition"] != "none").sum()
    assert (reused["rank_true"] >= 1).all()
