"""The context builder: per query, k segments with their provenance under each twin.

For a fact f (read by twin ``reader``; the other twin is ``base``), the context holds f's own
sentence (the statement every one of its planted documents carries) and k - 1 sentences of other
facts, in a seeded, shuffled order:

- ``k // 2 - 1`` facts the reader read *and learned* (in-weight for the reader),
- the rest facts the reader never read (in-context for the reader; read by the base twin),

so that, for the reader, in-weight (IW) and in-context (ICL) segments are balanced when f is
learned. When the reader learned too few other facts, ICL segments fill the gap (the labels stay
true; the balance is reported). A segment's label under twin m is ``iw`` when its fact was read by
m and learned (``causal/facts.parquet``), else ``icl``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from plantbench.data import prompts, tokenizer
from plantbench.errors import ConfigError
from plantbench.paths import MODELS
from plantbench.rng import rng
from plantbench.suites import common
from plantbench.suites.context.oracle import prompt_of

QUERY_COLUMNS = [
    "query_id",
    "fact_id",
    "form",
    "prompt",
    "answer",
    "reader",
    "base",
    "learned",
    "n_docs",
    "position",
    "cell",
    "segments",
]
SEGMENT_COLUMNS = [
    "query_id",
    "segment",
    "segment_fact",
    "text",
    "relevant",
    *[f"label_{m}" for m in MODELS],
]


def _pick(r: np.random.Generator, pool: np.ndarray, n: int) -> list[int]:
    n = min(n, len(pool))
    return [int(x) for x in r.choice(pool, size=n, replace=False)] if n else []


def fact_segments(facts: pd.DataFrame, k: int, seed: int) -> dict[str, list[int]]:
    """Per fact id, the row positions (in ``facts``) of its k segments' facts, in order."""
    if k > len(facts):
        raise ConfigError(
            f"config key 'context.segments' = {k} needs {k} facts' sentences but the grid has "
            f"{len(facts)}; lower context.segments"
        )
    reader = facts["reader"].to_numpy()
    learned = facts["learned"].to_numpy(dtype=bool)
    out = {}
    for i, fid in enumerate(facts["fact_id"]):
        r = rng(seed, "context", fid)
        others = np.delete(np.arange(len(facts)), i)
        iw = others[(reader[others] == reader[i]) & learned[others]]
        iw_pick = _pick(r, iw, max(k // 2 - 1, 0))
        icl = others[reader[others] != reader[i]]
        icl_pick = _pick(r, icl, k - 1 - len(iw_pick))
        rest = np.setdiff1d(others, [*iw_pick, *icl_pick])
        fill = _pick(r, rest, k - 1 - len(iw_pick) - len(icl_pick))
        chosen = np.array([i, *iw_pick, *icl_pick, *fill])
        out[fid] = [int(x) for x in chosen[r.permutation(k)]]
    return out


def build(
    facts: pd.DataFrame, causal_facts: pd.DataFrame, queries: pd.DataFrame, k: int, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The suite's query table and segment table (columns :data:`QUERY_COLUMNS`,
    :data:`SEGMENT_COLUMNS`; documented in results/README.md)."""
    f = facts.merge(causal_facts[["fact_id", "learned"]], on="fact_id", how="left")
    f["learned"] = f["learned"].fillna(False).astype(bool)
    chosen = fact_segments(f, k, seed)
    by_id = f.set_index("fact_id")
    qrows, srows = [], []
    for q in queries.sort_values("query_id").itertuples(index=False):
        fact = by_id.loc[q.fact_id]
        base = next(m for m in MODELS if m != fact["reader"])
        qrows.append(
            (
                q.query_id,
                q.fact_id,
                q.form,
                q.prompt,
                q.answer,
                fact["reader"],
                base,
                bool(fact["learned"]),
                int(fact["n_docs"]),
                fact["position"],
                fact["cell"],
                k,
            )
        )
        for j, row in enumerate(chosen[q.fact_id]):
            g = f.iloc[row]
            labels = ["iw" if (g["reader"] == m and g["learned"]) else "icl" for m in MODELS]
            srows.append(
                (q.query_id, j, g["fact_id"], g["sentence"], g["fact_id"] == q.fact_id, *labels)
            )
    qdf = pd.DataFrame(qrows, columns=QUERY_COLUMNS)
    sdf = pd.DataFrame(srows, columns=SEGMENT_COLUMNS)
    qdf[["n_docs", "segments"]] = qdf[["n_docs", "segments"]].astype(np.int64)
    sdf["segment"] = sdf["segment"].astype(np.int64)
    return qdf, sdf


def segments_of(seg: pd.DataFrame) -> dict[str, list[str]]:
    """Per query id, its segment texts in order."""
    s = seg.sort_values(["query_id", "segment"])
    return {qid: g["text"].tolist() for qid, g in s.groupby("query_id", sort=True)}


def check_fits(
    tok: Any, qdf: pd.DataFrame, seg: pd.DataFrame, candidates: pd.DataFrame, window: int
) -> None:
    """Refuse, before anything is written, a full context longer than the twins' window."""
    texts = segments_of(seg)
    full = [
        prompt_of(texts[q], [True] * len(texts[q]), p)
        for q, p in zip(qdf["query_id"], qdf["prompt"], strict=True)
    ]
    n = prompts.longest_sequence(tok, full, candidates)
    if n > window:
        raise ConfigError(
            f"config key 'context.segments': a context of {int(qdf['segments'].iloc[0])} segments "
            f"takes up to {n} tokens, more than the twins' window of {window}; lower "
            "context.segments"
        )


def run(cfg: dict[str, Any], paths: Any) -> dict[str, Any]:
    """Build and write ``context/contexts`` (queries and segments), refusing bad settings first."""
    from plantbench import io
    from plantbench.suites.context.methods import registry
    from plantbench.suites.context.settings import settings, settings_hash

    st = settings(cfg)
    for name in st.methods:
        registry.get(name)
    causal_meta, causal_facts = common.causal_table(paths)
    facts_meta = io.read_meta(paths.facts, "facts")
    facts = io.read_parquet(paths.facts / "facts.parquet")
    qs = io.read_parquet(paths.facts / "queries.parquet")
    cands = io.read_parquet(paths.facts / "candidates.parquet")
    qdf, seg = build(facts, causal_facts, qs, st.segments, st.seed)
    check_fits(tokenizer.load(paths.tokenizer), qdf, seg, cands, common.model_window(paths))
    reader_labels = seg.merge(qdf[["query_id", "reader", "learned"]], on="query_id")
    reader_labels = reader_labels[reader_labels["learned"]]
    own = np.where(
        reader_labels["reader"] == MODELS[0],
        reader_labels[f"label_{MODELS[0]}"],
        reader_labels[f"label_{MODELS[1]}"],
    )
    out = paths.context("contexts")
    with io.atomic_dir(out) as tmp:
        io.write_parquet(tmp / "queries.parquet", qdf)
        io.write_parquet(tmp / "segments.parquet", seg)
        return io.write_meta(
            tmp,
            "context_contexts",
            ["queries.parquet", "segments.parquet"],
            config_hash=settings_hash(st),
            inputs={"facts": facts_meta["hash"], "causal": causal_meta["hash"]},
            info={
                "queries": len(qdf),
                "segments": st.segments,
                "learned_queries": int(qdf["learned"].sum()),
                "reader_iw_share_learned": float((own == "iw").mean()) if len(own) else None,
            },
        )
