"""Fidelity of the projected gradient methods: how much of the exact gradient ranking each keeps.

On a seeded subset of pool windows (``fidelity.windows``, rows drawn without replacement from the
whole pool) and for every query, the *exact*, unprojected products of the loss gradients of all
block linears at the final checkpoint are computed in float64:

    dot(q, d) = sum_m <G_m(q), G_m(d)>        cos(q, d) = dot(q, d) / (|G(q)| |G(d)|)

with ``G_m`` the full ``out x in`` weight gradient of module ``m``
(:func:`plantbench.attribution.gradients.capture.full_grads`: one batched backward, no weight gradient kept beyond
one batch). Each gradient method (every enabled method that needs ``grads`` or
``grads_tracin``) scores the same queries against the same windows through its own registered
function, and the fidelity of a method is, per query, Spearman's rank correlation between its
scores and the exact reference over the subset windows:

- ``grad_dot`` against the exact dot: the projection's own fidelity (what LoGra keeps);
- ``grad_cos`` against the exact cosine;
- every other gradient method (TracIn over checkpoints, influence with the projected curvature)
  against the exact dot at the final checkpoint: how far its ranking is from the unprojected,
  unpreconditioned product; its gap to ``grad_dot``'s fidelity is what the method changes on
  purpose, not what the projection loses.

A query whose scores or reference are constant over the subset has NaN fidelity (counted in
``n_nan``, left out of the mean). Memory: the query gradients are held in float64 in chunks of
at most :data:`plantbench.layout.FIDELITY_MEMORY_BYTES`, each chunk paired with every subset window, so the cost is one
backward pass over the subset per chunk.

With ``fidelity.sweep: [k, ...]`` the stage also measures what other projections would keep:
for each ``k`` the LoGra projection ``k x k`` per module, and with ``fidelity.sketch_sweep: [D,
...]`` the count sketch (:mod:`plantbench.attribution.sketch`) to ``D`` dimensions, each with the study's
projection seed, computed in float32 on the same subset and queries (the study's own projection
reproduces the ``grad_dot`` row up to float rounding), its per-query Spearman with the exact dot.

Artifact ``<replicate>/fidelity/<model>/``: ``fidelity.parquet`` (query_id, fact_id, form,
method, reference, spearman), ``subset.parquet`` (row, window), ``exact.npy`` (float64
``[n_queries, n_windows]`` exact dot products), ``sweep.parquet`` (one row per swept ``k``;
empty without a sweep) and ``meta.json`` (per-method summary, seconds of each sweep size).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata

from plantbench import artifacts, floats, io, layout
from plantbench.attribution.gradients.capture import full_grads, projected_grads
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.methods import registry
from plantbench.attribution.sketch import Sketch
from plantbench.config import config_hash
from plantbench.errors import ConfigError
from plantbench.model.modeling import block_linear_names, device_of, to_numpy
from plantbench.paths import Paths
from plantbench.rng import rng

log = logging.getLogger(__name__)

FILES = ["fidelity.parquet", "subset.parquet", "exact.npy", "sweep.parquet"]
TABLE_COLUMNS = ["query_id", "fact_id", "form", "method", "reference", "spearman"]
SWEEP_COLUMNS = [
    "projection",
    "k_out",
    "k_in",
    "dims",
    "store_bytes_per_window",
    "mean",
    "median",
    "min",
    "max",
]


@dataclass(frozen=True)
class Exact:
    """Exact float64 products of query and window gradients: ``dot`` ``[n_q, n_w]`` and the
    gradient norms of the queries and the windows."""

    dot: np.ndarray
    q_norm: np.ndarray
    w_norm: np.ndarray

    @property
    def cos(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.dot / np.outer(self.q_norm, self.w_norm)


def fidelity_config_hash(cfg: dict[str, Any]) -> str:
    """The settings the stage reads: features, curvature, the gradient methods it grades and
    the subset and sweep sizes (the section is optional: its defaults are hashed when absent)."""
    picked = {k: cfg[k] for k in ("features", "curvature")}
    fid = {
        "windows": layout.fidelity_windows(cfg),
        "sweep": layout.sweep_dims(cfg),
        "sketch_sweep": layout.sketch_sweep_dims(cfg),
    }
    return config_hash({**picked, "fidelity": fid, "methods": registry.gradient_methods(cfg)})


def reference_of(method: str) -> str:
    """Which exact product a method is compared with."""
    return "cos" if method == "grad_cos" else "dot"


def subset_rows(cfg: dict[str, Any], n_pool: int, model: str) -> np.ndarray:
    """Seeded, sorted pool rows: ``min(fidelity.windows, n_pool)`` of them."""
    k = min(layout.fidelity_windows(cfg), n_pool)
    if k < 2:
        raise ConfigError(
            f"fidelity.windows = {layout.fidelity_windows(cfg)} on a pool of {n_pool} windows leaves "
            f"{k}; a rank correlation needs at least 2"
        )
    pick = rng(int(cfg["seed"]), "fidelity", model).choice(n_pool, size=k, replace=False)
    return np.sort(pick).astype(np.int64)


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of ``a`` with the same row of ``b`` (average ranks for ties;
    NaN for a row that is constant in either, or holds a non-finite value)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"need two equal 2-d arrays, got {a.shape} and {b.shape}")
    bad = ~(np.isfinite(a).all(1) & np.isfinite(b).all(1))
    ra = rankdata(np.nan_to_num(a), axis=1)
    rb = rankdata(np.nan_to_num(b), axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    den = np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = (ra * rb).sum(1) / den
    rho[bad | (den == 0)] = np.nan
    return rho


def exact_products(
    net: torch.nn.Module,
    windows: np.ndarray,
    query_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    batch: int = 16,
    budget: int = layout.FIDELITY_MEMORY_BYTES,
    progress: Any = None,
) -> Exact:
    """Exact float64 gradient products of every query with every window (``[n_w, T]`` token
    ids, loss on every position) over all block linears of ``net``."""
    names = block_linear_names(net)
    ids, attn, ans, tokens = _on_device(net, query_batch, windows)
    n_q, n_w = ids.shape[0], windows.shape[0]
    n_params = _n_params(net)
    dot = np.zeros((n_q, n_w), dtype=np.float64)
    q_norm = np.zeros(n_q, dtype=np.float64)
    w_norm = np.zeros(n_w, dtype=np.float64)
    ones = torch.ones_like(tokens, dtype=torch.bool)
    for c, (qa, qb) in enumerate(layout.query_chunks(n_q, n_params, 8, budget)):
        gq = full_grads(net, names, ids[qa:qb], ans[qa:qb], attn[qa:qb], torch.float64)
        q_norm[qa:qb] = to_numpy(gq.norm(dim=1))
        for s in range(0, n_w, batch):
            gw = full_grads(net, names, tokens[s : s + batch], ones[s : s + batch], None)
            dot[qa:qb, s : s + batch] = to_numpy(gq @ gw.T)
            if c == 0:
                w_norm[s : s + batch] = to_numpy(gw.norm(dim=1))
            if progress is not None:
                progress(gw.shape[0])
    return Exact(dot, q_norm, w_norm)


def _on_device(
    net: torch.nn.Module, query_batch: tuple[torch.Tensor, ...], windows: np.ndarray
) -> tuple[torch.Tensor, ...]:
    """The queries' ``(ids, attention, answer mask)`` and the windows' ids on ``net``'s device."""
    dev = device_of(net)
    ids, attn, ans = (t.to(dev) for t in query_batch)
    return ids, attn, ans, torch.as_tensor(windows, dtype=torch.long, device=dev)


