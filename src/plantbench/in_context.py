"""The in-context check of the answer key: does each twin read what its context says?

Per fact, query form and twin, the 20 candidates are scored (summed answer log-probability) in
three conditions, all in the plain format the context suites use (segments one per line, then the
query, no markup: ``<bos> seg_1 \\n ... seg_k \\n prompt answer``):

- ``none``: the query alone (as in ``causal/facts.parquet``);
- ``context``: k segments (``causal.context_segments``, default 2), one of them the fact's own
  sentence and the others sentences of other facts, in a seeded order;
- ``counterfactual``: the same segments, but the fact's sentence states a seeded wrong candidate.

The reading rate is the share of facts whose true answer ranks first in ``context``; the
following rate the share whose context answer (the wrong candidate) ranks first in
``counterfactual``. Both are reported for the twin that read the fact and the one that did not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from . import queries
from .errors import ConfigError
from .rng import rng

CONDITIONS = ("none", "context", "counterfactual")
DEFAULT_SEGMENTS = 2  # when causal.context_segments is absent (the default study sets 4)
TABLE = "in_context.parquet"
COLUMNS = [
    "fact_id",
    "form",
    "model",
    "role",
    "condition",
    "segments",
    "fact_segment",
    "context_answer",
    "logp_true",
    "logp_context",
    "rank_true",
    "rank_context",
]


def n_segments(cfg: dict[str, Any]) -> int:
    return int(cfg["causal"].get("context_segments", DEFAULT_SEGMENTS))


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
    ctx = build_contexts(facts, candidates, n_segments(cfg), int(cfg["seed"]))
    return prompts(ctx, qs)


def longest_sequence(tok: Any, prompts: list[str], candidates: pd.DataFrame) -> int:
    """Tokens of ``<bos>``, the longest prompt and the longest candidate: the window it needs."""
    from . import tokenizer

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


def _rank(scores: np.ndarray, target: int) -> int:
    """1 + the candidates scored at least as high as ``target`` (ties count against it)."""
    return 1 + int((np.delete(scores, target) >= scores[target]).sum())


def score(
    model: torch.nn.Module,
    tok: Any,
    prompts: pd.DataFrame,
    candidates: pd.DataFrame,
) -> pd.DataFrame:
    """Every candidate's log-probability under every prompt (the prompt run once, its cache
    shared by the candidates); the true and context answers' log-probabilities and ranks."""
    from . import tokenizer

    cands = candidates.sort_values(["fact_id", "candidate_index"])
    by_fact = {fid: g["candidate"].tolist() for fid, g in cands.groupby("fact_id", sort=True)}
    ids_of = dict(
        zip(
            cands["candidate"],
            tokenizer.encode_batch(tok, [f" {c}" for c in cands["candidate"]]),
            strict=True,
        )
    )
    prompt_ids = tokenizer.encode_batch(tok, prompts["prompt"].tolist())
    out = []
    for p, pids in zip(prompts.itertuples(index=False), prompt_ids, strict=True):
        names = by_fact[p.fact_id]
        s = queries.candidate_logprobs(model, [tokenizer.BOS_ID, *pids], [ids_of[c] for c in names])
        t = names.index(p.answer)
        c = names.index(p.context_answer) if p.context_answer else t
        out.append((float(s[t]), float(s[c]), _rank(s, t), _rank(s, c)))
    return pd.DataFrame(out, columns=["logp_true", "logp_context", "rank_true", "rank_context"])


def table(
    facts: pd.DataFrame,
    prompts: pd.DataFrame,
    scored: dict[str, pd.DataFrame],
    k: int,
) -> pd.DataFrame:
    """The published table (columns :data:`COLUMNS`, documented in results/README.md)."""
    reader = facts.set_index("fact_id")["reader"]
    parts = []
    for m, s in scored.items():
        t = prompts[["fact_id", "form", "condition", "fact_segment", "context_answer"]].copy()
        t = pd.concat([t.reset_index(drop=True), s.reset_index(drop=True)], axis=1)
        t["model"] = m
        t["role"] = np.where(reader.loc[t["fact_id"]].to_numpy() == m, "reader", "other")
        t["segments"] = np.where(t["condition"] == "none", 0, k).astype(np.int64)
        t.loc[t["condition"] == "none", "fact_segment"] = -1
        parts.append(t)
    out = pd.concat(parts, ignore_index=True)
    out["fact_segment"] = out["fact_segment"].astype(np.int64)
    out[["rank_true", "rank_context"]] = out[["rank_true", "rank_context"]].astype(np.int64)
    order = {c: i for i, c in enumerate(CONDITIONS)}
    out = out.assign(_c=out["condition"].map(order))
    out = out.sort_values(["fact_id", "form", "model", "_c"]).drop(columns="_c")
    return out[COLUMNS].reset_index(drop=True)


def rates(tab: pd.DataFrame) -> pd.DataFrame:
    """Reading and following rates by role and query form (and both forms together)."""
    rows = []
    for form in ("all", *sorted(tab["form"].unique())):
        sub = tab if form == "all" else tab[tab["form"] == form]
        for role in ("reader", "other"):
            r = sub[sub["role"] == role]
            none, ctx, cf = (r[r["condition"] == c] for c in CONDITIONS)
            rows.append(
                {
                    "form": form,
                    "role": role,
                    "no_context_first": float((none["rank_true"] == 1).mean()),
                    "reading_rate": float((ctx["rank_true"] == 1).mean()),
                    "following_rate": float((cf["rank_context"] == 1).mean()),
                    "gain_nats": float(ctx["logp_true"].mean() - none["logp_true"].mean()),
                }
            )
    return pd.DataFrame(rows)


SUMMARY_KEYS = ("no_context_first", "reading_rate", "following_rate")


def summary(tab: pd.DataFrame) -> dict[str, dict[str, float]]:
    """The rates over both query forms, by role (the causal meta's ``info.in_context``)."""
    both = rates(tab).query("form == 'all'").set_index("role")
    return {
        role: {key: float(both.loc[role, key]) for key in SUMMARY_KEYS}
        for role in ("reader", "other")
    }
