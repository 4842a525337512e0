"""LoGra-style projected per-example gradients and the sharded gradient store.

What is projected
-----------------
Every ``nn.Linear`` inside the transformer blocks (:func:`plantbench.modeling.block_linear_names`;
for Llama: q, k, v, o, gate, up, down of every layer; weights only, Llama's linears have no bias).
For a module with input size ``i`` and output size ``o`` the per-example weight gradient is
``G_n = sum_t delta_{n,t} x_{n,t}^T`` (``o x i``), where ``x`` is the module's input and
``delta = dL_n/d(output)``. Two fixed Gaussian matrices ``P_in`` (``k_in x i``) and ``P_out``
(``k_out x o``), entries ``N(0, 1/k)`` so that norms are preserved in expectation, give

    g_n = vec(P_out G_n P_in^T) = sum_t (P_out delta_{n,t}) (P_in x_{n,t})^T      (k_out x k_in)

which equals ``(P_out kron P_in) vec(G_n)`` with row-major ``vec``. We project first (forward
hooks project ``x``, tensor hooks on the module output project ``delta``) and never form ``G_n``:
the cost per module is ``O(T (i k_in + o k_out + k_in k_out))`` per example instead of
``O(i o)`` memory and ``O(i o k_in k_out)`` time for a dense projection of the full gradient.
Module blocks are concatenated in ``block_linear_names`` order into one vector of
``D = sum_m k_out k_in`` values; :attr:`Projector.slices` says where each module lives.

Projection matrices are never stored: they are regenerated in float64 from
``plantbench.rng.rng(seed, "proj", module_name, side)`` (``side`` = ``"in"`` / ``"out"``) and
then cast, so a seed plus the module list identifies them on any machine.

Default dimensions: ``k_in = k_out = 8`` per module (64 values per module; 28 modules of the
default 4-layer model -> ``D = 1,792``), chosen so that the default study's store and the full
Fisher stay small (1,792^2 float64 = 25 MB) while every module keeps a 64-dim block. The paper
preset asks for 15,360 dims over the seed's 60 linear layers, i.e. 256 per module = 16 x 16;
:func:`choose_module_dims` splits a total target into ``(k_out, k_in)`` (a 12-layer Llama has 84
block linears: 15,360 -> 13 x 14 per module, D = 15,288).

Loss
----
Per example: the *sum* over target positions of next-token cross-entropy. ``loss_mask[n, t]``
marks token ``t`` as a target (predicted from tokens ``< t``); column 0 has no prediction and is
ignored. Pool windows use every position; queries mark only answer tokens. With an
``attention_mask`` (1 = real token) a target also needs itself and its predecessor to be real,
and positions are counted from the first real token, so right or left padding gives the same
gradient as the unpadded example. Each example's loss depends only on its own row, so summing
the per-example losses and back-propagating once gives every example its own gradient; with the
eager (math) attention kernel and ``model.eval()`` batching does not change an example's
gradient beyond floating-point reassociation (exact in float64 up to ~1e-12).

The parameter gradients themselves are never computed: parameters are frozen for the call and
gradient flows from the (detached, grad-requiring) input embeddings, so backward computes only
activation gradients. Nor are the logits: the output layer and the loss are one chunked step
that computes the gradient of every target row's loss with respect to the final hidden state
in closed form (:mod:`plantbench.headloss`; the same gradients, in float64 to ~1e-12), so rows
that are not targets cost nothing and no ``[n, T, V]`` tensor is held.

Store layout (one shard = one folder)
-------------------------------------
::

    <shard>/grads.bin     raw C-order little-endian array [rows, D], float16 or float32
    <shard>/shard.json    identity (format, module names and (k_out, k_in), D, dtype,
                          projection seed, model label, checkpoint name/step, manifest hash,
                          config hash), rows, keys (window indices, row order), "complete",
                          byte size and xxh3 of grads.bin

A shard is built in ``<parent>/.<name>.partial/`` (same files, plus ``progress.json``: the
identity, the keys and the finished row ranges) and renamed to ``<shard>`` only when every row is
written, so a finished shard is never half-written. ``progress.json`` is rewritten (atomically)
only after the rows it lists were flushed to ``grads.bin``, so an interrupted job resumes from
the rows it lists and recomputes at most one batch. A partial folder made for a different
identity or key list is discarded and started over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from .errors import ArtifactError, PlantbenchError
from .hashing import hash_bytes, hash_file
from .headloss import fusable, head_losses
from .io import _fsync_dir, write_json
from .modeling import block_linear_names
from .rng import derive_seed, rng

if TYPE_CHECKING:
    from .sketch import Sketch

log = logging.getLogger(__name__)

STORE_FORMAT = 2  # 2: shard.json names its projection (logra | sketch)
DEFAULT_K_IN = 8
DEFAULT_K_OUT = 8
GRADS_FILE = "grads.bin"
SHARD_JSON = "shard.json"
PROGRESS_JSON = "progress.json"
STORE_DTYPES = {"float16": np.float16, "float32": np.float32}
# Keys of shard.json that must agree between shards merged into one store.
IDENTITY_KEYS = (
    "format",
    "projection",
    "modules",
    "dims",
    "dtype",
    "projection_seed",
    "model",
    "checkpoint",
    "checkpoint_step",
    "manifest_hash",
    "config_hash",
)


# --------------------------------------------------------------------------- projection


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


# --------------------------------------------------------------------------- loss


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def _attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [n, 1, T, T] mask: causal, real keys only, and every padded query attends to
    itself (a fully masked row would be NaN in the eager kernel and poison 0 * NaN products)."""
    n, t = attention_mask.shape
    real = attention_mask.bool()
    causal = torch.ones(t, t, dtype=torch.bool, device=real.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=real.device)
    allowed = causal & (real[:, None, None, :] | eye)
    zero = torch.zeros((), dtype=dtype, device=real.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def target_mask(loss_mask: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[n, T-1] bool: which next-token predictions carry loss (see module docstring)."""
    m = loss_mask[:, 1:].bool()
    if attention_mask is not None:
        a = attention_mask.bool()
        m = m & a[:, 1:] & a[:, :-1]
    return m


def example_losses(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    inputs_embeds: torch.Tensor | None = None,
    fused: bool = False,
) -> torch.Tensor:
    """Per-example summed next-token cross-entropy over the target positions, shape [n].

    ``fused``: the output layer and the loss in one chunked step that never forms the logits
    (:mod:`plantbench.headloss`; parameters must be frozen), where the model allows it; the
    same losses and gradients up to floating-point reassociation."""
    kwargs: dict[str, Any] = {"use_cache": False}
    if attention_mask is not None:
        dtype = next(model.parameters()).dtype
        kwargs["attention_mask"] = _attention_bias(attention_mask, dtype)
        kwargs["position_ids"] = _position_ids(attention_mask)
    if inputs_embeds is not None:
        kwargs["inputs_embeds"] = inputs_embeds
    else:
        kwargs["input_ids"] = input_ids
    mask = target_mask(loss_mask, attention_mask)
    if fused and fusable(model):
        hidden = model.model(**kwargs).last_hidden_state
        return head_losses(model, hidden, input_ids, mask)
    logits = model(**kwargs).logits
    n, t, v = logits.shape
    ce = F.cross_entropy(
        logits[:, :-1].reshape(-1, v), input_ids[:, 1:].reshape(-1), reduction="none"
    ).view(n, t - 1)
    return torch.where(mask, ce, torch.zeros((), dtype=ce.dtype)).sum(1)


def _check_inputs(model, input_ids, loss_mask, attention_mask, require_eager: bool) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [n, T], got {tuple(input_ids.shape)}")
    if loss_mask.shape != input_ids.shape:
        raise ValueError(
            f"loss_mask {tuple(loss_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    attn = getattr(getattr(model, "config", None), "_attn_implementation", "eager")
    if require_eager and attn != "eager":
        raise PlantbenchError(
            f"per-example gradients need the math attention kernel, but the model uses '{attn}'; "
            "load it with attn='eager' (plantbench.modeling.load_model(path, attn='eager'))"
        )


@contextlib.contextmanager
def frozen_eval(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        model.train(was_training)


# --------------------------------------------------------------------------- gradients


def frozen_pass(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward (fused loss) and one backward of the summed per-example losses, parameters
    frozen and in eval mode: gradient flows from the input embeddings, so only activation
    gradients are formed (the hooks of :func:`_capture` see them). Returns the detached
    per-example losses ``[n]``."""
    with frozen_eval(model), torch.enable_grad():
        embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        losses = example_losses(
            model, input_ids, loss_mask, attention_mask, inputs_embeds=embeds, fused=True
        )
        if losses.requires_grad:
            torch.autograd.grad(losses.sum(), embeds)
    return losses.detach()


def _capture(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dtype: torch.dtype,
    maps: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]],
    consume: Callable[[str, torch.Tensor, torch.Tensor], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward and one backward of the summed per-example losses; per named module its
    input ``x`` and output gradient ``delta`` (``[n, T, .]`` in ``dtype``), each multiplied by
    ``maps[name] = (P_in, P_out)`` transposed when given. Parameters stay frozen: gradient
    flows from the input embeddings, so no weight gradient is ever formed. A module missing
    from the second dict got no gradient (e.g. an empty loss mask). With ``consume``, each
    module's pair goes to ``consume(name, x, delta)`` as soon as its output gradient is known
    and neither is kept (both dicts come back empty)."""
    mods = dict(model.named_modules())
    xs: dict[str, torch.Tensor] = {}
    ds: dict[str, torch.Tensor] = {}
    ran: set[str] = set()
    handles = []

    def make_hook(name: str):
        p_in, p_out = maps.get(name, (None, None))

        def grad_hook(g: torch.Tensor) -> None:
            if name in ds:
                raise PlantbenchError(f"module '{name}' ran twice in one forward; not supported")
            g = g.detach().to(dtype)
            g = g if p_out is None else g @ p_out.T
            if consume is None:
                ds[name] = g
            else:
                consume(name, xs.pop(name), g)

        def fwd_hook(mod, inputs, output):
            if name in ran:
                raise PlantbenchError(f"module '{name}' ran twice in one forward; not supported")
            ran.add(name)
            x = inputs[0].detach().to(dtype)
            xs[name] = x if p_in is None else x @ p_in.T
            if output.requires_grad:
                output.register_hook(grad_hook)

        return fwd_hook

    try:
        for name in module_names:
            handles.append(mods[name].register_forward_hook(make_hook(name)))
        frozen_pass(model, input_ids, loss_mask, attention_mask)
    finally:
        for h in handles:
            h.remove()
    for name in module_names:
        if name not in ran:
            raise PlantbenchError(f"module '{name}' did not run in the forward pass")
    if consume is not None:
        xs.clear()
    return xs, ds


def projected_grads(
    model: torch.nn.Module,
    projector: Projector | Sketch,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    require_eager: bool = True,
) -> torch.Tensor:
    """Projected per-example gradients, ``[n, projector.dims]`` in ``dtype``.

    One forward and one backward for the whole batch. LoGra (:class:`Projector`): hooks
    project each module's inputs and output gradients; per example ``sum_t (P_out delta_t)
    (P_in x_t)^T`` is flattened row-major (``k_out`` major). A count sketch
    (:class:`plantbench.sketch.Sketch`): each module's exact gradient is sketched as soon as
    its output gradient is known (:meth:`~plantbench.sketch.Sketch.accumulate`). The model is
    put in eval mode and its parameters frozen for the call.
    """
    _check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
    device = input_ids.device
    n = input_ids.shape[0]
    if projector.kind == "sketch":
        out = torch.zeros((n, projector.dims), dtype=dtype, device=device)

        def consume(name: str, x: torch.Tensor, delta: torch.Tensor) -> None:
            projector.accumulate(out, name, x, delta)

        _capture(
            model, projector.module_names, input_ids, loss_mask, attention_mask, dtype, {},
            consume,
        )  # fmt: skip
        return out
    maps = {
        name: (
            projector.matrix(name, "in", dtype, device),
            projector.matrix(name, "out", dtype, device),
        )
        for name in projector.module_names
    }
    xs, ds = _capture(
        model, projector.module_names, input_ids, loss_mask, attention_mask, dtype, maps
    )
    out = torch.zeros((n, projector.dims), dtype=dtype, device=device)
    for name in projector.module_names:
        if name not in ds:  # no gradient reached it: zero block
            continue
        g = torch.einsum("ntk,ntj->nkj", ds[name], xs[name])
        out[:, projector.slices[name]] = g.reshape(n, -1)
    return out


def full_grads(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    *,
    require_eager: bool = True,
) -> torch.Tensor:
    """Every example's unprojected weight gradient of the named linears from one batched
    backward: ``G_n = sum_t delta_{n,t} x_{n,t}^T`` per module, flattened and concatenated like
    :func:`exact_grads_flat` (``[n, sum_m out_m in_m]``; what that function gives by one
    autograd pass per example, up to floating-point reassociation)."""
    mods = dict(model.named_modules())
    sizes = [mods[name].weight.numel() for name in module_names]
    xs, ds = module_io(
        model,
        module_names,
        input_ids,
        loss_mask,
        attention_mask,
        dtype,
        require_eager=require_eager,
    )
    n = input_ids.shape[0]
    out = torch.zeros((n, sum(sizes)), dtype=dtype, device=input_ids.device)
    start = 0
    for name, size in zip(module_names, sizes, strict=True):
        if name in ds:
            g = torch.einsum("nto,nti->noi", ds[name], xs[name])
            out[:, start : start + size] = g.reshape(n, -1)
        start += size
    return out


def module_io(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    require_eager: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per named linear its inputs ``x`` ``[n, T, in]`` and output gradients ``delta``
    ``[n, T, out]`` of the summed per-example losses, from one forward and one backward (no
    weight gradient formed): ``G_n = sum_t delta_{n,t} x_{n,t}^T`` is the example's gradient."""
    _check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
    return _capture(model, module_names, input_ids, loss_mask, attention_mask, dtype, {})


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
    _check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
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


# ----------------------------------------------------------------------- dense random projection

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


# --------------------------------------------------------------------------- store


def shard_identity(
    projector: Projector | Sketch,
    *,
    dtype: str = "float32",
    checkpoint: str,
    checkpoint_step: int,
    manifest_hash: str,
    config_hash: str,
    model: str = "",
) -> dict[str, Any]:
    """The metadata every shard of one store must share."""
    if dtype not in STORE_DTYPES:
        raise PlantbenchError(
            f"gradient store dtype '{dtype}' is not one of {sorted(STORE_DTYPES)}"
        )
    d = projector.describe()
    return {
        "format": STORE_FORMAT,
        "projection": d["projection"],
        "modules": d["modules"],
        "dims": d["dims"],
        "dtype": dtype,
        "projection_seed": d["projection_seed"],
        "model": model,
        "checkpoint": checkpoint,
        "checkpoint_step": int(checkpoint_step),
        "manifest_hash": manifest_hash,
        "config_hash": config_hash,
    }


def _ranges(done: np.ndarray) -> list[list[int]]:
    idx = np.flatnonzero(done)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks] + 1, [idx[-1] + 1]])
    return [[int(a), int(b)] for a, b in zip(starts, ends, strict=True)]


