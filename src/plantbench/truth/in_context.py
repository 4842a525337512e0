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

from plantbench.data.prompts import CONDITIONS
from plantbench.model import queries

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


SCORE_COLUMNS = ["logp_true", "logp_context", "rank_true", "rank_context"]


def _by_fact(candidates: pd.DataFrame) -> dict[str, list[str]]:
    """Each fact's candidate names in ``candidate_index`` order (the order scores come in)."""
    cands = candidates.sort_values(["fact_id", "candidate_index"])
    return {fid: g["candidate"].tolist() for fid, g in cands.groupby("fact_id", sort=True)}


def _rank(scores: np.ndarray, target: int) -> int:
    """1 + the candidates scored at least as high as ``target`` (ties count against it)."""
    return 1 + int((np.delete(scores, target) >= scores[target]).sum())


def score(
    model: torch.nn.Module,
    tok: Any,
    prompts: pd.DataFrame,
    candidates: pd.DataFrame,
) -> pd.DataFrame:
    """Every candidate's log-probability under every prompt (a fact's prompts run once as one
    batch, its candidates continuing from their key-value cache); the true and context
    answers' log-probabilities and ranks, in ``prompts``' row order."""
    from plantbench.data import tokenizer

    by_fact = _by_fact(candidates)
    ids_of = dict(
        zip(
            candidates["candidate"],
            tokenizer.encode_batch(tok, [f" {c}" for c in candidates["candidate"]]),
            strict=True,
        )
    )
    prompt_ids = tokenizer.encode_batch(tok, prompts["prompt"].tolist())
    out: list[tuple[float, float, int, int]] = [(0.0, 0.0, 0, 0)] * len(prompts)
    rows = prompts.reset_index(drop=True)
    for fid, idx in rows.groupby("fact_id", sort=False).indices.items():
        names = by_fact[fid]
        prefixes = [[tokenizer.BOS_ID, *prompt_ids[i]] for i in idx]
        scores, _ = queries.batch_candidate_logprobs(model, prefixes, [ids_of[c] for c in names])
        for i, sc in zip(idx.tolist(), scores, strict=True):
            p = rows.iloc[i]
            t = names.index(p["answer"])
            c = names.index(p["context_answer"]) if p["context_answer"] else t
            out[i] = (float(sc[t]), float(sc[c]), _rank(sc, t), _rank(sc, c))
    return pd.DataFrame(out, columns=SCORE_COLUMNS)


def from_candidates(
    prompts: pd.DataFrame, candidates: pd.DataFrame, cand_rows: pd.DataFrame, logp: np.ndarray
) -> pd.DataFrame:
    """:func:`score`'s columns for ``none`` prompts from candidate log-probabilities already
    computed under the same query alone (the answer key's): ``cand_rows`` (``fact_id``, ``form``,
    ``candidate``) is the row of each ``logp`` entry. Equal to scoring them again up to float
    rounding (a different padded batch), without the second forward."""
    if not (prompts["condition"] == "none").all():
        raise ValueError("from_candidates scores only the 'none' condition (the query alone)")
    by_fact = _by_fact(candidates)
    at = {
        (f, fo, c): i
        for i, (f, fo, c) in enumerate(
            zip(cand_rows["fact_id"], cand_rows["form"], cand_rows["candidate"], strict=True)
        )
    }
    out = []
    for p in prompts.itertuples(index=False):
        names = by_fact[p.fact_id]
        sc = np.array([logp[at[(p.fact_id, p.form, c)]] for c in names], dtype=np.float64)
        t = names.index(p.answer)
        out.append((float(sc[t]), float(sc[t]), _rank(sc, t), _rank(sc, t)))
    return pd.DataFrame(out, columns=SCORE_COLUMNS)


def score_reusing(
    model: torch.nn.Module,
    tok: Any,
    prompts: pd.DataFrame,
    candidates: pd.DataFrame,
    cand_rows: pd.DataFrame,
    logp: np.ndarray,
) -> pd.DataFrame:
    """:func:`score` of every prompt, the ``none`` ones taken from the answer key's candidate
    log-probabilities (:func:`from_candidates`) instead of a second forward; ``prompts``' row
    order."""
    rows = prompts.reset_index(drop=True)
    none = (rows["condition"] == "none").to_numpy()
    out = pd.DataFrame(index=rows.index, columns=SCORE_COLUMNS)
    if none.any():
        out.loc[none] = from_candidates(rows[none], candidates, cand_rows, logp).to_numpy()
    if (~none).any():
        out.loc[~none] = score(model, tok, rows[~none], candidates).to_numpy()
    kinds = [np.float64, np.float64, np.int64, np.int64]
    return out.astype(dict(zip(SCORE_COLUMNS, kinds, strict=True)))


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
