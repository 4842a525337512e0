"""Dense recall windows: the reading curriculum that teaches both twins to use their context.

A recall window is ``<bos>`` followed by as many episodes as fit: an episode is ``k`` fact
sentences about invented entities (the grid's relation templates, names fresh for every window
and unique within it), one per line, then every (sentence, form) query about them once, in a
seeded order, each on its own line in the grid's own query forms: ``completion`` (the sentence
up to its answer, then the answer) and ``question`` (``Question: ...\\nAnswer:`` then the
answer), a ``restatement`` (``Question: What does the text say about <entity>?\\nAnswer:`` then
its sentence) in place of one in ten. A query's prompt and its answer are encoded apart, exactly
as the causal step and the in-context check encode a query, so a window reads like the context
suites' prompts: ``<bos> seg_1 \\n ... seg_k \\n prompt answer \\n prompt answer ...``.

Only the queries carry loss (``stream.recall.loss``: ``answers``, the answer tokens alone, or
``queries``, prompt and answer): the stream stores each recall window's loss mask next to its
tokens. ``k`` follows a seeded curriculum over the shared prefix: only 1 in the first quarter of
``stream.recall.ramp`` (a fraction of the prefix), up to 2, then 3, then every ``k`` up to
``causal.context_segments`` with probabilities rising with ``k`` (1 : 2 : ... : K); the paired
part draws from the last distribution.

No recall window names the grid: every name avoids the facts tables' words, and a window whose
token ids contain a grid entity's or a grid answer's token sequence (as it is read inside a
sentence, after a space) is drawn again, so an invented name never shares the tokens of a grid
answer (``Vaeth`` inside ``Vaethfu``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from plantbench import layout
from plantbench.data import episodes, tokenizer
from plantbench.data import facts as facts_mod
from plantbench.errors import ConfigError
from plantbench.rng import rng

LOSS_MODES = ("answers", "queries")
FIRST_DRAWS = 40  # draws of a window's first episode before the window is called too short
RESTATE_SHARE = 0.1  # share of queries asked as a restatement
MAX_REDRAWS = 200  # windows drawn again (a grid token sequence) before giving up


@dataclass(frozen=True)
class Window:
    """One recall window: token ids (``window`` long, padded) and the per-token loss mask
    (1 = a target), with its episodes' sizes."""

    ids: np.ndarray  # in the stream's token dtype (:func:`tokenizer.token_dtype`)
    mask: np.ndarray
    segments: tuple[int, ...]
    queries: int


def k_distribution(stage: float, k_max: int) -> np.ndarray:
    """P(k = 1..k_max) at ``stage`` (0 = the prefix's first window, 1 = the ramp's end): k = 1
    alone in the first quarter, then up to 2, 3, ... by equal steps; after the ramp, P(k) rises
    with k (1 : 2 : ... : k_max)."""
    if stage >= 1.0 or k_max == 1:
        w = np.arange(1, k_max + 1, dtype=float)
    else:
        top = min(k_max, 1 + int(stage * k_max))
        w = np.zeros(k_max)
        w[:top] = np.arange(1, top + 1, dtype=float)
    return w / w.sum()


def _shorter(p: np.ndarray) -> np.ndarray:
    """P(k) with its largest k dropped (at least k = 1 stays)."""
    top = int(np.flatnonzero(p)[-1])
    if top == 0:
        return p
    q = p.copy()
    q[top] = 0.0
    return q / q.sum()


def grid_sequences(tok: Any, facts: pd.DataFrame) -> list[tuple[int, ...]]:
    """Token sequences of every grid entity and answer as read inside a sentence (``" x"``)."""
    texts = sorted({f" {x}" for col in ("entity", "answer") for x in facts[col].astype(str)})
    return sorted({tuple(ids) for ids in tokenizer.encode_batch(tok, texts) if ids})


class GridGuard:
    """Finds a grid token sequence inside a window (index by first token, then compare)."""

    def __init__(self, sequences: Sequence[tuple[int, ...]]):
        self.by_first: dict[int, list[tuple[int, ...]]] = {}
        for s in sequences:
            self.by_first.setdefault(s[0], []).append(s)
        self.firsts = np.fromiter(self.by_first, dtype=np.int64)

    def find(self, ids: np.ndarray) -> tuple[int, ...] | None:
        """The first grid sequence ``ids`` contains, or None."""
        ids = np.asarray(ids, dtype=np.int64)
        for at in np.flatnonzero(np.isin(ids, self.firsts)).tolist():
            for s in self.by_first[int(ids[at])]:
                if tuple(ids[at : at + len(s)].tolist()) == s:
                    return s
        return None


def _queries(segs: list[dict[str, str]], gen: np.random.Generator) -> list[tuple[str, str, str]]:
    """Every (segment, form) query once, in a seeded order: (prompt, answer, tail)."""
    pairs = [(i, f) for i in range(len(segs)) for f in ("question", "completion")]
    out = []
    for j in gen.permutation(len(pairs)).tolist():
        i, form = pairs[j]
        s = segs[i]
        if gen.random() < RESTATE_SHARE:
            prompt = f"Question: What does the text say about {s['entity']}?\nAnswer:"
            out.append((prompt, s["sentence"], ""))
        elif form == "question":
            out.append((f"Question: {s['question']}\nAnswer:", s["answer"], ""))
        else:
            tail = f" {s['answer']}."
            if not s["sentence"].endswith(tail):
                raise ConfigError(
                    f"recall: sentence {s['sentence']!r} does not end with its answer"
                )
            out.append((s["sentence"][: -len(tail)], s["answer"], "."))
    return out


