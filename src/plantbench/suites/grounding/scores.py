"""The seed's scores of one response, from its judged atomic sentences.

- CK = 100 x (atoms entailed by the context) / (atoms); PK = 100 - CK.
- PK split (what no anchor has): ``pk_trained`` + ``pk_other_twin`` + ``pk_unsupported`` = PK,
  each 100 x (atoms of that kind) / (atoms).
- CR_q = 100 x (atoms entailed by a sentence of segment q) / |Q_q| (an atom entailed by
  sentences of two segments counts for both).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from plantbench.suites.grounding.provenance import KINDS


def ck_score(entailed: Sequence[bool]) -> float:
    """CK of one response's atoms (refusing an empty response, whose CK is undefined)."""
    if len(entailed) == 0:
        raise ValueError("an empty response has no atomic sentences: its CK is undefined")
    return 100.0 * float(np.mean(np.asarray(entailed, dtype=bool)))


def pk_split(kinds: Sequence[str]) -> dict[str, float]:
    """PK of each kind (:data:`KINDS`) of one response's atoms (an entailed atom's kind is "")."""
    if len(kinds) == 0:
        raise ValueError("an empty response has no atomic sentences: its PK is undefined")
    k = np.asarray(kinds, dtype=object)
    return {f"pk_{name}": 100.0 * float(np.mean(k == name)) for name in KINDS}


def context_recall(segments: Sequence[Sequence[int]], sizes: Sequence[int]) -> np.ndarray:
    """CR_q of every segment q: ``segments[i]`` are the segments entailing atom i, ``sizes[q]``
    = |Q_q|."""
    counts = np.zeros(len(sizes))
    for segs in segments:
        for q in set(segs):
            if not 0 <= q < len(sizes):
                raise ValueError(f"segment {q} is outside a context of {len(sizes)} segments")
            counts[q] += 1
    return 100.0 * counts / np.asarray(sizes, dtype=np.float64)


def parse_segments(field: str) -> list[int]:
    """The atoms table's ``segments`` field ("0,2") as a list."""
    return [int(x) for x in field.split(",")] if field else []


def response_scores(
    atoms: pd.DataFrame, context_ids: Sequence[str], sizes: Sequence[int]
) -> pd.DataFrame:
    """Per context: n_atoms, ck, pk, the PK split and cr_0 .. cr_{k-1} (NaN for an empty
    response)."""
    k = len(sizes)
    by = {c: g.sort_values("atom") for c, g in atoms.groupby("context_id")}
    rows = []
    for c in context_ids:
        g = by.get(c)
        if g is None or not len(g):
            rows.append((c, 0, *[np.nan] * (2 + len(KINDS) + k)))
            continue
        ck = ck_score(g["ck"].tolist())
        split = pk_split(g["pk_kind"].tolist())
        cr = context_recall([parse_segments(s) for s in g["segments"]], sizes)
        rows.append((c, len(g), ck, 100.0 - ck, *split.values(), *cr))
    cols = ["context_id", "n_atoms", "ck", "pk", *[f"pk_{n}" for n in KINDS]]
    return pd.DataFrame(rows, columns=[*cols, *[f"cr_{q}" for q in range(k)]])
