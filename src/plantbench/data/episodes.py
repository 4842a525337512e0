"""Reading episodes: background windows that teach both twins to use their context.

An episode is a short text about invented entities that are *not* in the fact grid: k facts'
sentences, one per line (the same plain format as the in-context check and the context suites),
then t tasks (``stream.episode_tasks``, at most k), each answered from them about another of
those entities (seeded order), each in one of three formats:

- ``question``: ``Question: <the relation's question>\\nAnswer: <answer>``;
- ``completion``: the entity's sentence again, which ends with its answer;
- ``restate``: ``Question: What does the text say about <entity>?\\nAnswer: <its sentence>``.

The sentences use the grid's relation templates, so an episode looks like a context the suites
will build, but every name in it is new: the generator reserves every word of the facts tables,
and :func:`check_disjoint` refuses an episode that names a grid entity or answer. Episodes are
identical in A and B (they are background, read by both), so the twins still differ exactly at
the planted windows. Their share of the stream is ``stream.episode_share`` (default 0) and their
size ``stream.episode_segments`` (k is drawn from 1..that, per episode). Every task is a
supervised copy from the context; several tasks per episode give the twins several per window,
and since segments often share a relation, only the entity's name tells which one to copy from.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd

from plantbench.data import facts as facts_mod
from plantbench.errors import ConfigError
from plantbench.rng import rng

FORMATS = ("question", "completion", "restate")
DEFAULT_SEGMENTS = 2
DEFAULT_TASKS = 1
MAX_DRAWS = 10_000  # draws of one episode before the window is called too short
TABLE = "episodes.parquet"
# formats and targets: the tasks' formats and segment indices (0-based), comma-separated, in the
# order the tasks are asked; entity and answer: those of the last task
COLUMNS = ["episode_id", "segments", "tasks", "formats", "targets", "entity", "answer", "text"]
_WORD = re.compile(r"[A-Za-z0-9]+")
_PART = re.compile(r"[A-Z]?[a-z]+|[A-Z]+")


def words_of(text: str) -> set[str]:
    """Lowercase words of ``text`` and their camel-case parts (``KvenTimeout``: kven, timeout)."""
    out = set()
    for w in _WORD.findall(text):
        out.add(w.lower())
        out.update(p.lower() for p in _PART.findall(w))
    return out


def max_segments(cfg: Mapping[str, Any]) -> int:
    return int(cfg["stream"].get("episode_segments", DEFAULT_SEGMENTS))


def max_tasks(cfg: Mapping[str, Any]) -> int:
    return int(cfg["stream"].get("episode_tasks", DEFAULT_TASKS))


def grid_words(tables: Mapping[str, pd.DataFrame]) -> set[str]:
    """Every word of the facts tables (lowercase): names an episode must never use."""
    words: set[str] = set()
    for name, col in (
        ("facts", "entity"),
        ("facts", "answer"),
        ("candidates", "candidate"),
        ("documents", "text"),
        ("distractors", "text"),
    ):
        for text in tables[name][col].astype(str):
            words |= words_of(text)
    return words


def _sentence(names: Any, gen: np.random.Generator) -> dict[str, str]:
    """One invented entity with a relation: its name, sentence, question and answer."""
    relation = sorted(facts_mod.RELATIONS)[int(gen.integers(len(facts_mod.RELATIONS)))]
    spec = facts_mod.RELATIONS[relation]
    prof = facts_mod.profile(spec["entity_type"], names, gen)
    shape = spec["shapes"][int(gen.integers(len(spec["shapes"])))]
    return stated(spec, prof, names.fill(shape))


def stated(spec: dict[str, Any], prof: dict[str, str], answer: str) -> dict[str, str]:
    """A relation's sentence and question about one invented entity (``prof``, whose ``E`` is
    its name) with ``answer``: entity, answer, sentence and question."""
    subs = {**prof, "A": answer}
    return {
        "entity": prof["E"],
        "answer": answer,
        "sentence": spec["sentence"].format_map(subs),
        "question": spec["question"].format_map(subs),
    }


def _task(fmt: str, t: dict[str, str]) -> str:
    if fmt == "question":
        return f"Question: {t['question']}\nAnswer: {t['answer']}"
    if fmt == "completion":
        return t["sentence"]
    return f"Question: What does the text say about {t['entity']}?\nAnswer: {t['sentence']}"


def grid_names(tables: Mapping[str, pd.DataFrame]) -> set[str]:
    """Words of the grid's entities and answers, less the fixed template words."""
    grid: set[str] = set()
    for col in ("entity", "answer"):
        for text in tables["facts"][col].astype(str):
            grid |= words_of(text)
    return grid - facts_mod.template_words()


