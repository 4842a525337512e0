"""EK-FAC's maths on per-example ``(x, delta)`` of the block linears: the Kronecker factors, their
eigenbases, the eigenvalue correction, the damped preconditioner and the scores, every product in
float64 (see the package's docstring for the definitions)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from plantbench import artifacts, layout
from plantbench.attribution.ekfac.factors import FactorSums
from plantbench.attribution.gradients.capture import module_io
from plantbench.errors import ArtifactError
from plantbench.model.modeling import block_linear_names, device_of, to_numpy

Progress = Callable[[int], None] | None


Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def window_batches(
    windows: np.ndarray, batch: int, device: torch.device | None = None
) -> Iterator[Batch]:
    """``(ids, loss mask, attention mask)`` batches of pool windows (loss on every position), on
    ``device`` (the model's; default the CPU)."""
    tokens = torch.as_tensor(np.asarray(windows), dtype=torch.long, device=device)
    for s in range(0, tokens.shape[0], batch):
        ids = tokens[s : s + batch]
        yield ids, torch.ones_like(ids, dtype=torch.bool), None


def _grads(ds: dict[str, torch.Tensor], xs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Per-example weight gradients ``[n, out, in]`` of one module (zeros if none reached it)."""
    x = xs[name]
    if name not in ds:
        return x.new_zeros((x.shape[0], 0, x.shape[2]))
    return torch.einsum("nto,nti->noi", ds[name], x)


@dataclass(frozen=True)
class EKFAC:
    """The fitted curvature: per module the eigenbases, corrected eigenvalues and damping."""

    names: list[str]
    q_in: dict[str, torch.Tensor]  # [in, in] eigenvectors of A (columns), float64
    q_out: dict[str, torch.Tensor]  # [out, out] eigenvectors of S
    lam: dict[str, torch.Tensor]  # [out, in] corrected eigenvalues, float64
    damping: dict[str, float]
    n_windows: int

    def precondition(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """``(F_EK + lambda)^-1 G`` of module ``name`` for gradients ``g`` ``[n, out, in]``."""
        qo, qi = self.q_out[name].to(g.dtype), self.q_in[name].to(g.dtype)
        return self.unrotate(name, self.divide(name, qo.T @ g @ qi), g.dtype)

    def divide(self, name: str, rot: torch.Tensor) -> torch.Tensor:
        """Rotated gradients ``Q_S^T G Q_A`` over the damped corrected eigenvalues."""
        return rot / (self.lam[name].to(rot.dtype) + self.damping[name])

    def unrotate(self, name: str, rot: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``Q_S R Q_A^T`` in ``dtype``: the eigenbasis back to the module's weight space."""
        qo, qi = self.q_out[name].to(dtype), self.q_in[name].to(dtype)
        return qo @ rot.to(dtype) @ qi.T

    def precondition_tokens(
        self, name: str, delta: torch.Tensor, x: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """:meth:`precondition` of the per-example gradients ``sum_t delta_t x_t^T`` given as
        their tokens (``[n, T, out]``, ``[n, T, in]``, float64): the tokens are rotated first
        (``T (out^2 + in^2)`` per example instead of ``out in (out + in)``: cheaper while T is a
        query's length), divided in float64, and brought back in ``dtype``, the precision the
        scores use them in."""
        qo, qi = self.q_out[name].to(delta.dtype), self.q_in[name].to(delta.dtype)
        rot = torch.einsum("nto,nti->noi", delta @ qo, x @ qi)
        return self.unrotate(name, self.divide(name, rot), dtype)

    def dense(self, name: str) -> torch.Tensor:
        """The damped curvature block of ``name`` as a dense ``[out*in, out*in]`` matrix
        (row-major ``vec``; for tests on small modules)."""
        basis = torch.kron(self.q_out[name], self.q_in[name])
        diag = self.lam[name].reshape(-1) + self.damping[name]
        return basis @ torch.diag(diag) @ basis.T

    def info(self) -> dict[str, Any]:
        lam_mean = {n: float(self.lam[n].mean()) for n in self.names}
        return {
            "n_modules": len(self.names),
            "n_fit_windows": self.n_windows,
            "damping": {n: round(self.damping[n], 12) for n in self.names},
            "eigenvalue_mean": {n: round(v, 12) for n, v in lam_mean.items()},
        }


def kronecker_factors(
    net: torch.nn.Module,
    names: Sequence[str],
    batches: Iterator[Batch],
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> FactorSums:
    """EK-FAC's own first pass: per module the sums of ``x x^T`` and ``delta delta^T`` over
    every token (each batch's in ``dtype``, accumulated in float64), :class:`FactorSums`."""
    sums = FactorSums(names)
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        for name in names:
            sums.tap(name, "in", xs[name])
            if name in ds:
                sums.tap(name, "out", ds[name])
        sums.batch_done(ids.shape[0], ids.numel())
        if progress is not None:
            progress(ids.shape[0])
    return sums


def eigenbasis(m: torch.Tensor) -> torch.Tensor:
    """Eigenvectors (columns) of a symmetric matrix, float64."""
    return torch.linalg.eigh(0.5 * (m + m.T))[1]


def corrected_eigenvalues(
    net: torch.nn.Module,
    names: Sequence[str],
    q_in: dict[str, torch.Tensor],
    q_out: dict[str, torch.Tensor],
    batches: Iterator[Batch],
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """``E_windows[(Q_S^T G Q_A)^2]`` per module (float64) and the window count."""
    dev = device_of(net)
    total: dict[str, torch.Tensor] = {n: torch.zeros((), device=dev) for n in names}
    count = 0
    qi = {n: q_in[n].to(dev, dtype) for n in names}
    qo = {n: q_out[n].to(dev, dtype) for n in names}
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        for name in names:  # Q_S^T G Q_A = sum_t (Q_S^T delta_t)(Q_A^T x_t)^T: rotate tokens
            if name in ds:
                rot = torch.einsum("nto,nti->noi", ds[name] @ qo[name], xs[name] @ qi[name])
                total[name] = total[name] + rot.double().square().sum(0)
        count += ids.shape[0]
        if progress is not None:
            progress(ids.shape[0])
    return {n: total[n] / count for n in names}, count


def fit(
    net: torch.nn.Module,
    windows: np.ndarray,
    damping_ratio: float,
    *,
    batch: int = 16,
    dtype: torch.dtype = torch.float32,
    progress: Callable[[str], Progress] = lambda what: None,
    factors: FactorSums | None = None,
) -> EKFAC:
    """The EK-FAC curvature of every block linear of ``net`` on ``windows`` (``[n, T]`` ids);
    ``progress(pass name)`` makes each pass's progress callback when the pass starts.
    ``factors``: the Kronecker factor sums of these windows already made by another pass (the
    final checkpoint's ``grads_pool``); without them EK-FAC runs its own first pass."""
    names, dev = block_linear_names(net), device_of(net)
    if factors is None:
        factors = kronecker_factors(
            net, names, window_batches(windows, batch, dev), dtype, progress("factors")
        )
    elif factors.names != names or factors.rows != len(windows):
        raise ArtifactError(
            f"EK-FAC: the factor sums cover {factors.rows} windows of modules {factors.names[:2]}..., "
            f"not the {len(windows)} fit windows of this model; rerun its grads_pool jobs"
        )
    a, s = factors.means()  # on the CPU when they come from the grads_pool shards
    q_in = {n: eigenbasis(a[n].to(dev)) for n in names}
    q_out = {n: eigenbasis(s[n].to(dev)) for n in names}
    lam, count = corrected_eigenvalues(
        net, names, q_in, q_out, window_batches(windows, batch, dev), dtype, progress("eigenvalues")
    )
    return EKFAC(names, q_in, q_out, lam, damping_of(lam, damping_ratio), count)


def damping_of(lam: dict[str, torch.Tensor], damping_ratio: float) -> dict[str, float]:
    """Per module ``lambda_m = damping_ratio x mean(Lambda_m)`` (1 where no gradient reached
    the module): kronfluence's heuristic, so the damping follows each block's own scale."""
    out = {}
    for n, v in lam.items():
        mean = float(v.mean())
        out[n] = damping_ratio * mean if mean > 0 else 1.0
    return out


def preconditioned_queries(
    net: torch.nn.Module, ek: EKFAC, batch: Batch, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Per module ``P_m(q)`` of every query, flattened ``[n_q, out*in]`` in ``dtype`` (the
    gradients, their rotation and the division in float64; the rotation back in ``dtype``)."""
    ids, mask, attn = batch
    xs, ds = module_io(net, ek.names, ids, mask, attn, torch.float64)
    out = {}
    for n in ek.names:
        if n in ds:
            out[n] = ek.precondition_tokens(n, ds[n], xs[n], dtype).reshape(ids.shape[0], -1)
        else:  # no gradient reached it: zeros, as the per-example gradients would be
            out[n] = xs[n].new_zeros((ids.shape[0], ek.lam[n].numel()), dtype=dtype)
    return out


def scores(
    net: torch.nn.Module,
    pre: dict[str, torch.Tensor],
    batches: Iterator[Batch],
    n_windows: int,
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> np.ndarray:
    """``sum_m <P_m(q), G_m(d)>`` for every query and window: ``[n_q, n_windows]`` float64."""
    names = list(pre)
    n_q = next(iter(pre.values())).shape[0]
    out = np.zeros((n_q, n_windows), dtype=np.float64)
    start = 0
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        n = ids.shape[0]
        tile = torch.zeros((n_q, n), dtype=torch.float64, device=ids.device)
        for name in names:
            if name in ds:
                g = _grads(ds, xs, name).reshape(n, -1)
                tile += (pre[name] @ g.T).double()
        out[:, start : start + n] = to_numpy(tile)
        start += n
        if progress is not None:
            progress(n)
    return out


def chunked_scores(
    net: torch.nn.Module,
    ek: EKFAC,
    queries_batch: Batch,
    windows: np.ndarray,
    batch: int,
    *,
    budget: int = layout.EKFAC_MEMORY_BYTES,
    what: str = "ekfac",
) -> np.ndarray:
    """Every query's scores against every window, the queries in :func:`plantbench.layout.ekfac_query_chunks`."""
    return chunked_scores_of(net, ek, queries_batch, windows, batch, budget=budget, what=what)[0]


QueryVectors = Callable[[Batch], dict[str, torch.Tensor]]
"""Per module the vectors ``[n_q, out*in]`` of a chunk of queries to dot with the windows'
gradients (EK-FAC's preconditioned query gradients, ASTRA's refined ones)."""


def chunked_scores_of(
    net: torch.nn.Module,
    ek: EKFAC,
    queries_batch: Batch,
    windows: np.ndarray,
    batch: int,
    extra: Sequence[QueryVectors] = (),
    *,
    budget: int = layout.EKFAC_MEMORY_BYTES,
    what: str = "ekfac",
) -> list[np.ndarray]:
    """One score matrix ``[n_q, n_windows]`` for EK-FAC's preconditioned queries and one per
    ``extra`` maker (ASTRA's refined ones), all from the same passes over the pool: each chunk of
    queries (every maker's float32 values per query within ``budget``) has each maker's vectors
    stacked and dotted with every window's gradient once."""
    makers = [lambda part: preconditioned_queries(net, ek, part), *extra]
    n_params = sum(int(v.numel()) for v in ek.lam.values())
    dev = device_of(net)
    ids, mask, attn = (None if t is None else t.to(dev) for t in queries_batch)
    chunks = layout.ekfac_query_chunks(ids.shape[0], n_params * len(makers), budget)
    outs = [np.zeros((ids.shape[0], len(windows)), dtype=np.float64) for _ in makers]
    for c, (a, b) in enumerate(chunks):
        part = (ids[a:b], mask[a:b], None if attn is None else attn[a:b])
        made = [make(part) for make in makers]
        pre = made[0] if len(made) == 1 else {n: torch.cat([m[n] for m in made]) for n in made[0]}
        del made
        prog = artifacts.Progress(f"{what} scores (queries {c + 1}/{len(chunks)})", len(windows))
        tile = scores(net, pre, window_batches(windows, batch, dev), len(windows), progress=prog)
        for k, out in enumerate(outs):
            out[a:b] = tile[k * (b - a) : (k + 1) * (b - a)]
    return outs
