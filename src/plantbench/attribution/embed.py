"""``plantbench embed-shared`` and ``plantbench embed``: text-encoder embeddings, once per
distinct text.

Every text is encoded alone (:func:`plantbench.attribution.encoder.encode_each`), so its vector
is a function of its text only, bitwise: a content-addressed cache keyed by the text's hash
(:func:`plantbench.attribution.encoder.text_key`) holds what a direct encoding would give.

- ``embed-shared`` (``features/shared/embed/``) encodes the texts both twins need: the pool
  windows the two pools have in common and the queries. It waits only for the pools, so it runs
  while the twins train.
- ``embed --model M`` (``features/M/embed/``) takes its pool's and the queries' vectors from
  that cache and encodes only the rest (the windows of the facts that twin read).

Both artifacts record the pools, facts, tokenizer and encoder they were made from; a twin's
embed checks the cache's record against its own before it reads a vector.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from plantbench import artifacts, floats, io
from plantbench.attribution import encoder
from plantbench.attribution.features import pool_texts, query_texts, write_vectors
from plantbench.config import canonical_json
from plantbench.data import tokenizer
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_tree
from plantbench.paths import MODELS, Paths

log = logging.getLogger(__name__)

SHARED = "shared"  # the cache's folder name under features/
KEYS_NPY = "keys.npy"  # text keys (hex), sorted; row i of vectors.npy is key i's vector
VECTORS_NPY = "vectors.npy"


def _texts(paths: Paths, model: str, tok: Any) -> tuple[list[str], dict[str, str]]:
    """A twin's pool texts in pool row order, and the input hashes they come from."""
    stream, table, pmeta = artifacts.stream_and_pool(paths, model)
    return pool_texts(stream, table, tok), {"pool": pmeta["hash"], "stream": stream.meta["hash"]}


def _common_inputs(cfg: dict[str, Any], paths: Paths) -> tuple[Path, Any, dict[str, str]]:
    folder = encoder.resolve_encoder(cfg["features"]["encoder"])  # a bad path fails fast
    tmeta = io.read_meta(paths.tokenizer, "tokenizer")
    return (
        folder,
        tokenizer.load(paths.tokenizer),
        {
            "tokenizer": tmeta["hash"],
            "encoder": hash_tree(folder),
        },
    )


def _shared_texts(paths: Paths, tok: Any) -> tuple[list[str], dict[str, str]]:
    """The distinct texts both twins need (common pool windows, then queries), sorted by key."""
    by_model = {m: _texts(paths, m, tok) for m in MODELS}
    qs, fmeta = artifacts.queries_table(paths)
    common = set(by_model[MODELS[0]][0]).intersection(*(t for t, _ in by_model.values()))
    texts = {encoder.text_key(t): t for t in [*sorted(common), *query_texts(qs)]}
    inputs = {"facts": fmeta["hash"]}
    for m, (_, ins) in by_model.items():
        inputs.update({f"{k}/{m}": v for k, v in ins.items()})
    return [texts[k] for k in sorted(texts)], inputs


def shared(cfg: dict[str, Any], paths: Paths, *, threads: int | None = None) -> dict[str, Any]:
    """Encode the texts both twins need, once; write the content-addressed cache."""
    folder, tok, inputs = _common_inputs(cfg, paths)
    floats.set_threads(threads)
    texts, more = _shared_texts(paths, tok)
    vectors = encoder.encode_each(folder, texts, what="shared (common pool windows, queries)")
    keys = np.array([encoder.text_key(t) for t in texts], dtype="U32")
    if not np.isfinite(vectors).all():
        raise ArtifactError("shared embeddings are not finite; check the encoder")
    with io.atomic_dir(paths.embed(SHARED)) as tmp:
        np.save(tmp / KEYS_NPY, keys, allow_pickle=False)
        np.save(tmp / VECTORS_NPY, np.ascontiguousarray(vectors, dtype="<f4"), allow_pickle=False)
        meta = io.write_meta(
            tmp,
            "embed_shared",
            [KEYS_NPY, VECTORS_NPY],
            config_hash=hash_bytes(canonical_json(cfg["features"]).encode()),
            inputs={**inputs, **more},
            info={"encoder": cfg["features"]["encoder"], "n_texts": len(texts)},
        )
    log.info("embed shared: %d texts -> %s", len(texts), paths.embed(SHARED))
    return meta


def load_cache(
    paths: Paths, expect: dict[str, str]
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The shared cache as ``{key: vector}`` and its meta, after checking it was made from
    ``expect``'s inputs (a cache of other pools, facts, tokenizer or encoder is refused)."""
    where = paths.embed(SHARED)
    meta = io.read_meta(where, "embed_shared")
    for name, value in expect.items():
        io.check_input(meta, name, {"hash": value}, str(where))
    keys = np.load(where / KEYS_NPY, allow_pickle=False)
    vectors = np.load(where / VECTORS_NPY, allow_pickle=False)
    if len(keys) != len(vectors):
        raise ArtifactError(
            f"'{where}': {len(keys)} keys but {len(vectors)} vectors; rerun embed-shared"
        )
    return dict(zip(keys.tolist(), vectors, strict=True)), meta


def lookup(
    folder: Path, texts: list[str], cache: dict[str, np.ndarray], what: str
) -> tuple[np.ndarray, int]:
    """Vectors of ``texts`` in order: from ``cache`` where there, the rest encoded here (each
    alone, so bitwise what the cache would hold). Returns (vectors, how many were encoded)."""
    keys = [encoder.text_key(t) for t in texts]
    missing = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in cache}.items())
    if missing:
        fresh = encoder.encode_each(folder, [t for _, t in missing], what=what)
        cache = {**cache, **dict(zip([k for k, _ in missing], fresh, strict=True))}
    dim = len(next(iter(cache.values()))) if cache else 0
    out = np.stack([cache[k] for k in keys]) if keys else np.zeros((0, dim), np.float32)
    return out.astype(np.float32), len(missing)


def embed(
    cfg: dict[str, Any], paths: Paths, model: str, *, threads: int | None = None
) -> dict[str, Any]:
    """Text embeddings of every pool window and query of ``model``: from the shared cache,
    encoding only the texts it does not hold."""
    folder, tok, common = _common_inputs(cfg, paths)
    floats.set_threads(threads)
    texts, own = _texts(paths, model, tok)
    qs, fmeta = artifacts.queries_table(paths)
    expect = {**common, "facts": fmeta["hash"], f"pool/{model}": own["pool"]}
    cache, shared_meta = load_cache(paths, expect)
    pool_v, n_pool_new = lookup(folder, texts, cache, f"{model} pool (not shared)")
    q_v, n_q_new = lookup(folder, query_texts(qs), cache, f"{model} queries (not shared)")
    log.info(
        "embed %s: %d of %d pool texts encoded here, the rest from the cache",
        model,
        n_pool_new,
        len(texts),
    )
    info = {
        "model": model,
        "encoder": cfg["features"]["encoder"],
        "encoder_path": str(folder),
        "dim": int(pool_v.shape[1]),
        "n_pool": len(pool_v),
        "n_queries": len(q_v),
        "encoded_here": n_pool_new + n_q_new,
        "query_text": "prompt + ' ' + answer",
        "query_ids_hash": artifacts.query_ids_hash(qs),
    }
    inputs = {
        **own,
        "facts": fmeta["hash"],
        **common,
        "shared": shared_meta["hash"],
    }
    return write_vectors(paths.embed(model), "embed", pool_v, q_v, cfg, inputs, info)
