"""Candidate log-probabilities under ablated contexts, batched and memoized.

A context is k segments; an ablation is a boolean mask over them (True = kept). The prompt of a
mask is the kept segments one per line, then the query (the in-context check's format:
``<bos> seg_i \\n ... seg_j \\n prompt candidate``); no segment kept = the query alone.

:class:`Oracle` answers, for any set of masks, every candidate's summed log-probability: the
prompts of the masks not seen before run as one right-padded batch, and the candidates of all of
them continue from that batch's key-value cache (one prefix pass per mask, not one per
candidate). Every method of the suite reads the model only through it, so a mask two methods
both ask for costs one pass, and :attr:`Oracle.passes` counts the prompt passes actually run.

The attention methods (AT2, AttnTrace) read :meth:`Oracle.attention`: one forward of the ablated
prompt followed by the response (teacher-forced) with the math attention kernel, the attention
of every position that predicts a response token to every earlier position, and which segment
each position belongs to (memoized per mask; :attr:`Oracle.attention_passes` counts them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from plantbench.data import tokenizer
from plantbench.model.queries import batch_candidate_logprobs


def prompt_of(segments: Sequence[str], mask: Sequence[bool], query: str) -> str:
    """The prompt of one ablation: the kept segments, one per line, then the query."""
    kept = [s for s, m in zip(segments, mask, strict=True) if m]
    return "\n".join([*kept, query])


def mask_key(mask: np.ndarray) -> int:
    """A mask as an integer (bit i = segment i kept), the memo's key."""
    return int(sum(1 << i for i, m in enumerate(mask) if m))


