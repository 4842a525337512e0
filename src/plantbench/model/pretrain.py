"""Pretrain one twin from scratch on its stream, resumably.

- Ordered loader: optimizer step ``s`` reads exactly manifest windows ``[s*B, (s+1)*B)``.
- AdamW (weight decay on matrices only), linear warm-up then cosine decay to
  ``lr * min_lr_ratio``, gradient clipping, bf16 autocast on CUDA (``train.precision``).
- Both twins start from the same initial weights (seed ``derive_seed(seed, "init")``; replicate
  r >= 1 of the study adds ``"replicate", r`` to the tags, see :mod:`plantbench.replicates`).
- Resumable state (model, optimizer, scheduler, step, loss log, every RNG state, the hashes of
  the checkpoints saved so far) is saved atomically every ``train.state_every_steps`` steps and
  when SIGTERM / SIGUSR1 arrives (Slurm sends one before a time limit or preemption; SIGURG
  too); the job then exits with code 75 so that it is retried, and the retry resumes from the
  state. On the CPU the resumed run is bit-identical, and so is every file it writes (a torch
  pickle's bytes depend on its values only: :func:`canonical`). A state is resumed only when
  it was made with this train config and stream and every checkpoint it has passed is on disk
  as saved; otherwise one warning line, and training restarts from step 0 after removing the
  stale state, checkpoints, loss log and meta (a rerun never loops on a missing checkpoint).
- HF checkpoints (``save_pretrained``) every ``train.checkpoint_every_steps`` steps and at the end,
  each with the tokenizer files and a model card (:mod:`plantbench.model.modelcard`), so
  ``AutoTokenizer`` / ``pipeline("text-generation", model=<checkpoint>)`` work on the folder.

Data-parallel training (several GPUs, or several CPU processes with gloo)
-------------------------------------------------------------------------
Launch one process per device with ``torchrun --standalone --nproc_per_node N -m plantbench.cli
pretrain ...`` or ``accelerate launch --multi_gpu --num_processes N -m plantbench.cli pretrain
...`` (both set ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``; the Snakemake rule uses torchrun when
``train.devices`` > 1). The sequence of global batches does not depend on the world size ``P``:
step ``b``'s batch of ``B`` windows is cut into micro-batches of ``train.micro_batch_windows``
(gradient accumulation), and rank ``r`` trains on micro-batches ``r, r + P, r + 2P, ...`` of it
(:func:`rank_rows`), each weighted by its summed loss over the global batch's target count, so
the update uses the mean loss over the global batch for any ``P``. On GPUs DDP all-reduces the
ranks' gradients. On the CPU (gloo) each micro-batch round's gradients are gathered and added
in rank order, which is the order one process accumulates the same micro-batches in, so ``P``
processes give bitwise the weights of one (``tests/test_multiprocess.py``). The
logged loss is the all-reduced sum of the ranks' shares. Rank 0 alone writes checkpoints, the
resumable state and the meta; every rank resumes from the same state; a stop signal seen by any
rank stops all of them after the same step. With one process the plain loop runs (no DDP, no
collectives): the CPU path is bit-identical to a single-process run of earlier versions.
``train.compile`` wraps the model in ``torch.compile`` (off by default; the CPU default study
gains nothing from it); on CUDA AdamW is fused and attention uses SDPA (flash) kernels.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io as _io
import json
import logging
import math
import os
import random
import shutil
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from plantbench import floats, io, layout, replicates
from plantbench.config import canonical_json, train_recipe
from plantbench.data import tokenizer
from plantbench.data.stream import Stream, open_stream
from plantbench.errors import EXIT_PREEMPTED, ArtifactError, Preempted
from plantbench.hashing import hash_bytes, hash_tree
from plantbench.model import modelcard
from plantbench.model.modeling import build_model, compute_device, llama_config
from plantbench.paths import MODELS, Paths
from plantbench.rng import derive_seed

log = logging.getLogger(__name__)

STATE = "state.pt"
PREFIX = "prefix"  # models/prefix/: the shared prefix, trained once
FORK = "fork.pt"  # the prefix's full training state at the fork, both twins' start
# what a resumable state holds ("checkpoints", the checkpoint hashes, only from this version on)
STATE_KEYS = frozenset(
    ("step", "model", "optimizer", "scheduler", "rng", "losses", "config_hash", "stream_hash")
)
__all__ = ["EXIT_PREEMPTED", "Preempted", "train"]
# SIGTERM: scancel / preemption; SIGUSR1: `--signal=USR1@T`; SIGURG: `--signal=URG@T`, the one
# the Slurm profile uses because the executor's job wrapper survives it (see profiles/slurm).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGURG)


def train_config_hash(cfg: dict[str, Any]) -> str:
    train = train_recipe(cfg)
    sub = {"seed": cfg["seed"], "model": cfg["model"], "train": train, **replicates.hash_part(cfg)}
    return hash_bytes(canonical_json(sub).encode())


def _cosine(step: int, total: int, cfg_train: dict[str, Any]) -> float:
    warm = max(1, int(round(cfg_train["warmup_fraction"] * total)))
    floor = float(cfg_train["min_lr_ratio"])
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def lr_factor(step: int, cfg_train: dict[str, Any]) -> float:
    """Multiplier of the peak lr used for the update of optimizer step ``step`` (0-based):
    linear warm-up then cosine decay to ``min_lr_ratio``, over the whole run; with a shared
    prefix (``prefix_steps``), over the prefix and then again over the paired part, so the
    twins read the grid on the same schedule with or without the reading curriculum before."""
    total, fork = int(cfg_train["steps"]), int(cfg_train.get("prefix_steps", 0))
    if fork and step < fork:
        return _cosine(step, fork, cfg_train)
    return _cosine(step - fork, total - fork, cfg_train)


def lr_at(step: int, cfg_train: dict[str, Any]) -> float:
    return float(cfg_train["lr"]) * lr_factor(step, cfg_train)


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a data-parallel run (world 1: a plain single-process run)."""

    rank: int
    world: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> DistInfo:
    """Join the process group set up by torchrun / ``accelerate launch`` (env ``WORLD_SIZE`` >
    1): NCCL and one GPU per local rank on CUDA, gloo on the CPU. Otherwise a world of one."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(0, 1, compute_device())
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if compute_device().type == "cuda":
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), device)


def _all_reduce(value: float, dev: DistInfo, op: str = "sum") -> float:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=dev.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return float(t.item())


def _barrier(dev: DistInfo) -> None:
    if dev.world > 1:
        import torch.distributed as dist

        dist.barrier()


def _trace_windows(
    stream: Stream, rank: int, step: int, windows: np.ndarray, batch: np.ndarray
) -> None:
    """Test hook: ``PLANTBENCH_TRACE_WINDOWS=<folder>`` appends, per rank and step, the window
    indices this rank trained on and the xxh3 of each window's tokens and the loss mask it
    trained them with (manifest hashes)."""
    folder = os.environ.get("PLANTBENCH_TRACE_WINDOWS")
    if not folder:
        return
    from plantbench.hashing import window_hashes

    idx = [int(w) for w in windows]
    rows = stream.manifest["mask_row"].to_numpy()[idx] if stream.masks is not None else None
    hashes = window_hashes(batch, stream.masks, rows)
    row = {"step": step, "windows": idx, "hashes": [int(h) for h in hashes]}
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"rank{rank}.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _autocast(precision: str, device: torch.device) -> Any:
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if use_bf16:
        if device.type == "cpu":
            return _cpu_bf16()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.autocast(device_type=device.type, enabled=False)


@contextlib.contextmanager
def _cpu_bf16() -> Any:
    """bf16 autocast on the CPU, attention in the math kernel: ATen's bf16 flash kernel packs
    for AMX where the CPU has it, which fails under the float pin's AVX2 dispatch ("pack_vnni2
    is only supported when avx512 is supported"; found by the paper preset's rehearsal)."""
    floats.lift_for_bf16()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16), sdpa_kernel(SDPBackend.MATH):
        yield


