"""The in-context prompt format every reader of a context sees: segments one per line, then the
query, no markup (``<bos> seg_1 \\n ... seg_k \\n prompt answer``).

Per fact: k segments (``causal.context_segments``), one of them the fact's own sentence and the
others sentences of other facts, in a seeded order; the counterfactual context states a seeded
wrong candidate in the fact's sentence instead. The causal step's in-context check scores these
prompts (:mod:`plantbench.truth.in_context`), the stream step refuses a config whose prompts
would not fit the twins' window, and the suites build their contexts in the same format.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from plantbench import layout
from plantbench.data import tokenizer
from plantbench.errors import ConfigError
from plantbench.rng import rng

CONDITIONS = ("none", "context", "counterfactual")


def counterfactual_sentence(sentence: str, answer: str, wrong: str) -> str:
    """The fact sentence with its answer replaced (every fact sentence ends ``" answer."``)."""
    tail = f" {answer}."
    if not sentence.endswith(tail):
        raise ValueError(f"fact sentence {sentence!r} does not end with its answer {answer!r}")
    return sentence[: -len(tail)] + f" {wrong}."


def build_contexts(
    facts: pd.DataFrame, candidates: pd.DataFrame, k: int, seed: int
) -> pd.DataFrame:
    """One row per fact: its k segments (true and counterfactual) and where its sentence sits."""
    if k > len(facts):
        raise ConfigError(
            f"config key 'causal.context_segments' = {k} needs {k} facts' sentences but the grid "
            f"has {len(facts)}; lower causal.context_segments"
        )
    sentences = facts["sentence"].to_numpy(dtype=object)
    wrong = candidates[~candidates["is_true"]].groupby("fact_id", sort=True)["candidate"]
    wrong_of = {fid: sorted(g.tolist()) for fid, g in wrong}
    rows = []
    for i, f in enumerate(facts.itertuples(index=False)):
        r = rng(seed, "in_context", f.fact_id)
        others = r.choice(np.delete(np.arange(len(facts)), i), size=k - 1, replace=False)
        at = int(r.integers(k))
        segs = [str(sentences[j]) for j in others]
        cf = str(wrong_of[f.fact_id][int(r.integers(len(wrong_of[f.fact_id])))])
        true_segs = [*segs[:at], f.sentence, *segs[at:]]
        cf_segs = [*segs[:at], counterfactual_sentence(f.sentence, f.answer, cf), *segs[at:]]
        rows.append((f.fact_id, at, cf, "\n".join(true_segs), "\n".join(cf_segs)))
    return pd.DataFrame(rows, columns=["fact_id", "fact_segment", "wrong", "context", "cf"])


def prompts(ctx: pd.DataFrame, qs: pd.DataFrame) -> pd.DataFrame:
    """Every (query, condition) with its full prompt and the answer its context states."""
    q = qs.merge(ctx, on="fact_id", how="inner")
    parts = []
    for cond in CONDITIONS:
        p = q[["query_id", "fact_id", "form", "answer", "fact_segment", "wrong"]].copy()
        p["condition"] = cond
        if cond == "none":
            p["prompt"] = q["prompt"].to_numpy()
            p["context_answer"] = ""
        else:
            text = q["context" if cond == "context" else "cf"].to_numpy(dtype=object)
            p["prompt"] = [f"{c}\n{pr}" for c, pr in zip(text, q["prompt"], strict=True)]
            p["context_answer"] = q["answer" if cond == "context" else "wrong"].to_numpy()
        parts.append(p)
    return pd.concat(parts, ignore_index=True)


def config_prompts(
    cfg: dict[str, Any], facts: pd.DataFrame, candidates: pd.DataFrame, qs: pd.DataFrame
) -> pd.DataFrame:
    """The check's prompts for this config (``causal.context_segments``, the master seed)."""
    ctx = build_contexts(facts, candidates, layout.context_segments(cfg), int(cfg["seed"]))
    return prompts(ctx, qs)


def longest_sequence(tok: Any, prompts: list[str], candidates: pd.DataFrame) -> int:
    """Tokens of ``<bos>``, the longest prompt and the longest candidate: the window it needs."""
    p_len = max(len(x) for x in tokenizer.encode_batch(tok, prompts))
    c_len = max(
        len(x) for x in tokenizer.encode_batch(tok, [f" {c}" for c in candidates["candidate"]])
    )
    return 1 + p_len + c_len


def check_fits(tok: Any, prompts: pd.DataFrame, candidates: pd.DataFrame, window: int) -> None:
    """Refuse, before anything is written, contexts longer than the twins' window."""
    n = longest_sequence(tok, prompts["prompt"].tolist(), candidates)
    if n > window:
        raise ConfigError(
            f"config key 'causal.context_segments': a context of that many segments takes up to "
            f"{n} tokens, more than the twins' window of {window}; lower causal.context_segments"
        )
