"""Entailment of a response's atomic sentence by a context (or training) sentence.

Two back-ends give the same thing, a boolean matrix ``[hypotheses, premises]``:

- :class:`ExactChecker` (the default, no model): the facts' own structure. Every context
  sentence is a *statement* (its entity and the answer it states; a detail states no answer). A
  hypothesis is entailed by a statement when it is the same sentence (up to case, spacing and
  end punctuation), or when it names the statement's entity in full together with the
  statement's answer. So a sentence naming the entity with another entity's answer, or with a
  candidate the context does not state, is not entailed.
- :class:`NLIChecker`: a local NLI model folder (transformers sequence classification with an
  ``entailment`` label), for free text. As the seed's INFUSE adaptation, the score of a pair is
  bidirectional, ``max(P(premise => hypothesis), P(hypothesis => premise))``, and a hypothesis is
  entailed when the score exceeds ``grounding.nli_threshold`` (the seed's t = 0.7).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plantbench.errors import ConfigError


@dataclass(frozen=True)
class Statement:
    """A sentence with its structure: ``answer`` is "" for a detail."""

    text: str
    entity_id: str
    answer: str


def normalize(text: str) -> str:
    """Lowercase, single spaces, no list marker or end punctuation."""
    t = " ".join(text.lower().removeprefix("- ").split())
    return t.rstrip(".!?").strip()


def _pattern(names: Sequence[str]) -> re.Pattern[str]:
    """One alternation of the names, longest first, on word boundaries."""
    alts = "|".join(re.escape(n) for n in sorted(set(names), key=lambda n: (-len(n), n)))
    return re.compile(rf"(?<![\w-])(?:{alts})(?![\w-])")


class Lexicon:
    """The grid's entity names and every answer string (answers and candidates)."""

    def __init__(self, entities: dict[str, str], answers: Sequence[str]):
        self.entity_of = dict(entities)  # name -> entity id
        self._entities = _pattern(list(entities))
        self._answers = _pattern(list(answers))

    def claims(self, sentence: str) -> set[tuple[str, str]]:
        """(entity id, answer) of every entity named in full and every answer string found."""
        ents = {self.entity_of[m] for m in self._entities.findall(sentence)}
        answers = set(self._answers.findall(sentence))
        return {(e, a) for e in ents for a in answers}


class ExactChecker:
    """Entailment from the facts' structure (see the module docstring)."""

    def __init__(self, lexicon: Lexicon):
        self.lexicon = lexicon

    def matrix(self, premises: Sequence[Statement], hypotheses: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(hypotheses), len(premises)), dtype=bool)
        norm_p = [normalize(p.text) for p in premises]
        for i, h in enumerate(hypotheses):
            claims, nh = self.lexicon.claims(h), normalize(h)
            for j, p in enumerate(premises):
                out[i, j] = nh == norm_p[j] or (
                    bool(p.answer) and (p.entity_id, p.answer) in claims
                )
        return out


Scorer = Callable[[Sequence[str], Sequence[str]], np.ndarray]


class NLIChecker:
    """Bidirectional NLI entailment (see the module docstring). ``scorer(premises, hypotheses)``
    returns P(entailment) of each pair; by default the model in ``folder``."""

    def __init__(
        self,
        folder: str | Path | None,
        threshold: float,
        *,
        scorer: Scorer | None = None,
        batch: int = 32,
    ):
        self.threshold = float(threshold)
        self.scorer = scorer if scorer is not None else nli_scorer(folder, batch)

    def scores(self, premises: Sequence[Statement], hypotheses: Sequence[str]) -> np.ndarray:
        """``[hypotheses, premises]`` bidirectional entailment scores."""
        if not len(hypotheses) or not len(premises):
            return np.zeros((len(hypotheses), len(premises)))
        ps = [p.text for p in premises for _ in hypotheses]
        hs = [h for _ in premises for h in hypotheses]
        fwd = np.asarray(self.scorer(ps, hs), dtype=np.float64)
        back = np.asarray(self.scorer(hs, ps), dtype=np.float64)
        return np.maximum(fwd, back).reshape(len(premises), len(hypotheses)).T

    def matrix(self, premises: Sequence[Statement], hypotheses: Sequence[str]) -> np.ndarray:
        return self.scores(premises, hypotheses) > self.threshold


def entailment_label(id2label: dict[Any, str], folder: Any) -> int:
    """The index of the model's entailment label; refuse a model that has none."""
    found = [int(i) for i, name in id2label.items() if str(name).lower().startswith("entail")]
    if len(found) != 1:
        raise ConfigError(
            f"config key 'grounding.nli_model' = '{folder}' is not an NLI model: its labels "
            f"{sorted(map(str, id2label.values()))} have no single 'entailment' label"
        )
    return found[0]


def nli_scorer(folder: str | Path | None, batch: int = 32) -> Scorer:
    """P(entailment) of (premise, hypothesis) pairs from a local transformers NLI model."""
    path = Path(str(folder)) if folder is not None else None
    if path is None or not (path / "config.json").is_file():
        raise ConfigError(
            f"config key 'grounding.nli_model' = '{folder}': no model folder with a config.json "
            "there (a local transformers NLI model; leave the key unset for the exact checker)"
        )
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from plantbench.model.modeling import compute_device, to_numpy

    dev = compute_device()
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True)
    model.to(dev).eval()
    label = entailment_label(model.config.id2label, folder)
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)

    @torch.no_grad()
    def score(premises: Sequence[str], hypotheses: Sequence[str]) -> np.ndarray:
        out = []
        for s in range(0, len(premises), batch):
            enc = tok(
                list(premises[s : s + batch]),
                list(hypotheses[s : s + batch]),
                padding=True,
                truncation=True,
                return_tensors="pt",
            ).to(dev)
            probs = torch.softmax(model(**enc).logits.float(), dim=-1)[:, label]
            out.append(to_numpy(probs.double()))
        return np.concatenate(out) if out else np.zeros(0)

    return score
