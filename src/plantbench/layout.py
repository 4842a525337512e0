"""What a config implies, without opening anything: counts, names and files of every artifact.

Pure functions of the config (no torch, no file read): how many windows the stream has and where
the position spans lie, the checkpoints a finished twin has (the final one and the TracIn ones),
the pool's size and its feature shards, the projection seed and dimensions, the fidelity subset
and sweep, the EK-FAC query chunks, and which files a method's needs are. The Snakefile's rules files
import this module (with :mod:`plantbench.paths` and the torch-free method registry), so parsing
the job graph imports no stage and no torch; every stage asks the same functions, so a count is defined once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from plantbench.errors import ConfigError
from plantbench.paths import MODELS, Paths
from plantbench.rng import derive_seed

META = "meta.json"  # every artifact folder's record (plantbench.io.META)
SHARD_JSON = "shard.json"  # a gradient shard's record (plantbench.attribution.gradients)
POOL_NPY = "pool.npy"  # pool-window vectors of a vector feature (hidden, embed)
QUERIES_NPY = "queries.npy"  # query vectors of a vector feature
POOL_FILE = "pool.parquet"  # a twin's pool table
POOL_COLUMNS = ["row", "window", "kind", "fact_id", "doc_id", "hash"]
EKFAC_MEMORY_BYTES = 3 << 30  # preconditioned float32 query gradients held at once (3 GiB)
FIDELITY_MEMORY_BYTES = 3 << 30  # float64 query gradients held at once by the fidelity stage
# characters of text per tokenizer call of the stream step: the encodings hold about 27 bytes a
# character until their ids are copied out (measured: 164 MB for a 6 MB call, 28 MB at 1 MB)
ENCODE_CHARS = 1 << 20
DEFAULT_CONTEXT_SEGMENTS = 2  # when causal.context_segments is absent (the default study sets 4)


# --------------------------------------------------------------------------- the stream


def token_bytes(vocab_size: int) -> int:
    """Bytes of a stored token id: 2 (uint16) when the vocabulary fits, else 4 (uint32)."""
    return 2 if vocab_size <= 1 << 16 else 4


def n_windows(cfg: Mapping[str, Any]) -> int:
    """Training windows of each twin's stream: optimizer steps x windows per step."""
    return int(cfg["train"]["steps"]) * int(cfg["train"]["batch_windows"])


def prefix_steps(cfg: Mapping[str, Any]) -> int:
    """Optimizer steps of the shared prefix (``train.prefix_steps``, default 0): the same
    windows in both streams, trained once; the twins fork after it."""
    return int(cfg["train"].get("prefix_steps", 0))


def random_draws(cfg: Mapping[str, Any]) -> int:
    """Random twins the run trains (``random_twins.m``, default 0: none;
    :mod:`plantbench.randomtwins`)."""
    return int(cfg.get("random_twins", {}).get("m", 0))


def prefix_windows(cfg: Mapping[str, Any]) -> int:
    """Windows of the shared prefix: the stream's first ``prefix_steps x batch_windows``."""
    return prefix_steps(cfg) * int(cfg["train"]["batch_windows"])


def paired_windows(cfg: Mapping[str, Any]) -> range:
    """The paired part of the stream: every window after the prefix."""
    return range(prefix_windows(cfg), n_windows(cfg))


def span_windows(cfg: Mapping[str, Any], position: str) -> range:
    """The stream windows of one position span: ``stream.position_spans`` are fractions of
    the paired part (the whole stream without a prefix)."""
    paired = paired_windows(cfg)
    lo, hi = cfg["stream"]["position_spans"][position]
    n = len(paired)
    return range(paired.start + int(math.floor(lo * n)), paired.start + int(math.floor(hi * n)))


def episode_share(cfg: Mapping[str, Any]) -> float:
    return float(cfg["stream"].get("episode_share", 0.0))


def episode_count(cfg: Mapping[str, Any], windows: int) -> int:
    """How many reading-episode windows a stream of ``windows`` windows holds."""
    return int(round(episode_share(cfg) * windows))