def make_optimizer(
    model: torch.nn.Module, t: dict[str, Any], device: torch.device
) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": float(t["weight_decay"])},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=float(t["lr"]),
        betas=(float(t["beta1"]), float(t["beta2"])),
        eps=1e-8,
        fused=device.type == "cuda",
    )


class _StopFlag:
    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        log.warning("received signal %d: will save state after this step and exit", signum)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _seed_global_rngs(seed: int) -> None:
    """Seed torch's, numpy's and Python's global generators. Training draws from none of them
    (the data order is the stream's, the initialisation :func:`build_model`'s own), but a
    resumable state and the fork record them, and an unseeded one would make those bytes differ
    from run to run."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def canonical(obj: Any) -> Any:
    """``obj`` rebuilt so that its torch pickle depends on its values only. Pickle writes an
    object it meets again as a reference to the first, so the bytes also said which equal parts
    were one Python object: a run resumed from a state holds the loaded loss log and optimizer
    keys beside fresh ones, equal strings that are other objects, and its ``fork.pt`` had other
    bytes than a straight run's (issue 45). Rebuilt: every string interned (one object per
    value), every tuple of plain values one object per value, every dict and list a new one,
    every tensor as it is when it is the whole of its storage (tied weights stay one storage)
    and a contiguous copy otherwise. A straight run's payload already has this form, so its
    bytes are those of earlier versions. The module names of a state dict's ``_metadata`` stay
    one object each, as ``state_dict()`` makes them (interned, the root's name ``model`` would
    be the payload's key ``model``, and a straight run's bytes would change)."""
    return _Canonical().rebuild(obj)


class _Canonical:
    def __init__(self) -> None:
        self.tuples: dict[Any, tuple[Any, ...]] = {}  # a tuple of plain values, by value

    def rebuild(self, obj: Any) -> Any:
        if type(obj) is str:
            return sys.intern(obj)
        if isinstance(obj, torch.Tensor):
            return _whole_tensor(obj)
        if type(obj) in (dict, collections.OrderedDict):
            return self._dict(obj)
        if type(obj) is list:
            return [self.rebuild(v) for v in obj]
        if type(obj) is tuple:
            items = tuple(self.rebuild(v) for v in obj)
            key = _value_key(items)
            return items if key is None else self.tuples.setdefault(key, items)
        return obj

    def _dict(self, obj: dict[Any, Any]) -> dict[Any, Any]:
        out = type(obj)((self.rebuild(k), self.rebuild(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # a module state dict's: name -> version
        if meta is not None:
            names = ((_own_str(k), self.rebuild(v)) for k, v in meta.items())
            out._metadata = type(meta)(names)  # type: ignore[attr-defined]
        return out


def _own_str(s: str) -> str:
    """An equal string that is no other string's object (what ``state_dict()`` makes)."""
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


