"""Dense reference definitions the tests and benchmarks hold the fast paths against: the exact
per-example gradient (autograd, one example at a time), its dense Kronecker projection, and an
unstructured seeded Rademacher projection regenerated block by block."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from plantbench.rng import derive_seed

if TYPE_CHECKING:
    pass
from plantbench.attribution.gradients.capture import check_inputs, example_losses
from plantbench.attribution.gradients.projector import Projector


def dense_projections(
    projector: Projector, dtype: torch.dtype = torch.float64, device: Any = "cpu"
) -> dict[str, torch.Tensor]:
    """Per module the materialised ``P_out kron P_in`` (``k_out k_in x out in``): what LoGra
    avoids building (``sum_m D_m * params_m`` values)."""
    return {
        name: torch.kron(
            projector.matrix(name, "out", dtype, device),
            projector.matrix(name, "in", dtype, device),
        )
        for name in projector.module_names
    }


def exact_grads_flat(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    *,
    require_eager: bool = True,
) -> torch.Tensor:
    """Each example's full weight gradient of the named linears, by its own autograd pass
    (batch 1), each ``out x in`` gradient flattened row-major and concatenated in
    ``module_names`` order: ``[n, sum_m out_m in_m]`` in ``dtype`` (zeros for a module the loss
    does not reach). Slow and ``O(n P)`` memory; for tests and benchmarks."""
    check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
    mods = dict(model.named_modules())
    weights = [mods[name].weight for name in module_names]
    n = input_ids.shape[0]
    out = torch.zeros((n, sum(w.numel() for w in weights)), dtype=dtype, device=input_ids.device)
    was_training = model.training
    model.eval()
    flags = [(w, w.requires_grad) for w in weights]
    try:
        for w in weights:
            w.requires_grad_(True)
        for i in range(n):
            am = None if attention_mask is None else attention_mask[i : i + 1]
            loss = example_losses(model, input_ids[i : i + 1], loss_mask[i : i + 1], am)[0]
            grads = torch.autograd.grad(loss, weights, allow_unused=True)
            start = 0
            for w, g in zip(weights, grads, strict=True):
                if g is not None:
                    out[i, start : start + w.numel()] = g.reshape(-1)
                start += w.numel()
    finally:
        for w, f in flags:
            w.requires_grad_(f)
        model.train(was_training)
    return out


def exact_grads_projected(
    model: torch.nn.Module,
    projector: Projector,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    *,
    require_eager: bool = True,
    dense: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Reference: :func:`exact_grads_flat` (each example's full weight gradient by its own
    autograd pass), each module's block multiplied by the materialised ``(P_out kron P_in)``
    (slow; for tests and benchmarks). ``dense``: those matrices, from
    :func:`dense_projections` (built here if not given)."""
    flat = exact_grads_flat(
        model,
        projector.module_names,
        input_ids,
        loss_mask,
        attention_mask,
        dtype,
        require_eager=require_eager,
    )
    if dense is None:
        dense = dense_projections(projector, dtype, input_ids.device)
    out = torch.empty((flat.shape[0], projector.dims), dtype=dtype, device=flat.device)
    start = 0
    for s in projector.specs:
        size = s.in_features * s.out_features
        out[:, projector.slices[s.name]] = flat[:, start : start + size] @ dense[s.name].T
        start += size
    return out


RADEMACHER_BLOCK_ROWS = 16384


_SIGN_BITS = (torch.arange(256)[:, None] >> torch.arange(8)) & 1  # [byte, bit], LSB first


