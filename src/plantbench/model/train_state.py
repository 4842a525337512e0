"""Pretraining's resumable state: what it holds (model, optimizer, scheduler, step, loss log,
every RNG state, the hashes of the checkpoints saved so far, and what it was made with: the
train config's hash and the stream's, or the prefix's), how it is saved (bytes that depend on
the values only, :mod:`plantbench.model.canonical`) and read, why a state on disk cannot be
resumed, and how a run continues from one (its own, or the prefix's at the fork). Also Adam's
second moments, saved beside every checkpoint. Which state a run starts from is decided in
:mod:`plantbench.model.pretrain`."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plantbench import io, layout, replicates
from plantbench.config import canonical_json, train_recipe
from plantbench.data.stream import open_stream
from plantbench.errors import ArtifactError
from plantbench.hashing import hash_bytes, hash_tree
from plantbench.model import modelcard
from plantbench.model.canonical import torch_bytes
from plantbench.model.train_run import Run
from plantbench.paths import MODELS, Paths

# what a resumable state holds ("checkpoints", the checkpoint hashes, only from this version on)
STATE_KEYS = frozenset(
    ("step", "model", "optimizer", "scheduler", "rng", "losses", "config_hash", "stream_hash")
)


def train_config_hash(cfg: dict[str, Any]) -> str:
    train = train_recipe(cfg)
    sub = {"seed": cfg["seed"], "model": cfg["model"], "train": train, **replicates.hash_part(cfg)}
    return hash_bytes(canonical_json(sub).encode())


def prefix_hash(cfg: dict[str, Any], paths: Paths) -> str:
    """xxh3 of the shared prefix's window hashes (tokens and loss masks), refused unless both
    streams hold the same prefix."""
    n = layout.prefix_windows(cfg)
    hashes = {}
    for m in MODELS:
        man = open_stream(paths.stream(m), verify=False).manifest
        hashes[m] = man["hash"].to_numpy(np.uint64)[:n]
    if not np.array_equal(hashes[MODELS[0]], hashes[MODELS[1]]):
        first = int(np.flatnonzero(hashes[MODELS[0]] != hashes[MODELS[1]])[0])
        raise ArtifactError(
            f"the streams differ at window {first}, inside the shared prefix of {n} windows "
            "(train.prefix_steps x train.batch_windows); rerun the stream step"
        )
    return hash_bytes(hashes[MODELS[0]].tobytes())


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def seed_global_rngs(seed: int) -> None:
    """Seed torch's, numpy's and Python's global generators. Training draws from none of them
    (the data order is the stream's, the initialisation
    :func:`~plantbench.model.modeling.build_model`'s own), but a resumable state and the fork
    record them, and an unseeded one would make those bytes differ from run to run."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def snapshot(run: Run, step: int) -> dict[str, Any]:
    """The resumable state of ``run`` after ``step`` optimizer steps."""
    return {
        "step": step,
        "model": run.model.state_dict(),
        "optimizer": run.opt.state_dict(),
        "scheduler": run.sched.state_dict(),
        "rng": rng_state(),
        "losses": run.losses,
        "config_hash": run.chash,
        "stream_hash": run.data_hash,
        "checkpoints": dict(run.checkpoint_hashes),
    }


def save_state(path: Path, payload: dict[str, Any]) -> None:
    io.write_bytes(path, torch_bytes(payload))


def load_state(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ArtifactError(
            f"resumable state '{path}' is unreadable ({type(exc).__name__}); "
            "delete it to restart training"
        ) from None


def second_moments(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Adam's ``exp_avg_sq`` of every parameter that has one, by parameter name (float32, CPU)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group in opt.param_groups:
        for p in group["params"]:
            v = opt.state.get(p, {}).get("exp_avg_sq")
            if v is not None:
                out[names[id(p)]] = v.detach().float().cpu().clone()
    return out


def save_moments(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, checkpoint_hash: str
) -> None:
    """Save Adam's second moments beside a checkpoint (TrackStar's correction reads them), with
    the optimizer's ``eps`` and the hash of the checkpoint they belong to. The checkpoint folder
    and the model's meta are untouched: the file lies in ``models/<twin>/moments/``."""
    record = {
        "exp_avg_sq": second_moments(model, opt),
        "eps": float(opt.param_groups[0]["eps"]),
        "checkpoint_hash": checkpoint_hash,
    }
    data = torch_bytes(record)
    with io.atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _checkpoint_complete(folder: Path) -> bool:
    """A ``save_pretrained`` folder with its config and weights (states of earlier versions
    recorded no checkpoint hashes)."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def stale_reason(run: Run, state: dict[str, Any]) -> str | None:
    """Why ``state`` cannot be resumed (None: it can): made for another config or stream, or a
    checkpoint it has already passed is missing, incomplete or changed (resuming would never
    write it again)."""
    if not isinstance(state, dict) or not STATE_KEYS <= state.keys():
        return "it is not a resumable state of this version"
    if state["config_hash"] != run.chash or state["stream_hash"] != run.data_hash:
        return "it was made with another train config or stream"
    recorded = state.get("checkpoints")
    for s in layout.checkpoint_steps(run.t):
        if s > int(state["step"]):
            break
        name = layout.checkpoint_name(s)
        folder = run.ckpt_dir / name
        if not folder.is_dir():
            return f"checkpoint {name} is missing"
        problem = modelcard.checkpoint_problem(folder, run.tok_meta)
        if problem is not None:
            return f"checkpoint {name}: {problem}"
        if recorded is None:
            if not _checkpoint_complete(folder):
                return f"checkpoint {name} is incomplete"
        elif name not in recorded or hash_tree(folder) != recorded[name]:
            return f"checkpoint {name} differs from the one saved with the state"
    return None


def apply_state(run: Run, state: dict[str, Any]) -> None:
    """Continue from ``state``: weights, optimizer, scheduler, every RNG, loss log, position."""
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    run.losses = state["losses"]
    run.start = int(state["step"])
    if run.dev.main:  # the checkpoints passed so far, as stale_reason found them
        recorded = state.get("checkpoints") or {}
        passed = [
            layout.checkpoint_name(s) for s in layout.checkpoint_steps(run.t) if s <= run.start
        ]
        run.checkpoint_hashes = {
            n: recorded[n] if n in recorded else hash_tree(run.ckpt_dir / n) for n in passed
        }
