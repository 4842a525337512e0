"""ASTRA on EK-FAC: each query's inverse-Hessian-vector product refined with exact curvature.

EK-FAC's ``P^-1 g`` (:mod:`plantbench.attribution.ekfac`) solves the damped curvature only as
well as the Kronecker-factored Fisher approximates it. ASTRA (Wang et al. 2025,
arXiv:2507.14740) uses that inverse as a preconditioner and refines the solution of
``(G + lambda) v = g`` with products by the exact Gauss-Newton Hessian ``G``. Here, per query
gradient ``g`` (every block linear, the ``[out, in]`` layout of EK-FAC):

1. ``v_0 = P^-1 g``, EK-FAC's preconditioned query gradient, ``P = F_EK + lambda``;
2. ``k`` preconditioned Richardson (Neumann-series) steps
   ``v_{i+1} = v_i + eta P^-1 (g - (G + lambda) v_i)``, whose fixed point is
   ``(G + lambda)^-1 g`` (bergson's ``astra`` with momentum 0 and learning rate ``eta``, every
   product on the whole sample).

``G v = (1 / N) sum_w sum_t J_wt^T H_wt J_wt v`` is the Gauss-Newton Hessian of the windows'
summed next-token loss, averaged over a fixed seeded sample of ``N`` pool windows: the scale of
EK-FAC's Fisher (a window's summed loss, a mean over windows). ``J_wt`` is the Jacobian of the
logits at position ``t`` with respect to the block linears' weights (all of them at once: the
exact product couples the modules, which EK-FAC's blocks do not) and ``H = diag(p) - p p^T`` the
softmax cross-entropy's Hessian in the logits. ``J v`` is forward-mode (``torch.func.jvp``), and
``J^T (H J v)`` one reverse-mode pass through the same forward (``torch.autograd.grad`` of the
jvp's primal logits): one forward with tangents and one backward per batch of sample windows.
``lambda_m = damping_ratio x mean(Lambda_m)`` per module, the same in ``P`` and in
``G + lambda``; with the curvature's ``damping_ratio``, ``k = 0`` is EK-FAC's solution exactly.

The steps converge iff ``eta`` < 2 / ``mu_max``, the largest eigenvalue of
``P^-1 (G + lambda)``. ``eta`` = 1 (the plain Neumann series) diverges wherever EK-FAC
underestimates the exact curvature by more than a factor of two: its blocks miss the coupling
between modules, and its eigenvalue grid is only the diagonal of the curvature in its
Kronecker basis (on the tests' tiny model ``mu_max`` is about 55 and ``eta`` = 1 grows the
residual 40-fold a step). So ``eta`` defaults to ``1 / mu_max``, estimated once per fit by
power iteration (:data:`plantbench.layout.ASTRA_POWER_STEPS` products), which contracts every
eigen-direction; the meta records it and each step's relative residual
``||g - (G + lambda) v_i|| / ||g||`` (mean over queries). Cost: ``k`` products per query, each
a forward with tangents and a backward over the ``N`` sample windows (``k x N`` windows' worth,
against EK-FAC's passes over the pool for all queries together); the scores ride on EK-FAC's
scoring pass.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, jvp

from plantbench.attribution.ekfac.maths import EKFAC, Batch, damping_of, window_batches
from plantbench.attribution.gradients.capture import (
    _attention_bias,
    _position_ids,
    check_inputs,
    frozen_eval,
    module_io,
    target_mask,
)
from plantbench.layout import ASTRA_POWER_STEPS
from plantbench.model.modeling import device_of
from plantbench.rng import rng

Vec = dict[str, torch.Tensor]
"""Per module a tensor in the weights' layout: ``[out, in]`` (one query) or ``[n, out, in]``."""
Operator = Callable[[Vec], Vec]
"""A linear map of one query's vectors (``G + lambda``, ``P^-1``)."""


def sample_rows(seed: int, model: str, n_pool: int, windows: int) -> np.ndarray:
    """The pool rows (sorted) whose mean Gauss-Newton Hessian ASTRA uses: a seeded sample of
    ``min(windows, n_pool)``, fixed for every query and step (a deterministic iteration)."""
    k = min(int(windows), n_pool)
    pick = rng(int(seed), "astra", model).choice(n_pool, size=k, replace=False)
    return np.sort(pick).astype(np.int64)


def with_damping(ek: EKFAC, damping_ratio: float) -> EKFAC:
    """``ek`` damped with ``damping_ratio`` x its mean corrected eigenvalue per module."""
    return dataclasses.replace(ek, damping=damping_of(ek.lam, damping_ratio))