def _value_key(obj: Any) -> Any:
    """A key equal for equal plain values of the same types only (``1``, ``1.0`` and ``True``
    differ, so do ``0.0`` and ``-0.0``); None for anything else (an array, a tensor)."""
    if type(obj) is tuple:
        keys = [_value_key(v) for v in obj]
        return None if any(k is None for k in keys) else (tuple, *keys)
    if type(obj) is float:
        return (float, struct.pack("<d", obj))
    if obj is None or type(obj) in (str, int, bool, bytes):
        return (type(obj), obj)
    return None


def _whole_tensor(t: torch.Tensor) -> torch.Tensor:
    """``t`` when it is the whole of its storage, contiguous; else a contiguous copy (a view
    would be saved with its whole storage: bytes that are not its values)."""
    t = t.detach() if t.requires_grad else t
    size = t.numel() * t.element_size()
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == size
    return t if whole else t.clone(memory_format=torch.contiguous_format)


def torch_bytes(payload: Any) -> bytes:
    """``torch.save`` of the :func:`canonical` payload, in memory (the archive's name is then
    fixed): bytes that depend on the values only."""
    buf = _io.BytesIO()
    torch.save(canonical(payload), buf)
    return buf.getvalue()


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


def _fault_injection(model_name: str, step: int) -> None:
    """Test hook: ``PLANTBENCH_FAULT=pretrain:<model>:<step>`` kills this process (SIGKILL)
    right after that step completes, as a crash would."""
    spec = os.environ.get("PLANTBENCH_FAULT", "")
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if (
            len(parts) == 3
            and parts[0] == "pretrain"
            and parts[1] in (model_name, "*")
            and int(parts[2]) == step
        ):
            marker = os.environ.get("PLANTBENCH_FAULT_ONCE")
            if marker:
                m = Path(marker)
                if m.exists():
                    return
                m.write_text(item)
            log.error("fault injection: killing pretraining of %s after step %d", model_name, step)
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class _Run:
    """One twin's training: its inputs, model, optimizer and progress (rank-local)."""

    cfg: dict[str, Any]
    paths: Paths
    name: str
    dev: DistInfo
    stream: Stream
    tok_meta: dict[str, Any]
    model: Any
    opt: torch.optim.AdamW
    sched: Any
    chash: str
    losses: list[dict[str, float]] = field(default_factory=list)
    # checkpoint name -> hash_tree of its folder, for every checkpoint saved so far (rank 0)
    checkpoint_hashes: dict[str, str] = field(default_factory=dict)
    start: int = 0
    stop: int = 0  # the step training ends at: train.steps for a twin, the fork for the prefix
    data_hash: str = ""  # what the state's data is: the stream's hash, or the prefix's
    prefix_meta: dict[str, Any] | None = None  # the prefix a twin forked from

    @property
    def t(self) -> dict[str, Any]:
        return self.cfg["train"]

    @property
    def steps(self) -> int:
        return int(self.t["steps"])

    @property
    def batch(self) -> int:
        return int(self.t["batch_windows"])

    @property
    def local_batch(self) -> int:
        return self.batch // self.dev.world

    @property
    def window(self) -> int:
        return int(self.stream.meta["info"]["window"])

    @property
    def out(self) -> Path:
        return self.paths.model(self.name)

    @property
    def state_path(self) -> Path:
        return self.paths.train_state(self.name) / STATE

    @property
    def ckpt_dir(self) -> Path:
        return self.paths.checkpoints(self.name)

    def snapshot(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "rng": _rng_state(),
            "losses": self.losses,
            "config_hash": self.chash,
            "stream_hash": self.data_hash,
            "checkpoints": dict(self.checkpoint_hashes),
        }


