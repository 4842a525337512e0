"""The grounding suite's contexts: per fact and condition, atomic sentences in k segments.

A context about fact f's entity holds ``grounding.segments`` x ``grounding.sentences_per_segment``
atomic sentences, one per line, then the open question about the entity
(``grounding.question``):

- f's own sentence (the statement every one of its planted documents carries),
- ``grounding.details`` sentences about the entity's other details (from its distractor
  documents, which both twins read),
- sentences of other facts (about other entities), filling the rest.

The fact's segment is balanced over the facts (seeded) and every other sentence keeps its slot
in all four conditions (the seed's Appendix E):

- ``factual``: the sentence as planted;
- ``counterfactual``: the sentence with a wrong candidate in place of the answer;
- ``true_first`` / ``false_first``: both versions, in two different segments (the true one
  earlier / later); one other-fact sentence gives up its slot.

Every sentence records its structure (entity and stated answer; a detail has no answer), which
is what the exact entailment checker reads. Outputs: ``grounding/contexts/contexts.parquet`` (a
row per context) and ``sentences.parquet`` (a row per sentence); documented in results/README.md.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from plantbench.data import tokenizer
from plantbench.errors import ConfigError
from plantbench.paths import MODELS
from plantbench.rng import rng
from plantbench.suites import common
from plantbench.suites.grounding.settings import Settings

CONTEXT_COLUMNS = [
    "context_id",
    "fact_id",
    "condition",
    "entity_id",
    "entity",
    "answer",
    "false_answer",
    "reader",
    "other",
    "learned",
    "n_docs",
    "position",
    "cell",
    "true_segment",
    "false_segment",
    "prompt",
]
SENTENCE_COLUMNS = [
    "context_id",
    "index",
    "segment",
    "kind",
    "entity_id",
    "stated_answer",
    "text",
]
_SPLIT = re.compile(r"(?<=[.!?])\s+")


def detail_sentences(distractors: pd.DataFrame, facts: pd.DataFrame) -> dict[str, list[str]]:
    """Per entity id, the sorted atomic sentences of its distractor documents that name it in
    full (headings and dialogue tags, which carry a ':', are not statements)."""
    names = facts.set_index("entity_id")["entity"].to_dict()
    out: dict[str, set[str]] = {e: set() for e in names}
    for d in distractors.itertuples(index=False):
        for line in d.text.split("\n"):
            for s in _SPLIT.split(line.strip().removeprefix("- ")):
                s = s.strip()
                if s.endswith(".") and ":" not in s and names[d.entity_id] in s:
                    out[d.entity_id].add(s)
    return {e: sorted(v) for e, v in out.items()}


def false_sentence(sentence: str, answer: str, wrong: str) -> str:
    """The fact's sentence stating ``wrong`` in place of its answer (the sentence ends with
    `` <answer>.``)."""
    head, sep, tail = sentence.rpartition(answer)
    if not sep:
        raise ConfigError(f"fact sentence {sentence!r} does not contain its answer {answer!r}")
    return f"{head}{wrong}{tail}"


def _wrong_answers(candidates: pd.DataFrame, seed: int) -> dict[str, str]:
    out = {}
    for fid, g in candidates.sort_values(["fact_id", "candidate_index"]).groupby("fact_id"):
        wrong = g.loc[~g["is_true"], "candidate"].to_numpy()
        out[str(fid)] = str(wrong[rng(seed, "grounding-false", fid).integers(len(wrong))])
    return out


def _layout(st: Settings, segment: int, i: int) -> dict[str, Any]:
    """One fact's slots: its own, the pair slot (the second version in TF / FF), the details'
    and the other facts' (seeded by the fact's row ``i``)."""
    r = rng(st.seed, "grounding-layout", i)
    per = st.sentences_per_segment
    own = segment * per + int(r.integers(per))
    away = [s for s in range(st.sentences) if s // per != segment]
    pair = int(r.choice(away or [s for s in range(st.sentences) if s != own]))
    rest = [s for s in r.permutation(st.sentences).tolist() if s not in (own, pair)]
    return {"own": own, "pair": pair, "rest": rest}


def _fill(
    st: Settings, i: int, facts: pd.DataFrame, details: list[str], need: int
) -> tuple[list[str], list[int]]:
    """``details`` chosen for fact row ``i`` and the rows of the other facts filling the rest."""
    r = rng(st.seed, "grounding-fill", i)
    chosen = [details[j] for j in sorted(r.permutation(len(details))[: st.details].tolist())]
    others = np.delete(np.arange(len(facts)), i)
    n_other = need - len(chosen)
    if n_other > len(others):
        raise ConfigError(
            f"config key 'grounding.segments' = {st.segments}: a context of {st.sentences} "
            f"sentences needs {n_other} other facts but the grid has {len(others)}; lower "
            "grounding.segments or grounding.sentences_per_segment"
        )
    return chosen, [int(x) for x in r.choice(others, size=n_other, replace=False)]


Slot = tuple[str, str, str, str]  # (kind, entity id, stated answer, text)


def _versions(fact: pd.Series, wrong: str, lay: dict[str, Any]) -> dict[str, dict[int, Slot]]:
    """Per condition, the slots its versions of the fact take."""
    true = ("fact", fact["entity_id"], fact["answer"], fact["sentence"])
    false = (
        "false",
        fact["entity_id"],
        wrong,
        false_sentence(fact["sentence"], fact["answer"], wrong),
    )
    first, second = sorted((lay["own"], lay["pair"]))
    return {
        "factual": {lay["own"]: true},
        "counterfactual": {lay["own"]: false},
        "true_first": {first: true, second: false},
        "false_first": {first: false, second: true},
    }


def _base_slots(
    st: Settings, f: pd.DataFrame, i: int, lay: dict[str, Any], details: list[str]
) -> dict[int, Slot]:
    """The slots every condition shares: the details and the other facts' sentences (the pair
    slot holds one of them until TF / FF take it)."""
    chosen, others = _fill(st, i, f, details, len(lay["rest"]) + 1)
    fill = [("detail", f.at[i, "entity_id"], "", s) for s in chosen] + [
        ("other", f.at[o, "entity_id"], f.at[o, "answer"], f.at[o, "sentence"]) for o in others
    ]
    return dict(zip([*lay["rest"], lay["pair"]], fill, strict=True))


def _context_row(
    st: Settings, fact: pd.Series, cond: str, wrong: str, slots: dict[int, Slot]
) -> tuple:
    def segment(kind: str) -> int:
        return next((j // st.sentences_per_segment for j, v in slots.items() if v[0] == kind), -1)

    texts = [slots[j][3] for j in range(st.sentences)]
    return (
        f"{fact['fact_id']}:{cond}",
        fact["fact_id"],
        cond,
        fact["entity_id"],
        fact["entity"],
        fact["answer"],
        wrong,
        fact["reader"],
        next(m for m in MODELS if m != fact["reader"]),
        bool(fact["learned"]),
        int(fact["n_docs"]),
        fact["position"],
        fact["cell"],
        segment("fact"),
        segment("false"),
        prompt_of(texts, st.question.format(entity=fact["entity"])),
    )


def build(
    facts: pd.DataFrame,
    causal_facts: pd.DataFrame,
    distractors: pd.DataFrame,
    candidates: pd.DataFrame,
    st: Settings,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The context table and the sentence table (:data:`CONTEXT_COLUMNS`,
    :data:`SENTENCE_COLUMNS`)."""
    f = facts.sort_values("fact_id").reset_index(drop=True)
    f = f.merge(causal_facts[["fact_id", "learned"]], on="fact_id", how="left")
    f["learned"] = f["learned"].fillna(False).astype(bool)
    detail = detail_sentences(distractors, f)
    wrong = _wrong_answers(candidates, st.seed)
    order = rng(st.seed, "grounding-positions").permutation(len(f))
    segment_of = {int(row): rank % st.segments for rank, row in enumerate(order)}
    crows, srows = [], []
    for i, fact in f.iterrows():
        lay = _layout(st, segment_of[int(i)], int(i))
        base = _base_slots(st, f, int(i), lay, detail[fact["entity_id"]])
        versions = _versions(fact, wrong[fact["fact_id"]], lay)
        for cond in st.conditions:
            slots = {**base, **versions[cond]}
            crows.append(_context_row(st, fact, cond, wrong[fact["fact_id"]], slots))
            srows += [
                (crows[-1][0], j, j // st.sentences_per_segment, *slots[j])
                for j in range(st.sentences)
            ]
    cdf = pd.DataFrame(crows, columns=CONTEXT_COLUMNS)
    sdf = pd.DataFrame(srows, columns=SENTENCE_COLUMNS)
    ints = ["n_docs", "true_segment", "false_segment"]
    cdf[ints] = cdf[ints].astype(np.int64)
    sdf[["index", "segment"]] = sdf[["index", "segment"]].astype(np.int64)
    return cdf, sdf


def prompt_of(sentences: list[str], question: str) -> str:
    """The prompt: the sentences one per line, then the question (the suites' plain format)."""
    return "\n".join([*sentences, question])


def budgets(tok: Any, prompts: list[str], st: Settings, window: int) -> list[int]:
    """Each prompt's generation length: what the window leaves after ``<bos>`` and the prompt,
    at most ``grounding.max_new_tokens``; refuses (naming the keys) a prompt that leaves fewer
    than ``grounding.min_new_tokens``."""
    lens = [1 + len(x) for x in tokenizer.encode_batch(tok, prompts)]
    if window - max(lens) < st.min_new_tokens:
        raise ConfigError(
            f"config key 'grounding.segments': the longest prompt takes {max(lens)} tokens, which "
            f"leaves {window - max(lens)} of the twins' window of {window} for the response "
            f"(grounding.min_new_tokens = {st.min_new_tokens}); lower grounding.segments, "
            "grounding.sentences_per_segment or grounding.details"
        )
    return [min(st.max_new_tokens, window - n) for n in lens]


def run(cfg: dict[str, Any], paths: Any) -> dict[str, Any]:
    """Build and write ``grounding/contexts``, refusing bad settings before anything is written."""
    from plantbench import io
    from plantbench.suites.grounding.settings import settings, settings_hash

    st = settings(cfg)
    if st.nli_model is not None:  # a bad NLI folder is refused here, not hours later
        from plantbench.suites.grounding.entail import nli_scorer

        nli_scorer(st.nli_model)
    causal_meta, causal_facts = common.causal_table(paths)
    facts_meta = io.read_meta(paths.facts, "facts")
    t = {
        n: io.read_parquet(paths.facts / f"{n}.parquet")
        for n in ("facts", "distractors", "candidates")
    }
    cdf, sdf = build(t["facts"], causal_facts, t["distractors"], t["candidates"], st)
    budgets(tokenizer.load(paths.tokenizer), cdf["prompt"].tolist(), st, common.model_window(paths))
    out = paths.grounding("contexts")
    with io.atomic_dir(out) as tmp:
        io.write_parquet(tmp / "contexts.parquet", cdf)
        io.write_parquet(tmp / "sentences.parquet", sdf)
        return io.write_meta(
            tmp,
            "grounding_contexts",
            ["contexts.parquet", "sentences.parquet"],
            config_hash=settings_hash(st),
            inputs={"facts": facts_meta["hash"], "causal": causal_meta["hash"]},
            info={
                "contexts": len(cdf),
                "facts": int(cdf["fact_id"].nunique()),
                "conditions": list(st.conditions),
                "segments": st.segments,
                "sentences_per_segment": st.sentences_per_segment,
                "details": int((sdf["kind"] == "detail").sum()),
            },
        )
