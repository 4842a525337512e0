"""Seeded randomness: every random choice derives from the master seed and a purpose tag."""

from __future__ import annotations

import numpy as np
import xxhash


def derive_seed(seed: int, *tags: object) -> int:
    """A 63-bit seed for (master seed, tags...), stable across machines and Python versions."""
    key = "\x1f".join([str(seed), *(str(t) for t in tags)]).encode()
    return xxhash.xxh3_64_intdigest(key) & ((1 << 63) - 1)


def rng(seed: int, *tags: object) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(derive_seed(seed, *tags)))