def _open_inputs(
    cfg: dict[str, Any], paths: Paths, model_name: str
) -> tuple[Stream, dict[str, Any]]:
    """The twin's stream and the tokenizer meta, checked against each other and train.*."""
    t = cfg["train"]
    replicates.check_owner(paths.model(model_name), io.peek_meta(paths.model(model_name)), cfg)
    stream = open_stream(paths.stream(model_name))
    replicates.check_owner(stream.folder, stream.meta, cfg)
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    io.check_input(stream.meta, "tokenizer", tok_meta, str(paths.stream(model_name)))
    info = stream.meta["info"]
    if int(info["steps"]) != int(t["steps"]) or int(info["batch_windows"]) != int(
        t["batch_windows"]
    ):
        raise ArtifactError(
            f"stream '{stream.folder}' was built for {info['steps']} steps x "
            f"{info['batch_windows']} windows "
            "but train.* asks otherwise; rerun the stream step"
        )
    return stream, tok_meta


def _setup(cfg: dict[str, Any], paths: Paths, model_name: str, dev: DistInfo) -> _Run:
    """Inputs, the initial model (same seed for both twins), optimizer and schedule."""
    t = cfg["train"]
    stream, tok_meta = _open_inputs(cfg, paths, MODELS[0] if model_name == PREFIX else model_name)
    modelcard.check_tokenizer(paths.tokenizer)  # its files go into every checkpoint
    info = stream.meta["info"]
    conf = llama_config(
        cfg["model"],
        int(info["vocab_size"]),
        int(info["window"]),
        bos=tokenizer.BOS_ID,
        eos=tokenizer.EOS_ID,
        pad=tokenizer.PAD_ID,
        attn="sdpa",
    )
    seed = derive_seed(cfg["seed"], "init", *replicates.seed_tags(cfg))
    model = build_model(conf, seed).to(dev.device)
    _seed_global_rngs(derive_seed(cfg["seed"], "global-rng", *replicates.seed_tags(cfg)))
    B, micro = int(t["batch_windows"]), int(t["micro_batch_windows"])
    if B % dev.world or (B // dev.world) % micro:
        raise ArtifactError(
            f"train.batch_windows = {B} must split evenly over {dev.world} processes into "
            f"micro-batches of train.micro_batch_windows = {micro}; change the launch or the config"
        )
    opt = make_optimizer(model, t, dev.device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))
    chash = train_config_hash(cfg)
    run = _Run(cfg, paths, model_name, dev, stream, tok_meta, model, opt, sched, chash)
    run.stop = layout.prefix_steps(cfg) if model_name == PREFIX else int(t["steps"])
    run.data_hash = prefix_hash(cfg, paths) if model_name == PREFIX else stream.meta["hash"]
    return run


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


