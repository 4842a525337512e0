"""One twin's pass of the context suite: every method's segment scores on every context, and the
accuracies and log-probabilities of the conditions the metrics read.

Per query (``context/contexts``), under this twin's final checkpoint:

- ``scores.parquet``: every method's score of every segment;
- ``conditions.parquet``: per method and k, whether the true answer ranks first of the
  candidates and its log-probability with only the method's top k kept (``topk-only``) and with
  them removed (``rm-topk``);
- ``queries.parquet``: the same with no context and the full context, and p_∅ (the answer's
  probability normalized over the candidates with no context);
- ``lds.parquet``: every method's LDS on the query's held-out ablations.

A method's generator is seeded by (seed, method, query), the same for both twins, so the twins'
scores differ only through the twins.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import artifacts, io
from plantbench.data import tokenizer
from plantbench.model.modeling import load_model
from plantbench.paths import Paths
from plantbench.rng import rng
from plantbench.suites.context import contexts, metrics
from plantbench.suites.context.methods import registry
from plantbench.suites.context.oracle import Oracle
from plantbench.suites.context.settings import Settings, settings, settings_hash

log = logging.getLogger(__name__)
FILES = ["scores.parquet", "conditions.parquet", "queries.parquet", "lds.parquet"]


def condition_ks(st: Settings) -> list[int]:
    """The k of every top-k condition (BCS's and Drop@k's, capped at the segment count)."""
    return sorted({min(k, st.segments) for k in (*st.top_k, *st.drop_k)})


def lds_masks(st: Settings, query_id: str) -> np.ndarray:
    return rng(st.seed, "context_lds", query_id).random((st.lds_masks, st.segments)) < 0.5


def _pair(oracle: Oracle, masks: np.ndarray) -> tuple:
    """(correct, correct, logp, logp, greedy, greedy) of two masks, in the tables' order."""
    ok, lp, gr = oracle.correct(masks), oracle.logp(masks), oracle.greedy(masks)
    return bool(ok[0]), bool(ok[1]), float(lp[0]), float(lp[1]), bool(gr[0]), bool(gr[1])


def method_rows(
    oracle: Oracle, st: Settings, query_id: str, name: str, s: np.ndarray
) -> dict[str, list[tuple]]:
    """The scores, conditions and LDS rows of one method's segment scores ``s`` on one query."""
    s = np.asarray(s, dtype=float)
    held = lds_masks(st, query_id)
    rows: dict[str, list[tuple]] = {"scores": [], "conditions": [], "lds": []}
    rows["scores"] = [(query_id, name, j, float(v)) for j, v in enumerate(s)]
    for k in condition_ks(st):
        rows["conditions"].append(
            (query_id, name, k, *_pair(oracle, np.stack(metrics.top_masks(s, k))))
        )
    rows["lds"].append((query_id, name, metrics.lds(s, held, oracle.logp(held))))
    return rows


def _extend(rows: dict[str, list[tuple]], more: dict[str, list[tuple]]) -> None:
    for key, r in more.items():
        rows.setdefault(key, []).extend(r)


def attribute_query(
    oracle: Oracle, st: Settings, query_id: str, records: dict[str, dict[str, Any]] | None = None
) -> dict[str, list[tuple]]:
    """The rows of the four tables for one query. A learned method's record goes to
    ``records[method][query_id]`` instead (its rows come from :func:`learned_rows`)."""
    rows: dict[str, list[tuple]] = {"scores": [], "conditions": [], "lds": []}
    oracle.prefetch_lattice(st.lattice)
    for name in st.methods:
        method = registry.get(name)
        out = method.fn(oracle, st, rng(st.seed, "context", name, query_id))
        if method.learn is not None:
            if records is not None:
                records.setdefault(name, {})[query_id] = out
            continue
        _extend(rows, method_rows(oracle, st, query_id, name, out))
    ends = _pair(oracle, np.stack([oracle.empty(), oracle.full()]))
    share = float(oracle.answer_share(oracle.empty()[None])[0])
    rows["queries"] = [(query_id, *ends, share, oracle.passes)]
    return rows


def folds(st: Settings, fact_of: dict[str, str]) -> dict[str, int]:
    """Per query its cross-fitting fold (0 or 1): seeded per fact, so a fact's query forms
    share a fold."""
    return {q: int(rng(st.seed, "context_fold", f).integers(2)) for q, f in fact_of.items()}


