"""Query encoding and answer log-probabilities, shared by the causal step and the methods.

A query is ``<bos> prompt`` followed by `` answer`` (one space); only answer tokens carry loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from plantbench.data import tokenizer


def encode(tok: Any, prompts: Sequence[str], answers: Sequence[str]) -> list[tuple[list[int], int]]:
    """For each pair: the token ids of ``<bos> prompt answer`` and the number of answer tokens."""
    p_ids = tokenizer.encode_batch(tok, list(prompts))
    a_ids = tokenizer.encode_batch(tok, [" " + a for a in answers])
    return [([tokenizer.BOS_ID, *p, *a], len(a)) for p, a in zip(p_ids, a_ids, strict=True)]


def pad_batch(
    items: Sequence[tuple[list[int], int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``answer_mask`` (True where the token
    is an answer token, i.e. a position whose next-token loss counts is the one before it)."""
    T = max(len(ids) for ids, _ in items)
    ids = torch.full((len(items), T), tokenizer.PAD_ID, dtype=torch.long)
    attn = torch.zeros((len(items), T), dtype=torch.long)
    ans = torch.zeros((len(items), T), dtype=torch.bool)
    for i, (seq, n_ans) in enumerate(items):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        ans[i, len(seq) - n_ans : len(seq)] = True
    return ids, attn, ans


@torch.no_grad()
def answer_logprobs(
    model: torch.nn.Module, items: Sequence[tuple[list[int], int]], batch_size: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Summed log p(answer tokens | prefix) per item (float64) and the answer token counts."""
    device = next(model.parameters()).device
    out = np.zeros(len(items), dtype=np.float64)
    counts = np.array([n for _, n in items], dtype=np.int64)
    order = np.argsort([len(x[0]) for x in items], kind="stable")
    for s in range(0, len(items), batch_size):
        idx = order[s : s + batch_size]
        ids, attn, ans = pad_batch([items[i] for i in idx])
        ids, attn, ans = ids.to(device), attn.to(device), ans.to(device)
        logits = model(input_ids=ids, attention_mask=attn).logits.float()
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        tgt = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        summed = (tgt.double() * ans[:, 1:].double()).sum(dim=1)
        out[idx] = summed.cpu().numpy()
    return out, counts


@torch.no_grad()
def candidate_logprobs(
    model: torch.nn.Module, prefix: list[int], candidates: Sequence[list[int]]
) -> np.ndarray:
    """Summed log p(candidate tokens | prefix) of every candidate (float64), the prefix run once
    and its key-value cache shared by all candidates (the same numbers as :func:`answer_logprobs`
    on ``prefix + candidate``, up to float rounding)."""
    device = next(model.parameters()).device
    pre = model(input_ids=torch.tensor([prefix], device=device), use_cache=True, logits_to_keep=1)
    first = torch.log_softmax(pre.logits[0, -1].float(), dim=-1)
    n, T = len(candidates), max(len(c) for c in candidates)
    ids = torch.full((n, T), tokenizer.PAD_ID, dtype=torch.long)
    mask = torch.zeros((n, T), dtype=torch.long)
    for i, c in enumerate(candidates):
        ids[i, : len(c)] = torch.tensor(c)
        mask[i, : len(c)] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = pre.cache
    cache.batch_repeat_interleave(n)
    attn = torch.cat([torch.ones((n, len(prefix)), dtype=torch.long, device=device), mask], dim=1)
    logits = model(input_ids=ids, attention_mask=attn, cache=cache).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    rest = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1).double() * mask[:, 1:].double()
    return (first[ids[:, 0]].double() + rest.sum(dim=1)).cpu().numpy()


@torch.no_grad()
def batch_candidate_logprobs(
    model: torch.nn.Module, prefixes: Sequence[list[int]], candidates: Sequence[list[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """``[len(prefixes), len(candidates)]`` summed log p(candidate | prefix), float64, and
    whether greedy decoding from the prefix reproduces the candidate (every one of its tokens is
    the argmax after the prefix and the tokens before it: teacher forcing decides greedy).

    The prefixes run once as a right-padded batch; each candidate then continues every prefix
    from the repeated key-value cache, at explicit positions after that prefix's last real token
    (the pads between are masked out). Agrees with :func:`candidate_logprobs`
    on each prefix alone up to float rounding (tested)."""
    device = next(model.parameters()).device
    n, c = len(prefixes), len(candidates)
    lens = torch.tensor([len(p) for p in prefixes])
    T = int(lens.max())
    ids = torch.full((n, T), tokenizer.PAD_ID, dtype=torch.long)
    attn = torch.zeros((n, T), dtype=torch.long)
    for i, p in enumerate(prefixes):
        ids[i, : len(p)] = torch.tensor(p)
        attn[i, : len(p)] = 1
    # the vocabulary projection of each prefix's last real position only
    last_pos = (lens - 1).unsqueeze(1).to(device)
    pre = model(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        use_cache=True,
        logits_to_keep=last_pos,
    )
    last = pre.logits[:, 0].float()
    first = torch.log_softmax(last, dim=-1)  # [n, V]
    Tc = max(len(x) for x in candidates)
    cids = torch.full((c, Tc), tokenizer.PAD_ID, dtype=torch.long)
    cmask = torch.zeros((c, Tc), dtype=torch.long)
    for j, x in enumerate(candidates):
        cids[j, : len(x)] = torch.tensor(x)
        cmask[j, : len(x)] = 1
    cache = pre.cache
    cache.batch_repeat_interleave(c)
    rows_ids = cids.repeat(n, 1)
    rows_mask = cmask.repeat(n, 1)
    full_attn = torch.cat([attn.repeat_interleave(c, dim=0), rows_mask], dim=1)
    pos = lens.repeat_interleave(c).unsqueeze(1) + torch.arange(Tc).unsqueeze(0)
    logits = model(
        input_ids=rows_ids.to(device),
        attention_mask=full_attn.to(device),
        position_ids=pos.to(device),
        cache=cache,
    ).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    nxt = rows_ids[:, 1:].to(device)
    real = rows_mask[:, 1:].to(device).bool()
    rest = logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1).double()
    rest = (rest * real.double()).sum(dim=1).view(n, c)
    head = first.gather(1, cids[:, 0].to(device).unsqueeze(0).expand(n, c)).double()
    greedy_rest = ((logits[:, :-1].argmax(-1) == nxt) | ~real).all(dim=1).view(n, c)
    greedy = (first.argmax(-1, keepdim=True) == cids[:, 0].to(device).unsqueeze(0)) & greedy_rest
    return (head + rest).cpu().numpy(), greedy.cpu().numpy()
