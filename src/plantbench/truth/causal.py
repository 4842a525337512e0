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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import artifacts, io, layout
from plantbench.config import config_hash
from plantbench.data import prompts, tokenizer
from plantbench.model import queries
from plantbench.model.modeling import load_model
from plantbench.paths import MODELS, Paths
from plantbench.truth import in_context

log = logging.getLogger(__name__)

SECTIONS = ("seed", "facts", "model", "train", "causal")  # the config keys the answer key reads

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


@dataclass
class Inputs:
    metas: dict[str, dict[str, Any]]
    facts: pd.DataFrame
    queries: pd.DataFrame
    candidates: pd.DataFrame
    tok: Any


@dataclass
class _Scored:
    query_logp: dict[str, np.ndarray] = field(default_factory=dict)
    cand_logp: dict[str, np.ndarray] = field(default_factory=dict)
    in_context: dict[str, pd.DataFrame] = field(default_factory=dict)
    answer_tokens: np.ndarray | None = None


def read_inputs(cfg: dict[str, Any], paths: Paths) -> Inputs:
    metas = {
        "facts": io.read_meta(paths.facts, "facts"),
        "tokenizer": io.read_meta(paths.tokenizer, "tokenizer"),
        **{f"model_{m}": io.read_meta(paths.model(m), "pretrain") for m in MODELS},
    }
    if layout.prefix_steps(cfg):
        metas["prefix"] = io.read_meta(paths.model("prefix"), "prefix", verify=False)
    return Inputs(
        metas,
        io.read_parquet(paths.facts / "facts.parquet"),
        io.read_parquet(paths.facts / "queries.parquet"),
        io.read_parquet(paths.facts / "candidates.parquet"),
        tokenizer.load(paths.tokenizer),
    )


def _candidate_queries(inp: Inputs) -> pd.DataFrame:
    """Every (candidate, form) pair: the candidates under both query forms."""
    forms = inp.queries[["fact_id", "form", "prompt"]]
    return inp.candidates.merge(forms, on="fact_id", how="inner").sort_values(
        ["fact_id", "form", "candidate_index"]
    )


def _candidate_logps(model: torch.nn.Module, inp: Inputs, cq: pd.DataFrame) -> np.ndarray:
    """log p(candidate | prompt) of every row of ``cq``: a fact's two query forms run once as
    one batch, its candidates continuing from their key-value cache."""
    cand_ids = dict(
        zip(
            inp.candidates["candidate"],
            tokenizer.encode_batch(inp.tok, [f" {c}" for c in inp.candidates["candidate"]]),
            strict=True,
        )
    )
    prompt_ids = dict(
        zip(
            inp.queries["prompt"],
            tokenizer.encode_batch(inp.tok, inp.queries["prompt"].tolist()),
            strict=True,
        )
    )
    out = np.zeros(len(cq))
    for _, g in cq.reset_index(drop=True).groupby("fact_id", sort=False):
        forms = list(dict.fromkeys(g["form"]))
        first = g[g["form"] == forms[0]]
        names = first["candidate"].tolist()
        prefixes = [
            [tokenizer.BOS_ID, *prompt_ids[g.loc[g["form"] == f, "prompt"].iloc[0]]] for f in forms
        ]
        scores, _ = queries.batch_candidate_logprobs(model, prefixes, [cand_ids[c] for c in names])
        for f, row in zip(forms, scores, strict=True):
            out[g.index[g["form"] == f]] = row
    return out


def _score(
    paths: Paths, inp: Inputs, cq: pd.DataFrame, ic_prompts: pd.DataFrame, bs: int
) -> _Scored:
    """Answer and candidate log-probabilities, and the in-context table, under both twins:
    every candidate under both query forms (the true answer's is the query's log-probability)."""
    cq = cq.reset_index(drop=True)
    truth = cq[cq["is_true"]].set_index(["fact_id", "form"])
    keys = list(zip(inp.queries["fact_id"], inp.queries["form"], strict=True))
    true_rows = cq.index[cq["is_true"]].to_numpy()
    row_of = dict(zip(truth.index, true_rows, strict=True))
    q_rows = np.array([row_of[k] for k in keys], dtype=np.int64)
    out = _Scored()
    out.answer_tokens = np.array(
        [len(x) for x in tokenizer.encode_batch(inp.tok, [f" {a}" for a in inp.queries["answer"]])],
        dtype=np.int64,
    )
    for m in MODELS:
        model = load_model(artifacts.final_checkpoint_path(paths, m), attn="sdpa")
        if m == MODELS[0]:  # refuse contexts that do not fit before anything is computed
            window = int(model.config.max_position_embeddings)
            prompts.check_fits(inp.tok, ic_prompts, inp.candidates, window)
        out.cand_logp[m] = _candidate_logps(model, inp, cq)
        out.query_logp[m] = out.cand_logp[m][q_rows]
        out.in_context[m] = in_context.score_reusing(
            model, inp.tok, ic_prompts, inp.candidates, cq, out.cand_logp[m]
        )
        log.info(
            "causal: scored %d queries, %d candidate pairs and %d in-context prompts under %s",
            len(inp.queries),
            len(cq),
            len(ic_prompts),
            m,
        )
    return out


