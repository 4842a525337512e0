"""Greedy generation, batched: the twins' responses.

Prompts are left-padded into one batch (positions count real tokens only, so a prompt's
positions are the same as alone) and decoded greedily from the key-value cache, one token per
step for every row still running. A row stops at ``<eos>``, at a token that starts a new line
(``stop_ids``; the response is the text before it) or after its own ``limits[i]`` tokens (the
caller gives each prompt what is left of the window, at most ``grounding.max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from plantbench.data import tokenizer


@dataclass(frozen=True)
class Response:
    ids: list[int]  # the generated tokens, the stop token excluded
    stop: int | None  # the token that ended it (<eos> or a line break; None: the length limit)


def newline_ids(tok: Any) -> frozenset[int]:
    """Token ids whose text contains a line break."""
    return frozenset(i for i in range(tok.get_vocab_size()) if "\n" in tok.decode([i]))


def _left_padded(prompts: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), tokenizer.PAD_ID, dtype=torch.long)
    attn = torch.zeros((len(prompts), T), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p) :] = torch.tensor(p)
        attn[i, T - len(p) :] = 1
    return ids, attn


@torch.no_grad()
def greedy(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    limits: Sequence[int],
    stop_ids: frozenset[int] = frozenset(),
) -> list[Response]:
    """Greedy responses of every prompt (token ids, ``<bos>`` included by the caller)."""
    device = next(model.parameters()).device
    ids, attn = _left_padded(prompts)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    out = model(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=pos.to(device),
        use_cache=True,
    )
    n = len(prompts)
    gen: list[list[int]] = [[] for _ in range(n)]
    stop: list[int | None] = [None] * n
    nxt_pos = pos[:, -1] + 1
    stops = set(stop_ids) | {tokenizer.EOS_ID}
    running = [lim > 0 for lim in limits]
    for _ in range(max(limits)):
        nxt = out.logits[:, -1].argmax(-1).cpu()
        for i in np.flatnonzero(running):
            t = int(nxt[i])
            if t in stops:
                stop[i], running[i] = t, False
            else:
                gen[i].append(t)
                running[i] = len(gen[i]) < limits[i]
        if not any(running):
            break
        attn = torch.cat([attn, torch.ones((n, 1), dtype=torch.long)], dim=1)
        out = model(
            input_ids=nxt.unsqueeze(1).to(device),
            attention_mask=attn.to(device),
            position_ids=nxt_pos.unsqueeze(1).to(device),
            cache=out.cache,
            use_cache=True,
        )
        nxt_pos = nxt_pos + 1
    return [Response(g, s) for g, s in zip(gen, stop, strict=True)]


def response_text(tok: Any, r: Response, *, first_line: bool) -> str:
    """A response's text; with ``first_line``, up to its line break (the text of the stop
    token before the break is kept)."""
    ids = r.ids if r.stop in (None, tokenizer.EOS_ID) else [*r.ids, r.stop]
    text = tok.decode(ids, skip_special_tokens=True)
    return (text.split("\n", 1)[0] if first_line else text).strip()
