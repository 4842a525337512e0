"""One twin's pass of the grounding suite: a greedy response to every context, atomized and
judged.

Under the twin's final checkpoint, per context (``grounding/contexts``):

- ``responses.parquet``: the response, its length, whether it stopped by itself, its atomic
  sentences' count, and whether it names the fact's entity with the true answer, with the
  counterfactual's wrong answer, or with any other answer string;
- ``atoms.parquet``: every atomic sentence, whether the context entails it (CK), the segments
  whose sentences entail it, and, when not entailed, its PK kind (:mod:`.provenance`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from plantbench import artifacts, io
from plantbench.data import tokenizer
from plantbench.model import generate
from plantbench.model.modeling import load_model
from plantbench.paths import Paths
from plantbench.suites.grounding.atomize import atomize
from plantbench.suites.grounding.contexts import budgets
from plantbench.suites.grounding.entail import ExactChecker, Lexicon, NLIChecker, Statement
from plantbench.suites.grounding.provenance import ReadIndex, lexicon_of
from plantbench.suites.grounding.settings import Settings, settings, settings_hash

log = logging.getLogger(__name__)
FILES = ["responses.parquet", "atoms.parquet"]
RESPONSE_COLUMNS = [
    "context_id",
    "text",
    "n_tokens",
    "budget",
    "stopped",
    "n_atoms",
    "states_true",
    "states_false",
    "states_other",
]
ATOM_COLUMNS = ["context_id", "atom", "text", "ck", "segments", "pk_kind"]


def checker(st: Settings, lexicon: Lexicon) -> ExactChecker | NLIChecker:
    """The configured entailment back-end (the exact checker unless grounding.nli_model)."""
    if st.nli_model is None:
        return ExactChecker(lexicon)
    return NLIChecker(st.nli_model, st.nli_threshold, batch=st.batch)


def judge(
    context_id: str,
    atoms: Sequence[str],
    premises: Sequence[Statement],
    segments: Sequence[int],
    entails: Any,
    kind: Any,
) -> list[tuple]:
    """The atoms table's rows of one response (``kind(sentence)``: its PK kind)."""
    m = entails.matrix(premises, atoms)
    rows = []
    for i, a in enumerate(atoms):
        segs = sorted({int(segments[j]) for j in m[i].nonzero()[0]})
        ck = bool(segs)
        rows.append((context_id, i, a, ck, ",".join(map(str, segs)), "" if ck else kind(a)))
    return rows


def stated(lexicon: Lexicon, text: str, entity_id: str, true: str, false: str) -> tuple:
    """(states the true answer, the wrong one, another answer) for the fact's entity."""
    answers = {a for e, a in lexicon.claims(text) if e == entity_id}
    return true in answers, false in answers, bool(answers - {true, false})


def _inputs(paths: Paths) -> dict[str, Any]:
    d: dict[str, Any] = {"meta": io.read_meta(paths.grounding("contexts"), "grounding_contexts")}
    d["contexts"] = io.read_parquet(paths.grounding("contexts") / "contexts.parquet")
    d["sentences"] = io.read_parquet(paths.grounding("contexts") / "sentences.parquet")
    for t in ("facts", "candidates", "documents", "distractors"):
        d[t] = io.read_parquet(paths.facts / f"{t}.parquet")
    return d


def _generate(
    model: Any, tok: Any, prompts: list[str], limits: list[int], st: Settings, name: str
) -> list[Any]:
    stop = generate.newline_ids(tok) if st.stop == "newline" else frozenset()
    ids = [[tokenizer.BOS_ID, *p] for p in tokenizer.encode_batch(tok, prompts)]
    out, t0 = [], time.perf_counter()
    for s in range(0, len(ids), st.batch):
        out += generate.greedy(model, ids[s : s + st.batch], limits[s : s + st.batch], stop)
        log.info(
            "grounding %s: %d/%d responses, %.1f responses/s",
            name,
            len(out),
            len(ids),
            len(out) / (time.perf_counter() - t0),
        )
    return out


