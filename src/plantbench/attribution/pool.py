"""The pool: per model, the training windows every attribution method ranks.

A model's pool is every planted window it read (its own facts' documents), every distractor
window (both models read them) and ``pool.random_windows`` background windows chosen with a
seeded generator. Background windows are identical in both streams, and the random choice does
not depend on the model, so both pools hold the same background windows.

``{results}/pool/{model}/pool.parquet``, one row per pool window, sorted by window index:

========  ======  ==================================================================
row       int64   0..n-1, the pool row (feature stores and score matrices use this order)
window    int64   the manifest index of the window in the model's stream
kind      str     planted | distractor | background
fact_id   str     the fact the document is about ("" for background)
doc_id    str     the document ("" for background)
hash      uint64  xxh3-64 of the window's tokens (as in the manifest)
========  ======  ==================================================================

The pool size is a pure function of the config (:func:`pool_size`), so the Snakefile can fix
the number of feature shards before anything is built; :func:`build` checks that the realised
pool has exactly that size.

Haystack levels (:func:`haystack_levels`, computed from the table, not stored): the sub-pool at
share ``f`` of ``analysis.haystack`` holds every planted and distractor window and the first
``ceil(f * n_background)`` background windows of a seeded permutation of the pool's background
rows (``rng(seed, "pool", "haystack")``), so every sub-pool holds the ones before it.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pandas as pd

from plantbench import io, layout
from plantbench.config import config_hash, haystack_fractions
from plantbench.data.stream import open_stream
from plantbench.errors import ArtifactError
from plantbench.paths import Paths
from plantbench.rng import rng

log = logging.getLogger(__name__)


def haystack_cuts(fractions: list[float], n_background: int) -> np.ndarray:
    """Background windows in each haystack sub-pool: ``ceil(f * n_background)`` per share
    (rounded to 9 decimals first, so that 0.07 * 100 gives 7, not 8)."""
    return np.array([math.ceil(round(f * n_background, 9)) for f in fractions], dtype=np.int64)


def haystack_levels(cfg: dict[str, Any], table: pd.DataFrame) -> np.ndarray:
    """Per pool row (``table`` order) the first haystack sub-pool holding it: 0 = every one
    (planted and distractor windows), ``j`` = the ``j``-th share of ``analysis.haystack`` and
    after (background windows). Sub-pool ``j`` = the rows with level ``<= j``."""
    background = np.flatnonzero(table["kind"].to_numpy() == "background")
    order = rng(cfg["seed"], "pool", "haystack").permutation(background.size)
    cuts = haystack_cuts(haystack_fractions(cfg), background.size)
    levels = np.zeros(len(table), dtype=np.int64)
    levels[background[order]] = np.searchsorted(cuts, np.arange(background.size), "right") + 1
    return levels


def pool_config_hash(cfg: dict[str, Any]) -> str:
    return config_hash(cfg, ["seed", "pool"])


def build(cfg: dict[str, Any], paths: Paths, model: str) -> dict[str, Any]:
    """Write ``{results}/pool/{model}/`` (pool.parquet + meta.json)."""
    stream = open_stream(paths.stream(model), verify=False)
    man = stream.manifest
    docs = man[man["kind"].isin(["planted", "distractor"])]
    background = man.loc[man["kind"] == "background", "index"].to_numpy(np.int64)
    counts = layout.pool_counts(cfg)
    k = counts["background"]
    chosen = np.sort(
        rng(cfg["seed"], "pool", "random-background").choice(background, size=k, replace=False)
    )
    rows = pd.concat([docs, man[man["index"].isin(chosen)]]).sort_values("index")
    table = pd.DataFrame(
        {
            "row": np.arange(len(rows), dtype=np.int64),
            "window": rows["index"].to_numpy(np.int64),
            "kind": rows["kind"].astype(str).to_numpy(),
            "fact_id": rows["fact_id"].astype(str).to_numpy(),
            "doc_id": rows["doc_id"].astype(str).to_numpy(),
            "hash": rows["hash"].to_numpy(np.uint64),
        }
    )
    have = table["kind"].value_counts().to_dict()
    for kind in ("planted", "distractor"):
        if int(have.get(kind, 0)) != counts[kind]:
            raise ArtifactError(
                f"stream '{paths.stream(model)}' has {have.get(kind, 0)} {kind} windows but the "
                f"config implies {counts[kind]} (plantbench.layout.pool_size); rerun the facts "
                "and stream steps"
            )
    out = paths.pool(model)
    out.mkdir(parents=True, exist_ok=True)
    io.write_parquet(out / layout.POOL_FILE, table)
    log.info("pool %s: %d windows (%s)", model, len(table), counts)
    return io.write_meta(
        out,
        "pool",
        [layout.POOL_FILE],
        config_hash=pool_config_hash(cfg),
        inputs={"stream": stream.meta["hash"]},
        info={"model": model, "n_pool": len(table), "counts": counts},
    )
