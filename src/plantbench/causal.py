"""The causal ground truth: what each fact's documents did to the model that read them.

Per fact, under the final checkpoints of both twins (see results/README.md for every column):
- effect = mean over the two query forms of [log p(answer | query) under the reader - the same
  under the other model], log p summed over answer tokens;
- rank = the reader's rank of the true answer among the candidates, scoring each candidate by
  its summed log-probability averaged over the two forms (1 = first; ties count against it);
- learned = effect > 0 and rank == 1;
- answer_tokens = answer length in tokens; difficulty = -log p(answer | query) under the model
  that never read it (mean over forms); final_loss = the reader's mean per-token negative
  log-likelihood of the answer (mean over forms).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from . import io, queries, tokenizer
from .config import config_hash
from .modeling import load_model
from .paths import MODELS, Paths
from .pretrain import final_checkpoint

log = logging.getLogger(__name__)

FACT_COLUMNS = [
    "fact_id",
    "domain",
    "entity_type",
    "relation",
    "n_docs",
    "position",
    "reader",
    "cell",
    "answer",
    "answer_tokens",
    "logp_reader",
    "logp_other",
    "effect",
    "rank",
    "learned",
    "difficulty",
    "final_loss",
]


def run(cfg: dict[str, Any], paths: Paths, *, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    facts_meta = io.read_meta(paths.facts, "facts")
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    model_metas = {m: io.read_meta(paths.model(m), "pretrain") for m in MODELS}
    facts = io.read_parquet(paths.facts / "facts.parquet")
    qs = io.read_parquet(paths.facts / "queries.parquet")
    cands = io.read_parquet(paths.facts / "candidates.parquet")
    tok = tokenizer.load(paths.tokenizer)
    bs = int(cfg["causal"]["batch_size"])

    q_items = queries.encode(tok, qs["prompt"].tolist(), qs["answer"].tolist())
    # candidates under both forms: every (candidate, form) pair
    forms = qs[["fact_id", "form", "prompt"]]
    cq = cands.merge(forms, on="fact_id", how="inner").sort_values(
        ["fact_id", "form", "candidate_index"]
    )
    c_items = queries.encode(tok, cq["prompt"].tolist(), cq["candidate"].tolist())

    q_logp: dict[str, np.ndarray] = {}
    c_logp: dict[str, np.ndarray] = {}
    for m in MODELS:
        model = load_model(final_checkpoint(paths, m), attn="sdpa")
        q_logp[m], n_ans = queries.answer_logprobs(model, q_items, bs)
        c_logp[m], _ = queries.answer_logprobs(model, c_items, bs)
        log.info(
            "causal: scored %d queries and %d candidate pairs under model %s",
            len(q_items),
            len(c_items),
            m,
        )

    qdf = qs[["query_id", "fact_id", "form"]].copy()
    qdf["answer_tokens"] = n_ans
    for m in MODELS:
        qdf[f"logp_{m}"] = q_logp[m]
    f = facts.set_index("fact_id")
    reader = f.loc[qdf["fact_id"], "reader"].to_numpy()
    qdf["logp_reader"] = np.where(reader == "A", qdf["logp_A"], qdf["logp_B"])
    qdf["logp_other"] = np.where(reader == "A", qdf["logp_B"], qdf["logp_A"])
    qdf["nll_per_token_reader"] = -qdf["logp_reader"] / qdf["answer_tokens"]

    cq = cq.copy()
    for m in MODELS:
        cq[f"logp_{m}"] = c_logp[m]
    cand_score = (
        cq.groupby(["fact_id", "candidate_index"], sort=True)[["logp_A", "logp_B", "is_true"]]
        .agg({"logp_A": "mean", "logp_B": "mean", "is_true": "first"})
        .reset_index()
    )
    cand_score["reader"] = f.loc[cand_score["fact_id"], "reader"].to_numpy()
    cand_score["score"] = np.where(
        cand_score["reader"] == "A", cand_score["logp_A"], cand_score["logp_B"]
    )
    ranks = {}
    for fid, g in cand_score.groupby("fact_id", sort=True):
        true_score = float(g.loc[g["is_true"], "score"].iloc[0])
        ranks[fid] = 1 + int((g.loc[~g["is_true"], "score"] >= true_score).sum())

    per = qdf.groupby("fact_id", sort=True).agg(
        logp_reader=("logp_reader", "mean"),
        logp_other=("logp_other", "mean"),
        answer_tokens=("answer_tokens", "first"),
        final_loss=("nll_per_token_reader", "mean"),
    )
    out = facts.set_index("fact_id").join(per, how="inner").reset_index()
    out["effect"] = out["logp_reader"] - out["logp_other"]
    out["rank"] = out["fact_id"].map(ranks).astype(np.int64)
    out["learned"] = (out["effect"] > 0) & (out["rank"] == 1)
    out["difficulty"] = -out["logp_other"]
    out["answer_tokens"] = out["answer_tokens"].astype(np.int64)
    out = out[FACT_COLUMNS].sort_values("fact_id").reset_index(drop=True)

    paths.causal.mkdir(parents=True, exist_ok=True)
    io.write_parquet(paths.causal / "facts.parquet", out)
    io.write_parquet(
        paths.causal / "queries.parquet", qdf.sort_values("query_id").reset_index(drop=True)
    )
    rate = float(out["learned"].mean())
    log.info("causal: %d facts, learned %.1f%%", len(out), 100 * rate)
    return io.write_meta(
        paths.causal,
        "causal",
        ["facts.parquet", "queries.parquet"],
        config_hash=config_hash(cfg, ["seed", "facts", "model", "train", "causal"]),
        inputs={
            "facts": facts_meta["hash"],
            "tokenizer": tok_meta["hash"],
            **{f"model_{m}": model_metas[m]["hash"] for m in MODELS},
        },
        info={"n_facts": len(out), "learned_rate": rate},
    )