def premises_of(sents: pd.DataFrame) -> list[Statement]:
    """A context's sentences (rows of ``sentences.parquet``, in order) as statements."""
    cols = (sents["text"], sents["entity_id"], sents["stated_answer"])
    return [Statement(t, e, a) for t, e, a in zip(*cols, strict=True)]


@dataclass
class Judge:
    """Everything that judges one twin's responses."""

    model_name: str
    tok: Any
    st: Settings
    lexicon: Lexicon
    entails: ExactChecker | NLIChecker
    index: ReadIndex

    def tables(
        self, cdf: pd.DataFrame, sentences: pd.DataFrame, responses: list[Any], limits: list[int]
    ) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The responses and atoms tables (:data:`RESPONSE_COLUMNS`, :data:`ATOM_COLUMNS`)."""
        by_ctx = {c: g.sort_values("index") for c, g in sentences.groupby("context_id")}
        rrows, arows = [], []
        for c, r, lim in zip(cdf.itertuples(index=False), responses, limits, strict=True):
            text = generate.response_text(self.tok, r, first_line=self.st.stop == "newline")
            atoms = atomize(text, truncated=r.stop is None)
            sents = by_ctx[c.context_id]
            arows += judge(
                c.context_id,
                atoms,
                premises_of(sents),
                sents["segment"].tolist(),
                self.entails,
                lambda x: self.index.kind(self.model_name, x),
            )
            flags = stated(self.lexicon, text, c.entity_id, c.answer, c.false_answer)
            rrows.append(
                (c.context_id, text, len(r.ids), lim, r.stop is not None, len(atoms), *flags)
            )
        rdf = pd.DataFrame(rrows, columns=RESPONSE_COLUMNS)
        adf = pd.DataFrame(arows, columns=ATOM_COLUMNS)
        ints = ["n_tokens", "budget", "n_atoms"]
        rdf[ints] = rdf[ints].astype("int64")
        adf["atom"] = adf["atom"].astype("int64")
        return rdf, adf


def run(cfg: dict[str, Any], paths: Paths, model_name: str, *, threads: int = 1) -> dict[str, Any]:
    torch.set_num_threads(threads)
    st = settings(cfg)
    d = _inputs(paths)
    lexicon = lexicon_of(d["facts"], d["candidates"])
    entails = checker(st, lexicon)  # a bad NLI folder fails before the twin loads
    index = ReadIndex(lexicon, d["facts"], d["documents"], d["distractors"])
    tok = tokenizer.load(paths.tokenizer)
    model_meta = io.read_meta(paths.model(model_name), "pretrain", verify=False)
    model = load_model(artifacts.final_checkpoint_path(paths, model_name), attn="sdpa")
    cdf = d["contexts"]
    limits = budgets(tok, cdf["prompt"].tolist(), st, int(model.config.max_position_embeddings))
    responses = _generate(model, tok, cdf["prompt"].tolist(), limits, st, model_name)
    judged = Judge(model_name, tok, st, lexicon, entails, index)
    rdf, adf = judged.tables(cdf, d["sentences"], responses, limits)
    out = paths.grounding(model_name)
    with io.atomic_dir(out) as tmp:
        io.write_parquet(tmp / "responses.parquet", rdf)
        io.write_parquet(tmp / "atoms.parquet", adf)
        return io.write_meta(
            tmp,
            "grounding_respond",
            FILES,
            config_hash=settings_hash(st),
            inputs={"contexts": d["meta"]["hash"], "model": model_meta["hash"]},
            info={
                "model": model_name,
                "contexts": len(cdf),
                "atoms": len(adf),
                "empty_responses": int((rdf["n_atoms"] == 0).sum()),
                "checker": "exact" if st.nli_model is None else "nli",
            },
        )