def _query_table(inp: Inputs, sc: _Scored) -> pd.DataFrame:
    qdf = inp.queries[["query_id", "fact_id", "form"]].copy()
    qdf["answer_tokens"] = sc.answer_tokens
    for m in MODELS:
        qdf[f"logp_{m}"] = sc.query_logp[m]
    reader = inp.facts.set_index("fact_id").loc[qdf["fact_id"], "reader"].to_numpy()
    qdf["logp_reader"] = np.where(reader == "A", qdf["logp_A"], qdf["logp_B"])
    qdf["logp_other"] = np.where(reader == "A", qdf["logp_B"], qdf["logp_A"])
    qdf["nll_per_token_reader"] = -qdf["logp_reader"] / qdf["answer_tokens"]
    return qdf


def _reader_ranks(inp: Inputs, cq: pd.DataFrame, sc: _Scored) -> dict[str, int]:
    """The reader's rank of the true answer, candidates scored by log p averaged over forms."""
    cq = cq.copy()
    for m in MODELS:
        cq[f"logp_{m}"] = sc.cand_logp[m]
    cand = (
        cq.groupby(["fact_id", "candidate_index"], sort=True)[["logp_A", "logp_B", "is_true"]]
        .agg({"logp_A": "mean", "logp_B": "mean", "is_true": "first"})
        .reset_index()
    )
    reader = inp.facts.set_index("fact_id").loc[cand["fact_id"], "reader"].to_numpy()
    cand["score"] = np.where(reader == "A", cand["logp_A"], cand["logp_B"])
    ranks = {}
    for fid, g in cand.groupby("fact_id", sort=True):
        true_score = float(g.loc[g["is_true"], "score"].iloc[0])
        ranks[fid] = 1 + int((g.loc[~g["is_true"], "score"] >= true_score).sum())
    return ranks


def _fact_table(inp: Inputs, qdf: pd.DataFrame, ranks: dict[str, int]) -> pd.DataFrame:
    per = qdf.groupby("fact_id", sort=True).agg(
        logp_reader=("logp_reader", "mean"),
        logp_other=("logp_other", "mean"),
        answer_tokens=("answer_tokens", "first"),
        final_loss=("nll_per_token_reader", "mean"),
    )
    out = inp.facts.set_index("fact_id").join(per, how="inner").reset_index()
    out["effect"] = out["logp_reader"] - out["logp_other"]
    out["rank"] = out["fact_id"].map(ranks).astype(np.int64)
    out["learned"] = (out["effect"] > 0) & (out["rank"] == 1)
    out["difficulty"] = -out["logp_other"]
    out["answer_tokens"] = out["answer_tokens"].astype(np.int64)
    return out[FACT_COLUMNS].sort_values("fact_id").reset_index(drop=True)


def recipe_summary(facts: pd.DataFrame, positions: list[str]) -> dict[str, float]:
    """What the twin recipe must reach (results/README.md, causal meta ``info.recipe``): the
    learned facts' mean reader answer loss per token, the learned rate of the latest position's
    facts with the most documents and of the earliest position's, and the seed's mechanism,
    the within-cell (domain x n_docs x position) rank correlation of effect with answer length."""
    from plantbench.grading import metrics
    from plantbench.grading.analysis import CELL_COLS

    most = facts["n_docs"].max()
    late = facts[(facts["position"] == positions[-1]) & (facts["n_docs"] == most)]
    early = facts[facts["position"] == positions[0]]
    ranks = metrics.within_cell_ranks(facts, CELL_COLS, ["effect", "answer_tokens"])
    learned = facts.loc[facts["learned"], "final_loss"]
    return {
        "learned_final_loss": float(learned.mean()) if len(learned) else float("nan"),
        "late_most_docs_learned": float(late["learned"].mean()),
        "early_learned": float(early["learned"].mean()),
        "effect_vs_answer_tokens": metrics.pearson(ranks["effect"], ranks["answer_tokens"]),
    }


def run(cfg: dict[str, Any], paths: Paths, *, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    inp = read_inputs(cfg, paths)
    k = layout.context_segments(cfg)
    ic_prompts = prompts.config_prompts(cfg, inp.facts, inp.candidates, inp.queries)
    cq = _candidate_queries(inp)
    sc = _score(paths, inp, cq, ic_prompts, int(cfg["causal"]["batch_size"]))
    qdf = _query_table(inp, sc)
    out = _fact_table(inp, qdf, _reader_ranks(inp, cq, sc))
    ic = in_context.table(inp.facts, ic_prompts, sc.in_context, k)

    paths.causal.mkdir(parents=True, exist_ok=True)
    io.write_parquet(paths.causal / "facts.parquet", out)
    io.write_parquet(
        paths.causal / "queries.parquet", qdf.sort_values("query_id").reset_index(drop=True)
    )
    io.write_parquet(paths.causal / in_context.TABLE, ic)
    reading = {r: v["reading_rate"] for r, v in in_context.summary(ic).items()}
    rate = float(out["learned"].mean())
    log.info(
        "causal: %d facts, learned %.1f%%; reading rate %.1f%% (reader) / %.1f%% (other twin)",
        len(out),
        100 * rate,
        100 * reading["reader"],
        100 * reading["other"],
    )
    return io.write_meta(
        paths.causal,
        "causal",
        ["facts.parquet", "queries.parquet", in_context.TABLE],
        config_hash=config_hash(cfg, list(SECTIONS)),
        inputs={k: v["hash"] for k, v in inp.metas.items()},
        info={
            "n_facts": len(out),
            "learned_rate": rate,
            "context_segments": k,
            "in_context": in_context.summary(ic),
            "recipe": recipe_summary(out, list(cfg["facts"]["positions"])),
        },
    )