def recall_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """``stream.recall`` with its defaults (absent: no recall windows)."""
    r = dict(cfg["stream"].get("recall") or {})
    return {
        "prefix_share": float(r.get("prefix_share", 0.0)),
        "paired_share": float(r.get("paired_share", 0.0)),
        "ramp": float(r.get("ramp", 0.4)),
        "loss": str(r.get("loss", "answers")),
    }


def recall_counts(cfg: Mapping[str, Any]) -> dict[str, int]:
    """Recall windows in the shared prefix and in the paired part."""
    r = recall_settings(cfg)
    return {
        "prefix": int(round(r["prefix_share"] * prefix_windows(cfg))),
        "paired": int(round(r["paired_share"] * len(paired_windows(cfg)))),
    }


def context_segments(cfg: Mapping[str, Any]) -> int:
    """Segments of the in-context check's contexts (``causal.context_segments``)."""
    return int(cfg["causal"].get("context_segments", DEFAULT_CONTEXT_SEGMENTS))


# --------------------------------------------------------------------------- checkpoints


def checkpoint_steps(cfg_train: Mapping[str, Any]) -> list[int]:
    """Optimizer steps after which a twin's HF checkpoint is saved: every
    ``checkpoint_every_steps`` counted from the fork (``prefix_steps``, 0 without a prefix), and
    the last step."""
    steps, every = int(cfg_train["steps"]), int(cfg_train["checkpoint_every_steps"])
    fork = int(cfg_train.get("prefix_steps", 0))
    return sorted({*range(fork + every, steps + 1, every), steps})


def checkpoint_name(step: int) -> str:
    """Folder name of the checkpoint saved after ``step`` optimizer steps."""
    return f"step_{int(step):07d}"


def checkpoint_names(cfg: Mapping[str, Any]) -> list[str]:
    """Every checkpoint a finished model of this config has, oldest first."""
    return [checkpoint_name(s) for s in checkpoint_steps(cfg["train"])]


def final_checkpoint(cfg: Mapping[str, Any]) -> str:
    """The name of the last checkpoint (the one every single-checkpoint method reads)."""
    return checkpoint_names(cfg)[-1]