def _checkpoint_complete(folder: Path) -> bool:
    """A ``save_pretrained`` folder with its config and weights (states of earlier versions
    recorded no checkpoint hashes)."""
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _stale_reason(run: _Run, state: dict[str, Any]) -> str | None:
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


def _load_valid_state(run: _Run) -> dict[str, Any] | None:
    """The resumable state if it can be resumed; otherwise None, after one warning line."""
    try:
        state = load_state(run.state_path)
    except ArtifactError:
        state, reason = None, "it is unreadable"
    else:
        reason = None if state is None else _stale_reason(run, state)
    if reason is not None:
        log.warning(
            "%s: not resuming from '%s': %s; restarting from step 0",
            run.name,
            run.state_path,
            reason,
        )
        return None
    return state


def _clear_outputs(run: _Run) -> None:
    """Before training from step 0: the meta first (the folder is then unfinished), the loss
    log, every checkpoint with its index, and any stale resumable state."""
    for f in (run.out / io.META, run.out / "loss.csv", run.state_path):
        f.unlink(missing_ok=True)
    shutil.rmtree(run.ckpt_dir, ignore_errors=True)
    shutil.rmtree(run.paths.moments(run.name, "x").parent, ignore_errors=True)


def _forks(run: _Run) -> bool:
    """A twin of a config with a shared prefix: it starts from the prefix's state at the fork."""
    return run.name != PREFIX and layout.prefix_steps(run.cfg) > 0


def _fork_state(run: _Run) -> dict[str, Any] | None:
    """The shared prefix's state at the fork (``models/prefix/fork.pt``), checked: made with
    this train config from this stream's prefix. None without a prefix."""
    if not _forks(run):
        return None
    folder = run.paths.model(PREFIX)
    meta = io.read_meta(folder, "prefix")  # the fork's bytes checked against its hash
    state = load_state(folder / FORK)
    want = prefix_hash(run.cfg, run.paths)
    if state is None or state["config_hash"] != run.chash or state["stream_hash"] != want:
        raise ArtifactError(
            f"'{folder / FORK}' was made with another train config or stream prefix than twin "
            f"{run.name}'s; rerun the pretrain_prefix step (plantbench prefix)"
        )
    if int(state["step"]) != layout.prefix_steps(run.cfg):
        raise ArtifactError(
            f"'{folder / FORK}' is the state after step {state['step']}, not after "
            f"train.prefix_steps = {layout.prefix_steps(run.cfg)}; rerun the pretrain_prefix step"
        )
    run.prefix_meta = meta
    return state


def _apply_state(run: _Run, state: dict[str, Any]) -> None:
    """Continue from ``state``: weights, optimizer, scheduler, every RNG, loss log, position."""
    run.model.load_state_dict(state["model"])
    run.opt.load_state_dict(state["optimizer"])
    run.sched.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    run.losses = state["losses"]
    run.start = int(state["step"])
    if run.dev.main:  # the checkpoints passed so far, as _stale_reason found them
        recorded = state.get("checkpoints") or {}
        passed = [
            layout.checkpoint_name(s) for s in layout.checkpoint_steps(run.t) if s <= run.start
        ]
        run.checkpoint_hashes = {
            n: recorded[n] if n in recorded else hash_tree(run.ckpt_dir / n) for n in passed
        }


def _resume(run: _Run, fork: bool = True) -> None:
    """Resume from the state; else, for a twin of a config with a prefix, start from the
    prefix's state at the fork (``fork=False``: from step 0 on the twin's own stream, the same
    run computed whole); else from step 0. Stale outputs are removed first."""
    state = _load_valid_state(run)
    _barrier(run.dev)  # every rank has decided before rank 0 removes anything
    if state is not None:
        _apply_state(run, state)
        if fork and _forks(run):  # the prefix it forked from: its meta's inputs, as a fork's
            run.prefix_meta = io.read_meta(run.paths.model(PREFIX), "prefix")
        log.info("resuming %s from step %d (%s)", run.name, run.start, run.state_path)
        return
    if run.dev.main:
        _clear_outputs(run)
    start = _fork_state(run) if fork else None
    if start is not None:
        _apply_state(run, start)
        log.info("%s: forked from the shared prefix at step %d", run.name, run.start)


