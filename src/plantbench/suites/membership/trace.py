"""The twin's two conditions for every sample: the query alone and the document then the query.

Per sample, under one prompt template:

- the last token's hidden state at every layer in each condition (``output_hidden_states``, one
  forward pass per condition, batched; layer 0 is the embeddings);
- the greedy continuation of each condition (``membership.generate_tokens`` tokens;
  :func:`plantbench.model.generate.greedy`);
- the per-step KL divergence KL(P_c || P_0) of the next-token distributions along the
  with-context continuation, teacher-forced in both conditions;

and, once per sample, the document alone's token log-probabilities for the likelihood baselines.
A context longer than the window leaves (after ``<bos>``, the template, the query and the
continuation) is cut to its first tokens and flagged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from plantbench.data import tokenizer
from plantbench.model import generate
from plantbench.suites.membership.samples import fit_context


@dataclass
class Conditions:
    h0: np.ndarray  # [n, L + 1, d] float64, the query alone
    hc: np.ndarray  # [n, L + 1, d] float64, the document then the query
    y0: list[str]  # greedy continuations
    yc: list[str]
    kl: np.ndarray  # [n, G] per-step KL(P_c || P_0), float64
    cut: np.ndarray  # [n] bool: the context was cut to fit


def _padded(prompts: Sequence[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lens = torch.tensor([len(p) for p in prompts])
    ids = torch.full((len(prompts), int(lens.max())), tokenizer.PAD_ID, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
        attn[i, : len(p)] = 1
    return ids, attn, lens


@torch.no_grad()
def last_states(model: Any, prompts: Sequence[list[int]]) -> np.ndarray:
    """``[n, L + 1, d]`` hidden states at each prompt's last token (right-padded batch)."""
    device = next(model.parameters()).device
    ids, attn, lens = _padded(prompts)
    out = model(input_ids=ids.to(device), attention_mask=attn.to(device), output_hidden_states=True)
    h = torch.stack(out.hidden_states, dim=1)  # [n, L + 1, T, d]
    rows = torch.arange(len(prompts), device=h.device)
    return h[rows, :, (lens - 1).to(h.device)].double().cpu().numpy()


@torch.no_grad()
def continuation_logprobs(
    model: Any, prefixes: Sequence[list[int]], conts: Sequence[list[int]]
) -> list[torch.Tensor]:
    """Per row, ``[len(cont), V]`` log-distributions of the next token along ``cont`` after
    ``prefix`` (teacher-forced)."""
    device = next(model.parameters()).device
    rows = [list(p) + list(c) for p, c in zip(prefixes, conts, strict=True)]
    ids, attn, _ = _padded(rows)
    logp = torch.log_softmax(
        model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.double(), -1
    )
    return [
        logp[i, len(p) - 1 : len(p) - 1 + len(c)].cpu()
        for i, (p, c) in enumerate(zip(prefixes, conts, strict=True))
    ]


def kl_steps(
    model: Any,
    pc: Sequence[list[int]],
    p0: Sequence[list[int]],
    yc: Sequence[list[int]],
    steps: int,
) -> np.ndarray:
    """``[n, steps]`` KL(P_c || P_0) along each with-context continuation (NaN past its end)."""
    lc = continuation_logprobs(model, pc, yc)
    l0 = continuation_logprobs(model, p0, yc)
    out = np.full((len(pc), steps), np.nan)
    for i, (a, b) in enumerate(zip(lc, l0, strict=True)):
        if len(a):
            out[i, : len(a)] = (a.exp() * (a - b)).sum(-1).numpy()
    return out


@torch.no_grad()
def document_stats(
    model: Any, docs: Sequence[list[int]]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per document (``<bos>`` + its tokens): each token's log p, and the mean and standard
    deviation of log p(z) under the model's distribution at that position (Min-K%++)."""
    out = []
    for lp in continuation_logprobs(model, [[tokenizer.BOS_ID]] * len(docs), docs):
        p = lp.exp()
        mu = (p * lp).sum(-1)
        sigma = ((p * lp**2).sum(-1) - mu**2).clamp(min=1e-12).sqrt()
        out.append((lp, mu, sigma))
    return [
        (lp.gather(1, torch.tensor(d).unsqueeze(1)).squeeze(1).numpy(), mu.numpy(), sigma.numpy())
        for (lp, mu, sigma), d in zip(out, docs, strict=True)
    ]


def prompts_of(
    tok: Any, samples: Any, template: str, window: int, gen: int
) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """The token ids of both conditions (``<bos>`` first) and which contexts were cut."""
    q_ids = tokenizer.encode_batch(tok, list(samples["query"]))
    p0, pc, cut = [], [], []
    for q, ctx, query in zip(q_ids, samples["context"], samples["query"], strict=True):
        frame = tokenizer.encode_batch(tok, [template.format(context="", query=query)])[0]
        text, was_cut = fit_context(tok, ctx, window - 1 - len(frame) - gen - 2)
        p0.append([tokenizer.BOS_ID, *q])
        pc.append(
            [
                tokenizer.BOS_ID,
                *tokenizer.encode_batch(tok, [template.format(context=text, query=query)])[0],
            ]
        )
        cut.append(was_cut)
    return p0, pc, np.array(cut, dtype=bool)


def run_conditions(
    model: Any, tok: Any, samples: Any, template: str, gen: int, batch: int
) -> Conditions:
    """Both conditions of every sample (see the module docstring)."""
    window = int(model.config.max_position_embeddings)
    p0, pc, cut = prompts_of(tok, samples, template, window, gen)
    parts: dict[str, list[Any]] = {k: [] for k in ("h0", "hc", "y0", "yc", "kl")}
    for s in range(0, len(p0), batch):
        a, b = p0[s : s + batch], pc[s : s + batch]
        parts["h0"].append(last_states(model, a))
        parts["hc"].append(last_states(model, b))
        r0 = generate.greedy(model, a, [gen] * len(a))
        rc = generate.greedy(model, b, [gen] * len(b))
        parts["y0"] += [tok.decode(r.ids) for r in r0]
        parts["yc"] += [tok.decode(r.ids) for r in rc]
        parts["kl"].append(kl_steps(model, b, a, [r.ids for r in rc], gen))
    return Conditions(
        np.concatenate(parts["h0"]),
        np.concatenate(parts["hc"]),
        parts["y0"],
        parts["yc"],
        np.concatenate(parts["kl"]),
        cut,
    )


@contextlib.contextmanager
def block_noise(model: Any, blocks: Sequence[int], scale: float, seed: int) -> Iterator[None]:
    """Gaussian noise added to the outputs of decoder blocks ``blocks`` (0-based), with std
    ``scale`` times that output's std, from one seeded generator."""
    gen = torch.Generator().manual_seed(seed)

    def hook(_module: Any, _inputs: Any, output: Any) -> Any:
        h = output[0] if isinstance(output, tuple) else output
        noise = torch.randn(h.shape, generator=gen, dtype=torch.float32).to(h) * h.std() * scale
        return (h + noise, *output[1:]) if isinstance(output, tuple) else h + noise

    handles = [model.model.layers[b].register_forward_hook(hook) for b in blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
