"""What a scoring function sees: one model's pool, the queries and lazily loaded features.

Every loader checks the artifact against what it was made from (pool, stream, facts,
checkpoint, projection seed) and records the artifact's hash in :attr:`Context.inputs`, which
the score step writes into its ``meta.json``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from plantbench import artifacts, io, layout
from plantbench.attribution import features
from plantbench.attribution.curvature import Curvature
from plantbench.attribution.ekfac import store as ekfac_store
from plantbench.attribution.gradients.store import GradientStore
from plantbench.data import tokenizer
from plantbench.data.stream import open_stream
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_file
from plantbench.paths import Paths


class Context:
    def __init__(self, cfg: dict[str, Any], paths: Paths, model: str):
        self.cfg = cfg
        self.paths = paths
        self.model = model
        self.stream = open_stream(paths.stream(model))
        self.pool, self.pool_meta = artifacts.load_pool(
            paths, model, stream_hash=self.stream.meta["hash"]
        )
        self.queries: pd.DataFrame
        self.queries, self.facts_meta = artifacts.queries_table(paths)
        self.query_ids = artifacts.query_ids_hash(self.queries)
        self.final = layout.final_checkpoint(cfg)
        self.cache: dict[str, Any] = {}
        model_meta = io.read_meta(paths.model(model), "pretrain", verify=False)
        self.inputs: dict[str, str] = {
            "pool": self.pool_meta["hash"],
            "facts": self.facts_meta["hash"],
            "stream": self.stream.meta["hash"],
            "model": model_meta["hash"],
        }
        self._stores: dict[str, GradientStore] = {}

    @property
    def n_pool(self) -> int:
        return len(self.pool)

    @property
    def n_queries(self) -> int:
        return len(self.queries)

    # ------------------------------------------------------------------ text
    def texts(self) -> list[str]:
        """Decoded text of every pool window, in pool row order."""
        if "_texts" not in self.cache:
            tmeta = io.read_meta(self.paths.tokenizer, "tokenizer")
            io.check_input(self.stream.meta, "tokenizer", tmeta, str(self.paths.stream(self.model)))
            tok = tokenizer.load(self.paths.tokenizer)
            self.cache["_texts"] = features.pool_texts(self.stream, self.pool, tok)
            self.inputs["stream"] = self.stream.meta["hash"]
            self.inputs["tokenizer"] = tmeta["hash"]
        return self.cache["_texts"]

    def query_texts(self) -> list[str]:
        """``prompt + " " + answer`` of every query."""
        return features.query_texts(self.queries)

    # ------------------------------------------------------------------ vectors
    def vectors(self, kind: str) -> tuple[np.ndarray, np.ndarray]:
        """(pool, queries) vectors of the ``hidden`` or ``embed`` features (float32)."""
        key = f"_vectors_{kind}"
        if key not in self.cache:
            p, q, meta = features.load_vectors(
                self.paths,
                self.model,
                kind,
                pool_hash=self.pool_meta["hash"],
                facts_hash=self.facts_meta["hash"],
                query_ids=self.query_ids,
            )
            if kind == "hidden" and meta["info"]["checkpoint"] != self.final:
                raise ArtifactError(
                    f"'{self.paths.hidden(self.model)}' holds hidden states of "
                    f"{meta['info']['checkpoint']}, not of the final checkpoint {self.final}; "
                    "rerun the hidden step"
                )
            if p.shape[0] != self.n_pool or q.shape[0] != self.n_queries:
                raise ArtifactError(
                    f"{kind} features of model {self.model} do not match the pool/queries; "
                    f"rerun {kind}"
                )
            self.cache[key] = (p, q)
            self.inputs[kind] = meta["hash"]
        return self.cache[key]

    # ------------------------------------------------------------------ gradients
    def pool_store(self, checkpoint: str) -> GradientStore:
        if checkpoint not in self._stores:
            store = features.open_pool_grads(
                self.cfg,
                self.paths,
                self.model,
                checkpoint,
                self.pool,
                self.pool_meta,
                self.stream.meta["hash"],
            )
            self._stores[checkpoint] = store
            self.inputs[f"grads_pool/{checkpoint}"] = store.hash
        return self._stores[checkpoint]

    def query_grads(self, checkpoint: str) -> np.ndarray:
        """Every query's projected gradient at ``checkpoint``, float64 [n_queries, D]."""
        key = f"_qgrads_{checkpoint}"
        if key not in self.cache:
            pool_store = self.pool_store(checkpoint)
            store = features.open_query_grads(
                self.cfg,
                self.paths,
                self.model,
                checkpoint,
                self.queries,
                self.facts_meta["hash"],
                self.stream.meta["hash"],
            )
            features.check_compatible(
                pool_store, store, str(self.paths.grads(self.model, checkpoint) / "pool")
            )
            self.cache[key] = store.rows(0, store.n_rows, np.float64)
            self.inputs[f"grads_queries/{checkpoint}"] = store.hash
        return self.cache[key]

    def pool_grads(self, checkpoint: str, pool_rows: np.ndarray) -> np.ndarray:
        """Projected gradients of the given pool rows at ``checkpoint``, float64."""
        store = self.pool_store(checkpoint)
        rows = np.asarray(pool_rows, dtype=np.int64)
        if rows.size and rows[-1] - rows[0] + 1 == rows.size and np.all(np.diff(rows) == 1):
            return store.rows(int(rows[0]), int(rows[-1]) + 1, np.float64)
        return store.get(store.keys[rows], np.float64)

    def curvature(self, checkpoint: str) -> Curvature:
        key = f"_curv_{checkpoint}"
        if key not in self.cache:
            store = self.pool_store(checkpoint)
            self.cache[key] = features.load_curvature(
                self.cfg, self.paths, self.model, checkpoint, store
            )
            self.inputs[f"curvature/{checkpoint}"] = hash_file(
                self.paths.curvature(self.model, checkpoint)
            )
        return self.cache[key]

    def ekfac(self, checkpoint: str | None = None) -> np.ndarray:
        """EK-FAC scores ``[n_queries, n_pool]`` (the ``ekfac`` feature step) at the final
        checkpoint, or at another TracIn ``checkpoint``, checked."""
        ckpt = checkpoint or self.final
        key = "ekfac" if ckpt == self.final else f"ekfac/{ckpt}"
        if f"_{key}" not in self.cache:
            folder = layout.ekfac_folder(self.cfg, self.paths, self.model, ckpt)
            s, meta = ekfac_store.load_scores(
                self.paths,
                self.model,
                pool_hash=self.pool_meta["hash"],
                facts_hash=self.facts_meta["hash"],
                query_ids=self.query_ids,
                folder=folder,
            )
            if meta["info"]["checkpoint"] != ckpt or s.shape != (self.n_queries, self.n_pool):
                raise ArtifactError(
                    f"'{folder}' does not hold checkpoint {ckpt}'s scores of these queries and pool; "
                    "rerun its ekfac step"
                )
            self.cache[f"_{key}"] = s
            self.inputs[key] = meta["hash"]
        return self.cache[f"_{key}"]

    def trackstar(self) -> tuple[np.ndarray, np.ndarray]:
        """(pool, query) TrackStar features (:mod:`plantbench.attribution.trackstar`), checked."""
        if "_trackstar" not in self.cache:
            from plantbench.attribution import trackstar

            pool, queries, meta = trackstar.load(
                self.paths, self.model, self.pool_meta["hash"], self.query_ids
            )
            if pool.shape[0] != self.n_pool or queries.shape[0] != self.n_queries:
                raise ArtifactError(
                    f"'{self.paths.trackstar(self.model)}' does not hold one row per pool window "
                    "and query; rerun its trackstar step"
                )
            self.cache["_trackstar"] = (pool.astype(np.float64), queries.astype(np.float64))
            self.inputs["trackstar"] = meta["hash"]
        return self.cache["_trackstar"]

    def tracin(self) -> list[tuple[str, float]]:
        """(checkpoint, learning rate of the update that produced it) for TracIn."""
        if "_tracin" not in self.cache:
            out = []
            for name in layout.tracin_checkpoints(self.cfg):
                e = artifacts.checkpoint_entry(self.paths, self.model, name)
                out.append((name, float(e["lr"])))
                self.inputs[f"checkpoint/{name}"] = e["hash"]
            self.cache["_tracin"] = out
        return self.cache["_tracin"]

    # ------------------------------------------------------------------ checks
    def prepare(self, needs: tuple[str, ...] | list[str]) -> None:
        """Open (and check) every feature a method needs before any scoring starts."""
        for need in needs:
            if need == "text":
                self.texts()
            elif need in ("hidden", "embed"):
                self.vectors(need)
            elif need == "grads":
                self.query_grads(self.final)
            elif need == "grads_tracin":
                for c, _ in self.tracin():
                    self.query_grads(c)
            elif need == "curvature":
                self.curvature(self.final)
            elif need == "curvature_tracin":
                for c, _ in self.tracin():
                    self.curvature(c)
            elif need == "ekfac":
                self.ekfac()
            elif need == "trackstar":
                self.trackstar()