def _network(run: _Run) -> tuple[Any, Any]:
    """(the module that runs forward/backward, the DDP wrapper or None): the model's
    target-loss forward in a single process; with P > 1 on GPUs wrapped in DDP (gradient
    all-reduce = mean over ranks; on the CPU :func:`_exact_sum` instead); optionally compiled."""
    ddp: Any = None
    net: Any = _TargetLoss(run.model)
    if run.dev.world > 1 and not _exact(run):
        device = run.dev.device
        ddp = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None
        )
        net = ddp
    if run.t.get("compile", False):
        net = torch.compile(net)
    return net, ddp


class _TargetLoss(torch.nn.Module):
    """The model's training forward: the hidden states, then the output layer only at the
    target positions (``sel``, a recall window's answers or every position of a document); what
    data-parallel training wraps."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.lm = model

    def forward(self, ids: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        h = self.lm.model(input_ids=ids).last_hidden_state[:, :-1]
        return self.lm.lm_head(h[sel])


def rank_rows(batch: int, micro: int, world: int, rank: int) -> np.ndarray:
    """The rows of a global batch that ``rank`` trains on, in its micro-batch order: its k-th
    micro-batch is the batch's micro-batch ``k * world + rank``, so the ranks' k-th
    micro-batches are consecutive in the batch (what makes :func:`_exact_sum` the
    single-process accumulation order)."""
    local = batch // world
    return np.concatenate(
        [
            np.arange((k * world + rank) * micro, (k * world + rank + 1) * micro)
            for k in range(local // micro)
        ]
    ).astype(np.int64)


def _exact(run: _Run) -> bool:
    """Data-parallel on the CPU: the ranks' gradients are gathered and added in the
    single-process order (bitwise one process); on GPUs DDP's all-reduce."""
    return run.dev.world > 1 and run.dev.device.type == "cpu"


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat(
        [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params]
    )


def _exact_sum(params: list[torch.nn.Parameter], acc: torch.Tensor | None) -> torch.Tensor:
    """Add every rank's gradient of this micro-batch round to ``acc`` in rank order: the
    rounds' micro-batches are consecutive in the global batch (:func:`rank_rows`), so this is
    the order in which one process accumulates them, and every rank gets the same bits."""
    import torch.distributed as dist

    mine = _flat_grads(params)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine)
    for part in parts:
        acc = part.clone() if acc is None else acc.add_(part)
    assert acc is not None
    return acc


def _set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    start = 0
    for p in params:
        p.grad = flat[start : start + p.numel()].view_as(p)  # views of this step's sum
        start += p.numel()


def _step_loss(run: _Run, net: Any, ddp: Any, step: int) -> float:
    """Forward and backward of this rank's share of optimizer step ``step``'s batch; returns
    its share of the batch's loss: the summed cross-entropy of the target tokens (a recall
    window's loss mask, every next token elsewhere) over the global batch's target count."""
    t, dev, B_local = run.t, run.dev, run.local_batch
    micro = int(t["micro_batch_windows"])
    idx = rank_rows(run.batch, micro, dev.world, dev.rank)
    rows = run.stream.batch(step)[idx]
    _trace_windows(run.stream, dev.rank, step, step * run.batch + idx, rows)
    mask = run.stream.batch_mask(step)[:, 1:].astype(bool)
    n_targets = max(1, int(mask.sum()))  # the global batch's, the same on every rank
    batch = torch.from_numpy(rows.astype(np.int64)).to(dev.device)
    sel_all = torch.from_numpy(mask[idx]).to(dev.device)
    run.opt.zero_grad(set_to_none=True)
    exact = _exact(run)
    params = [p for p in run.model.parameters() if p.requires_grad]
    # DDP averages the ranks' gradients: each rank's share counts world times there
    scale = (1 if exact else dev.world) / n_targets
    total, acc = 0.0, None
    for m0 in range(0, B_local, micro):
        ids, sel = batch[m0 : m0 + micro], sel_all[m0 : m0 + micro]
        sync = ddp is None or m0 + micro >= B_local  # all-reduce on the last micro-batch
        if exact:
            run.opt.zero_grad(set_to_none=True)
        with contextlib.nullcontext() if sync else ddp.no_sync():
            with _autocast(t["precision"], dev.device):
                logits = net(ids, sel)
            loss = torch.nn.functional.cross_entropy(
                logits.float(), ids[:, 1:][sel], reduction="sum"
            )
            (loss * scale).backward()
        if exact:
            acc = _exact_sum(params, acc)
        total += float(loss.detach()) / n_targets
    if acc is not None:
        _set_grads(params, acc)
    return total