def projection_sweep(
    net: torch.nn.Module,
    windows: np.ndarray,
    query_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    exact: Exact,
    seed: int,
    sizes: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    batch: int = 16,
    sketch_sizes: Sequence[int] = (),
) -> tuple[pd.DataFrame, dict[str, float]]:
    """What the gradient dot product would keep at other projections: for each ``k`` in
    ``sizes`` the LoGra projection ``k x k`` per module and for each ``D`` in ``sketch_sizes``
    the count sketch to ``D`` dims (the study's seed), its per-query Spearman with the exact dot
    over the subset; and the seconds each took (keys ``logra k`` / ``sketch D``)."""
    ids, attn, ans, tokens = _on_device(net, query_batch, windows)
    ones = torch.ones_like(tokens, dtype=torch.bool)
    rows, seconds = [], {}
    runs: list[tuple[str, int]] = [("logra", k) for k in sizes]
    runs += [("sketch", d) for d in sketch_sizes]
    for kind, k in runs:
        t0 = time.time()
        proj: Projector | Sketch = (
            Sketch.from_model(net, seed, k)
            if kind == "sketch"
            else Projector.from_model(net, seed, k_in=k, k_out=k)
        )
        pw = _projected(net, proj, tokens, ones, None, dtype, batch)
        pq = _projected(net, proj, ids, ans, attn, dtype, batch)
        rho = spearman_rows(to_numpy(pq.double()) @ to_numpy(pw.double()).T, exact.dot)
        kk = None if kind == "sketch" else k
        rows.append(
            {
                "projection": kind,
                "k_out": kk,
                "k_in": kk,
                "dims": proj.dims,
                "store_bytes_per_window": proj.dims * dtype.itemsize,
                **_stats(rho, missing=np.nan),
            }
        )
        seconds[f"{kind} {k}"] = round(time.time() - t0, 3)
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS), seconds


def _projected(net, proj, ids, mask, attn, dtype, batch) -> torch.Tensor:
    parts = [
        projected_grads(
            net,
            proj,
            ids[s : s + batch],
            mask[s : s + batch],
            None if attn is None else attn[s : s + batch],
            dtype,
        )
        for s in range(0, ids.shape[0], batch)
    ]
    return torch.cat(parts)


def method_scores(ctx: Any, methods: Sequence[str], rows: np.ndarray) -> dict[str, np.ndarray]:
    """Each method's own scores of every query against the subset rows ``[n_q, n_w]``."""
    block = int(ctx.cfg["scoring"]["query_block"])
    out = {}
    for name in methods:
        m = registry.get(name)
        ctx.prepare(m.needs)
        parts = [
            np.asarray(m.score(ctx, np.arange(s, min(s + block, ctx.n_queries)), rows))
            for s in range(0, ctx.n_queries, block)
        ]
        out[name] = np.concatenate(parts, axis=0).astype(np.float64)
    return out