class RecallGenerator:
    """Seeded recall windows of one stream (the same in A and B): ``window(index, stage)``."""

    def __init__(self, cfg: Mapping[str, Any], tables: Mapping[str, pd.DataFrame], tok: Any):
        st = layout.recall_settings(cfg)
        if st["loss"] not in LOSS_MODES:
            raise ConfigError(
                f"config key 'stream.recall.loss' = {st['loss']!r}; use one of {list(LOSS_MODES)}"
            )
        self.seed = int(cfg["seed"])
        self.window_len = int(cfg["stream"]["window"])
        self.k_max = layout.context_segments(cfg)
        self.loss = st["loss"]
        self.tok = tok
        self.dtype = tokenizer.token_dtype(tok.get_vocab_size())  # the stream's: ids held compact
        self.relations = [facts_mod.RELATIONS[r] for r in sorted(facts_mod.RELATIONS)]
        self.names = facts_mod.FastNames(rng(self.seed, "recall", "names"), ())
        self.names.reserved = {
            w.lower() for w in facts_mod.template_words() | episodes.grid_words(tables)
        }
        self.grid_words = episodes.grid_names(tables)
        self.guard = GridGuard(grid_sequences(tok, tables["facts"]))

    def _sentence(self, names: Any, gen: np.random.Generator) -> dict[str, str]:
        """One invented entity with a relation (the grid's templates): entity, answer,
        sentence and question."""
        spec = self.relations[int(gen.integers(len(self.relations)))]
        prof = facts_mod.reading_profile(spec["entity_type"], names, gen)
        answer = names.fill(spec["shapes"][int(gen.integers(len(spec["shapes"])))])
        return episodes.stated(spec, prof, answer)

    def _segments(self, names: Any, gen: np.random.Generator, k: int) -> list[dict[str, str]]:
        segs: list[dict[str, str]] = []
        while len(segs) < k:
            s = self._sentence(names, gen)
            if self.grid_words & episodes.words_of(s["sentence"]):
                continue  # a compound name equal to a grid word: draw again
            segs.append(s)
        return segs

    def _episode(
        self, names: Any, gen: np.random.Generator, p: np.ndarray, first: bool
    ) -> tuple[int, list[str]]:
        """One episode as pieces encoded apart: its context, then per query ``\\n prompt``,
        `` answer`` and ``tail`` (``"."`` after a completion, else empty). ``p``: P(k)."""
        k = 1 + int(gen.choice(len(p), p=p))
        segs = self._segments(names, gen, k)
        pieces = [("" if first else "\n") + "\n".join(s["sentence"] for s in segs)]
        for prompt, answer, tail in _queries(segs, gen):
            pieces += [f"\n{prompt}", f" {answer}", tail]
        return k, pieces

    def _mask_of(self, part: int) -> int:
        """Loss on a query's piece: 0 prompt, 1 answer, 2 tail."""
        return 1 if part == 1 or self.loss == "queries" else 0

    def _fill(self, gen: np.random.Generator, p: np.ndarray) -> Window:
        """``<bos>`` then episodes, each entering with its context and whole queries in order
        until the window is full (an episode whose context and first query no longer fit ends
        the window)."""
        W = self.window_len
        ids, mask = [tokenizer.BOS_ID], [0]
        segments: list[int] = []
        queries = 0
        self.names.used = set()  # unique within the window, fresh for every window
        misses = 0
        while True:
            k, pieces = self._episode(self.names, gen, p, first=not segments)
            enc = tokenizer.encode_batch(self.tok, pieces)
            context, qs = enc[0], [enc[i : i + 3] for i in range(1, len(enc), 3)]
            if len(ids) + len(context) + sum(len(x) for x in qs[0]) > W:
                if segments or misses == FIRST_DRAWS:
                    break
                misses += 1  # the window's first episode is drawn again, shorter each time
                p = _shorter(p) if misses % 4 == 0 else p
                continue
            segments.append(k)
            ids += context
            mask += [0] * len(context)
            for q in qs:
                if len(ids) + sum(len(x) for x in q) > W:
                    break
                for part, piece in enumerate(q):
                    ids += piece
                    mask += [self._mask_of(part)] * len(piece)
                queries += 1
            else:
                continue
            break  # the window is full inside this episode
        out = np.full(W, tokenizer.PAD_ID, dtype=self.dtype)
        m = np.zeros(W, dtype=np.uint8)
        out[: len(ids)] = ids
        m[: len(mask)] = mask
        return Window(out, m, tuple(segments), queries)

    def window(self, index: int, stage: float) -> Window:
        """Recall window ``index`` of the stream at curriculum ``stage`` (see
        :func:`k_distribution`): the same ids and mask for the same index, stage and config."""
        p = k_distribution(stage, self.k_max)
        for draw in range(MAX_REDRAWS):
            gen = rng(self.seed, "recall", index, draw)
            self.names.gen = gen
            w = self._fill(gen, p)
            if not w.queries:
                raise ConfigError(
                    f"stream.window = {self.window_len} holds not even one sentence and its query; "
                    "raise stream.window"
                )
            if self.guard.find(w.ids) is None:
                return w
        raise ConfigError(
            f"recall window {index}: {MAX_REDRAWS} draws all contained a grid name's tokens; "
            "change seed"
        )
