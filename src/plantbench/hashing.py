"""xxh3 hashing of bytes, files, arrays and token windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

CHUNK = 1 << 24


def hash_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hash_file(path: str | Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(root: str | Path) -> str:
    """Hash of a directory: relative names and contents, in sorted order."""
    root = Path(root)
    h = xxhash.xxh3_128()
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hash_file(p).encode())
    return h.hexdigest()


def window_hashes(
    windows: np.ndarray, masks: np.ndarray | None = None, mask_rows: np.ndarray | None = None
) -> np.ndarray:
    """xxh3-64 of each row's little-endian bytes, as uint64 (the manifest's window hash). A
    window with a loss mask (``mask_rows[i] >= 0``: row of ``masks``, uint8 per token) hashes
    its tokens' bytes followed by its mask's."""
    arr = np.ascontiguousarray(windows.astype(windows.dtype.newbyteorder("<"), copy=False))
    out = np.empty(arr.shape[0], dtype=np.uint64)
    for i in range(arr.shape[0]):
        data = arr[i].tobytes()
        if mask_rows is not None and masks is not None and mask_rows[i] >= 0:
            data += np.ascontiguousarray(masks[int(mask_rows[i])], dtype=np.uint8).tobytes()
        out[i] = xxhash.xxh3_64_intdigest(data)
    return out