def fidelity_table(qs: pd.DataFrame, scores: dict[str, np.ndarray], exact: Exact) -> pd.DataFrame:
    """One row per (method, query): Spearman of the method's scores with its exact reference."""
    refs = {"dot": exact.dot, "cos": exact.cos}
    if not scores:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    parts = []
    for name, s in scores.items():
        ref = reference_of(name)
        parts.append(
            pd.DataFrame(
                {
                    "query_id": qs["query_id"].astype(str).to_numpy(),
                    "fact_id": qs["fact_id"].astype(str).to_numpy(),
                    "form": qs["form"].astype(str).to_numpy(),
                    "method": name,
                    "reference": ref,
                    "spearman": spearman_rows(s, refs[ref]),
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


def summarize(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per method: reference, mean, min, max and median of the per-query Spearman, NaN count."""
    out = {}
    for name, g in table.groupby("method", sort=False):
        v = g["spearman"].to_numpy(np.float64)
        out[str(name)] = {
            "reference": str(g["reference"].iloc[0]),
            **_stats(v, missing=None),
            "n_queries": int(v.size),
            "n_nan": int((~np.isfinite(v)).sum()),
        }
    return out


def _stats(v: np.ndarray, missing: float | None) -> dict[str, float | None]:
    """Mean, median, min and max of the finite values (``missing`` when there are none)."""
    ok = v[np.isfinite(v)]
    if not ok.size:
        return dict.fromkeys(("mean", "median", "min", "max"), missing)
    return {
        "mean": float(ok.mean()),
        "median": float(np.median(ok)),
        "min": float(ok.min()),
        "max": float(ok.max()),
    }


def run(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Exact products on the subset, every gradient method's scores there, their fidelity."""
    from plantbench.attribution.methods.scoring_context import Context

    floats.set_threads(threads)
    methods = registry.gradient_methods(cfg)
    ctx = Context(cfg, paths, model)
    rows = subset_rows(cfg, ctx.n_pool, model)
    t0 = time.time()
    scores = method_scores(ctx, methods, rows)
    entry = artifacts.checkpoint_entry(paths, model, ctx.final)
    net = artifacts.load_checkpoint(paths, model, entry, attn="eager")
    keys = ctx.pool["window"].to_numpy(np.int64)[rows]
    windows = np.asarray(ctx.stream.windows[keys], dtype=np.int64)
    batch = artifacts.query_batch(paths, ctx.queries)
    n_params = _n_params(net)
    n_chunks = len(layout.query_chunks(ctx.n_queries, n_params, 8, layout.FIDELITY_MEMORY_BYTES))
    prog = artifacts.Progress(f"fidelity {model} exact", len(rows) * n_chunks)
    exact = exact_products(
        net, windows, batch, batch=int(cfg["features"]["batch_windows"]), progress=prog
    )
    table = fidelity_table(ctx.queries, scores, exact)
    summary = summarize(table)
    seconds = round(time.time() - t0, 3)
    sweep, sweep_seconds = projection_sweep(
        net,
        windows,
        batch,
        exact,
        layout.projection_seed(cfg),
        layout.sweep_dims(cfg),
        batch=int(cfg["features"]["batch_windows"]),
        sketch_sizes=layout.sketch_sweep_dims(cfg),
    )
    out = paths.fidelity(model)
    with io.atomic_dir(out) as tmp:
        io.write_parquet(tmp / "fidelity.parquet", table)
        io.write_parquet(tmp / "subset.parquet", pd.DataFrame({"row": rows, "window": keys}))
        np.save(tmp / "exact.npy", exact.dot.astype("<f8"))
        io.write_parquet(tmp / "sweep.parquet", sweep)
        meta = io.write_meta(
            tmp,
            "fidelity",
            FILES,
            config_hash=fidelity_config_hash(cfg),
            inputs={**ctx.inputs, f"checkpoint/{ctx.final}": entry["hash"]},
            info={
                "model": model,
                "checkpoint": ctx.final,
                "methods": methods,
                "n_windows": int(len(rows)),
                "n_queries": int(ctx.n_queries),
                "n_params": n_params,
                "projected_dims": int(ctx.query_grads(ctx.final).shape[1]) if methods else 0,
                "projection": cfg["features"]["projection"],
                "summary": summary,
                "sweep": layout.sweep_dims(cfg),
                "sketch_sweep": layout.sketch_sweep_dims(cfg),
                "seconds": seconds,
                "sweep_seconds": sweep_seconds,
            },
        )
    for name, s in summary.items():
        log.info("fidelity %s %s vs exact %s: mean %s", model, name, s["reference"], s["mean"])
    return meta


def _n_params(net: torch.nn.Module) -> int:
    mods = dict(net.named_modules())
    return int(sum(mods[n].weight.numel() for n in block_linear_names(net)))
