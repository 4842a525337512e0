"""Our ContextCite against the ContextCite package (context-cite, the optional ``peers`` extra)
on a trained micro twin: the same ablations give the same targets and the same weights, and our
own ablations rank the segments as the package's do. Skipped when the package is not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from micro_study import build_upstream
from plantbench import artifacts

pytest.importorskip("context_cite")


def _partitioner(segments):
    from context_cite.context_partitioner import BaseContextPartitioner

    class Lines(BaseContextPartitioner):
        """One source per segment; an ablated context keeps the kept segments, each on its own
        line, so the prompt is the suite's ``seg_i \\n ... query``."""

        def __init__(self, segs):
            self.segs = list(segs)
            super().__init__("\n".join(self.segs))

        @property
        def num_sources(self):
            return len(self.segs)

        def split_context(self):
            pass

        def get_source(self, index):
            return self.segs[index]

        def get_context(self, mask=None):
            mask = np.ones(len(self.segs), bool) if mask is None else mask
            return "".join(s + "\n" for s, keep in zip(self.segs, mask, strict=True) if keep)

    return Lines(segments)


@pytest.fixture(scope="module")
def twin():
    from transformers import AutoTokenizer

    from plantbench import io
    from plantbench.data import tokenizer
    from plantbench.model.modeling import load_model

    cfg, p = build_upstream()
    ckpt = artifacts.final_checkpoint_path(p, "A")
    model = load_model(ckpt).eval()
    hf_tok = AutoTokenizer.from_pretrained(ckpt)
    hf_tok.chat_template = "{{ bos_token }}{{ messages[0]['content'] }}"  # no chat markup
    facts = io.read_parquet(p.facts / "facts.parquet")
    qs = io.read_parquet(p.facts / "queries.parquet")
    return model, hf_tok, tokenizer.load(p.tokenizer), facts, qs


def _cases(facts, qs):
    segs = facts["sentence"].tolist()
    q = qs[qs["form"] == "completion"].sort_values("fact_id")
    return [(segs, row.prompt, " " + row.answer) for row in q.itertuples()]


def test_our_contextcite_matches_the_package(twin):
    from context_cite import ContextCiter
    from context_cite.utils import aggregate_logit_probs

    from plantbench.data import tokenizer
    from plantbench.suites.context.methods import contextcite
    from plantbench.suites.context.oracle import Oracle

    model, hf_tok, tok, facts, qs = twin
    agree = []
    for segments, query, response in _cases(facts, qs):
        cc = ContextCiter(
            model,
            hf_tok,
            context="\n".join(segments),
            query=query,
            partitioner=_partitioner(segments),
            prompt_template="{context}{query}",
            num_ablations=32,
            batch_size=1,
        )
        _, prompt_text = cc._get_prompt_ids(return_prompt=True)
        cc._cache["output"] = prompt_text + response  # attribute the true answer, not a generation
        theirs = cc.get_attributions(verbose=False)
        ids = tokenizer.encode_batch(tok, [response])
        oracle = Oracle(model, tok, segments, query, ids, 0)
        masks = np.asarray(cc._masks, dtype=bool)
        target = contextcite.logit_prob(oracle.logp(masks))
        assert target == pytest.approx(aggregate_logit_probs(cc._logit_probs), abs=2e-3)
        ours = contextcite.fit(masks, target, 0.01, len(ids[0]))
        assert ours == pytest.approx(theirs, abs=2e-3)
        # our own seeded masks: the same ranking of the segments?
        own = contextcite.score(
            oracle, type("S", (), {"ablations": 32, "lasso_alpha": 0.01}), np.random.default_rng(0)
        )
        if np.ptp(own) > 0 and np.ptp(theirs) > 0:
            agree.append(spearmanr(own, theirs).statistic)
    print(
        f"context-cite agreement: Spearman of segment scores, own masks vs the package's: "
        f"{np.round(agree, 3).tolist()}"
    )
