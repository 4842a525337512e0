"""TrackStar features (Chang et al. 2024, "Scalable influence and fact tracing for large language
model pretraining"): optimizer-corrected, projected, whitened and unit-normalised gradients.

For a pool window or a query ``z`` at the final checkpoint:

1. the exact per-example weight gradient of every block linear, divided elementwise by the
   square root of Adam's second moment at that checkpoint: ``g(z) / (sqrt(v) + eps)``, the
   denominator of Adam's own update (the optimizer-state correction; ``v`` and ``eps`` are saved
   beside each checkpoint by pretraining, ``models/<twin>/moments/<checkpoint>.pt``; bergson's
   ``trackstar`` places eps the same way);
2. projected with the study's projection (``features.projection``: the count sketch or LoGra,
   the same matrices as the plain gradient features), giving ``p(z)`` in ``D`` dimensions;
3. whitened by the mixed curvature ``R = (1 - MIX) R_pool / m_pool + MIX R_query / m_query +
   DAMPING I`` (``features.trackstar_mix``, default 0.5; ``features.trackstar_damping``, default
   1e-3) with ``R_pool`` (``R_query``) the mean outer product of the pool windows' (the
   queries') projected features, each divided by its mean eigenvalue ``m`` so that the two mix
   on the same scale (pool windows sum the loss over every token, queries over the answer only):
   ``r(z) = R^{-1/2} p(z)``;
4. unit-normalised: ``f(z) = r(z) / |r(z)|``.

The TrackStar score of a query and a window is ``f(q) . f(d)``: a cosine in ``[-1, 1]``, > 0 when
a corrected descent step on ``d`` lowers the query's loss in the whitened metric.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plantbench import artifacts, floats, io, layout
from plantbench.attribution.features import projector
from plantbench.attribution.gradients.capture import projected_grads
from plantbench.config import canonical_json
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_file
from plantbench.model.modeling import device_of, to_numpy
from plantbench.paths import Paths

log = logging.getLogger(__name__)

MIX = 0.5  # weight of the query Fisher in the mixed curvature (features.trackstar_mix)
DAMPING = 1e-3  # added to the mixed curvature's eigenvalues, mean 1 (features.trackstar_damping)
FEATURES = "features.npz"


def load_scales(
    path: Path, module_names: list[str], checkpoint_hash: str
) -> dict[str, torch.Tensor]:
    """Per block linear ``1 / (sqrt(v) + eps)`` (float64, ``[out, in]``) from a moments file,
    refused unless it was saved for the checkpoint with ``checkpoint_hash``."""
    if not path.is_file():
        raise ArtifactError(
            f"'{path}' (Adam's second moments) is missing; rerun the pretrain step of this twin"
        )
    rec = torch.load(path, map_location="cpu", weights_only=True)
    if rec.get("checkpoint_hash") != checkpoint_hash:
        raise ArtifactError(f"'{path}' belongs to another checkpoint; rerun the pretrain step")
    v, eps = rec["exp_avg_sq"], float(rec["eps"])
    return {n: 1.0 / (torch.sqrt(v[f"{n}.weight"].double()) + eps) for n in module_names}


def corrected(
    net: torch.nn.Module,
    proj: Any,
    scales: dict[str, torch.Tensor],
    ids: np.ndarray,
    loss_mask: np.ndarray | None,
    attention_mask: np.ndarray | None,
    batch: int,
) -> np.ndarray:
    """Projected corrected gradients ``P (g / (sqrt(v) + eps))`` of every row, float64."""
    dtype = torch.float64 if next(net.parameters()).dtype == torch.float64 else torch.float32
    out, dev = np.zeros((len(ids), proj.dims)), device_of(net)
    for a in range(0, len(ids), batch):
        x = torch.as_tensor(np.asarray(ids[a : a + batch]), dtype=torch.long, device=dev)
        lm = (
            torch.ones_like(x, dtype=torch.bool)
            if loss_mask is None
            else torch.as_tensor(loss_mask[a : a + batch], device=dev).bool()
        )
        am = (
            None
            if attention_mask is None
            else torch.as_tensor(attention_mask[a : a + batch], device=dev)
        )
        g = projected_grads(net, proj, x, lm, am, dtype, scales=scales)
        out[a : a + batch] = to_numpy(g.double())
    return out


def _second_moment(g: np.ndarray) -> np.ndarray:
    r = g.T @ g / max(1, len(g))
    return r / max(float(np.trace(r)) / len(r), np.finfo(float).tiny)


def whitener(
    pool: np.ndarray, queries: np.ndarray, mix: float = MIX, damping: float = DAMPING
) -> np.ndarray:
    """``R^{-1/2}`` of the mixed, damped curvature (module docstring), float64 ``[D, D]``."""
    r = (1.0 - mix) * _second_moment(pool) + mix * _second_moment(queries)
    w, u = np.linalg.eigh((r + r.T) / 2)
    return (u / np.sqrt(np.clip(w, 0.0, None) + damping)) @ u.T


def unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, n, out=np.zeros_like(x), where=n > 0)


def features(
    pool: np.ndarray, queries: np.ndarray, mix: float = MIX, damping: float = DAMPING
) -> tuple[np.ndarray, np.ndarray]:
    """(pool, query) TrackStar features from projected corrected gradients: whitened, unit."""
    w = whitener(pool, queries, mix, damping)
    return unit(pool @ w), unit(queries @ w)


def mixing(cfg: dict[str, Any]) -> tuple[float, float]:
    """(mix, damping) of the mixed curvature: the config's, or the defaults."""
    f = cfg["features"]
    return float(f.get("trackstar_mix", MIX)), float(f.get("trackstar_damping", DAMPING))