def learned_rows(
    oracles: dict[str, Oracle],
    st: Settings,
    records: dict[str, dict[str, Any]],
    fact_of: dict[str, str],
) -> dict[str, list[tuple]]:
    """The rows of every learned method, each query scored by weights fitted on the other
    fold's queries (:mod:`plantbench.suites.context.methods.registry`)."""
    rows: dict[str, list[tuple]] = {"scores": [], "conditions": [], "lds": []}
    split = folds(st, fact_of)
    for name, recs in records.items():
        learn = registry.get(name).learn
        assert learn is not None
        scores = learn(recs, {q: split[q] for q in recs}, st)
        for q, oracle in oracles.items():
            if q in scores:
                _extend(rows, method_rows(oracle, st, q, name, scores[q]))
    return rows


COLUMNS = {
    "scores": ["query_id", "method", "segment", "score"],
    "conditions": [
        "query_id",
        "method",
        "k",
        "topk_only_correct",
        "rm_topk_correct",
        "topk_only_logp",
        "rm_topk_logp",
        "topk_only_greedy",
        "rm_topk_greedy",
    ],
    "queries": [
        "query_id",
        "none_correct",
        "full_correct",
        "none_logp",
        "full_logp",
        "none_greedy",
        "full_greedy",
        "p_empty",
        "passes",
    ],
    "lds": ["query_id", "method", "lds"],
}


def _inputs(paths: Paths) -> tuple[dict[str, Any], pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    meta = io.read_meta(paths.context("contexts"), "context_contexts")
    qdf = io.read_parquet(paths.context("contexts") / "queries.parquet")
    seg = io.read_parquet(paths.context("contexts") / "segments.parquet")
    cands = io.read_parquet(paths.facts / "candidates.parquet")
    return meta, qdf, seg, cands


def run(cfg: dict[str, Any], paths: Paths, model_name: str, *, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    st = settings(cfg)
    for name in st.methods:
        registry.get(name)  # an unregistered name fails before the model loads
    meta, qdf, seg, cands = _inputs(paths)
    tok = tokenizer.load(paths.tokenizer)
    model_meta = io.read_meta(paths.model(model_name), "pretrain", verify=False)
    model = load_model(artifacts.final_checkpoint_path(paths, model_name), attn="sdpa")
    texts = contexts.segments_of(seg)
    by_fact = {f: g.sort_values("candidate_index") for f, g in cands.groupby("fact_id")}
    rows: dict[str, list[tuple]] = {k: [] for k in COLUMNS}
    t0, passes = time.perf_counter(), 0
    oracles: dict[str, Oracle] = {}
    records: dict[str, dict[str, Any]] = {}
    for i, q in enumerate(qdf.itertuples(index=False)):
        c = by_fact[q.fact_id]
        ids = tokenizer.encode_batch(tok, [f" {x}" for x in c["candidate"]])
        target = c["candidate"].tolist().index(q.answer)
        oracle = Oracle(model, tok, texts[q.query_id], q.prompt, ids, target, st.batch)
        _extend(rows, attribute_query(oracle, st, q.query_id, records))
        oracles[q.query_id] = oracle
        passes += oracle.passes
        if (i + 1) % 50 == 0 or i + 1 == len(qdf):
            dt = time.perf_counter() - t0
            log.info(
                "context %s: %d/%d queries, %d passes, %.1f passes/s",
                model_name,
                i + 1,
                len(qdf),
                passes,
                passes / dt,
            )
    before = sum(o.passes for o in oracles.values())
    fact_of = dict(zip(qdf["query_id"], qdf["fact_id"], strict=True))
    _extend(rows, learned_rows(oracles, st, records, fact_of))
    passes += sum(o.passes for o in oracles.values()) - before
    tables = {k: pd.DataFrame(v, columns=COLUMNS[k]) for k, v in rows.items()}
    out = paths.context(model_name)
    with io.atomic_dir(out) as tmp:
        for key, df in tables.items():
            io.write_parquet(tmp / f"{key}.parquet", df)
        result = io.write_meta(
            tmp,
            "context_attribute",
            FILES,
            config_hash=settings_hash(st),
            inputs={"contexts": meta["hash"], "model": model_meta["hash"]},
            info={
                "model": model_name,
                "queries": len(qdf),
                "methods": list(st.methods),
                "forward_passes": passes,
                "attention_passes": sum(o.attention_passes for o in oracles.values()),
                "passes_per_s": passes / max(time.perf_counter() - t0, 1e-9),
            },
        )
    return result
