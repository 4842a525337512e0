"""Writing a gradient shard: built in ``<parent>/.<name>.partial/``, resumable from its
``progress.json``, renamed into place only when every row is written."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from plantbench import floats, lineage
from plantbench.errors import ArtifactError, PlantbenchError
from plantbench.hashing import hash_file
from plantbench.io import fsync_dir, write_json
from plantbench.model.modeling import device_of

if TYPE_CHECKING:
    from plantbench.attribution.sketch import Sketch
from plantbench.attribution.gradients.capture import projected_grads
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.gradients.store import (
    GRADS_FILE,
    IDENTITY_KEYS,
    SHARD_JSON,
    STORE_DTYPES,
    STORE_FORMAT,
)

log = logging.getLogger(__name__)


PROGRESS_JSON = "progress.json"
FACTOR_SAVE_EVERY = 16  # batches between saves of the factor sums in a partial shard


def shard_identity(
    projector: Projector | Sketch,
    *,
    dtype: str = "float32",
    checkpoint: str,
    checkpoint_step: int,
    manifest_hash: str,
    config_hash: str,
    model: str = "",
) -> dict[str, Any]:
    """The metadata every shard of one store must share."""
    if dtype not in STORE_DTYPES:
        raise PlantbenchError(
            f"gradient store dtype '{dtype}' is not one of {sorted(STORE_DTYPES)}"
        )
    d = projector.describe()
    return {
        "format": STORE_FORMAT,
        "projection": d["projection"],
        "modules": d["modules"],
        "dims": d["dims"],
        "dtype": dtype,
        "projection_seed": d["projection_seed"],
        "model": model,
        "checkpoint": checkpoint,
        "checkpoint_step": int(checkpoint_step),
        "manifest_hash": manifest_hash,
        "config_hash": config_hash,
    }


def _ranges(done: np.ndarray) -> list[list[int]]:
    idx = np.flatnonzero(done)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks] + 1, [idx[-1] + 1]])
    return [[int(a), int(b)] for a, b in zip(starts, ends, strict=True)]


class ShardWriter:
    """Writes one shard, resumably: construct it (it reopens a matching partial shard), write
    row ranges from :meth:`pending_batches` with :meth:`write`, then :meth:`finalize`.
    :func:`extract_to_shard` does all three for a model and a block of windows."""

    def __init__(self, shard_dir: str | Path, keys: Sequence[int] | np.ndarray, identity: dict):
        self.final = Path(shard_dir)
        self.partial = self.final.parent / f".{self.final.name}.partial"
        self.keys = np.asarray(keys, dtype=np.int64)
        if self.keys.ndim != 1 or len(np.unique(self.keys)) != len(self.keys):
            raise PlantbenchError(f"shard '{self.final}': keys must be a 1-D list without repeats")
        self.identity = dict(identity)
        self.np_dtype = np.dtype(STORE_DTYPES[self.identity["dtype"]]).newbyteorder("<")
        self.rows = len(self.keys)
        self.D = int(self.identity["dims"])
        self.nbytes = self.rows * self.D * self.np_dtype.itemsize
        self.done = np.zeros(self.rows, dtype=bool)
        self.complete = self._already_final()
        self._mm: np.memmap | None = None
        if not self.complete:
            self._open_partial()

    def _already_final(self) -> bool:
        p = self.final / SHARD_JSON
        if not p.is_file():
            return False
        try:
            meta = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return False
        same = all(meta.get(k) == self.identity.get(k) for k in IDENTITY_KEYS)
        ok = same and meta.get("keys") == self.keys.tolist() and meta.get("complete") is True
        if ok and (self.final / GRADS_FILE).is_file():
            self.done[:] = True
            return (self.final / GRADS_FILE).stat().st_size == self.nbytes
        return False

    def _progress(self) -> dict[str, Any]:
        return {**self.identity, "keys": self.keys.tolist(), "done": _ranges(self.done)}

    def _open_partial(self) -> None:
        grads = self.partial / GRADS_FILE
        prog = self.partial / PROGRESS_JSON
        resumed = False
        if prog.is_file() and grads.is_file() and grads.stat().st_size == self.nbytes:
            try:
                p = json.loads(prog.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError):
                p = {}
            if (
                all(p.get(k) == self.identity.get(k) for k in IDENTITY_KEYS)
                and p.get("keys") == self.keys.tolist()
            ):
                for a, b in p.get("done", []):
                    self.done[a:b] = True
                resumed = True
                log.info(
                    "resuming shard %s: %d/%d rows done", self.final, self.done.sum(), self.rows
                )
        if not resumed:
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
            with open(grads, "wb") as fh:
                fh.truncate(self.nbytes)
            write_json(prog, self._progress())
        if self.rows:
            self._mm = np.memmap(grads, dtype=self.np_dtype, mode="r+", shape=(self.rows, self.D))

    @property
    def pending(self) -> np.ndarray:
        """Row positions not yet written."""
        return np.flatnonzero(~self.done)

    def pending_batches(self, batch_rows: int) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` row ranges (at most ``batch_rows``) that still need writing."""
        for a, b in _ranges(~self.done):
            for s in range(a, b, batch_rows):
                yield s, min(s + batch_rows, b)

    def write(self, start: int, grads: np.ndarray | torch.Tensor) -> None:
        """Write rows ``[start, start + len(grads))``, flush, then record them as done."""
        if self.complete:
            raise PlantbenchError(f"shard '{self.final}' is already complete")
        g = grads.detach().cpu().numpy() if isinstance(grads, torch.Tensor) else np.asarray(grads)
        if g.ndim != 2 or g.shape[1] != self.D or start < 0 or start + g.shape[0] > self.rows:
            raise ValueError(
                f"rows [{start}, {start + g.shape[0]}) x {g.shape[1:]} do not fit "
                f"shard '{self.final}' ({self.rows} x {self.D})"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            cast = g.astype(self.np_dtype)
        if not np.isfinite(cast).all():
            raise ArtifactError(
                f"shard '{self.final}': gradients overflow or are not finite in "
                f"{self.identity['dtype']}; use a float32 store or check the model"
            )
        assert self._mm is not None
        self._mm[start : start + g.shape[0]] = cast
        self._mm.flush()
        self.done[start : start + g.shape[0]] = True
        write_json(self.partial / PROGRESS_JSON, self._progress())

    def finalize(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check every row is written, write shard.json (with ``extra`` entries, e.g. the
        EK-FAC factors' record), and rename the shard into place."""
        if self.complete:
            return json.loads((self.final / SHARD_JSON).read_text())
        if not self.done.all():
            raise ArtifactError(
                f"shard '{self.final}': {int((~self.done).sum())} of {self.rows} rows not written"
            )
        if self._mm is not None:
            self._mm.flush()
            del self._mm
            self._mm = None
        grads = self.partial / GRADS_FILE
        with open(grads, "rb+") as fh:
            os.fsync(fh.fileno())
        meta = {
            **self.identity,
            "rows": self.rows,
            "keys": self.keys.tolist(),
            "complete": True,
            "file": GRADS_FILE,
            "nbytes": self.nbytes,
            "xxh3": hash_file(grads),
            **(extra or {}),
        }
        if lineage.current() is not None:  # outside the store's identity and hash
            meta[lineage.KEY] = lineage.current()
        write_json(self.partial / SHARD_JSON, meta)
        (self.partial / PROGRESS_JSON).unlink()
        if self.final.exists():
            old = self.final.parent / f".{self.final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.final, old)
            os.replace(self.partial, self.final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.partial, self.final)
        fsync_dir(self.final.parent)
        self.complete = True
        return meta


class FactorSink(Protocol):
    """What :func:`extract_to_shard` feeds alongside the gradients (EK-FAC's running factor
    sums, :class:`plantbench.attribution.ekfac.factors.FactorSums`)."""

    rows: int

    def tap(self, name: str, kind: str, t: torch.Tensor) -> None: ...
    def batch_done(self, n_rows: int, n_tokens: int) -> None: ...
    def save(self, folder: Path) -> dict[str, Any]: ...
    def restore(self, folder: Path, rows_done: int) -> None: ...


def _batch(
    windows: np.ndarray,
    loss_mask: np.ndarray | None,
    attention_mask: np.ndarray | None,
    a: int,
    b: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rows ``[a, b)`` as tensors on the model's ``device``."""
    ids = torch.as_tensor(np.asarray(windows[a:b]), dtype=torch.long, device=device)
    lm = (
        torch.ones_like(ids, dtype=torch.bool)
        if loss_mask is None
        else torch.as_tensor(np.asarray(loss_mask[a:b]), dtype=torch.bool, device=device)
    )
    am = (
        None
        if attention_mask is None
        else torch.as_tensor(np.asarray(attention_mask[a:b]), device=device)
    )
    return ids, lm, am


def extract_to_shard(
    model: torch.nn.Module,
    projector: Projector | Sketch,
    windows: np.ndarray,
    keys: Sequence[int] | np.ndarray,
    shard_dir: str | Path,
    identity: dict[str, Any],
    *,
    loss_mask: np.ndarray | None = None,
    attention_mask: np.ndarray | None = None,
    batch_rows: int = 16,
    progress: Any = None,
    factors: FactorSink | None = None,
) -> dict[str, Any]:
    """Compute projected gradients of ``windows`` ([rows, T] token ids) into one shard,
    resuming a partial shard; returns the finished shard.json. ``loss_mask`` defaults to every
    next-token position. ``progress(rows_done)`` is called after each batch if given.
    ``factors``: fed every module's inputs and output gradients by the same pass, its sums
    saved in the shard (``shard.json``'s ``factors``); rows a resumed shard wrote before its
    sums were saved are run again for the sums alone."""
    writer = ShardWriter(shard_dir, keys, identity)
    if len(windows) != writer.rows:
        raise ValueError(f"{len(windows)} windows but {writer.rows} keys")
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    tap = None if factors is None or writer.complete else factors.tap

    device = device_of(model)

    def run(a: int, b: int) -> torch.Tensor:
        ids, lm, am = _batch(windows, loss_mask, attention_mask, a, b, device)
        g = projected_grads(model, projector, ids, lm, am, dtype=dtype, tap=tap)
        if factors is not None:
            factors.batch_done(b - a, ids.numel())
        return g

    if factors is not None and not writer.complete:
        first_pending = int(writer.pending[0]) if len(writer.pending) else writer.rows
        factors.restore(writer.partial, first_pending)
        for a in range(factors.rows, first_pending, batch_rows):  # written, not yet summed
            run(a, min(a + batch_rows, first_pending))
    for i, (a, b) in enumerate(writer.pending_batches(batch_rows)):
        writer.write(a, run(a, b))
        if factors is not None and (i + 1) % FACTOR_SAVE_EVERY == 0:
            factors.save(writer.partial)
        if progress is not None:
            progress(b - a)
    platform = {"platform": floats.record()}  # the float path (device) the rows were made on
    if factors is None or writer.complete:
        return writer.finalize(platform)
    record = {**factors.save(writer.partial), "batch_rows": int(batch_rows), "dtype": str(dtype)}
    return writer.finalize({"factors": record, **platform})
