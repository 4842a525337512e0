"""LoGra's per-module projection (seeded Gaussian ``P_out`` and ``P_in`` per block linear, regenerated from the
seed, never stored) and the check that no module's block of a projected gradient is all zero."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.model.modeling import block_linear_names
from plantbench.rng import rng

if TYPE_CHECKING:
    from plantbench.attribution.sketch import Sketch


DEFAULT_K_IN = 8


DEFAULT_K_OUT = 8


def choose_module_dims(total_dim: int, n_modules: int) -> tuple[int, int]:
    """Split a total target dimension evenly over modules: ``(k_out, k_in)`` per module.

    ``total_dim // n_modules`` values per module, factored as ``k_out * k_in`` with
    ``k_out <= k_in`` as close to square as possible (15,360 over 60 modules -> (16, 16);
    1,792 over 28 -> (8, 8)). The realised total is ``n_modules * k_out * k_in``.
    """
    per = total_dim // n_modules
    if per < 1:
        raise PlantbenchError(
            f"projection dimension {total_dim} is smaller than the number of modules "
            f"({n_modules}); raise it to at least {n_modules}"
        )
    k_out = max(d for d in range(1, math.isqrt(per) + 1) if per % d == 0)
    return k_out, per // k_out


@dataclass(frozen=True)
class ModuleSpec:
    name: str
    in_features: int
    out_features: int
    k_out: int
    k_in: int

    @property
    def size(self) -> int:
        return self.k_out * self.k_in


class Projector:
    """Per-module random projections, identified by a seed (matrices are regenerated, cached
    in memory only)."""

    kind = "logra"

    def __init__(self, specs: Sequence[ModuleSpec], seed: int):
        if not specs:
            raise PlantbenchError("no modules to project (the model has no block linear layers)")
        self.specs: tuple[ModuleSpec, ...] = tuple(specs)
        self.seed = int(seed)
        self.module_names: list[str] = [s.name for s in self.specs]
        self.slices: dict[str, slice] = {}
        start = 0
        for s in self.specs:
            self.slices[s.name] = slice(start, start + s.size)
            start += s.size
        self.dims: int = start
        self._cache: dict[tuple[str, str, torch.dtype, torch.device], torch.Tensor] = {}

    @classmethod
    def from_model(
        cls,
        model: torch.nn.Module,
        seed: int,
        *,
        k_in: int = DEFAULT_K_IN,
        k_out: int = DEFAULT_K_OUT,
        total_dim: int | None = None,
    ) -> Projector:
        """Projector for every block linear of ``model``; ``total_dim`` (if given) overrides
        ``k_in``/``k_out`` via :func:`choose_module_dims`."""
        names = block_linear_names(model)
        if total_dim is not None:
            k_out, k_in = choose_module_dims(total_dim, len(names))
        if k_in < 1 or k_out < 1:
            raise PlantbenchError(f"projection dims must be >= 1, got k_in={k_in}, k_out={k_out}")
        mods = dict(model.named_modules())
        specs = [
            ModuleSpec(n, mods[n].in_features, mods[n].out_features, int(k_out), int(k_in))
            for n in names
        ]
        return cls(specs, seed)

    @property
    def module_dims(self) -> list[tuple[int, int]]:
        """``(k_out, k_in)`` per module, in order."""
        return [(s.k_out, s.k_in) for s in self.specs]

    @property
    def block_sizes(self) -> list[int]:
        """One curvature block per module."""
        return [s.size for s in self.specs]

    def describe(self) -> dict[str, Any]:
        """JSON-ready identity: kind, seed, D, and per module [name, in, out, k_out, k_in]."""
        return {
            "projection": self.kind,
            "projection_seed": self.seed,
            "dims": self.dims,
            "modules": [
                [s.name, s.in_features, s.out_features, s.k_out, s.k_in] for s in self.specs
            ],
        }

    def matrix(
        self, name: str, side: str, dtype: torch.dtype = torch.float32, device: Any = "cpu"
    ) -> torch.Tensor:
        """``P_in`` (``k_in x in_features``) or ``P_out`` (``k_out x out_features``)."""
        key = (name, side, dtype, torch.device(device))
        if key not in self._cache:
            spec = self.specs[self.module_names.index(name)]
            if side not in ("in", "out"):
                raise ValueError(f"side must be 'in' or 'out', got {side!r}")
            k, d = (
                (spec.k_in, spec.in_features) if side == "in" else (spec.k_out, spec.out_features)
            )
            m = rng(self.seed, "proj", name, side).standard_normal((k, d)) / math.sqrt(k)
            self._cache[key] = torch.from_numpy(m).to(dtype=dtype, device=device)
        return self._cache[key]

    def check(self) -> None:
        """Raise if any projection matrix is all zero or not finite (a silent zero block)."""
        for s in self.specs:
            for side in ("in", "out"):
                m = self.matrix(s.name, side, torch.float64)
                if not torch.isfinite(m).all() or not (m != 0).any():
                    raise ArtifactError(
                        f"projection '{side}' of module '{s.name}' (seed {self.seed}) is all zero "
                        "or not finite; this is a bug, report it"
                    )


def check_blocks_nonzero(grads: np.ndarray | torch.Tensor, projector: Projector | Sketch) -> None:
    """Raise if any module's block of projected gradients is all zero (or non-finite) across
    the given rows: a hook that did not fire or a projection that vanished (a sketch is one
    block of every module)."""
    g = grads.detach().cpu().numpy() if isinstance(grads, torch.Tensor) else np.asarray(grads)
    if g.ndim != 2 or g.shape[1] != projector.dims:
        raise ValueError(f"expected [n, {projector.dims}] gradients, got {g.shape}")
    for name, sl in projector.slices.items():
        block = g[:, sl]
        if not np.isfinite(block).all():
            raise ArtifactError(f"projected gradients of module '{name}' contain inf/NaN")
        if not (block != 0).any():
            raise ArtifactError(
                f"projected gradients of module '{name}' are all zero for {g.shape[0]} rows; "
                "a hook did not fire or the loss mask is empty"
            )
