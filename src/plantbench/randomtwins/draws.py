"""Random twins: which side of every fact pair a draw reads, and the stream it trains on.

A's fact and B's fact of the same (domain, n_docs, position, pair) share their planted slots
(:mod:`plantbench.data.stream`), so a twin is one choice per pair of which fact's documents it
reads there: twin A chose side A everywhere, twin B side B. Random twin ``k`` (``k`` = 0 ..
``random_twins.m`` - 1) chooses side A for a seeded half of the pairs (``floor(P / 2)`` of the
``P`` pairs, by ``rng(seed, "random-twins", random_twins.seed, k)``) and side B for the rest.
Everywhere else (background, distractors, reading episodes, recall windows, padding) it reads
what both twins read. It trains from the shared prefix's fork, like A and B, so it costs one
twin's paired part, and a fact is read with all of its documents or not at all.

Its stream is not written: :func:`stream_of` reads stream A's window at every slot except the
planted slots of the pairs on side B, where it reads stream B's (:class:`MixedWindows`). The
stream's hash (the twin's recorded input, and its resumable state's) is the xxh3 of its windows'
manifest hashes in order, as the shared prefix's is (:func:`plantbench.model.train_state.prefix_hash`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from plantbench import layout
from plantbench.data.stream import Stream, open_stream
from plantbench.errors import ArtifactError, ConfigError
from plantbench.hashing import hash_bytes
from plantbench.paths import MODELS, Paths
from plantbench.rng import rng

PAIR_KEY = ["domain", "n_docs", "position", "pair"]
SIDE_COLUMNS = [*PAIR_KEY, "fact_A", "fact_B", "side", "fact_read"]


n_draws = layout.random_draws


def draw_seed(cfg: dict[str, Any]) -> int:
    """``random_twins.seed``: the draws' own seed (beside the master seed)."""
    return int(cfg.get("random_twins", {}).get("seed", 0))


def check_draw(cfg: dict[str, Any], draw: int) -> None:
    if not 0 <= draw < n_draws(cfg):
        raise ConfigError(
            f"random twin {draw} is not among the config's random_twins.m = {n_draws(cfg)} "
            "draws (0 to m - 1); raise random_twins.m"
        )


def pairs(facts: pd.DataFrame) -> pd.DataFrame:
    """One row per fact pair, sorted by :data:`PAIR_KEY`: its A fact and its B fact."""
    wide = facts.pivot(index=PAIR_KEY, columns="reader", values="fact_id")
    if list(wide.columns) != list(MODELS) or wide.isna().any().any():
        raise ArtifactError("the facts table has an unpaired cell; rebuild the facts step")
    wide = wide.rename(columns={m: f"fact_{m}" for m in MODELS}).sort_index()
    return wide.reset_index()