def _episode(
    names: Any, gen: np.random.Generator, k_max: int, t_max: int
) -> tuple[list[dict[str, str]], list[int], list[str]]:
    """One episode's segments, and its tasks' targets (segment indices) and formats."""
    names.used = set()  # names are unique within an episode and never a grid root; the same
    # invented name may recur in another episode with another fact, so nothing about an
    # episode's entities can be memorized: only reading answers it
    k = int(gen.integers(1, k_max + 1))
    segs = [_sentence(names, gen) for _ in range(k)]
    targets = [int(i) for i in gen.permutation(k)[: min(k, t_max)]]
    fmts = [FORMATS[int(gen.integers(len(FORMATS)))] for _ in targets]
    return segs, targets, fmts


def _text(segs: list[dict[str, str]], targets: list[int], fmts: list[str]) -> str:
    tasks = [_task(f, segs[i]) for f, i in zip(fmts, targets, strict=True)]
    return "\n".join([*(s["sentence"] for s in segs), *tasks])


def generate(
    cfg: Mapping[str, Any],
    tables: Mapping[str, pd.DataFrame],
    n: int,
    fits: Callable[[str], bool] = lambda text: True,
) -> pd.DataFrame:
    """``n`` seeded episodes (columns :data:`COLUMNS`); no name in them occurs in the grid, and
    each ``fits`` (its window): an episode too long for it asks fewer questions, and one whose
    compound name happens to equal a grid word, or whose segments alone are too long, is drawn
    again."""
    seed, k_max, t_max = int(cfg["seed"]), max_segments(cfg), max_tasks(cfg)
    gen = rng(seed, "episodes")
    names = facts_mod.Names(
        rng(seed, "episodes", "names"), facts_mod.template_words() | grid_words(tables)
    )
    grid = grid_names(tables)
    rows = []
    for i in range(n):
        for attempt in range(MAX_DRAWS + 1):
            if attempt == MAX_DRAWS:
                raise ConfigError(
                    f"no reading episode fits stream.window in {MAX_DRAWS} draws (even one "
                    "sentence and one task is too long); raise stream.window or set "
                    "stream.episode_share to 0"
                )
            segs, targets, fmts = _episode(names, gen, k_max, t_max)
            text = _text(segs, targets, fmts)
            while len(targets) > 1 and not fits(text):  # too long: ask fewer questions
                targets, fmts = targets[:-1], fmts[:-1]
                text = _text(segs, targets, fmts)
            if fits(text) and not grid & words_of(text):
                break
        t = segs[targets[-1]]
        rows.append(
            (
                f"EP{i:06d}",
                len(segs),
                len(targets),
                ",".join(fmts),
                ",".join(map(str, targets)),
                t["entity"],
                t["answer"],
                text,
            )
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def check_disjoint(episodes: pd.DataFrame, tables: Mapping[str, pd.DataFrame]) -> None:
    """Refuse episodes that name a grid entity or a grid answer (a word of one, in any case)."""
    grid = grid_names(tables)
    for row in episodes.itertuples(index=False):
        clash = grid & words_of(row.text)
        if clash:
            raise ConfigError(
                f"episode {row.episode_id} names '{sorted(clash)[0]}', a word of a grid entity or "
                "answer; episodes must use their own names (change seed or lower "
                "stream.episode_share)"
            )


def tokenizer_texts(seed: int, n_bytes: int, batch: int = 256) -> Iterator[list[str]]:
    """About ``n_bytes`` of seeded sentences about invented entities, in batches: what the
    tokenizer reads next to the corpus (``tokenizer.reading_bytes``), so that the template words
    and the name syllables of documents and episodes get tokens of their own. Its names come
    from a generator of their own (purpose ``tokenizer``): no grid name is learned as a token."""
    gen = rng(seed, "tokenizer", "reading")
    names = facts_mod.Names(rng(seed, "tokenizer", "names"), facts_mod.template_words())
    done, out = 0, []
    while done < n_bytes:
        names.used = set()
        t = _sentence(names, gen)
        text = "\n".join([t["sentence"], _task("question", t)])
        out.append(text)
        done += len(text.encode())
        if len(out) == batch:
            yield out
            out = []
    if out:
        yield out
