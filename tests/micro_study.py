"""A micro study (4 facts, 1-layer model, 20 steps) built once per test process through the
plantbench step functions, for the pool / features / scoring tests. Not a test module."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

from plantbench import config, layout

ROOT = Path(__file__).resolve().parents[1]

MICRO = {
    "facts": {
        "domains": ["world"],
        "n_docs": [2],
        "positions": ["early", "late"],
        "facts_per_cell": 1,
    },
    "corpus": {"max_bytes": 400000},
    "tokenizer": {"vocab_size": 1024},
    "stream": {"window": 256},
    "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "intermediate": 64},
    "train": {
        "steps": 20,
        "prefix_steps": 0,
        "batch_windows": 4,
        "micro_batch_windows": 4,
        "lr": 3.0e-3,
        "checkpoint_every_steps": 10,
        "state_every_steps": 10,
    },
    "pool": {"random_windows": 20},
    "features": {
        "grad_dims": 48,
        "grad_k_in": 4,
        "grad_k_out": 2,
        "batch_windows": 8,
        "shard_windows": 16,
        "tracin_checkpoints": 2,
    },
    "scoring": {"query_block": 3, "pool_block": 7, "top_k": 5},
}

_BUILT: dict[str, Any] = {}


def micro_cfg(results: Path, **over: Any) -> dict[str, Any]:
    return config.load(
        [ROOT / "config.yaml"], config.deep_merge(MICRO, {"results": str(results), **over})
    )


def build_upstream() -> tuple[dict[str, Any], Any]:
    """facts .. pretrain + pool for both twins, once per process; returns (cfg, Paths)."""
    if "cfg" not in _BUILT:
        from plantbench.attribution import pool
        from plantbench.data import corpus, facts, stream, tokenizer
        from plantbench.model import pretrain
        from plantbench.paths import MODELS, Paths

        top = Path(tempfile.mkdtemp(prefix="plantbench_micro_"))
        atexit.register(shutil.rmtree, top, True)
        root = top / "results"
        cfg = micro_cfg(root)
        p = Paths(cfg)
        facts.run(cfg, p.facts)
        corpus.run(cfg, p.corpus)
        tokenizer.run(cfg, p.corpus, p.tokenizer)
        stream.build(cfg, p)
        for m in MODELS:
            pretrain.train(cfg, p, m, threads=1)
            pool.build(cfg, p, m)
        _BUILT["cfg"], _BUILT["paths"] = cfg, p
    return _BUILT["cfg"], _BUILT["paths"]


def build_grad_features(model: str = "A") -> None:
    """Pool + query gradients and curvature at every TracIn checkpoint of ``model``."""
    key = f"grads_{model}"
    if key not in _BUILT:
        from plantbench.attribution import features

        cfg, p = build_upstream()
        for ck in layout.tracin_checkpoints(cfg):
            for k in range(layout.n_shards(cfg)):
                features.grads_pool(cfg, p, model, ck, k)
            features.grads_queries(cfg, p, model, ck)
            features.curvature(cfg, p, model, ck)
        _BUILT[key] = True
