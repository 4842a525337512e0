"""The per-example next-token loss of a causal LM, with its output layer fused and chunked.

What it computes
----------------
The same per-example losses as :func:`plantbench.attribution.gradients.capture.example_losses` (the *sum* of
next-token cross-entropy over an example's target positions), from the final hidden states
``h`` of the base model instead of the logits: for target row ``r`` (a target token ``y_r``
and the hidden state ``h_r`` of its predecessor, example ``n_r``)

    loss_n = sum_{r: n_r = n} logsumexp(W h_r) - (W h_r)[y_r]

with ``W`` the output layer (``lm_head``, ``V x d``, no bias). Its gradient with respect to
``h_r`` is known in closed form, ``W^T (softmax(W h_r) - e_{y_r})``, so the forward pass
computes it right away, ``chunk`` target rows at a time, and keeps only it (``[R, d]``); the
backward pass scales it by the incoming gradient of each example's loss. No ``[n, T, V]``
logits tensor, its slice, its log-softmax or their gradients are ever held: on the default
study's model (``V = 4,096``, ``d = 128``) those were half the time of a per-example gradient
pass (fresh 33 MB buffers per batch, each filled and copied several times). Rows that are not
targets (a query's prompt, padding) cost nothing at all.

The output layer's weight gets no gradient (the callers freeze every parameter; a weight that
requires grad is refused rather than silently given none). Logits are formed in the weight's
dtype and the softmax in float32 (float64 stays float64), so a bfloat16 model loses no
accuracy in the loss. In float64 the gradients equal those of the unfused loss to ~1e-12
(tests/test_headloss.py).
"""

from __future__ import annotations

from typing import Any

import torch

from plantbench.errors import PlantbenchError

CHUNK_BYTES = 2 << 20  # logits of one chunk of target rows (one buffer, reused)
MIN_ROWS = 64  # but at least this many rows per chunk (a large vocabulary)


def fusable(model: torch.nn.Module) -> bool:
    """True when ``model`` is a causal LM whose logits are ``lm_head(model.model(...))``
    with a bias-free linear head and nothing after it (transformers' Llama family)."""
    head = getattr(model, "lm_head", None)
    conf = getattr(model, "config", None)
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and isinstance(getattr(model, "model", None), torch.nn.Module)
        and getattr(conf, "final_logit_softcapping", None) is None
        and getattr(conf, "logit_scale", None) is None
    )


def _chunk(
    h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, buf: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """Losses of a chunk of target rows; writes their hidden-state gradients into ``grad``.
    Every ``[rows, V]`` step happens in ``buf`` in place (no fresh buffer per chunk)."""
    if weight.dtype == buf.dtype:
        torch.mm(h, weight.T, out=buf)
    else:
        buf.copy_(h @ weight.T)
    picked = buf.gather(1, y)[:, 0]
    top = buf.amax(1)
    buf.sub_(top[:, None]).exp_()
    total = buf.sum(1)
    buf.div_(total[:, None])
    buf.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=buf.dtype, device=buf.device))
    if weight.dtype == buf.dtype:
        torch.mm(buf, weight, out=grad)
    else:
        grad.copy_(buf.to(weight.dtype) @ weight)
    return top + total.log() - picked


class _HeadLoss(torch.autograd.Function):
    """losses[n] from target rows' hidden states; see the module docstring."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        rows: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        example: torch.Tensor,
        n: int,
    ) -> torch.Tensor:
        soft = torch.float64 if weight.dtype == torch.float64 else torch.float32
        per_row = torch.empty(rows.shape[0], dtype=soft, device=rows.device)
        grad = torch.empty_like(rows)
        step = max(MIN_ROWS, CHUNK_BYTES // (weight.shape[0] * torch.finfo(soft).bits // 8))
        buf = torch.empty(
            (min(step, rows.shape[0]), weight.shape[0]), dtype=soft, device=rows.device
        )
        for a in range(0, rows.shape[0], step):
            b = min(rows.shape[0], a + step)
            y = targets[a:b, None]
            per_row[a:b] = _chunk(rows[a:b], weight, y, buf[: b - a], grad[a:b])
        ctx.save_for_backward(grad, example)
        losses = torch.zeros(n, dtype=soft, device=rows.device)
        return losses.index_add_(0, example, per_row)

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        grad, example = ctx.saved_tensors
        scale = upstream.to(grad.dtype)[example, None]
        return grad * scale, None, None, None, None


def head_losses(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """Per-example summed next-token losses ``[n]`` from the base model's final hidden states
    ``hidden`` ``[n, T, d]``; ``targets`` ``[n, T-1]`` bool marks which next-token predictions
    carry loss (:func:`plantbench.attribution.gradients.capture.target_mask`)."""
    weight = model.get_output_embeddings().weight
    if weight.requires_grad:
        raise PlantbenchError(
            "the fused output-layer loss gives the output weight no gradient; freeze it first"
        )
    n = hidden.shape[0]
    where = targets.nonzero(as_tuple=True)
    rows = hidden[:, :-1][where]
    ys = input_ids[:, 1:][where]
    out = _HeadLoss.apply(rows, weight, ys, where[0], n)
    return out  # type: ignore[no-any-return]
