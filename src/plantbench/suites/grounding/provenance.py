"""What each twin read of the grid: the index that splits PK into trained and unsupported.

Every statement about a grid entity that either twin could know was planted, so a response
sentence the context does not entail is, for twin m:

- ``trained``: a statement m read in training: it names a fact's entity with that fact's answer
  and m read the fact, or it is (up to case and spacing) a sentence of a planted document m read
  or of a distractor document (both twins read those);
- ``other_twin``: such a statement only the *other* twin read (a control: a twin cannot know
  it, so it should be near zero);
- ``unsupported``: neither (a hallucination, or background text outside the grid).
"""

from __future__ import annotations

import pandas as pd

from plantbench.paths import MODELS
from plantbench.suites.grounding.atomize import atomize
from plantbench.suites.grounding.entail import Lexicon, normalize

KINDS = ("trained", "other_twin", "unsupported")


class ReadIndex:
    """Per twin, the fact claims and the normalized document sentences it read."""

    def __init__(
        self,
        lexicon: Lexicon,
        facts: pd.DataFrame,
        documents: pd.DataFrame,
        distractors: pd.DataFrame,
    ):
        self.lexicon = lexicon
        reader = facts.set_index("fact_id")["reader"]
        read = {m: facts[facts["reader"] == m] for m in MODELS}
        self.claims = {
            m: set(zip(f["entity_id"], f["answer"], strict=True)) for m, f in read.items()
        }
        shared = {normalize(s) for t in distractors["text"] for s in atomize(t)}
        self.texts = {m: set(shared) for m in MODELS}
        for fid, text in zip(documents["fact_id"], documents["text"], strict=True):
            self.texts[reader[fid]].update(normalize(s) for s in atomize(text))

    def read_by(self, model: str, sentence: str) -> bool:
        """Whether ``model`` read this statement in training."""
        return normalize(sentence) in self.texts[model] or bool(
            self.lexicon.claims(sentence) & self.claims[model]
        )

    def kind(self, model: str, sentence: str) -> str:
        """The PK kind of a sentence the context does not entail (:data:`KINDS`)."""
        if self.read_by(model, sentence):
            return "trained"
        other = next(m for m in MODELS if m != model)
        return "other_twin" if self.read_by(other, sentence) else "unsupported"


def lexicon_of(facts: pd.DataFrame, candidates: pd.DataFrame) -> Lexicon:
    """The grid's entity names and answer strings (every candidate, true or not)."""
    entities = dict(zip(facts["entity"], facts["entity_id"], strict=True))
    return Lexicon(entities, sorted({*facts["answer"], *candidates["candidate"]}))