def _save_progress(run: _Run, done: int, stopping: bool) -> None:
    """Rank 0: the HF checkpoint after a checkpoint step, the resumable state when due."""
    if not run.dev.main:
        return
    if done in layout.checkpoint_steps(run.t):
        name = layout.checkpoint_name(done)
        with io.atomic_dir(run.ckpt_dir / name) as tmp:
            run.model.save_pretrained(tmp)
            params = sum(p.numel() for p in run.model.parameters())
            twin = modelcard.Twin(run.cfg, run.paths, run.name, run.stream, run.chash, params)
            modelcard.complete_checkpoint(tmp, twin, done)
        run.checkpoint_hashes[name] = hash_tree(run.ckpt_dir / name)
        save_moments(
            run.paths.moments(run.name, name), run.model, run.opt, run.checkpoint_hashes[name]
        )
    if done % int(run.t["state_every_steps"]) == 0 or done == run.stop or stopping:
        save_state(run.state_path, run.snapshot(done))


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


def _log_rank(run: _Run) -> None:
    if run.dev.world > 1:
        B_local = run.local_batch
        log.info(
            "%s: rank %d of %d on %s, windows [b*%d + %d, +%d) per step, %d micro-batches",
            run.name,
            run.dev.rank,
            run.dev.world,
            run.dev.device,
            run.batch,
            run.dev.rank * B_local,
            B_local,
            B_local // int(run.t["micro_batch_windows"]),
        )


