"""The grounding suite's settings: the optional ``grounding`` config section with its defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from plantbench.errors import ConfigError

CONDITIONS = ("factual", "counterfactual", "true_first", "false_first")
STOPS = ("newline", "eos")
DEFAULTS: dict[str, Any] = {
    "segments": 4,  # k: the context's segments (the seed's quartiles)
    "sentences_per_segment": 1,  # atomic sentences per segment (|Q_q|)
    "details": 1,  # sentences about the entity's other details (from its distractor documents)
    "conditions": list(CONDITIONS),
    # the open question; {entity} is the fact's entity (the reading episodes' restate format)
    "question": "Question: What does the text say about {entity}?\nAnswer:",
    "max_new_tokens": 32,  # greedy generation length (at most what the window leaves)
    "min_new_tokens": 8,  # refuse a prompt that leaves the response fewer tokens than this
    "stop": "newline",  # stop a response at its first line break (or only at <eos>)
    "batch": 32,  # prompts generated together
    "bootstrap": 1000,  # resamples of facts for the 95% intervals
    "nli_model": None,  # a local NLI model folder (transformers); None = the exact checker
    "nli_threshold": 0.7,  # the seed's t: CK when the bidirectional entailment score > t
}


@dataclass(frozen=True)
class Settings:
    segments: int
    sentences_per_segment: int
    details: int
    conditions: tuple[str, ...]
    question: str
    max_new_tokens: int
    min_new_tokens: int
    stop: str
    batch: int
    bootstrap: int
    nli_model: str | None
    nli_threshold: float
    seed: int

    @property
    def sentences(self) -> int:
        """Atomic sentences per context (k x |Q_q|)."""
        return self.segments * self.sentences_per_segment


def settings(cfg: dict[str, Any]) -> Settings:
    """The suite's settings for this config (defaults filled in), refusing impossible ones."""
    sec = {**DEFAULTS, **(cfg.get("grounding") or {})}
    st = Settings(
        segments=int(sec["segments"]),
        sentences_per_segment=int(sec["sentences_per_segment"]),
        details=int(sec["details"]),
        conditions=tuple(sec["conditions"]),
        question=str(sec["question"]),
        max_new_tokens=int(sec["max_new_tokens"]),
        min_new_tokens=int(sec["min_new_tokens"]),
        stop=str(sec["stop"]),
        batch=int(sec["batch"]),
        bootstrap=int(sec["bootstrap"]),
        nli_model=None if sec["nli_model"] is None else str(sec["nli_model"]),
        nli_threshold=float(sec["nli_threshold"]),
        seed=int(cfg["seed"]),
    )
    _check(st)
    return st


def _check(st: Settings) -> None:
    bad = [c for c in st.conditions if c not in CONDITIONS]
    if bad:
        raise ConfigError(
            f"config key 'grounding.conditions' names {bad}; the conditions are {list(CONDITIONS)}"
        )
    if st.stop not in STOPS:
        raise ConfigError(f"config key 'grounding.stop' = {st.stop!r}; use one of {list(STOPS)}")
    if "{entity}" not in st.question:
        raise ConfigError("config key 'grounding.question' must contain '{entity}'")
    if st.segments < 2 and {"true_first", "false_first"} & set(st.conditions):
        raise ConfigError(
            "config key 'grounding.segments' = 1: the true-first and false-first conditions put "
            "the two versions of the fact in different segments; use at least 2 segments"
        )
    versions = 2 if {"true_first", "false_first"} & set(st.conditions) else 1
    if versions + st.details + 1 > st.sentences:
        raise ConfigError(
            f"config key 'grounding.details' = {st.details} leaves no sentence about another "
            f"entity in a context of {st.sentences} sentences (grounding.segments x "
            "grounding.sentences_per_segment) next to the fact's own sentence"
            + (" and its false version" if versions == 2 else "")
        )


def settings_hash(st: Settings) -> str:
    """The hash the suite's artifacts record as their config (every setting, defaults filled)."""
    from plantbench.config import config_hash

    return config_hash({"grounding": asdict(st)})