class Oracle:
    """One query's context under one twin: candidate log-probabilities of any ablation.

    ``segments``: the k segment texts; ``query``: the query prompt; ``candidate_ids``: each
    candidate's token ids (with its leading space); ``target``: the index of the response (the
    true answer) among the candidates. ``batch`` bounds the masks run in one forward pass."""

    def __init__(
        self,
        model: torch.nn.Module,
        tok: Any,
        segments: Sequence[str],
        query: str,
        candidate_ids: Sequence[list[int]],
        target: int,
        batch: int = 16,
    ):
        self.model, self.tok = model, tok
        self.segments, self.query = list(segments), query
        self.candidate_ids, self.target, self.batch = list(candidate_ids), int(target), batch
        self.k = len(self.segments)
        self.memo: dict[int, np.ndarray] = {}
        self.greedy_memo: dict[int, np.ndarray] = {}
        self.attention_memo: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.passes = 0
        self.attention_passes = 0

    def candidates(self, masks: np.ndarray) -> np.ndarray:
        """``[len(masks), n_candidates]`` log-probabilities; masks not seen before are run."""
        masks = np.asarray(masks, dtype=bool).reshape(-1, self.k)
        keys = [mask_key(m) for m in masks]
        todo = list(dict.fromkeys(k for k in keys if k not in self.memo))
        for s in range(0, len(todo), self.batch):
            chunk = todo[s : s + self.batch]
            texts = [prompt_of(self.segments, _unkey(k, self.k), self.query) for k in chunk]
            prefixes = [[tokenizer.BOS_ID, *p] for p in tokenizer.encode_batch(self.tok, texts)]
            out, greedy = batch_candidate_logprobs(self.model, prefixes, self.candidate_ids)
            self.memo.update(zip(chunk, out, strict=True))
            self.greedy_memo.update(zip(chunk, greedy, strict=True))
            self.passes += len(chunk)
        return np.stack([self.memo[k] for k in keys]) if keys else np.zeros((0, 0))

    def prefetch_lattice(self, limit: int) -> bool:
        """Run every one of the 2^k masks up front, in full batches, when 2^k <= ``limit``
        (cheaper than the methods' small requests; the passes are then 2^k per context)."""
        if 2**self.k > limit:
            return False
        self.candidates(np.array([_unkey(key, self.k) for key in range(2**self.k)]))
        return True

    def logp(self, masks: np.ndarray) -> np.ndarray:
        """log p(response | ablated context ⊕ query) of every mask (float64)."""
        return self.candidates(masks)[:, self.target]

    def correct(self, masks: np.ndarray) -> np.ndarray:
        """Whether the response ranks first of the candidates (ties count against it)."""
        s = self.candidates(masks)
        t = s[:, self.target]
        others = np.delete(s, self.target, axis=1)
        return (others < t[:, None]).all(axis=1)

    def greedy(self, masks: np.ndarray) -> np.ndarray:
        """Whether greedy decoding reproduces the response exactly (the second reading)."""
        self.candidates(masks)
        masks = np.asarray(masks, dtype=bool).reshape(-1, self.k)
        return np.array([bool(self.greedy_memo[mask_key(m)][self.target]) for m in masks])

    def answer_share(self, masks: np.ndarray) -> np.ndarray:
        """The response's probability normalized over the candidates (in [0, 1])."""
        s = self.candidates(masks)
        s = s - s.max(axis=1, keepdims=True)
        p = np.exp(s)
        return p[:, self.target] / p.sum(axis=1)

    def attention(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(att, owner)`` of one ablation. ``att`` ``[layers, heads, R, S]`` float64: the
        attention weights of the R positions that predict the response's tokens (the prompt's
        last position and the response's tokens but the last) over all S positions of
        ``<bos> prompt response[:-1]``; ``owner`` ``[S]`` int: the segment (0..k-1, in the full
        context's numbering) each position's token lies in, -1 for the rest (bos, newlines,
        query, response). A token that straddles a segment's end belongs to that segment."""
        mask = np.asarray(mask, dtype=bool).reshape(self.k)
        key = mask_key(mask)
        if key not in self.attention_memo:
            self.attention_memo[key] = self._attention(mask)
            self.attention_passes += 1
        return self.attention_memo[key]

    def _attention(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        text = prompt_of(self.segments, mask, self.query)
        enc = self.tok.encode(text, add_special_tokens=False)
        response = self.candidate_ids[self.target]
        ids = [tokenizer.BOS_ID, *enc.ids, *response[:-1]]
        owner = np.full(len(ids), -1, dtype=np.int64)
        spans = _segment_spans(self.segments, mask)
        for t, (a, _) in enumerate(enc.offsets):
            for j, (lo, hi) in spans.items():
                if lo <= a < hi:
                    owner[1 + t] = j
        device = next(self.model.parameters()).device
        with _eager(self.model), torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], device=device), output_attentions=True)
        first = len(enc.ids)  # position of the prompt's last token (after <bos>)
        # the R rows only, copied: a view would keep every row of every layer alive in the memo
        rows = torch.stack([a[0, :, first : first + len(response)] for a in out.attentions])
        return rows.double().cpu().numpy(), owner

    def full(self) -> np.ndarray:
        return np.ones(self.k, dtype=bool)

    def empty(self) -> np.ndarray:
        return np.zeros(self.k, dtype=bool)


def _segment_spans(segments: Sequence[str], mask: np.ndarray) -> dict[int, tuple[int, int]]:
    """Character span of every kept segment in :func:`prompt_of`'s text, by segment index."""
    spans, at = {}, 0
    for j, (seg, kept) in enumerate(zip(segments, mask, strict=True)):
        if kept:
            spans[j] = (at, at + len(seg))
            at += len(seg) + 1
    return spans


@contextlib.contextmanager
def _eager(model: torch.nn.Module) -> Iterator[None]:
    """The math attention kernel for one call (the only one that returns attention weights)."""
    conf = model.config
    old = conf._attn_implementation
    conf._attn_implementation = "eager"
    try:
        yield
    finally:
        conf._attn_implementation = old


def _unkey(key: int, k: int) -> np.ndarray:
    return np.array([(key >> i) & 1 for i in range(k)], dtype=bool)