def _model_kwargs(net: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor | None) -> dict:
    """The forward's arguments as :func:`plantbench.attribution.gradients.capture.example_losses`
    builds them (the same masking and positions)."""
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": False}
    if attn is not None:
        dtype = next(net.parameters()).dtype
        kwargs["attention_mask"] = _attention_bias(attn, dtype)
        kwargs["position_ids"] = _position_ids(attn)
    return kwargs


class GaussNewton:
    """Products ``G v`` with the Gauss-Newton Hessian of the summed next-token loss, averaged
    over fixed windows, over the block linears' weights ``names`` (see the module docstring)."""

    def __init__(self, net: torch.nn.Module, names: Sequence[str], batches: Sequence[Batch]):
        self.net, self.names, self.batches = net, list(names), list(batches)
        self.n_windows = sum(int(b[0].shape[0]) for b in self.batches)
        mods = dict(net.named_modules())
        self.weights = {n: mods[n].weight for n in self.names}
        for ids, mask, attn in self.batches[:1]:  # forward-mode AD needs the math kernel
            check_inputs(net, ids, mask, attn, require_eager=True)

    def __call__(self, v: Mapping[str, torch.Tensor]) -> Vec:
        """``G v`` of one vector ``v`` (per module ``[out, in]``), in ``v``'s dtype."""
        out = {n: torch.zeros_like(v[n]) for n in self.names}
        with frozen_eval(self.net), torch.enable_grad():
            for b in self.batches:
                for n, h in zip(self.names, self._batch(v, b), strict=True):
                    out[n] += h.to(out[n].dtype)
        return {n: out[n] / self.n_windows for n in self.names}

    def _batch(self, v: Mapping[str, torch.Tensor], batch: Batch) -> tuple[torch.Tensor, ...]:
        """``sum_w sum_t J^T H J v`` over one batch's windows and target positions."""
        ids, mask, attn = batch
        keep = target_mask(mask, attn)
        kwargs = _model_kwargs(self.net, ids, attn)
        primals = {f"{n}.weight": w.detach().requires_grad_(True) for n, w in self.weights.items()}
        tangents = {f"{n}.weight": v[n].to(w.dtype) for n, w in self.weights.items()}

        def logits(params: dict[str, torch.Tensor]) -> torch.Tensor:
            return functional_call(self.net, params, (), kwargs).logits[:, :-1]

        out, jv = jvp(logits, (primals,), (tangents,))
        with torch.no_grad():
            p = F.softmax(out, dim=-1)
            hjv = p * (jv - (p * jv).sum(-1, keepdim=True)) * keep[..., None].to(p.dtype)
        return torch.autograd.grad(out, list(primals.values()), hjv)


Tokens = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]
"""A chunk of queries' block-linear inputs ``x`` and output gradients ``delta`` (float64)."""


def query_tokens(net: torch.nn.Module, ek: EKFAC, batch: Batch) -> Tokens:
    """The chunk's ``(x, delta)`` per module (float64, as EK-FAC's queries take them)."""
    ids, mask, attn = batch
    return module_io(net, ek.names, ids, mask, attn, torch.float64)


def query_gradient(ek: EKFAC, tokens: Tokens, q: int) -> tuple[Vec, Vec]:
    """``(g, P^-1 g)`` of query ``q`` of the chunk, per module ``[out, in]`` in float64: its
    gradient and EK-FAC's preconditioned gradient as
    :func:`plantbench.attribution.ekfac.maths.preconditioned_queries` forms it in float64
    (rotated tokens, divided, rotated back). One query at a time: a chunk's float64 vectors
    would be four times the float32 ones the memory budget counts."""
    xs, ds = tokens
    g, v = {}, {}
    for n in ek.names:
        if n in ds:
            x, d = xs[n][q : q + 1], ds[n][q : q + 1]
            g[n] = torch.einsum("nto,nti->oi", d, x)
            v[n] = ek.precondition_tokens(n, d, x, torch.float64)[0]
        else:  # no gradient reached it: zeros, as EK-FAC's scores take them
            g[n] = xs[n].new_zeros(ek.lam[n].shape, dtype=torch.float64)
            v[n] = g[n].clone()
    return g, v


