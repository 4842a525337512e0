"""Count sketch of the exact per-example gradients of the block linears (the default projection).

What it computes
----------------
For every block linear ``m`` (input size ``i``, output size ``o``) and every example ``n`` the
exact weight gradient ``G_{n,m} = sum_t delta_{n,t} x_{n,t}^T`` (``o x i``) is formed, one module
and a bounded chunk of examples at a time (:data:`CHUNK_BYTES`), and every one of its weights is
added, with a random sign, into one of ``D`` shared buckets:

    s_n[b] = sum_m sum_{(r, c): h_m(r, c) = b} sigma_m(r) tau_m(c) G_{n,m}[r, c]

``h_m`` is a seeded uniform bucket per weight; the sign of weight ``(r, c)`` is the product of a
seeded sign per output row ``sigma_m(r)`` and per input column ``tau_m(c)``, so it is folded into
``delta`` and ``x`` before the product and costs nothing. Every pair of distinct weights has
independent buckets and uncorrelated signs, so ``<s_q, s_d>`` is an unbiased estimate of the
exact gradient product ``sum_m <G_{q,m}, G_{d,m}>`` with the variance of a dense random
projection to ``D`` dimensions (a count sketch: Charikar, Chen and Farach-Colton 2002; Weinberger
et al. 2009). The buckets are shared by all modules: a module whose gradients are large gets as
many of the ``D`` dimensions as its share of the product needs, where LoGra's fixed ``k_out x
k_in`` per module spends as much on a quiet module as on a loud one.

Why not LoGra's Kronecker projection: ``(P_out delta)(P_in x)^T`` estimates each module's product
as a product of two ``k``-dimensional estimates; when the inputs of two examples point the same
way (as a transformer's residual stream does), the error is that of a ``k_out``-dimensional
projection, not a ``k_out k_in``-dimensional one. Measured on the default study's twin A (300
pool windows x 144 queries, Spearman with the exact float64 dot, mean over queries): LoGra 8 x 8
(D = 1,792) 0.59, 16 x 16 (D = 7,168) 0.75, 32 x 32 (D = 28,672) 0.85; this sketch 0.85 at
D = 1,792, 0.92 at 4,096 and 0.95 at 8,192.

Cost: forming ``G`` adds ``2 T P_b`` flops per window (``P_b`` block-linear weights) to the
forward and activation-only backward (about +30%), and the bucket adds are ``P_b`` additions per
window. Extra memory: at most :data:`CHUNK_BYTES` of formed gradients at a time, plus the bucket
tables (``P_b`` int64, regenerated from the seed, held while the object lives). Nothing is
``O(P_b D)``: no projection matrix exists.

Projection seeds: ``plantbench.rng.rng(seed, "sketch", module, what)`` with ``what`` in
``"bucket"``, ``"out"``, ``"in"``; a seed, ``D`` and the module list identify the sketch on any
machine (numpy's PCG64 stream is the same everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.model.modeling import block_linear_names
from plantbench.rng import rng

KIND = "sketch"
CHUNK_BYTES = 64 << 20  # formed per-example gradients of one module held at once


@dataclass(frozen=True)
class SketchModule:
    name: str
    in_features: int
    out_features: int

    @property
    def size(self) -> int:
        return self.in_features * self.out_features


class Sketch:
    """Count sketch of every block linear's exact gradient into ``dims`` shared buckets.

    The same interface as :class:`plantbench.attribution.gradients.projector.Projector` where the store and the
    readers need it (``kind``, ``module_names``, ``dims``, ``seed``, ``slices``,
    ``block_sizes``, ``describe``, ``check``)."""

    kind = KIND

    def __init__(self, modules: Sequence[SketchModule], dims: int, seed: int):
        if not modules:
            raise PlantbenchError("no modules to sketch (the model has no block linear layers)")
        if int(dims) < 1:
            raise PlantbenchError(f"sketch dimension must be >= 1, got {dims}")
        self.modules: tuple[SketchModule, ...] = tuple(modules)
        self.module_names: list[str] = [m.name for m in self.modules]
        self.dims = int(dims)
        self.seed = int(seed)
        self._by_name = {m.name: m for m in self.modules}
        self._cache: dict[tuple[str, torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}

    @classmethod
    def from_model(cls, model: torch.nn.Module, seed: int, dims: int) -> Sketch:
        mods = dict(model.named_modules())
        specs = [
            SketchModule(n, mods[n].in_features, mods[n].out_features)
            for n in block_linear_names(model)
        ]
        return cls(specs, dims, seed)

    @property
    def slices(self) -> dict[str, slice]:
        """One block holding every module (what
        :func:`plantbench.attribution.gradients.projector.check_blocks_nonzero` checks)."""
        return {"all block linears (sketch)": slice(0, self.dims)}

    @property
    def block_sizes(self) -> list[int]:
        """One block: every dimension mixes every module (block curvature is the full one)."""
        return [self.dims]

    def describe(self) -> dict[str, Any]:
        """JSON-ready identity: kind, seed, D, and per module [name, in, out]."""
        return {
            "projection": KIND,
            "projection_seed": self.seed,
            "dims": self.dims,
            "modules": [[m.name, m.in_features, m.out_features] for m in self.modules],
        }

    def tables(
        self, name: str, dtype: torch.dtype = torch.float32, device: Any = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(buckets [o * i] int64, out-row signs [o], in-column signs [i])`` of a module;
        weight ``(r, c)`` is flattened row-major to ``r * i + c``."""
        key = (name, dtype, torch.device(device))
        if key not in self._cache:
            m = self._by_name[name]
            buckets = rng(self.seed, "sketch", name, "bucket").integers(0, self.dims, m.size)
            signs = [
                rng(self.seed, "sketch", name, side).integers(0, 2, k) * 2.0 - 1.0
                for side, k in (("out", m.out_features), ("in", m.in_features))
            ]
            self._cache[key] = (
                torch.from_numpy(buckets).to(device=device),
                *(torch.from_numpy(s).to(dtype=dtype, device=device) for s in signs),
            )
        return self._cache[key]  # type: ignore[return-value]

    def accumulate(
        self,
        out: torch.Tensor,
        name: str,
        x: torch.Tensor,
        delta: torch.Tensor,
        scale: torch.Tensor | None = None,
    ) -> None:
        """Add module ``name``'s sketched per-example gradients to ``out`` (``[n, dims]``) from
        its inputs ``x`` ``[n, T, i]`` and output gradients ``delta`` ``[n, T, o]``. ``scale``
        (``[o, i]``) multiplies every formed gradient elementwise before it is sketched (the
        optimizer-state correction of TrackStar); the signs commute with it."""
        m = self._by_name[name]
        sc = None if scale is None else scale.to(out.dtype).to(out.device).reshape(1, -1)
        buckets, s_out, s_in = self.tables(name, out.dtype, out.device)
        ds = delta.to(out.dtype) * s_out
        xs = x.to(out.dtype) * s_in
        step = max(1, CHUNK_BYTES // (m.size * out.element_size()))
        for a in range(0, out.shape[0], step):
            g = torch.bmm(ds[a : a + step].transpose(1, 2), xs[a : a + step])
            g = g.reshape(g.shape[0], m.size)
            out[a : a + step].index_add_(1, buckets, g if sc is None else g * sc)

    def dense(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The sketch as an explicit ``[P_b, dims]`` matrix (one signed 1 per row, modules in
        order, each module's weights row-major): for tests only."""
        rows = []
        for m in self.modules:
            buckets, s_out, s_in = self.tables(m.name, dtype)
            mat = torch.zeros((m.size, self.dims), dtype=dtype)
            mat[torch.arange(m.size), buckets] = torch.outer(s_out, s_in).reshape(-1)
            rows.append(mat)
        return torch.cat(rows)

    def check(self) -> None:
        """Raise if a module's tables are degenerate (no bucket in range): a bug."""
        for m in self.modules:
            buckets, _, _ = self.tables(m.name, torch.float64)
            if (
                buckets.numel() != m.size
                or int(buckets.min()) < 0
                or int(buckets.max()) >= self.dims
            ):
                raise ArtifactError(
                    f"sketch tables of module '{m.name}' (seed {self.seed}) are out of range; "
                    "this is a bug, report it"
                )