def _train_steps(run: _Run) -> None:
    """Optimizer steps from ``run.start`` to the end; a stop signal saves the state and raises
    :class:`Preempted` after the current step."""
    flag = _StopFlag()
    old = {s: signal.signal(s, flag) for s in STOP_SIGNALS}
    dev, steps = run.dev, run.stop
    run.model.train()
    net, ddp = _network(run)
    _log_rank(run)
    t0, tok_seen = time.time(), 0
    try:
        for step in range(run.start, steps):
            total = _step_loss(run, net, ddp, step)
            if dev.world > 1:
                total = _all_reduce(total, dev)
                if _all_reduce(float(flag.signal or 0), dev, "max") and flag.signal is None:
                    flag.signal = -1  # another rank was signalled: stop after this step too
            gnorm = torch.nn.utils.clip_grad_norm_(
                run.model.parameters(), float(run.t["grad_clip"])
            )
            lr = run.opt.param_groups[0]["lr"]
            run.opt.step()
            run.sched.step()
            run.losses.append({"step": step, "lr": lr, "loss": total, "grad_norm": float(gnorm)})
            tok_seen += run.batch * run.window
            done = step + 1
            _save_progress(run, done, flag.signal is not None)
            if flag.signal is not None and done < steps:
                _barrier(dev)  # the state is on disk before any rank exits
                raise Preempted(
                    f"stopped by signal {flag.signal} after step {done}; "
                    f"state saved to '{run.state_path}'"
                )
            if done % max(1, steps // 20) == 0 or done == steps:
                rate = tok_seen / max(1e-9, time.time() - t0)
                log.info(
                    "%s step %d/%d loss %.4f lr %.2e %.0f tok/s",
                    run.name,
                    done,
                    steps,
                    total,
                    lr,
                    rate,
                )
            _fault_injection(run.name, done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _loss_csv(run: _Run) -> str:
    buf = _io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["step", "tokens", "lr", "loss", "grad_norm"])
    for r in run.losses:
        w.writerow(
            [
                r["step"],
                (r["step"] + 1) * run.batch * run.window,
                repr(r["lr"]),
                repr(r["loss"]),
                repr(r["grad_norm"]),
            ]
        )
    return buf.getvalue()


def _write_outputs(run: _Run) -> dict[str, Any]:
    """Rank 0: the loss log and checkpoint index, then the artifact meta (written last)."""
    t, out, ckpt_dir, steps = run.t, run.out, run.ckpt_dir, run.steps
    B, W = run.batch, run.window
    io.write_text(out / "loss.csv", _loss_csv(run))
    index = [
        {
            "name": layout.checkpoint_name(s),
            "step": s,
            "tokens": s * B * W,
            "lr": lr_at(s - 1, t),
            "hash": hash_tree(ckpt_dir / layout.checkpoint_name(s)),
        }
        for s in layout.checkpoint_steps(t)
    ]
    io.write_json(ckpt_dir / "index.json", index)
    files = ["loss.csv", "checkpoints/index.json"]
    # only the indexed checkpoints: a process killed inside atomic_dir (SIGKILL, OOM) leaves a
    # hidden ``.step_*.tmp`` folder behind, which must not become part of the artifact
    files += sorted(
        p.relative_to(out).as_posix()
        for c in index
        for p in (ckpt_dir / c["name"]).rglob("*")
        if p.is_file()
    )
    tail = [r["loss"] for r in run.losses[-max(1, steps // 20) :]]
    return io.write_meta(
        out,
        "pretrain",
        files,
        config_hash=run.chash,
        inputs={
            "stream": run.stream.meta["hash"],
            "tokenizer": run.tok_meta["hash"],
            **({"prefix": run.prefix_meta["hash"]} if run.prefix_meta else {}),
        },
        info={
            "model": run.name,
            **replicates.hash_part(run.cfg),
            "params": sum(p.numel() for p in run.model.parameters()),
            "steps": steps,
            "tokens": steps * B * W,
            "final_loss": float(np.mean(tail)),
            "final_loss_window": len(tail),
            "checkpoints": [c["name"] for c in index],
            "final_checkpoint": index[-1]["name"],
        },
    )


def train(
    cfg: dict[str, Any],
    paths: Paths,
    model_name: str,
    *,
    threads: int | None = None,
    fork: bool = True,
) -> dict[str, Any]:
    """Train one twin to ``train.steps`` (or, ``model_name`` = ``prefix``, the shared prefix to
    ``train.prefix_steps``), resuming from its state when that state is for this config and
    stream and every checkpoint it has passed is still on disk; otherwise (one warning line)
    from the prefix's state at the fork, or from step 0, with the stale state and checkpoints
    removed. ``fork=False`` trains a twin whole from step 0 (the same run: a test's check)."""
    torch.set_num_threads(int(threads or cfg["train"]["threads"]))
    dev = init_distributed()
    run = _setup(cfg, paths, model_name, dev)
    _resume(run, fork=fork)
    _train_steps(run)
    if not dev.main:
        _barrier(dev)  # rank 0 writes the loss log and the meta
        return io.read_meta(run.out, "prefix" if model_name == PREFIX else "pretrain", verify=False)
    meta = _write_prefix_outputs(run) if model_name == PREFIX else _write_outputs(run)
    _barrier(dev)
    return meta


def _write_prefix_outputs(run: _Run) -> dict[str, Any]:
    """Rank 0: the prefix's loss log and its full state at the fork, then the meta."""
    out, B, W = run.out, run.batch, run.window
    io.write_text(out / "loss.csv", _loss_csv(run))
    save_state(out / FORK, run.snapshot(run.stop))
    tail = [r["loss"] for r in run.losses[-max(1, run.stop // 20) :]]
    counts = run.stream.manifest["kind"].iloc[: run.stop * B].value_counts().to_dict()
    return io.write_meta(
        out,
        "prefix",
        ["loss.csv", FORK],
        config_hash=run.chash,
        inputs={
            **{
                f"stream_{m}": open_stream(run.paths.stream(m), verify=False).meta["hash"]
                for m in MODELS
            },
            "tokenizer": run.tok_meta["hash"],
        },
        info={
            **replicates.hash_part(run.cfg),
            "prefix_windows_hash": run.data_hash,
            "params": sum(p.numel() for p in run.model.parameters()),
            "steps": run.stop,
            "tokens": run.stop * B * W,
            "windows": {k: int(v) for k, v in sorted(counts.items())},
            "final_loss": float(np.mean(tail)) if tail else None,
        },
    )