def settings_hash(cfg: dict[str, Any]) -> str:
    mix, damping = mixing(cfg)
    return hash_bytes(
        canonical_json({**layout.grad_settings(cfg), "mix": mix, "damping": damping}).encode()
    )


def run(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """``plantbench trackstar``: TrackStar features of every pool window and query of a twin at
    the final checkpoint, written to ``features/<twin>/trackstar/``."""
    floats.set_threads(threads)
    stream, table, pmeta = artifacts.stream_and_pool(paths, model)
    qs, fmeta = artifacts.queries_table(paths)
    entry = artifacts.checkpoint_entry(paths, model, layout.final_checkpoint(cfg))
    net = artifacts.load_checkpoint(paths, model, entry, attn="eager")
    proj = projector(cfg, net)
    mfile = paths.moments(model, entry["name"])
    scales = load_scales(mfile, proj.module_names, entry["hash"])
    batch, t0 = int(cfg["features"]["batch_windows"]), time.time()
    windows = np.asarray(stream.windows[table["window"].to_numpy(np.int64)], dtype=np.int64)
    pool = corrected(net, proj, scales, windows, None, None, batch)
    ids, attn, ans = artifacts.query_batch(paths, qs)
    query = corrected(net, proj, scales, ids.numpy(), ans.numpy(), attn.numpy(), batch)
    mix, damping = mixing(cfg)
    pf, qf = features(pool, query, mix, damping)
    if not (np.isfinite(pf).all() and np.isfinite(qf).all()):
        raise ArtifactError(f"TrackStar features of model {model} are not finite")
    folder = paths.trackstar(model)
    folder.mkdir(parents=True, exist_ok=True)
    with io.atomic_path(folder / FEATURES) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, pool=pf.astype(np.float32), queries=qf.astype(np.float32))
    info = {
        "model": model,
        "checkpoint": entry["name"],
        "n_pool": len(pf),
        "n_queries": len(qf),
        "dims": int(proj.dims),
        "mix": mix,
        "damping": damping,
        "query_ids_hash": artifacts.query_ids_hash(qs),
        "seconds": round(time.time() - t0, 3),
    }
    inputs = {
        "pool": pmeta["hash"],
        "facts": fmeta["hash"],
        "checkpoint": entry["hash"],
        "moments": hash_file(mfile),
    }
    meta = io.write_meta(
        folder, "trackstar", [FEATURES], config_hash=settings_hash(cfg), inputs=inputs, info=info
    )
    log.info("trackstar %s: %d windows, %d queries -> %s", model, len(pf), len(qf), folder)
    return meta


def load(
    paths: Paths, model: str, pool_hash: str, query_ids_hash: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(pool, query) TrackStar features of a twin, checked against the pool and the queries."""
    folder = paths.trackstar(model)
    meta = io.read_meta(folder, "trackstar")
    if meta["inputs"]["pool"] != pool_hash or meta["info"]["query_ids_hash"] != query_ids_hash:
        raise ArtifactError(f"'{folder}' was made for another pool or queries; rerun trackstar")
    with np.load(folder / FEATURES) as z:
        return z["pool"], z["queries"], meta
