"""EK-FAC influence on the block linears, unprojected: the curvature, its fit and the scores.

Eigenvalue-corrected Kronecker-factored curvature (George et al. 2018; Grosse et al. 2023, the
estimator of kronfluence and of bergson's ``ekfac``). For every block linear ``m`` with inputs
``x`` (``in``) and output gradients ``delta`` (``out``) of a window's summed next-token loss,
and the window's weight gradient ``G_m = sum_t delta_t x_t^T``:

1. Kronecker factors over all tokens of the fit windows: ``A_m = E[x x^T]``,
   ``S_m = E[delta delta^T]``; their eigenbases ``A_m = Q_A D_A Q_A^T``, ``S_m = Q_S D_S Q_S^T``.
2. Eigenvalue correction over the fit windows: ``Lambda_m[i, j] = E[(Q_S^T G_m Q_A)_ij^2]``,
   the Fisher's exact diagonal in the Kronecker eigenbasis (what K-FAC's ``D_S kron D_A``
   only approximates).
3. Damping ``lambda_m = damping_ratio * mean(Lambda_m)`` per module (the curvature's
   ``damping_ratio``, kronfluence's heuristic), and the preconditioned query gradient
   ``P_m(q) = Q_S [(Q_S^T G_m(q) Q_A) / (Lambda_m + lambda_m)] Q_A^T``.
4. ``score(q, d) = sum_m <P_m(q), G_m(d)>``: ``g_q^T (F_EK + lambda)^-1 g_d``.

The Fisher is the empirical one (each window's own next tokens), fitted on the pool windows,
like the projected curvature of ``influence``; the fit and the scoring pass read every pool
window at the final checkpoint. Scale and sign: the first-order decrease of the query's loss per
unit of upweighting ``d``; > 0 = proponent.

Artifact ``<replicate>/features/<model>/ekfac/``: ``scores.npy`` (float64
``[n_queries, n_pool]`` in pool-row order) and ``meta.json`` (per-module damping and eigenvalue
summary, seconds of each pass). ``tracin_ekfac`` (off by default) also needs the same at each
other TracIn checkpoint: ``features/<model>/ekfac_tracin/<checkpoint>/`` (:func:`folder_of`,
``plantbench ekfac --checkpoint``), fitted and scored at that checkpoint.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import features, fidelity, io
from .config import canonical_json
from .errors import ArtifactError, ConfigError
from .gradients import module_io
from .hashing import hash_bytes
from .modeling import block_linear_names
from .paths import Paths

log = logging.getLogger(__name__)

SCORES_NPY = "scores.npy"
MEMORY_BYTES = 3 << 30  # preconditioned float32 query gradients held at once (3 GiB)
Progress = Callable[[int], None] | None
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def window_batches(windows: np.ndarray, batch: int) -> Iterator[Batch]:
    """``(ids, loss mask, attention mask)`` batches of pool windows (loss on every position)."""
    tokens = torch.as_tensor(np.asarray(windows), dtype=torch.long)
    for s in range(0, tokens.shape[0], batch):
        ids = tokens[s : s + batch]
        yield ids, torch.ones_like(ids, dtype=torch.bool), None


def _grads(ds: dict[str, torch.Tensor], xs: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Per-example weight gradients ``[n, out, in]`` of one module (zeros if none reached it)."""
    x = xs[name]
    if name not in ds:
        return x.new_zeros((x.shape[0], 0, x.shape[2]))
    return torch.einsum("nto,nti->noi", ds[name], x)


@dataclass(frozen=True)
class EKFAC:
    """The fitted curvature: per module the eigenbases, corrected eigenvalues and damping."""

    names: list[str]
    q_in: dict[str, torch.Tensor]  # [in, in] eigenvectors of A (columns), float64
    q_out: dict[str, torch.Tensor]  # [out, out] eigenvectors of S
    lam: dict[str, torch.Tensor]  # [out, in] corrected eigenvalues, float64
    damping: dict[str, float]
    n_windows: int

    def precondition(self, name: str, g: torch.Tensor) -> torch.Tensor:
        """``(F_EK + lambda)^-1 G`` of module ``name`` for gradients ``g`` ``[n, out, in]``."""
        qo, qi = self.q_out[name].to(g.dtype), self.q_in[name].to(g.dtype)
        rot = qo.T @ g @ qi
        rot = rot / (self.lam[name].to(g.dtype) + self.damping[name])
        return qo @ rot @ qi.T

    def dense(self, name: str) -> torch.Tensor:
        """The damped curvature block of ``name`` as a dense ``[out*in, out*in]`` matrix
        (row-major ``vec``; for tests on small modules)."""
        basis = torch.kron(self.q_out[name], self.q_in[name])
        diag = self.lam[name].reshape(-1) + self.damping[name]
        return basis @ torch.diag(diag) @ basis.T

    def info(self) -> dict[str, Any]:
        lam_mean = {n: float(self.lam[n].mean()) for n in self.names}
        return {
            "n_modules": len(self.names),
            "n_fit_windows": self.n_windows,
            "damping": {n: round(self.damping[n], 12) for n in self.names},
            "eigenvalue_mean": {n: round(v, 12) for n, v in lam_mean.items()},
        }


