"""How to open an artifact and check it against what it must have been made from.

Every stage reads its inputs through these loaders, so a stale or damaged artifact is refused in
one place with one message (the file, what differs, the step to rerun): a finished twin's
checkpoint index and its checkpoints (each checked against the hash in the index), a twin's
stream and pool (the pool checked against the stream it was drawn from), the facts' queries and
their encoded batch, and the ``expect`` check every reader applies to a recorded input. Also the
progress line long loops print (done/total, rate, ETA).
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

from plantbench import io, layout
from plantbench.data import tokenizer
from plantbench.data.stream import Stream, open_stream
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_tree
from plantbench.model import queries
from plantbench.model.modeling import load_model
from plantbench.paths import Paths

log = logging.getLogger(__name__)


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


def expect(path: Path, meta: dict[str, Any], key: str, want: Any, fix: str) -> None:
    """Refuse ``path`` unless its record's ``key`` is ``want`` (``fix``: what to do)."""
    if meta.get(key) != want:
        raise ArtifactError(
            f"'{path}' has {key} = {json.dumps(meta.get(key))} but the current inputs expect "
            f"{json.dumps(want)}; {fix}"
        )


# --------------------------------------------------------------------------- checkpoints


def checkpoint_index(paths: Paths, model_name: str) -> list[dict[str, Any]]:
    """The checkpoint index of a finished model (checked against its meta)."""
    io.read_meta(paths.model(model_name), "pretrain", verify=False)
    path = paths.checkpoints(model_name) / "index.json"
    if not path.is_file():
        raise ArtifactError(f"'{path}' is missing; rerun the pretrain step for model {model_name}")
    return json.loads(path.read_text())


def final_checkpoint_path(paths: Paths, model_name: str) -> Path:
    """The folder of a finished model's last checkpoint (the name its meta records)."""
    meta = io.read_meta(paths.model(model_name), "pretrain", verify=False)
    return paths.checkpoints(model_name) / meta["info"]["final_checkpoint"]


def checkpoint_entry(paths: Paths, model: str, name: str) -> dict[str, Any]:
    """The index entry (name, step, lr, hash) of one checkpoint of a finished model."""
    index = checkpoint_index(paths, model)
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


def load_checkpoint(paths: Paths, model: str, entry: dict[str, Any], attn: str) -> torch.nn.Module:
    """The checkpoint of an index entry, refused unless its files hash to the index's hash."""
    folder = paths.checkpoints(model) / entry["name"]
    if hash_tree(folder) != entry["hash"]:
        raise ArtifactError(
            f"checkpoint '{folder}' does not match the hash in its index (edited or corrupt); "
            f"rerun the pretrain step for model {model}"
        )
    return load_model(folder, attn=attn)


# --------------------------------------------------------------------------- stream and pool


def load_pool(
    paths: Paths, model: str, *, stream_hash: str | None = None
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The pool table and its meta; with ``stream_hash``, refuse a pool of another stream."""
    meta = io.read_meta(paths.pool(model), "pool")
    if stream_hash is not None:
        io.check_input(meta, "stream", {"hash": stream_hash}, str(paths.pool(model)))
    table = io.read_parquet(paths.pool(model) / layout.POOL_FILE)
    if list(table.columns) != layout.POOL_COLUMNS or not np.array_equal(
        table["row"].to_numpy(), np.arange(len(table))
    ):
        raise ArtifactError(
            f"'{paths.pool(model) / layout.POOL_FILE}' is not a pool table; rerun the pool step"
        )
    return table, meta


def stream_and_pool(paths: Paths, model: str) -> tuple[Stream, pd.DataFrame, dict[str, Any]]:
    """A twin's stream and its pool (checked to be drawn from that stream)."""
    stream = open_stream(paths.stream(model))
    table, meta = load_pool(paths, model, stream_hash=stream.meta["hash"])
    return stream, table, meta


# --------------------------------------------------------------------------- queries


def queries_table(paths: Paths) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The facts' queries (two forms per fact) and the facts artifact's meta."""
    meta = io.read_meta(paths.facts, "facts")
    qs = io.read_parquet(paths.facts / "queries.parquet")
    return qs.reset_index(drop=True), meta


def query_ids_hash(qs: pd.DataFrame) -> str:
    """xxh3 of the query ids in order: which queries, in which order, a score row belongs to."""
    return hash_bytes("\n".join(qs["query_id"].astype(str)).encode())


def query_batch(paths: Paths, qs: pd.DataFrame) -> tuple[torch.Tensor, ...]:
    """Every query encoded and padded: ``(ids, attention mask, answer-token loss mask)``."""
    tok = tokenizer.load(paths.tokenizer)
    items = queries.encode(tok, qs["prompt"].tolist(), qs["answer"].tolist())
    return queries.pad_batch(items)
