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
from plantbench.attribution.ekfac.factors import FactorSums, merge
from plantbench.attribution.ekfac.maths import (
    Batch,
    chunked_scores,
    fit,
)
from plantbench.attribution.ekfac.store import config_hash, write_scores
from plantbench.attribution.gradients.store import SHARD_JSON, GradientStore
from plantbench.errors import ArtifactError
from plantbench.paths import Paths

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
    out = chunked_scores(
        net,
        ek,
        _query_batch(paths, qs),
        windows,
        batch,
        budget=layout.ekfac_memory_bytes(cfg),
        what=f"ekfac {model}",
    )
    seconds = {"fit": round(t1 - t0, 3), "scores": round(time.time() - t1, 3)}
    if not np.isfinite(out).all():
        raise ArtifactError(f"EK-FAC scores of model {model} are not finite; check the model")
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
    meta = write_scores(where, out, config_hash(cfg), inputs, info)
    log.info(
        "ekfac %s %s: %d x %d scores, %s s -> %s", model, checkpoint, *out.shape, seconds, where
    )
    return meta