def _gram(v: torch.Tensor) -> torch.Tensor:
    """``v^T v`` over all tokens of a ``[n, T, k]`` batch, computed in ``v``'s dtype, float64."""
    v = v.reshape(-1, v.shape[-1])
    return (v.T @ v).double()


def kronecker_factors(
    net: torch.nn.Module,
    names: Sequence[str],
    batches: Iterator[Batch],
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Token means of ``x x^T`` and ``delta delta^T`` per module (each batch's sum in
    ``dtype``, accumulated in float64)."""
    a: dict[str, torch.Tensor] = {}
    s: dict[str, torch.Tensor] = {}
    tokens = 0
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        tokens += ids.numel()
        for name in names:
            a[name] = a.get(name, 0) + _gram(xs[name])
            if name in ds:
                s[name] = s.get(name, 0) + _gram(ds[name])
        if progress is not None:
            progress(ids.shape[0])
    missing = [n for n in names if n not in s]
    if missing:
        raise ArtifactError(f"EK-FAC: no gradient reached {missing}; check the fit windows")
    return {n: a[n] / tokens for n in names}, {n: s[n] / tokens for n in names}


def eigenbasis(m: torch.Tensor) -> torch.Tensor:
    """Eigenvectors (columns) of a symmetric matrix, float64."""
    return torch.linalg.eigh(0.5 * (m + m.T))[1]


def corrected_eigenvalues(
    net: torch.nn.Module,
    names: Sequence[str],
    q_in: dict[str, torch.Tensor],
    q_out: dict[str, torch.Tensor],
    batches: Iterator[Batch],
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> tuple[dict[str, torch.Tensor], int]:
    """``E_windows[(Q_S^T G Q_A)^2]`` per module (float64) and the window count."""
    total: dict[str, torch.Tensor] = {n: torch.zeros(()) for n in names}
    count = 0
    qi = {n: q_in[n].to(dtype) for n in names}
    qo = {n: q_out[n].to(dtype) for n in names}
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        for name in names:  # Q_S^T G Q_A = sum_t (Q_S^T delta_t)(Q_A^T x_t)^T: rotate tokens
            if name in ds:
                rot = torch.einsum("nto,nti->noi", ds[name] @ qo[name], xs[name] @ qi[name])
                total[name] = total[name] + rot.double().square().sum(0)
        count += ids.shape[0]
        if progress is not None:
            progress(ids.shape[0])
    return {n: total[n] / count for n in names}, count


def fit(
    net: torch.nn.Module,
    windows: np.ndarray,
    damping_ratio: float,
    *,
    batch: int = 16,
    dtype: torch.dtype = torch.float32,
    progress: Callable[[str], Progress] = lambda what: None,
) -> EKFAC:
    """The EK-FAC curvature of every block linear of ``net`` on ``windows`` (``[n, T]`` ids);
    ``progress(pass name)`` makes each pass's progress callback when the pass starts."""
    names = block_linear_names(net)
    batches = window_batches(windows, batch)
    a, s = kronecker_factors(net, names, batches, dtype, progress("factors"))
    q_in = {n: eigenbasis(a[n]) for n in names}
    q_out = {n: eigenbasis(s[n]) for n in names}
    lam, count = corrected_eigenvalues(
        net, names, q_in, q_out, window_batches(windows, batch), dtype, progress("eigenvalues")
    )
    damping = {}
    for n in names:
        mean = float(lam[n].mean())
        damping[n] = damping_ratio * mean if mean > 0 else 1.0
    return EKFAC(names, q_in, q_out, lam, damping, count)


def preconditioned_queries(
    net: torch.nn.Module, ek: EKFAC, batch: Batch, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Per module ``P_m(q)`` of every query, flattened ``[n_q, out*in]`` in ``dtype`` (the
    gradients and their preconditioning in float64)."""
    ids, mask, attn = batch
    xs, ds = module_io(net, ek.names, ids, mask, attn, torch.float64)
    return {
        n: ek.precondition(n, _grads(ds, xs, n)).reshape(ids.shape[0], -1).to(dtype)
        for n in ek.names
    }


def scores(
    net: torch.nn.Module,
    pre: dict[str, torch.Tensor],
    batches: Iterator[Batch],
    n_windows: int,
    dtype: torch.dtype = torch.float32,
    progress: Progress = None,
) -> np.ndarray:
    """``sum_m <P_m(q), G_m(d)>`` for every query and window: ``[n_q, n_windows]`` float64."""
    names = list(pre)
    n_q = next(iter(pre.values())).shape[0]
    out = np.zeros((n_q, n_windows), dtype=np.float64)
    start = 0
    for ids, mask, attn in batches:
        xs, ds = module_io(net, names, ids, mask, attn, dtype)
        n = ids.shape[0]
        tile = torch.zeros((n_q, n), dtype=torch.float64)
        for name in names:
            if name in ds:
                g = _grads(ds, xs, name).reshape(n, -1)
                tile += (pre[name] @ g.T).double()
        out[:, start : start + n] = tile.numpy()
        start += n
        if progress is not None:
            progress(n)
    return out


def query_chunks(n_q: int, n_params: int, budget: int = MEMORY_BYTES) -> list[tuple[int, int]]:
    """Query ranges whose preconditioned float32 gradients fit in ``budget`` bytes: one scoring
    pass over the pool per range (one at the default size; many at the paper size)."""
    step = max(1, budget // (4 * n_params))
    return [(s, min(s + step, n_q)) for s in range(0, n_q, step)]


def chunked_scores(
    net: torch.nn.Module,
    ek: EKFAC,
    queries_batch: Batch,
    windows: np.ndarray,
    batch: int,
    *,
    budget: int = MEMORY_BYTES,
    what: str = "ekfac",
) -> np.ndarray:
    """Every query's scores against every window, the queries in :func:`query_chunks`."""
    ids, mask, attn = queries_batch
    n_params = sum(int(v.numel()) for v in ek.lam.values())
    chunks = query_chunks(ids.shape[0], n_params, budget)
    out = np.zeros((ids.shape[0], len(windows)), dtype=np.float64)
    for c, (a, b) in enumerate(chunks):
        part = (ids[a:b], mask[a:b], None if attn is None else attn[a:b])
        pre = preconditioned_queries(net, ek, part)
        prog = features.Progress(f"{what} scores (queries {c + 1}/{len(chunks)})", len(windows))
        out[a:b] = scores(net, pre, window_batches(windows, batch), len(windows), progress=prog)
    return out


# --------------------------------------------------------------------------- the stage


def _query_batch(paths: Paths, qs: pd.DataFrame) -> Batch:
    ids, attn, ans = fidelity.query_batch(paths, qs)
    return ids, ans, attn


def config_hash(cfg: dict[str, Any]) -> str:
    """What the scores depend on beyond their inputs: the damping and the batch size."""
    keys = {
        "damping_ratio": cfg["curvature"]["damping_ratio"],
        "batch_windows": cfg["features"]["batch_windows"],
    }
    return hash_bytes(canonical_json(keys).encode())


def folder_of(cfg: dict[str, Any], paths: Paths, model: str, checkpoint: str) -> Path:
    """Where a checkpoint's scores live: ``ekfac/`` for the final one (the ``ekfac`` method),
    ``ekfac_tracin/<checkpoint>/`` for the other TracIn checkpoints (``tracin_ekfac``)."""
    if checkpoint == features.final_checkpoint(cfg):
        return paths.ekfac(model)
    if checkpoint not in features.tracin_checkpoints(cfg):
        raise ConfigError(
            f"EK-FAC at '{checkpoint}': only the TracIn checkpoints have a step "
            f"({', '.join(features.tracin_checkpoints(cfg))})"
        )
    return paths.ekfac(model, checkpoint)


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
    features._threads(threads)
    checkpoint = checkpoint or features.final_checkpoint(cfg)
    where = folder_of(cfg, paths, model, checkpoint)
    stream, table, pmeta = features._stream_and_pool(paths, model)
    qs, fmeta = features._queries_table(paths)
    entry = features.checkpoint_entry(paths, model, checkpoint)
    net = features._load_checkpoint(paths, model, entry, attn="eager")
    windows = np.asarray(stream.windows[table["window"].to_numpy(np.int64)], dtype=np.int64)
    batch, n = int(cfg["features"]["batch_windows"]), len(windows)
    t0 = time.time()
    ek = fit(
        net,
        windows,
        float(cfg["curvature"]["damping_ratio"]),
        batch=batch,
        progress=lambda what: features.Progress(f"ekfac {model} {what}", n),
    )
    t1 = time.time()
    out = chunked_scores(net, ek, _query_batch(paths, qs), windows, batch, what=f"ekfac {model}")
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
        "query_ids_hash": features.query_ids_hash(qs),
        "seconds": seconds,
        **ek.info(),
    }
    meta = _write(where, out, config_hash(cfg), inputs, info)
    log.info(
        "ekfac %s %s: %d x %d scores, %s s -> %s", model, checkpoint, *out.shape, seconds, where
    )
    return meta


def _write(
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
    entry = features.checkpoint_entry(paths, model, meta["info"]["checkpoint"])
    io.check_input(meta, "checkpoint", entry, str(folder))
    features._expect(
        folder / io.META, meta["info"], "query_ids_hash", query_ids, "rerun the ekfac step"
    )
    return np.load(folder / SCORES_NPY, mmap_mode="r", allow_pickle=False), meta
