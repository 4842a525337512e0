"""Reading gradient shards: the store's format, a shard's identity, and :class:`GradientStore`
(one or several shards of the same identity as one memory-mapped row-addressable store)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from plantbench import lineage
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_file

if TYPE_CHECKING:
    pass


STORE_FORMAT = 2  # 2: shard.json names its projection (logra | sketch)


GRADS_FILE = "grads.bin"


SHARD_JSON = "shard.json"


STORE_DTYPES = {"float16": np.float16, "float32": np.float32}


# Keys of shard.json that must agree between shards merged into one store.
IDENTITY_KEYS = (
    "format",
    "projection",
    "modules",
    "dims",
    "dtype",
    "projection_seed",
    "model",
    "checkpoint",
    "checkpoint_step",
    "manifest_hash",
    "config_hash",
)


def _read_shard_meta(shard_dir: Path) -> dict[str, Any]:
    p = shard_dir / SHARD_JSON
    if not p.is_file():
        partial = shard_dir.parent / f".{shard_dir.name}.partial"
        hint = (
            " (a partial one exists: rerun its features job to resume)" if partial.exists() else ""
        )
        raise ArtifactError(f"gradient shard '{shard_dir}' is missing or unfinished{hint}")
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"'{p}' is corrupt; delete '{shard_dir}' and recompute it") from None
    if meta.get("format") != STORE_FORMAT or meta.get("complete") is not True:
        raise ArtifactError(f"'{p}' is not a finished format-{STORE_FORMAT} gradient shard")
    lineage.check_read(meta, shard_dir)
    return meta


class GradientStore:
    """Read-only view of one or more finished shards, rows keyed by window index.

    Shards are ordered by their smallest key, so the merged row order (and :attr:`hash`) does not
    depend on the order the folders were given in.
    """

    def __init__(self, shard_dirs: Sequence[str | Path], *, verify: bool = True):
        if not shard_dirs:
            raise ArtifactError("no gradient shards given")
        metas = []
        for d in shard_dirs:
            d = Path(d)
            metas.append((d, _read_shard_meta(d)))
        first_dir, first = metas[0]
        for d, m in metas[1:]:
            for k in IDENTITY_KEYS:
                if m.get(k) != first.get(k):
                    mine, theirs = json.dumps(m.get(k))[:80], json.dumps(first.get(k))[:80]
                    raise ArtifactError(
                        f"gradient shard '{d / SHARD_JSON}' differs from "
                        f"'{first_dir / SHARD_JSON}' in '{k}' ({mine} vs {theirs}); "
                        "recompute it with the same settings or leave it out"
                    )
        metas.sort(key=lambda dm: min(dm[1]["keys"]) if dm[1]["keys"] else -1)
        self.identity = {k: first[k] for k in IDENTITY_KEYS}
        self.dims: int = int(first["dims"])
        self.dtype = np.dtype(STORE_DTYPES[first["dtype"]]).newbyteorder("<")
        self.projection: str = str(first["projection"])
        self.module_names = [m[0] for m in first["modules"]]
        self.slices: dict[str, slice] = {}
        if self.projection == "sketch":  # every dimension mixes every module: one block
            self._blocks, s = [self.dims], self.dims
        else:
            self._blocks, s = [], 0
            for m in first["modules"]:
                self.slices[m[0]] = slice(s, s + int(m[3]) * int(m[4]))
                self._blocks.append(int(m[3]) * int(m[4]))
                s += self._blocks[-1]
        if s != self.dims:
            raise ArtifactError(
                f"'{first_dir / SHARD_JSON}': module sizes sum to {s}, not {self.dims}"
            )
        self.shard_dirs = [d for d, _ in metas]
        self._arrays: list[np.ndarray] = []
        owner: dict[int, Path] = {}
        keys = []
        for d, m in metas:
            f = d / GRADS_FILE
            want = int(m["rows"]) * self.dims * self.dtype.itemsize
            have = f.stat().st_size if f.is_file() else -1
            if have != want or len(m["keys"]) != m["rows"]:
                raise ArtifactError(
                    f"gradient shard file '{f}' has {have} bytes, expected {want} "
                    f"({m['rows']} rows x {self.dims} x {self.dtype.itemsize}); "
                    f"it is truncated or corrupt: delete '{d}' and recompute it"
                )
            if verify and hash_file(f) != m["xxh3"]:
                raise ArtifactError(
                    f"gradient shard file '{f}' does not match its recorded hash; "
                    f"delete '{d}' and recompute it"
                )
            extra = m.get("factors")  # EK-FAC's factor sums from the same pass, if any
            if verify and extra and hash_file(d / str(extra["file"])) != extra["xxh3"]:
                raise ArtifactError(
                    f"'{d / str(extra['file'])}' does not match its recorded hash; "
                    f"delete '{d}' and recompute it"
                )
            for k in m["keys"]:
                if k in owner:
                    raise ArtifactError(
                        f"gradient shard '{d / SHARD_JSON}' overlaps '{owner[k] / SHARD_JSON}' "
                        f"(both hold window {k}); merge disjoint shards only"
                    )
                owner[k] = d
            keys.extend(m["keys"])
            self._arrays.append(
                np.memmap(f, dtype=self.dtype, mode="r", shape=(int(m["rows"]), self.dims))
                if m["rows"]
                else np.zeros((0, self.dims), self.dtype)
            )
        self.keys = np.asarray(keys, dtype=np.int64)
        self._row_of = {int(k): i for i, k in enumerate(self.keys)}
        self._offsets = np.cumsum([0] + [a.shape[0] for a in self._arrays])
        self.hash = hash_bytes(
            json.dumps(
                {"identity": self.identity, "shards": [m["xxh3"] for _, m in metas]}, sort_keys=True
            ).encode()
        )

    @classmethod
    def open(cls, shard_dirs: Sequence[str | Path], *, verify: bool = True) -> GradientStore:
        return cls(shard_dirs, verify=verify)

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def n_rows(self) -> int:
        return len(self.keys)

    def row_of(self, key: int) -> int:
        try:
            return self._row_of[int(key)]
        except KeyError:
            raise ArtifactError(f"window {key} is not in the gradient store") from None

    def rows(self, start: int, stop: int, dtype: Any = np.float32) -> np.ndarray:
        """Rows ``[start, stop)`` in merged order, as a new array of ``dtype``."""
        out = np.empty((max(stop - start, 0), self.dims), dtype=dtype)
        for j, arr in enumerate(self._arrays):
            a, b = max(start, self._offsets[j]), min(stop, self._offsets[j + 1])
            if a < b:
                out[a - start : b - start] = arr[a - self._offsets[j] : b - self._offsets[j]]
        return out

    def get(self, keys: Sequence[int] | np.ndarray, dtype: Any = np.float32) -> np.ndarray:
        """Rows for the given window indices, in that order."""
        idx = [self.row_of(k) for k in np.asarray(keys).ravel()]
        return (
            np.stack([self.rows(i, i + 1, dtype)[0] for i in idx])
            if idx
            else np.zeros((0, self.dims), dtype)
        )

    def chunks(
        self, chunk_rows: int = 4096, dtype: Any = np.float32
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Stream ``(keys, rows)`` in merged order, at most ``chunk_rows`` at a time."""
        for s in range(0, self.n_rows, chunk_rows):
            e = min(s + chunk_rows, self.n_rows)
            yield self.keys[s:e], self.rows(s, e, dtype)

    @property
    def block_sizes(self) -> list[int]:
        """Curvature blocks: one per module for LoGra, one for a sketch."""
        return list(self._blocks)