def sides(cfg: dict[str, Any], facts: pd.DataFrame, draw: int) -> pd.DataFrame:
    """Draw ``draw``'s side of every pair (:data:`SIDE_COLUMNS`): ``floor(P / 2)`` pairs on
    side A, chosen by a seeded permutation, the rest on side B; ``fact_read`` is the fact whose
    documents the draw reads at the pair's slots."""
    out = pairs(facts)
    order = rng(cfg["seed"], "random-twins", draw_seed(cfg), int(draw)).permutation(len(out))
    on_a = np.zeros(len(out), dtype=bool)
    on_a[order[: len(out) // 2]] = True
    out["side"] = np.where(on_a, MODELS[0], MODELS[1])
    out["fact_read"] = np.where(on_a, out[f"fact_{MODELS[0]}"], out[f"fact_{MODELS[1]}"])
    return out[SIDE_COLUMNS]


def reads(cfg: dict[str, Any], facts: pd.DataFrame, draws: range | list[int]) -> np.ndarray:
    """``bool [len(draws), len(facts)]``: whether each draw reads each fact (facts in the
    table's row order)."""
    ids = facts["fact_id"].to_numpy()
    return np.stack([np.isin(ids, sides(cfg, facts, d)["fact_read"].to_numpy()) for d in draws])


class MixedWindows:
    """Stream A's windows with stream B's at the rows ``from_b`` marks (read-only, lazily: the
    two memmaps are never copied whole)."""

    def __init__(self, a: np.ndarray, b: np.ndarray, from_b: np.ndarray):
        if a.shape != b.shape or from_b.shape != a.shape[:1]:
            raise ArtifactError(
                "streams A and B do not have the same windows; rerun the stream step"
            )
        self.a, self.b, self.from_b = a, b, from_b
        self.shape, self.dtype = a.shape, a.dtype

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        idx = np.arange(self.shape[0])[key]
        rows = np.array(self.a[key])
        sel = self.from_b[idx]
        if np.ndim(idx) == 0:
            return np.array(self.b[idx]) if sel else rows
        rows[sel] = self.b[idx[sel]]
        return rows


def window_sides(a: Stream, b: Stream, side: pd.DataFrame) -> np.ndarray:
    """``bool [n_windows]``: the planted slots of the pairs on side B (there the draw reads
    stream B's window), checked: at each of them A's manifest names the pair's A fact and B's
    the pair's B fact."""
    planted = (a.manifest["kind"] == "planted").to_numpy()
    fact_a = a.manifest["fact_id"].to_numpy()
    on_b = side.loc[side["side"] == MODELS[1]]
    from_b = planted & np.isin(fact_a, on_b[f"fact_{MODELS[0]}"].to_numpy())
    partner = dict(zip(on_b[f"fact_{MODELS[0]}"], on_b[f"fact_{MODELS[1]}"], strict=True))
    got = b.manifest["fact_id"].to_numpy()[from_b]
    want = np.array([partner[f] for f in fact_a[from_b]], dtype=object)
    if not np.array_equal(got.astype(object), want):
        raise ArtifactError(
            f"streams A and B do not share the slots of paired facts ('{a.folder}', '{b.folder}'); "
            "rerun the stream step"
        )
    return from_b


def stream_of(cfg: dict[str, Any], paths: Paths, facts: pd.DataFrame, draw: int) -> Stream:
    """Random twin ``draw``'s stream: stream A with stream B's window at the planted slots of
    the pairs on side B. Its meta is A's with its own hash and, under ``twin_inputs`` and
    ``twin_info``, what the twin records it was made from (both streams' hashes, its sides)."""
    check_draw(cfg, draw)
    a, b = (open_stream(paths.stream(m)) for m in MODELS)
    side = sides(cfg, facts, draw)
    from_b = window_sides(a, b, side)
    manifest = a.manifest.copy()
    for col in manifest.columns:
        manifest[col] = np.where(from_b, b.manifest[col].to_numpy(), manifest[col].to_numpy())
    data_hash = hash_bytes(manifest["hash"].to_numpy(np.uint64).tobytes())
    meta = {
        **a.meta,
        "hash": data_hash,
        "twin_inputs": {f"stream_{m}": s.meta["hash"] for m, s in zip(MODELS, (a, b), strict=True)},
        "twin_info": {
            "random_draw": int(draw),
            "random_seed": draw_seed(cfg),
            "sides_hash": sides_hash(side),
            "pairs_on_A": int((side["side"] == MODELS[0]).sum()),
            "pairs": len(side),
            "windows_from_B": int(from_b.sum()),
            "stream_hash": data_hash,
        },
    }
    windows = MixedWindows(a.windows, b.windows, from_b)
    return replace(a, meta=meta, windows=windows, manifest=manifest)  # type: ignore[arg-type]


def sides_hash(side: pd.DataFrame) -> str:
    """xxh3 of the draw's (pair, side) list, in :data:`PAIR_KEY` order."""
    text = "\n".join(
        "\x1f".join(str(v) for v in row)
        for row in side[[*PAIR_KEY, "side"]].itertuples(index=False)
    )
    return hash_bytes(text.encode())
