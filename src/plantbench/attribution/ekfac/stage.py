"""``plantbench ekfac``: fit EK-FAC on a twin's pool at one checkpoint and score every query."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pandas as pd

from plantbench import artifacts, floats, layout
from plantbench.attribution.ekfac.maths import (
    Batch,
    chunked_scores,
    fit,
)
from plantbench.attribution.ekfac.store import config_hash, write_scores
from plantbench.errors import ArtifactError
from plantbench.paths import Paths

log = logging.getLogger(__name__)


def _query_batch(paths: Paths, qs: pd.DataFrame) -> Batch:
    ids, attn, ans = artifacts.query_batch(paths, qs)
    return ids, ans, attn


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
    ek = fit(
        net,
        windows,
        float(cfg["curvature"]["damping_ratio"]),
        batch=batch,
        progress=lambda what: artifacts.Progress(f"ekfac {model} {what}", n),
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
    info = {
        "model": model,
        "checkpoint": entry["name"],
        "n_pool": int(out.shape[1]),
        "n_queries": int(out.shape[0]),
        "query_ids_hash": artifacts.query_ids_hash(qs),
        "seconds": seconds,
        **ek.info(),
    }
    meta = write_scores(where, out, config_hash(cfg), inputs, info)
    log.info(
        "ekfac %s %s: %d x %d scores, %s s -> %s", model, checkpoint, *out.shape, seconds, where
    )
    return meta