def tracin_checkpoints(cfg: Mapping[str, Any]) -> list[str]:
    """``features.tracin_checkpoints`` checkpoint names, evenly spaced over the model's
    checkpoints with the last one included (all of them if there are fewer)."""
    names = checkpoint_names(cfg)
    n, k = len(names), int(cfg["features"]["tracin_checkpoints"])
    if k >= n:
        return names
    return [names[(i + 1) * n // k - 1] for i in range(k)]


# --------------------------------------------------------------------------- the pool


def n_cells(cfg: Mapping[str, Any]) -> int:
    """The grid's cells: domain x documents per fact x position x twin."""
    f = cfg["facts"]
    return len(f["domains"]) * len(f["n_docs"]) * len(f["positions"]) * len(MODELS)


def n_facts(cfg: Mapping[str, Any]) -> int:
    return n_cells(cfg) * int(cfg["facts"]["facts_per_cell"])


def planted_per_position(cfg: Mapping[str, Any]) -> int:
    """Planted windows of one position's span in one twin's stream (A's and B's facts of a cell
    and pair share their slots, so both twins plant this many there)."""
    f = cfg["facts"]
    return len(f["domains"]) * int(f["facts_per_cell"]) * sum(int(x) for x in f["n_docs"])


# The linears of every transformer block that attribution takes gradients of: attention's
# q, k, v and o, and the SwiGLU's gate, up and down projections. The model's own list at run
# time (plantbench.model.modeling.block_linear_names) is checked against it; the plan and the
# benchmarks count with it.
BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tracked_linears(n_layer: int) -> int:
    """How many linears gradients are taken of in a model of ``n_layer`` blocks."""
    return len(BLOCK_LINEARS) * int(n_layer)


def pool_counts(cfg: Mapping[str, Any]) -> dict[str, int]:
    """Planted, distractor and random background windows of one model's pool (from the config
    alone: each fact has its own entity, and both twins have the same grid)."""
    f = cfg["facts"]
    planted = planted_per_position(cfg) * len(f["positions"])
    distractor = n_facts(cfg) * int(f["distractors_per_entity"])
    n = n_windows(cfg)
    # A and B share planted slots; reading episodes and recall windows are not background
    recall = sum(recall_counts(cfg).values())
    background = n - planted - distractor - episode_count(cfg, n) - recall
    random = min(int(cfg["pool"]["random_windows"]), max(background, 0))
    return {"planted": planted, "distractor": distractor, "background": random}


def pool_size(cfg: Mapping[str, Any]) -> int:
    """Number of windows in each model's pool (``pool.random_windows`` is capped at the number
    of background windows in the stream)."""
    return sum(pool_counts(cfg).values())


def n_shards(cfg: Mapping[str, Any]) -> int:
    """Feature shards per checkpoint (one Slurm job each): ``features.shard_windows`` a shard."""
    return max(1, math.ceil(pool_size(cfg) / int(cfg["features"]["shard_windows"])))


def shard_range(cfg: Mapping[str, Any], shard: int, n_pool: int) -> tuple[int, int]:
    """Pool rows ``[start, stop)`` of one feature shard."""
    s = int(cfg["features"]["shard_windows"])
    return shard * s, min((shard + 1) * s, n_pool)


# --------------------------------------------------------------------------- projection


def projection_seed(cfg: Mapping[str, Any]) -> int:
    return derive_seed(cfg["seed"], "logra-projection")


def grad_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The projection's settings, as recorded in every gradient shard's identity."""
    f = cfg["features"]
    return {
        "projection": f["projection"],
        **(
            {"dims": int(f["grad_dims"])}
            if f["projection"] == "sketch"
            else {"k_in": int(f["grad_k_in"]), "k_out": int(f["grad_k_out"])}
        ),
        "dtype": f["grad_dtype"],
        "projection_seed": projection_seed(cfg),
    }


def grad_dims(cfg: Mapping[str, Any], n_modules: int) -> int:
    """Projected gradient dimensions: ``features.grad_dims`` for a sketch, ``n_modules x k_out x
    k_in`` for LoGra."""
    f = cfg["features"]
    if f["projection"] == "sketch":
        return int(f["grad_dims"])
    return n_modules * int(f["grad_k_in"]) * int(f["grad_k_out"])


def query_chunks(
    n_q: int, n_params: int, bytes_per_value: int, budget: int
) -> list[tuple[int, int]]:
    """Query ranges whose gradients (``n_params`` values of ``bytes_per_value`` each) fit in
    ``budget`` bytes: one pass over the pool per range."""
    step = max(1, budget // (bytes_per_value * n_params))
    return [(s, min(s + step, n_q)) for s in range(0, n_q, step)]


def ekfac_memory_bytes(cfg: Mapping[str, Any]) -> int:
    """EK-FAC's memory bound: ``curvature.ekfac_memory_mb`` (default :data:`EKFAC_MEMORY_BYTES`)."""
    mb = cfg.get("curvature", {}).get("ekfac_memory_mb")
    return EKFAC_MEMORY_BYTES if mb is None else int(mb) << 20


def ekfac_query_chunks(
    n_q: int, n_params: int, budget: int = EKFAC_MEMORY_BYTES
) -> list[tuple[int, int]]:
    """EK-FAC's query ranges: preconditioned float32 query gradients of at most ``budget``
    bytes (one at the default size; many at the paper size)."""
    return query_chunks(n_q, n_params, 4, budget)


ASTRA_DEFAULTS: dict[str, Any] = {
    "steps": 3,
    "damping_ratio": 0.1,
    "windows": 64,
    "step_size": "auto",
}
"""``methods.astra``'s defaults (ekfac_astra, :mod:`plantbench.attribution.ekfac.astra`)."""
ASTRA_POWER_STEPS = 10  # power iterations of ASTRA's automatic step size (within ~1% in the tests)


def astra_enabled(cfg: Mapping[str, Any]) -> bool:
    """Whether the final checkpoint's ``ekfac`` step also refines with ASTRA (``ekfac_astra`` is
    in ``methods.enabled``)."""
    return "ekfac_astra" in cfg["methods"]["enabled"]


def astra_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ASTRA's settings: ``methods.astra`` over :data:`ASTRA_DEFAULTS` (recorded with its scores,
    checked by the method that reads them)."""
    return {**ASTRA_DEFAULTS, **dict(cfg["methods"].get("astra") or {})}


# --------------------------------------------------------------------------- fidelity


def fidelity_windows(cfg: Mapping[str, Any]) -> int:
    """Pool windows of the fidelity subset (``fidelity.windows``, default 300)."""
    return int(cfg.get("fidelity", {}).get("windows", 300))


def sweep_dims(cfg: Mapping[str, Any]) -> list[int]:
    """Per-module projection sizes ``k`` (``k x k``) the fidelity sweep measures (default none)."""
    return [int(k) for k in cfg.get("fidelity", {}).get("sweep", [])]


def sketch_sweep_dims(cfg: Mapping[str, Any]) -> list[int]:
    """Count-sketch sizes ``D`` the fidelity sweep measures (default none)."""
    return [int(k) for k in cfg.get("fidelity", {}).get("sketch_sweep", [])]


# --------------------------------------------------------------------------- feature files


def ekfac_folder(cfg: Mapping[str, Any], paths: Paths, model: str, checkpoint: str) -> Path:
    """Where a checkpoint's EK-FAC scores live: ``ekfac/`` for the final one (the ``ekfac``
    method), ``ekfac_tracin/<checkpoint>/`` for the other TracIn checkpoints (``tracin_ekfac``)."""
    if checkpoint == final_checkpoint(cfg):
        return paths.ekfac(model)
    if checkpoint not in tracin_checkpoints(cfg):
        raise ConfigError(
            f"EK-FAC at '{checkpoint}': only the TracIn checkpoints have a step "
            f"({', '.join(tracin_checkpoints(cfg))})"
        )
    return paths.ekfac(model, checkpoint)


def _grad_files(cfg: Mapping[str, Any], p: Paths, model: str, ckpts: list[str]) -> list[Path]:
    files = []
    for c in ckpts:
        files += [p.pool_shard(model, c, k) / SHARD_JSON for k in range(n_shards(cfg))]
        files.append(p.query_grads(model, c) / SHARD_JSON)
    return files


def feature_files(cfg: dict[str, Any], model: str, needs: Sequence[str]) -> list[str]:
    """Files a method with these ``needs`` (:data:`plantbench.attribution.methods.registry.FEATURES`)
    reads."""
    p = Paths(cfg)
    final, tracin = final_checkpoint(cfg), tracin_checkpoints(cfg)
    by_need = {
        "text": lambda: [p.stream(model) / META, p.tokenizer / META],
        "hidden": lambda: [p.hidden(model) / META],
        "embed": lambda: [p.embed(model) / META],
        "grads": lambda: _grad_files(cfg, p, model, [final]),
        "grads_tracin": lambda: _grad_files(cfg, p, model, tracin),
        "curvature": lambda: [p.curvature(model, final)],
        "curvature_tracin": lambda: [p.curvature(model, c) for c in tracin],
        "ekfac": lambda: [p.ekfac(model) / META],
        "ekfac_tracin": lambda: [ekfac_folder(cfg, p, model, c) / META for c in tracin],
        "trackstar": lambda: [p.trackstar(model) / META],
    }
    out: list[str] = []
    for need in needs:
        if need not in by_need:
            raise ConfigError(f"unknown feature need '{need}'")
        out += [str(f) for f in by_need[need]() if str(f) not in out]
    return out
