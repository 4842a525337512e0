"""The EK-FAC scores artifact (``features/<model>/ekfac/`` and ``ekfac_tracin/<checkpoint>/``):
writing it and opening it checked against the pool, the queries and the checkpoint it names.
With ``ekfac_astra`` enabled the final checkpoint's folder also holds ASTRA's scores
(``astra_scores.npy``, :mod:`plantbench.attribution.ekfac.astra`), its settings in
``meta.json``'s ``info.astra``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from plantbench import artifacts, io
from plantbench.config import canonical_json
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes
from plantbench.paths import Paths

SCORES_NPY = "scores.npy"
ASTRA_NPY = "astra_scores.npy"


def config_hash(cfg: dict[str, Any], astra: dict[str, Any] | None = None) -> str:
    """What the scores depend on beyond their inputs: the damping and the batch size, and
    ASTRA's settings where the folder holds its scores too (``astra``; else the hash is the
    one of EK-FAC alone)."""
    keys = {
        "damping_ratio": cfg["curvature"]["damping_ratio"],
        "batch_windows": cfg["features"]["batch_windows"],
    }
    if astra is not None:
        keys["astra"] = astra
    return hash_bytes(canonical_json(keys).encode())


def write_scores(
    folder: Path,
    out: np.ndarray,
    cfg_hash: str,
    inputs: dict[str, str],
    info: dict[str, Any],
    astra: np.ndarray | None = None,
) -> dict[str, Any]:
    """The artifact: EK-FAC's scores, ASTRA's beside them when given (float64, pool-row order)."""
    arrays = {SCORES_NPY: out} if astra is None else {SCORES_NPY: out, ASTRA_NPY: astra}
    with io.atomic_dir(folder) as tmp:
        for name, a in arrays.items():
            np.save(tmp / name, np.ascontiguousarray(a, dtype="<f8"), allow_pickle=False)
        return io.write_meta(
            tmp, "ekfac", list(arrays), config_hash=cfg_hash, inputs=inputs, info=info
        )


def load_astra(folder: Path, settings: dict[str, Any], shape: tuple[int, int]) -> np.ndarray:
    """ASTRA's scores in the ekfac artifact ``folder`` (its files checked against ``meta.json``),
    which must record ``settings`` (``methods.astra``) and hold ``[n_queries, n_pool]``
    ``shape`` scores; the pool, queries and checkpoint are :func:`load_scores`'s checks."""
    meta = io.read_meta(folder, "ekfac")
    made = (meta.get("info") or {}).get("astra") or {}
    if ASTRA_NPY not in meta.get("files", {}) or made.get("settings") != settings:
        raise ArtifactError(
            f"'{folder}' holds no ASTRA scores made with methods.astra = {settings} (it has "
            f"{made.get('settings')}); rerun its ekfac step with ekfac_astra in methods.enabled"
        )
    out = np.load(folder / ASTRA_NPY, mmap_mode="r", allow_pickle=False)
    if out.shape != shape:
        raise ArtifactError(
            f"'{folder / ASTRA_NPY}' is {out.shape}, not {shape}; rerun its ekfac step"
        )
    return out


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
