"""EK-FAC's Kronecker factors as running sums, fed by any frozen pass over the fit windows.

EK-FAC's first pass only needs each block linear's inputs ``x`` and output gradients ``delta``
over every token of the pool. The final checkpoint's ``grads_pool`` job runs exactly that frozen
forward and backward (same windows, same batches, same dtype), so it feeds a :class:`FactorSums`
through :func:`plantbench.attribution.gradients.capture.projected_grads`'s ``tap`` and leaves the
sums beside its shard (``factors.npz``, recorded in ``shard.json``); the ``ekfac`` job then runs
two passes instead of three. With one shard the factors are bitwise those of EK-FAC's own pass
(the same ``x^T x`` per batch, summed in the same order); several shards add their float64 sums
in shard order. A shard without them (a run from before, or EK-FAC enabled afterwards) makes
EK-FAC run its own pass.

Resumable with the shard: the sums are saved in the partial shard every
:data:`plantbench.attribution.gradients.writer.FACTOR_SAVE_EVERY` batches with the rows they
cover; on resume, rows written but not yet
summed are run through the frozen pass again (factors only) before the shard goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plantbench import io
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_file
from plantbench.model.modeling import to_numpy

FILE = "factors.npz"
STATE = "factors.json"


def gram(v: torch.Tensor) -> torch.Tensor:
    """``v^T v`` over all tokens of a ``[n, T, k]`` batch, computed in ``v``'s dtype, float64."""
    v = v.reshape(-1, v.shape[-1])
    return (v.T @ v).double()


class FactorSums:
    """Running float64 sums of ``x x^T`` (``a``) and ``delta delta^T`` (``s``) per module, the
    tokens they cover and the pool rows ``[0, rows)`` of a shard they came from."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.a: dict[str, torch.Tensor] = {}
        self.s: dict[str, torch.Tensor] = {}
        self.tokens = 0
        self.rows = 0

    def tap(self, name: str, kind: str, t: torch.Tensor) -> None:
        """The capture's ``tap``: one batch's inputs (``"in"``) or output gradients (``"out"``)."""
        side, g = (self.a if kind == "in" else self.s), gram(t)
        prev = side.get(name)  # restored sums are on the CPU: they join the pass's device
        side[name] = g if prev is None else prev.to(g.device) + g

    def batch_done(self, n_rows: int, n_tokens: int) -> None:
        self.rows += n_rows
        self.tokens += n_tokens

    def means(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(A, S)``: the token means; every module must have had a gradient."""
        missing = [n for n in self.names if n not in self.s or n not in self.a]
        if missing:
            raise ArtifactError(f"EK-FAC: no gradient reached {missing}; check the fit windows")
        return (
            {n: self.a[n] / self.tokens for n in self.names},
            {n: self.s[n] / self.tokens for n in self.names},
        )

    # ------------------------------------------------------------------ files

    def _arrays(self) -> dict[str, np.ndarray]:
        out = {f"a/{n}": to_numpy(self.a[n]) for n in self.names if n in self.a}
        out.update({f"s/{n}": to_numpy(self.s[n]) for n in self.names if n in self.s})
        return out

    def save(self, folder: Path) -> dict[str, Any]:
        """Write ``factors.npz`` (atomically) and ``factors.json``; returns the record."""
        with io.atomic_path(folder / FILE) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **self._arrays())
        record = {
            "file": FILE,
            "xxh3": hash_file(folder / FILE),
            "rows": self.rows,
            "tokens": self.tokens,
            "names": self.names,
        }
        io.write_json(folder / STATE, record)
        return record

    @classmethod
    def load(cls, folder: Path, record: dict[str, Any]) -> FactorSums:
        """The sums of ``folder`` as ``record`` describes them, their hash checked."""
        path = folder / str(record["file"])
        if not path.is_file() or hash_file(path) != record["xxh3"]:
            raise ArtifactError(
                f"'{path}' is missing or does not match its recorded hash; rerun its grads_pool job"
            )
        out = cls(record["names"])
        with np.load(path, allow_pickle=False) as z:
            for key in z.files:
                side, name = key.split("/", 1)
                (out.a if side == "a" else out.s)[name] = torch.from_numpy(z[key].copy())
        out.rows, out.tokens = int(record["rows"]), int(record["tokens"])
        return out

    def restore(self, folder: Path, rows_done: int) -> None:
        """Take the partial sums saved in a partial shard ``folder`` if they cover at most the
        ``rows_done`` rows written there (else, or if none or unreadable, start empty)."""
        self.a, self.s, self.tokens, self.rows = {}, {}, 0, 0
        try:
            record = json.loads((folder / STATE).read_text())
            if record.get("names") == self.names and int(record["rows"]) <= rows_done:
                saved = FactorSums.load(folder, record)
                self.a, self.s, self.tokens, self.rows = saved.a, saved.s, saved.tokens, saved.rows
        except (OSError, ValueError, KeyError, ArtifactError):
            pass


def merge(parts: Iterable[FactorSums]) -> FactorSums:
    """The shards' sums added in the given (shard) order, float64."""
    parts = list(parts)
    if not parts:
        raise ArtifactError("EK-FAC: no factor sums to merge")
    out = FactorSums(parts[0].names)
    for p in parts:
        if p.names != out.names:
            raise ArtifactError("EK-FAC: the shards' factor sums cover different modules")
        for side, mine in ((p.a, out.a), (p.s, out.s)):
            for n, v in side.items():
                mine[n] = mine.get(n, 0) + v
        out.batch_done(p.rows, p.tokens)
    return out
