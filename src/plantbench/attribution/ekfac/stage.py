"""``plantbench ekfac``: fit EK-FAC on a twin's pool at one checkpoint and score every query."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import artifacts, floats, layout
from plantbench.attribution.ekfac.astra import Astra, sample_rows
from plantbench.attribution.ekfac.factors import FactorSums, merge
from plantbench.attribution.ekfac.maths import (
    EKFAC,
    Batch,
    chunked_scores_of,
    fit,
)
from plantbench.attribution.ekfac.store import config_hash, write_scores
from plantbench.attribution.gradients.store import SHARD_JSON, GradientStore
from plantbench.errors import ArtifactError
from plantbench.paths import Paths
from plantbench.rng import derive_seed

log = logging.getLogger(__name__)


def _query_batch(paths: Paths, qs: pd.DataFrame) -> Batch:
    ids, attn, ans = artifacts.query_batch(paths, qs)
    return ids, ans, attn


def _shard_factors(
    cfg: dict[str, Any], paths: Paths, model: str, entry: dict[str, Any], pool_hash: str, n: int
) -> tuple[FactorSums | None, str, list[Path]]:
    """The Kronecker factor sums the checkpoint's ``grads_pool`` shards made in their pass
    (merged in shard order), where they came from and the shards; ``(None, why, [])``
    when a shard lacks them or was made otherwise (EK-FAC then runs its own first pass)."""
    parts: list[FactorSums] = []
    shards_used: list[Path] = []
    batch = int(cfg["features"]["batch_windows"])
    for k in range(layout.n_shards(cfg)):
        folder = paths.pool_shard(model, entry["name"], k)
        try:
            meta = json.loads((folder / SHARD_JSON).read_text())
        except (OSError, ValueError):
            return None, f"shard {k} is not there", []
        rec = meta.get("factors") or {}
        same = (
            meta.get("complete") is True
            and meta.get("checkpoint_hash") == entry["hash"]
            and meta.get("pool_hash") == pool_hash
            and meta.get("pool_rows") == list(layout.shard_range(cfg, k, n))
            and rec.get("batch_rows") == batch
            and rec.get("dtype") == str(torch.float32)
        )
        if not same:
            return None, f"shard {k} has no factor sums of this pool, checkpoint and batch", []
        parts.append(FactorSums.load(folder, rec))  # refuses a file that fails its hash
        shards_used.append(folder)
    return merge(parts), "the grads_pool shards' pass", shards_used


def _astra(
    cfg: dict[str, Any], model: str, net: torch.nn.Module, ek: EKFAC, windows: np.ndarray
) -> Astra | None:
    """ASTRA's query refinement (:mod:`plantbench.attribution.ekfac.astra`) where ``ekfac_astra``
    is enabled: its Gauss-Newton sample of ``methods.astra.windows`` seeded pool windows."""
    if not layout.astra_enabled(cfg):
        return None
    st = layout.astra_settings(cfg)
    rows = sample_rows(int(cfg["seed"]), model, len(windows), int(st["windows"]))
    return Astra(
        net,
        ek,
        windows[rows],
        steps=int(st["steps"]),
        damping_ratio=float(st["damping_ratio"]),
        step_size=None if st["step_size"] == "auto" else float(st["step_size"]),
        batch=int(cfg["features"]["batch_windows"]),
        seed=derive_seed(int(cfg["seed"]), "astra-power", model),
    )


def _scores(
    cfg: dict[str, Any],
    model: str,
    net: torch.nn.Module,
    ek: EKFAC,
    astra: Astra | None,
    queries: Batch,
    windows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray | None]:
    """EK-FAC's scores and ASTRA's (None without it), both from the same passes over the pool
    (:func:`plantbench.attribution.ekfac.maths.chunked_scores_of`), checked finite."""
    outs = chunked_scores_of(
        net,
        ek,
        queries,
        windows,
        int(cfg["features"]["batch_windows"]),
        () if astra is None else (astra,),
        budget=layout.ekfac_memory_bytes(cfg),
        what=f"ekfac {model}",
    )
    for name, out in zip(("EK-FAC", "ASTRA"), outs, strict=False):
        if not np.isfinite(out).all():
            raise ArtifactError(f"{name} scores of model {model} are not finite; check the model")
    return outs[0], (outs[1] if astra is not None else None)


def run(
    cfg: dict[str, Any],
    paths: Paths,
    model: str,
    *,
    checkpoint: str | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Fit EK-FAC on the pool at ``checkpoint`` (default: the final one) and score every query
    against it."""
    floats.set_threads(threads)
    checkpoint = checkpoint or layout.final_checkpoint(cfg)
    where = layout.ekfac_folder(cfg, paths, model, checkpoint)
    stream, table, pmeta = artifacts.stream_and_pool(paths, model)
    qs, fmeta = artifacts.queries_table(paths)
    entry = artifacts.checkpoint_entry(paths, model, checkpoint)
    net = artifacts.load_checkpoint(paths, model, entry, attn="eager")
    windows = np.asarray(stream.windows[table["window"].to_numpy(np.int64)], dtype=np.int64)
    batch, n = int(cfg["features"]["batch_windows"]), len(windows)
    t0 = time.time()
    sums, source, factor_shards = _shard_factors(cfg, paths, model, entry, pmeta["hash"], n)
    log.info("ekfac %s %s: Kronecker factors from %s", model, entry["name"], source)
    ek = fit(
        net,
        windows,
        float(cfg["curvature"]["damping_ratio"]),
        batch=batch,
        progress=lambda what: artifacts.Progress(f"ekfac {model} {what}", n),
        factors=sums,
    )
    t1 = time.time()
    final = checkpoint == layout.final_checkpoint(cfg)
    astra = _astra(cfg, model, net, ek, windows) if final else None
    out, refined = _scores(cfg, model, net, ek, astra, _query_batch(paths, qs), windows)
    seconds = {"fit": round(t1 - t0, 3), "scores": round(time.time() - t1, 3)}
    inputs = {
        "pool": pmeta["hash"],
        "facts": fmeta["hash"],
        "stream": stream.meta["hash"],
        "checkpoint": entry["hash"],
    }
    if factor_shards:  # the pool shards that carry them (their files checked by verify)
        inputs["factors"] = GradientStore.open(factor_shards, verify=False).hash
    info = {
        "model": model,
        "checkpoint": entry["name"],
        "n_pool": int(out.shape[1]),
        "n_queries": int(out.shape[0]),
        "query_ids_hash": artifacts.query_ids_hash(qs),
        "seconds": seconds,
        "factors_from": source if sums is not None else f"its own pass ({source})",
        **ek.info(),
    }
    settings = None if astra is None else layout.astra_settings(cfg)
    if astra is not None:
        info["astra"] = {"settings": settings, **astra.info()}
    meta = write_scores(where, out, config_hash(cfg, settings), inputs, info, refined)
    log.info(
        "ekfac %s %s: %d x %d scores, %s s -> %s", model, checkpoint, *out.shape, seconds, where
    )
    return meta