class ShardWriter:
    """Writes one shard, resumably: construct it (it reopens a matching partial shard), write
    row ranges from :meth:`pending_batches` with :meth:`write`, then :meth:`finalize`.
    :func:`extract_to_shard` does all three for a model and a block of windows."""

    def __init__(self, shard_dir: str | Path, keys: Sequence[int] | np.ndarray, identity: dict):
        self.final = Path(shard_dir)
        self.partial = self.final.parent / f".{self.final.name}.partial"
        self.keys = np.asarray(keys, dtype=np.int64)
        if self.keys.ndim != 1 or len(np.unique(self.keys)) != len(self.keys):
            raise PlantbenchError(f"shard '{self.final}': keys must be a 1-D list without repeats")
        self.identity = dict(identity)
        self.np_dtype = np.dtype(STORE_DTYPES[self.identity["dtype"]]).newbyteorder("<")
        self.rows = len(self.keys)
        self.D = int(self.identity["dims"])
        self.nbytes = self.rows * self.D * self.np_dtype.itemsize
        self.done = np.zeros(self.rows, dtype=bool)
        self.complete = self._already_final()
        self._mm: np.memmap | None = None
        if not self.complete:
            self._open_partial()

    def _already_final(self) -> bool:
        p = self.final / SHARD_JSON
        if not p.is_file():
            return False
        try:
            meta = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        same = all(meta.get(k) == self.identity.get(k) for k in IDENTITY_KEYS)
        ok = same and meta.get("keys") == self.keys.tolist() and meta.get("complete") is True
        if ok and (self.final / GRADS_FILE).is_file():
            self.done[:] = True
            return (self.final / GRADS_FILE).stat().st_size == self.nbytes
        return False

    def _progress(self) -> dict[str, Any]:
        return {**self.identity, "keys": self.keys.tolist(), "done": _ranges(self.done)}

    def _open_partial(self) -> None:
        grads = self.partial / GRADS_FILE
        prog = self.partial / PROGRESS_JSON
        resumed = False
        if prog.is_file() and grads.is_file() and grads.stat().st_size == self.nbytes:
            try:
                p = json.loads(prog.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                p = {}
            if (
                all(p.get(k) == self.identity.get(k) for k in IDENTITY_KEYS)
                and p.get("keys") == self.keys.tolist()
            ):
                for a, b in p.get("done", []):
                    self.done[a:b] = True
                resumed = True
                log.info(
                    "resuming shard %s: %d/%d rows done", self.final, self.done.sum(), self.rows
                )
        if not resumed:
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
            with open(grads, "wb") as fh:
                fh.truncate(self.nbytes)
            write_json(prog, self._progress())
        if self.rows:
            self._mm = np.memmap(grads, dtype=self.np_dtype, mode="r+", shape=(self.rows, self.D))

    @property
    def pending(self) -> np.ndarray:
        """Row positions not yet written."""
        return np.flatnonzero(~self.done)

    def pending_batches(self, batch_rows: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` row ranges (at most ``batch_rows``) that still need writing."""
        for a, b in _ranges(~self.done):
            for s in range(a, b, batch_rows):
                yield s, min(s + batch_rows, b)

    def write(self, start: int, grads: np.ndarray | torch.Tensor) -> None:
        """Write rows ``[start, start + len(grads))``, flush, then record them as done."""
        if self.complete:
            raise PlantbenchError(f"shard '{self.final}' is already complete")
        g = grads.detach().cpu().numpy() if isinstance(grads, torch.Tensor) else np.asarray(grads)
        if g.ndim != 2 or g.shape[1] != self.D or start < 0 or start + g.shape[0] > self.rows:
            raise ValueError(
                f"rows [{start}, {start + g.shape[0]}) x {g.shape[1:]} do not fit "
                f"shard '{self.final}' ({self.rows} x {self.D})"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            cast = g.astype(self.np_dtype)
        if not np.isfinite(cast).all():
            raise ArtifactError(
                f"shard '{self.final}': gradients overflow or are not finite in "
                f"{self.identity['dtype']}; use a float32 store or check the model"
            )
        assert self._mm is not None
        self._mm[start : start + g.shape[0]] = cast
        self._mm.flush()
        self.done[start : start + g.shape[0]] = True
        write_json(self.partial / PROGRESS_JSON, self._progress())

    def finalize(self) -> dict[str, Any]:
        """Check every row is written, write shard.json, and rename the shard into place."""
        if self.complete:
            return json.loads((self.final / SHARD_JSON).read_text())
        if not self.done.all():
            raise ArtifactError(
                f"shard '{self.final}': {int((~self.done).sum())} of {self.rows} rows not written"
            )
        if self._mm is not None:
            self._mm.flush()
            del self._mm
            self._mm = None
        grads = self.partial / GRADS_FILE
        with open(grads, "rb+") as fh:
            os.fsync(fh.fileno())
        meta = {
            **self.identity,
            "rows": self.rows,
            "keys": self.keys.tolist(),
            "complete": True,
            "file": GRADS_FILE,
            "nbytes": self.nbytes,
            "xxh3": hash_file(grads),
        }
        write_json(self.partial / SHARD_JSON, meta)
        (self.partial / PROGRESS_JSON).unlink()
        if self.final.exists():
            old = self.final.parent / f".{self.final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.final, old)
            os.replace(self.partial, self.final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.partial, self.final)
        _fsync_dir(self.final.parent)
        self.complete = True
        return meta


def extract_to_shard(
    model: torch.nn.Module,
    projector: Projector | Sketch,
    windows: np.ndarray,
    keys: Sequence[int] | np.ndarray,
    shard_dir: str | Path,
    identity: dict[str, Any],
    *,
    loss_mask: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    batch_rows: int = 16,
    progress: Any = None,
) -> dict[str, Any]:
    """Compute projected gradients of ``windows`` ([rows, T] token ids) into one shard,
    resuming a partial shard; returns the finished shard.json. ``loss_mask`` defaults to every
    next-token position. ``progress(rows_done)`` is called after each batch if given."""
    writer = ShardWriter(shard_dir, keys, identity)
    if len(windows) != writer.rows:
        raise ValueError(f"{len(windows)} windows but {writer.rows} keys")
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    for a, b in writer.pending_batches(batch_rows):
        ids = torch.as_tensor(np.asarray(windows[a:b]), dtype=torch.long)
        lm = (
            torch.ones_like(ids, dtype=torch.bool)
            if loss_mask is None
            else torch.as_tensor(np.asarray(loss_mask[a:b]), dtype=torch.bool)
        )
        am = None if attention_mask is None else torch.as_tensor(np.asarray(attention_mask[a:b]))
        writer.write(a, projected_grads(model, projector, ids, lm, am, dtype=dtype))
        if progress is not None:
            progress(b - a)
    return writer.finalize()


def _read_shard_meta(shard_dir: Path) -> dict[str, Any]:
    p = shard_dir / SHARD_JSON
    if not p.is_file():
        partial = shard_dir.parent / f".{shard_dir.name}.partial"
        hint = (
            " (a partial one exists: rerun its features job to resume)" if partial.exists() else ""
        )
        raise ArtifactError(f"gradient shard '{shard_dir}' is missing or unfinished{hint}")
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"'{p}' is corrupt; delete '{shard_dir}' and recompute it") from None
    if meta.get("format") != STORE_FORMAT or meta.get("complete") is not True:
        raise ArtifactError(f"'{p}' is not a finished format-{STORE_FORMAT} gradient shard")
    return meta


class GradientStore:
    """Read-only view of one or more finished shards, rows keyed by window index.

    Shards are ordered by their smallest key, so the merged row order (and :attr:`hash`) does not
    depend on the order the folders were given in.
    """

    def __init__(self, shard_dirs: Sequence[str | Path], *, verify: bool = True):
        if not shard_dirs:
            raise ArtifactError("no gradient shards given")
        metas = []
        for d in shard_dirs:
            d = Path(d)
            metas.append((d, _read_shard_meta(d)))
        first_dir, first = metas[0]
        for d, m in metas[1:]:
            for k in IDENTITY_KEYS:
                if m.get(k) != first.get(k):
                    mine, theirs = json.dumps(m.get(k))[:80], json.dumps(first.get(k))[:80]
                    raise ArtifactError(
                        f"gradient shard '{d / SHARD_JSON}' differs from "
                        f"'{first_dir / SHARD_JSON}' in '{k}' ({mine} vs {theirs}); "
                        "recompute it with the same settings or leave it out"
                    )
        metas.sort(key=lambda dm: min(dm[1]["keys"]) if dm[1]["keys"] else -1)
        self.identity = {k: first[k] for k in IDENTITY_KEYS}
        self.dims: int = int(first["dims"])
        self.dtype = np.dtype(STORE_DTYPES[first["dtype"]]).newbyteorder("<")
        self.projection: str = str(first["projection"])
        self.module_names = [m[0] for m in first["modules"]]
        self.slices: dict[str, slice] = {}
        if self.projection == "sketch":  # every dimension mixes every module: one block
            self._blocks, s = [self.dims], self.dims
        else:
            self._blocks, s = [], 0
            for m in first["modules"]:
                self.slices[m[0]] = slice(s, s + int(m[3]) * int(m[4]))
                self._blocks.append(int(m[3]) * int(m[4]))
                s += self._blocks[-1]
        if s != self.dims:
            raise ArtifactError(
                f"'{first_dir / SHARD_JSON}': module sizes sum to {s}, not {self.dims}"
            )
        self.shard_dirs = [d for d, _ in metas]
        self._arrays: list[np.ndarray] = []
        owner: dict[int, Path] = {}
        keys = []
        for d, m in metas:
            f = d / GRADS_FILE
            want = int(m["rows"]) * self.dims * self.dtype.itemsize
            have = f.stat().st_size if f.is_file() else -1
            if have != want or len(m["keys"]) != m["rows"]:
                raise ArtifactError(
                    f"gradient shard file '{f}' has {have} bytes, expected {want} "
                    f"({m['rows']} rows x {self.dims} x {self.dtype.itemsize}); "
                    f"it is truncated or corrupt: delete '{d}' and recompute it"
                )
            if verify and hash_file(f) != m["xxh3"]:
                raise ArtifactError(
                    f"gradient shard file '{f}' does not match its recorded hash; "
                    f"delete '{d}' and recompute it"
                )
            for k in m["keys"]:
                if k in owner:
                    raise ArtifactError(
                        f"gradient shard '{d / SHARD_JSON}' overlaps '{owner[k] / SHARD_JSON}' "
                        f"(both hold window {k}); merge disjoint shards only"
                    )
                owner[k] = d
            keys.extend(m["keys"])
            self._arrays.append(
                np.memmap(f, dtype=self.dtype, mode="r", shape=(int(m["rows"]), self.dims))
                if m["rows"]
                else np.zeros((0, self.dims), self.dtype)
            )
        self.keys = np.asarray(keys, dtype=np.int64)
        self._row_of = {int(k): i for i, k in enumerate(self.keys)}
        self._offsets = np.cumsum([0] + [a.shape[0] for a in self._arrays])
        self.hash = hash_bytes(
            json.dumps(
                {"identity": self.identity, "shards": [m["xxh3"] for _, m in metas]}, sort_keys=True
            ).encode()
        )

    @classmethod
    def open(cls, shard_dirs: Sequence[str | Path], *, verify: bool = True) -> GradientStore:
        return cls(shard_dirs, verify=verify)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def n_rows(self) -> int:
        return len(self.keys)

    def row_of(self, key: int) -> int:
        try:
            return self._row_of[int(key)]
        except KeyError:
            raise ArtifactError(f"window {key} is not in the gradient store") from None

    def rows(self, start: int, stop: int, dtype: Any = np.float32) -> np.ndarray:
        """Rows ``[start, stop)`` in merged order, as a new array of ``dtype``."""
        out = np.empty((max(stop - start, 0), self.dims), dtype=dtype)
        for j, arr in enumerate(self._arrays):
            a, b = max(start, self._offsets[j]), min(stop, self._offsets[j + 1])
            if a < b:
                out[a - start : b - start] = arr[a - self._offsets[j] : b - self._offsets[j]]
        return out

    def get(self, keys: Sequence[int] | np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """Rows for the given window indices, in that order."""
        idx = [self.row_of(k) for k in np.asarray(keys).ravel()]
        return (
            np.stack([self.rows(i, i + 1, dtype)[0] for i in idx])
            if idx
            else np.zeros((0, self.dims), dtype)
        )

    def chunks(
        self, chunk_rows: int = 4096, dtype: Any = np.float32
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(keys, rows)`` in merged order, at most ``chunk_rows`` at a time."""
        for s in range(0, self.n_rows, chunk_rows):
            e = min(s + chunk_rows, self.n_rows)
            yield self.keys[s:e], self.rows(s, e, dtype)

    @property
    def block_sizes(self) -> list[int]:
        """Curvature blocks: one per module for LoGra, one for a sketch."""
        return list(self._blocks)
