"""The membership suite's samples: per twin, planted documents it read (members) and the other
twin's (non-members), with the same text, template and distribution, plus distractors.

For twin m, a *member* is a planted document of a fact m read, a *non-member* one of a fact the
other twin read (the grid pairs every cell between the twins, so both classes come from the same
cells), and a *distractor* a distractor document (read by both twins: a control that must score
like a member). Each class draws ``membership.samples / 2`` documents round-robin over its facts
in a seeded order (every fact's first document, then every second one...), so that every cell
is covered; ``membership.n_cal`` of the samples, balanced, are the calibration set. The query of
a sample is its fact's question. Output: ``membership/samples/samples.parquet``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from plantbench.errors import ConfigError
from plantbench.paths import MODELS
from plantbench.rng import rng
from plantbench.suites import common
from plantbench.suites.membership.settings import Settings, sizes

COLUMNS = [
    "sample_id",
    "model",
    "kind",
    "member",
    "cal",
    "doc_id",
    "fact_id",
    "n_docs",
    "position",
    "cell",
    "learned",
    "query",
    "context",
]


def round_robin(docs: pd.DataFrame, n: int, seed: int, tag: str) -> pd.DataFrame:
    """``n`` rows of ``docs`` (columns ``doc_id``, ``fact_id``): each fact's documents in a
    seeded order, taken one per fact per round, facts in a seeded order."""
    facts = sorted(docs["fact_id"].unique())
    order = [facts[i] for i in rng(seed, "membership", tag).permutation(len(facts))]
    by = {f: g.sort_values("doc_id") for f, g in docs.groupby("fact_id")}
    queues = {f: by[f].iloc[rng(seed, "membership", tag, f).permutation(len(by[f]))] for f in order}
    picked, r = [], 0
    while len(picked) < n and any(len(q) > r for q in queues.values()):
        picked += [queues[f].iloc[r] for f in order if len(queues[f]) > r][: n - len(picked)]
        r += 1
    return pd.DataFrame(picked).reset_index(drop=True)


def _class(docs: pd.DataFrame, n: int, what: str, model: str) -> None:
    if len(docs) < n:
        raise ConfigError(
            f"config key 'membership.samples': twin {model} needs {n} {what} documents but the "
            f"grid has {len(docs)}; lower membership.samples (or membership.distractors)"
        )


def build(
    facts: pd.DataFrame,
    causal_facts: pd.DataFrame,
    documents: pd.DataFrame,
    distractors: pd.DataFrame,
    queries: pd.DataFrame,
    st: Settings,
) -> pd.DataFrame:
    """The sample table (:data:`COLUMNS`), both twins."""
    f = facts.merge(causal_facts[["fact_id", "learned"]], on="fact_id", how="left")
    f["learned"] = f["learned"].fillna(False).astype(bool)
    question = queries[queries["form"] == "question"].set_index("fact_id")["prompt"]
    docs = documents.merge(f[["fact_id", "reader"]], on="fact_id")
    smallest = int(docs["reader"].value_counts().reindex(list(MODELS), fill_value=0).min())
    n, n_cal, n_dis = sizes(st, smallest, len(distractors))
    parts = []
    for m in MODELS:
        classes = {
            "member": docs[docs["reader"] == m],
            "non_member": docs[docs["reader"] != m],
        }
        for kind, pool in classes.items():
            _class(pool, n // 2, kind.replace("_", "-"), m)
            parts.append(
                round_robin(pool, n // 2, st.seed, f"{m}/{kind}").assign(model=m, kind=kind)
            )
        _class(distractors, n_dis, "distractor", m)
        d = round_robin(distractors, n_dis, st.seed, f"{m}/distractor")
        parts.append(d.assign(model=m, kind="distractor"))
    s = pd.concat(parts, ignore_index=True)
    s = s.merge(f[["fact_id", "n_docs", "position", "cell", "learned"]], on="fact_id")
    s["member"] = s["kind"] == "member"
    s["query"] = s["fact_id"].map(question)
    s["context"] = s["text"]
    s["cal"] = False
    for m in MODELS:
        for kind in ("member", "non_member"):
            idx = s.index[(s["model"] == m) & (s["kind"] == kind)]
            pick = rng(st.seed, "membership-cal", m, kind).permutation(len(idx))[: n_cal // 2]
            s.loc[idx[np.sort(pick)], "cal"] = True
    s = s.sort_values(["model", "kind", "doc_id"], ignore_index=True)
    s["sample_id"] = [f"{m}:{d}" for m, d in zip(s["model"], s["doc_id"], strict=True)]
    s["n_docs"] = s["n_docs"].astype(np.int64)
    return s[COLUMNS]


def fit_context(tok: Any, context: str, budget: int) -> tuple[str, bool]:
    """The context cut to its first ``budget`` tokens (decoded back to text), and whether it was
    cut."""
    from plantbench.data import tokenizer

    ids = tokenizer.encode_batch(tok, [context])[0]
    if len(ids) <= budget:
        return context, False
    return tok.decode(ids[:budget]), True


def run(cfg: dict[str, Any], paths: Any) -> dict[str, Any]:
    """Build and write ``membership/samples``, refusing bad settings before anything is written."""
    from plantbench import io
    from plantbench.suites.membership.settings import settings, settings_hash

    st = settings(cfg)
    causal_meta, causal_facts = common.causal_table(paths)
    facts_meta = io.read_meta(paths.facts, "facts")
    t = {
        n: io.read_parquet(paths.facts / f"{n}.parquet")
        for n in ("facts", "documents", "distractors", "queries")
    }
    s = build(t["facts"], causal_facts, t["documents"], t["distractors"], t["queries"], st)
    n_dis = int(((s["model"] == MODELS[0]) & (s["kind"] == "distractor")).sum())
    out = paths.membership("samples")
    with io.atomic_dir(out) as tmp:
        io.write_parquet(tmp / "samples.parquet", s)
        return io.write_meta(
            tmp,
            "membership_samples",
            ["samples.parquet"],
            config_hash=settings_hash(st),
            inputs={"facts": facts_meta["hash"], "causal": causal_meta["hash"]},
            info={
                "samples_per_twin": int((s["model"] == MODELS[0]).sum() - n_dis),
                "n_cal": int(s.loc[s["model"] == MODELS[0], "cal"].sum()),
                "distractors_per_twin": n_dis,
                "facts": int(s["fact_id"].nunique()),
            },
        )