def _dot(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return float(sum((a[n].double() * b[n].double()).sum() for n in a))


def _norm(v: Mapping[str, torch.Tensor]) -> float:
    return _dot(v, v) ** 0.5


def richardson(
    a: Operator, precondition: Operator, g: Vec, v: Vec, steps: int, step_size: float
) -> tuple[Vec, list[float]]:
    """``steps`` preconditioned Richardson steps ``v <- v + step_size P^-1 (g - A v)`` for one
    query (per module ``[out, in]``), and the relative residual ``||g - A v|| / ||g||`` before
    each step. One product with ``A`` per step."""
    scale = _norm(g) or 1.0
    out = []
    for _ in range(steps):
        av = a(v)
        r = {n: g[n] - av[n] for n in g}
        out.append(_norm(r) / scale)
        z = precondition(r)
        v = {n: v[n] + step_size * z[n] for n in g}
    return v, out


def largest_eigenvalue(a: Operator, precondition: Operator, start: Vec, iterations: int) -> float:
    """The largest eigenvalue of ``P^-1 A`` (both symmetric positive definite) by power
    iteration from ``start``: the Rayleigh quotient ``(A x)^T P^-1 (A x) / x^T A x`` of the last
    iterate, an estimate from below that settles within a few percent in ~10 iterations."""
    x, mu = start, 0.0
    for _ in range(iterations):
        ax = a(x)
        y = precondition(ax)
        mu = _dot(ax, y) / _dot(x, ax)
        size = _norm(y)
        x = {n: y[n] / size for n in y}
    return mu


class Astra:
    """ASTRA's refined query vectors, a ``QueryVectors`` maker of
    :func:`plantbench.attribution.ekfac.maths.chunked_scores_of`: EK-FAC ``ek`` re-damped with ``damping_ratio`` preconditions,
    ``windows`` (``[N, T]`` ids) define ``G``. ``step_size`` None: ``1 / mu_max`` of
    ``P^-1 (G + lambda)`` (:func:`largest_eigenvalue`, from a start seeded with ``seed``), the
    largest step whose every eigen-direction contracts. Keeps the residuals and the seconds."""

    def __init__(
        self,
        net: torch.nn.Module,
        ek: EKFAC,
        windows: np.ndarray,
        *,
        steps: int,
        damping_ratio: float,
        step_size: float | None,
        batch: int,
        seed: int = 0,
    ):
        self.net, self.steps, self.step_size, self.seed = net, int(steps), step_size, seed
        self.ek = with_damping(ek, damping_ratio)
        self.gn = GaussNewton(net, ek.names, list(window_batches(windows, batch, device_of(net))))
        self.mu_max: float | None = None
        self.residuals: list[np.ndarray] = []
        self.seconds = 0.0

    def damped(self, v: Vec) -> Vec:
        """``(G + lambda) v`` of one query."""
        gv = self.gn(v)
        return {n: gv[n] + self.ek.damping[n] * v[n] for n in self.ek.names}

    def precondition(self, r: Vec) -> Vec:
        """EK-FAC's ``P^-1 r`` of one query, re-damped."""
        return {n: self.ek.precondition(n, r[n][None])[0] for n in self.ek.names}

    def step(self) -> float:
        """The step size: the configured one, else ``1 / mu_max`` (estimated once)."""
        if self.step_size is not None:
            return float(self.step_size)
        if self.mu_max is None:
            gen = torch.Generator().manual_seed(self.seed)
            start = {
                n: torch.randn(self.ek.lam[n].shape, generator=gen, dtype=torch.float64).to(
                    self.ek.lam[n].device
                )
                for n in self.ek.names
            }
            self.mu_max = largest_eigenvalue(
                self.damped, self.precondition, start, ASTRA_POWER_STEPS
            )
        return 1.0 / self.mu_max

    def __call__(self, batch: Batch, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """Per module the refined vectors of the chunk's queries, ``[n_q, out*in]`` in ``dtype``."""
        t0 = time.time()
        tokens = query_tokens(self.net, self.ek, batch)
        n_q, names = batch[0].shape[0], self.ek.names
        step = self.step() if self.steps else 1.0
        dev = batch[0].device
        out = {
            n: torch.zeros((n_q, self.ek.lam[n].numel()), dtype=dtype, device=dev) for n in names
        }
        res = np.zeros((n_q, self.steps))
        for q in range(n_q):
            g, v = query_gradient(self.ek, tokens, q)
            v, res[q] = richardson(self.damped, self.precondition, g, v, self.steps, step)
            for n in names:
                out[n][q] = v[n].reshape(-1).to(dtype)
        self.residuals.append(res)
        self.seconds += time.time() - t0
        return out

    def info(self) -> dict[str, Any]:
        """What the meta records: the step size, the mean relative residual before each step,
        the seconds."""
        res = np.concatenate(self.residuals) if self.residuals else np.zeros((0, self.steps))
        mean = res.mean(0) if len(res) else np.zeros(self.steps)
        return {
            "gn_windows": self.gn.n_windows,
            "step_size": None if not self.steps else round(self.step(), 12),
            "mu_max": None if self.mu_max is None else round(self.mu_max, 9),
            "residual_before_step": [round(float(x), 9) for x in mean],
            "seconds_refine": round(self.seconds, 3),
        }
