"""The EK-FAC scores artifact (``features/<model>/ekfac/`` and ``ekfac_tracin/<checkpoint>/``):
writing it and opening it checked against the pool, the queries and the checkpoint it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from plantbench import artifacts, io
from plantbench.config import canonical_json
from plantbench.hashing import hash_bytes
from plantbench.paths import Paths

SCORES_NPY = "scores.npy"


def config_hash(cfg: dict[str, Any]) -> str:
    """What the scores depend on beyond their inputs: the damping and the batch size."""
    keys = {
        "damping_ratio": cfg["curvature"]["damping_ratio"],
        "batch_windows": cfg["features"]["batch_windows"],
    }
    return hash_bytes(canonical_json(keys).encode())


def write_scores(
    folder: Path, out: np.ndarray, cfg_hash: str, inputs: dict[str, str], info: dict[str, Any]
) -> dict[str, Any]:
    with io.atomic_dir(folder) as tmp:
        np.save(tmp / SCORES_NPY, np.ascontiguousarray(out, dtype="<f8"), allow_pickle=False)
        return io.write_meta(
            tmp, "ekfac", [SCORES_NPY], config_hash=cfg_hash, inputs=inputs, info=info
        )


def load_scores(
    paths: Paths,
    model: str,
    *,
    pool_hash: str,
    facts_hash: str,
    query_ids: str,
    folder: Path | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """(scores ``[n_queries, n_pool]``, meta) of the ekfac artifact in ``folder`` (default: the
    final checkpoint's; another TracIn checkpoint's: :func:`folder_of`), checked against the
    current pool, queries and the checkpoint it names."""
    folder = folder or paths.ekfac(model)
    meta = io.read_meta(folder, "ekfac")
    io.check_input(meta, "pool", {"hash": pool_hash}, str(folder))
    io.check_input(meta, "facts", {"hash": facts_hash}, str(folder))
    entry = artifacts.checkpoint_entry(paths, model, meta["info"]["checkpoint"])
    io.check_input(meta, "checkpoint", entry, str(folder))
    artifacts.expect(
        folder / io.META, meta["info"], "query_ids_hash", query_ids, "rerun the ekfac step"
    )
    return np.load(folder / SCORES_NPY, mmap_mode="r", allow_pickle=False), meta