def _rademacher_bits(seed: int, block: int, rows: int, dims: int) -> torch.Tensor:
    """Sign bits of rows ``[0, rows)`` of block ``block``: uint8 bytes, row-major, LSB first.
    One ``torch.Generator`` per block; fewer rows give a prefix of the same bits."""
    g = torch.Generator().manual_seed(derive_seed(seed, "rademacher", dims, block))
    words = torch.empty(-(-rows * dims // 64), dtype=torch.int64)
    return words.random_(-(2**63), None, generator=g).view(torch.uint8)


def _expand_signs(
    bits: torch.Tensor, row0: int, row1: int, dims: int, table: torch.Tensor
) -> torch.Tensor:
    """Rows ``[row0, row1)`` of a block as a ``[row1 - row0, dims]`` matrix of ``table``'s
    values (``table[byte]`` = the 8 signed entries of that byte)."""
    b0, b1 = row0 * dims // 8, -(-row1 * dims // 8)
    vals = F.embedding(bits[b0:b1].long(), table).reshape(-1)
    off = row0 * dims - 8 * b0
    return vals[off : off + (row1 - row0) * dims].view(row1 - row0, dims)


def _sign_table(dims: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    return ((2 * _SIGN_BITS - 1).to(dtype) / math.sqrt(dims)).to(device)


def rademacher_block(
    seed: int,
    block: int,
    rows: int,
    dims: int,
    dtype: torch.dtype = torch.float32,
    *,
    device: Any = "cpu",
) -> torch.Tensor:
    """Rows ``[block * B, block * B + rows)`` of the seeded Rademacher matrix ``R`` (entries
    ``+-1/sqrt(dims)``) of :func:`dense_random_projection`, ``B`` its ``block_rows``."""
    bits = _rademacher_bits(seed, block, rows, dims).to(device)
    return _expand_signs(bits, 0, rows, dims, _sign_table(dims, dtype, device))


def dense_random_projection(
    grads: torch.Tensor,
    dims: int,
    seed: int,
    *,
    block_rows: int = RADEMACHER_BLOCK_ROWS,
    tile_rows: int = 1024,
    times: dict[str, float] | None = None,
) -> torch.Tensor:
    """Unstructured (TRAK-style) random projection ``grads @ R``, ``[n, P] -> [n, dims]``.

    ``R`` is ``[P, dims]`` with independent entries ``+-1/sqrt(dims)`` (so ``E|x R|^2 =
    |x|^2``), never held: rows ``[b B, (b + 1) B)`` (``B = block_rows``) come from their own
    ``torch.Generator`` seeded from ``(seed, dims, b)``, 1 bit per entry; each block's bits are
    expanded to ``grads.dtype`` ``tile_rows`` rows at a time (a tile that stays in cache) and
    multiplied in. ``R`` depends on ``seed``, ``dims`` and ``block_rows`` only (not on
    ``tile_rows``, and a smaller ``P`` gives the leading rows of the same matrix); cost per call:
    ``P dims`` random signs and ``2 n P dims`` flops. ``times`` (if given) accumulates the
    seconds spent generating (``"generate"``: bits and expansion) and multiplying (``"matmul"``).
    """
    if grads.ndim != 2 or dims < 1 or block_rows < 1 or tile_rows < 1:
        raise ValueError(f"need [n, P] grads and positive sizes, got {tuple(grads.shape)}")
    n, p = grads.shape
    out = torch.zeros((n, dims), dtype=grads.dtype, device=grads.device)
    table = _sign_table(dims, grads.dtype, grads.device)
    clock = {"generate": 0.0, "matmul": 0.0}
    for b, start in enumerate(range(0, p, block_rows)):
        rows = min(block_rows, p - start)
        t0 = time.perf_counter()
        bits = _rademacher_bits(seed, b, rows, dims).to(grads.device)
        clock["generate"] += time.perf_counter() - t0
        for r0 in range(0, rows, tile_rows):
            r1 = min(r0 + tile_rows, rows)
            t0 = time.perf_counter()
            tile = _expand_signs(bits, r0, r1, dims, table)
            t1 = time.perf_counter()
            out.addmm_(grads[:, start + r0 : start + r1], tile)
            t2 = time.perf_counter()
            clock["generate"] += t1 - t0
            clock["matmul"] += t2 - t1
    if times is not None:
        for k, v in clock.items():
            times[k] = times.get(k, 0.0) + v
    return out
