"""Pretrain one twin from scratch on its stream, resumably.

- Ordered loader: optimizer step ``s`` reads exactly manifest windows ``[s*B, (s+1)*B)``.
- AdamW (weight decay on matrices only), linear warm-up then cosine decay to
  ``lr * min_lr_ratio``, gradient clipping, bf16 autocast on CUDA (``train.precision``).
- Both twins start from the same initial weights (seed ``derive_seed(seed, "init")``).
- Resumable state (model, optimizer, scheduler, step, loss log, every RNG state) is saved
  atomically every ``train.state_every_steps`` steps and when SIGTERM / SIGUSR1 arrives (Slurm
  sends one before a time limit or preemption; SIGURG too); the job then exits with code 75 so
  that it is retried, and the retry resumes from the state. On the CPU the resumed run is
  bit-identical.
- HF checkpoints (``save_pretrained``) every ``train.checkpoint_every_steps`` steps and at the end.

Data-parallel training (several GPUs, or several CPU processes with gloo)
-------------------------------------------------------------------------
Launch one process per device with ``torchrun --standalone --nproc_per_node N -m plantbench.cli
pretrain ...`` or ``accelerate launch --multi_gpu --num_processes N -m plantbench.cli pretrain
...`` (both set ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``; the Snakemake rule uses torchrun when
``train.devices`` > 1). The sequence of global batches does not depend on the world size ``P``:
rank ``r`` of step ``b`` reads windows ``[b*B + r*B/P, b*B + (r+1)*B/P)`` in micro-batches of
``train.micro_batch_windows`` (gradient accumulation), each micro-batch's mean loss weighted by
``micro / (B/P)``; DDP averages the ranks' gradients, so the update uses the mean loss over the
global batch of ``B`` windows (every window has the same number of targets) for any ``P``. The
logged loss is the all-reduced sum of the ranks' shares. Rank 0 alone writes checkpoints, the
resumable state and the meta; every rank resumes from the same state; a stop signal seen by any
rank stops all of them after the same step. With one process the plain loop runs (no DDP, no
collectives): the CPU path is bit-identical to a single-process run of earlier versions.
``train.compile`` wraps the model in ``torch.compile`` (off by default; the CPU default study
gains nothing from it); on CUDA AdamW is fused and attention uses SDPA (flash) kernels.
"""

from __future__ import annotations

import contextlib
import csv
import io as _io
import json
import logging
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import io, tokenizer
from .config import canonical_json
from .errors import EXIT_PREEMPTED, ArtifactError, Preempted
from .hashing import hash_bytes, hash_tree
from .modeling import build_model, llama_config
from .paths import Paths
from .rng import derive_seed
from .stream import open_stream

log = logging.getLogger(__name__)

STATE = "state.pt"
__all__ = ["EXIT_PREEMPTED", "Preempted", "train"]
# SIGTERM: scancel / preemption; SIGUSR1: `--signal=USR1@T`; SIGURG: `--signal=URG@T`, the one
# the Slurm profile uses because the executor's job wrapper survives it (see profiles/slurm).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGURG)
# train.* keys that say how to run, not what to compute: left out of the config hash
EXECUTION_KEYS = ("threads", "devices", "compile")


def train_config_hash(cfg: dict[str, Any]) -> str:
    train = {k: v for k, v in cfg["train"].items() if k not in EXECUTION_KEYS}
    sub = {"seed": cfg["seed"], "model": cfg["model"], "train": train}
    return hash_bytes(canonical_json(sub).encode())


def checkpoint_steps(cfg_train: dict[str, Any]) -> list[int]:
    """Optimizer steps after which an HF checkpoint is saved: every
    ``checkpoint_every_steps`` and the last step (pure: the Snakefile uses it too)."""
    steps, every = int(cfg_train["steps"]), int(cfg_train["checkpoint_every_steps"])
    return sorted({*range(every, steps + 1, every), steps})


def checkpoint_name(step: int) -> str:
    """Folder name of the checkpoint saved after ``step`` optimizer steps."""
    return f"step_{int(step):07d}"


def checkpoint_names(cfg: dict[str, Any]) -> list[str]:
    """Every checkpoint a finished model of this config has, oldest first."""
    return [checkpoint_name(s) for s in checkpoint_steps(cfg["train"])]


def lr_factor(step: int, cfg_train: dict[str, Any]) -> float:
    """Multiplier of the peak lr used for the update of optimizer step ``step`` (0-based)."""
    total = int(cfg_train["steps"])
    warm = max(1, int(round(cfg_train["warmup_fraction"] * total)))
    floor = float(cfg_train["min_lr_ratio"])
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def lr_at(step: int, cfg_train: dict[str, Any]) -> float:
    return float(cfg_train["lr"]) * lr_factor(step, cfg_train)


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


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
        return DistInfo(0, 1, _device())
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
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


def _trace_windows(rank: int, step: int, first: int, batch: np.ndarray) -> None:
    """Test hook: ``PLANTBENCH_TRACE_WINDOWS=<folder>`` appends, per rank and step, the window
    indices this rank trained on and the xxh3 of each window's tokens (manifest hashes)."""
    folder = os.environ.get("PLANTBENCH_TRACE_WINDOWS")
    if not folder:
        return
    from .hashing import window_hashes

    row = {"step": step, "windows": list(range(first, first + len(batch))),
           "hashes": [int(h) for h in window_hashes(batch)]}  # fmt: skip
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / f"rank{rank}.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")


def _autocast(precision: str, device: torch.device) -> Any:
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.autocast(device_type=device.type, enabled=False)


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


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_state(path: Path, payload: dict[str, Any]) -> None:
    buf = _io.BytesIO()
    torch.save(payload, buf)
    io.write_bytes(path, buf.getvalue())


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


def train(
    cfg: dict[str, Any], paths: Paths, model_name: str, *, threads: int | None = None
) -> dict[str, Any]:
    t = cfg["train"]
    torch.set_num_threads(int(threads or t["threads"]))
    dev = init_distributed()
    device = dev.device
    stream = open_stream(paths.stream(model_name))
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
    W = int(info["window"])
    conf = llama_config(
        cfg["model"],
        int(info["vocab_size"]),
        W,
        bos=tokenizer.BOS_ID,
        eos=tokenizer.EOS_ID,
        pad=tokenizer.PAD_ID,
        attn="sdpa",
    )
    model = build_model(conf, derive_seed(cfg["seed"], "init")).to(device)
    B, micro = int(t["batch_windows"]), int(t["micro_batch_windows"])
    if B % dev.world or (B // dev.world) % micro:
        raise ArtifactError(
            f"train.batch_windows = {B} must split evenly over {dev.world} processes into "
            f"micro-batches of train.micro_batch_windows = {micro}; change the launch or the config"
        )
    B_local = B // dev.world
    opt = make_optimizer(model, t, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))

    out = paths.model(model_name)
    state_path = paths.train_state(model_name) / STATE
    ckpt_dir = paths.checkpoints(model_name)
    losses: list[dict[str, float]] = []
    start = 0
    chash = train_config_hash(cfg)
    state = load_state(state_path)
    if state is not None:
        if state["config_hash"] != chash or state["stream_hash"] != stream.meta["hash"]:
            raise ArtifactError(
                f"resumable state '{state_path}' belongs to another config or stream; delete "
                f"'{paths.train_state(model_name)}' to restart training"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        losses = state["losses"]
        start = int(state["step"])
        log.info("resuming %s from step %d (%s)", model_name, start, state_path)

    def snapshot(step: int) -> dict[str, Any]:
        return {
            "step": step,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": _rng_state(),
            "losses": losses,
            "config_hash": chash,
            "stream_hash": stream.meta["hash"],
        }

    flag = _StopFlag()
    old = {s: signal.signal(s, flag) for s in STOP_SIGNALS}
    steps = int(t["steps"])
    ckpt_steps = checkpoint_steps(t)
    model.train()
    # the module that runs forward/backward: the model itself in a single process; with P > 1
    # DDP (gradient all-reduce = mean over ranks); optionally compiled
    ddp: Any = None
    net: Any = model
    if dev.world > 1:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
        net = ddp
    if t.get("compile", False):
        net = torch.compile(net)
    first = dev.rank * B_local
    if dev.world > 1:
        log.info(
            "%s: rank %d of %d on %s, windows [b*%d + %d, +%d) per step, %d micro-batches",
            model_name,
            dev.rank,
            dev.world,
            device,
            B,
            first,
            B_local,
            B_local // micro,
        )
    t0, tok_seen = time.time(), 0
    try:
        for step in range(start, steps):
            rows = stream.batch(step)[first : first + B_local]
            _trace_windows(dev.rank, step, step * B + first, rows)
            batch = torch.from_numpy(rows.astype(np.int64)).to(device)
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for m0 in range(0, B_local, micro):
                ids = batch[m0 : m0 + micro]
                sync = ddp is None or m0 + micro >= B_local  # all-reduce on the last micro-batch
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    with _autocast(t["precision"], device):
                        logits = net(input_ids=ids).logits
                    loss = torch.nn.functional.cross_entropy(
                        logits[:, :-1].float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
                    )
                    (loss * (ids.size(0) / B_local)).backward()
                total += float(loss.detach()) * ids.size(0) / B
            if dev.world > 1:
                total = _all_reduce(total, dev)
                if _all_reduce(float(flag.signal or 0), dev, "max") and flag.signal is None:
                    flag.signal = -1  # another rank was signalled: stop after this step too
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(t["grad_clip"]))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            losses.append({"step": step, "lr": lr, "loss": total, "grad_norm": float(gnorm)})
            tok_seen += B * W
            done = step + 1
            if done in ckpt_steps and dev.main:
                with io.atomic_dir(ckpt_dir / checkpoint_name(done)) as tmp:
                    model.save_pretrained(tmp)
            if dev.main and (
                done % int(t["state_every_steps"]) == 0 or done == steps or flag.signal is not None
            ):
                save_state(state_path, snapshot(done))
            if flag.signal is not None and done < steps:
                _barrier(dev)  # the state is on disk before any rank exits
                raise Preempted(
                    f"stopped by signal {flag.signal} after step {done}; "
                    f"state saved to '{state_path}'"
                )
            if done % max(1, steps // 20) == 0 or done == steps:
                rate = tok_seen / max(1e-9, time.time() - t0)
                log.info(
                    "%s step %d/%d loss %.4f lr %.2e %.0f tok/s",
                    model_name,
                    done,
                    steps,
                    total,
                    lr,
                    rate,
                )
            _fault_injection(model_name, done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if not dev.main:
        _barrier(dev)  # rank 0 writes the loss log and the meta
        return io.read_meta(out, "pretrain", verify=False)

    # loss log and checkpoint index, then the artifact meta (written last)
    buf = _io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["step", "tokens", "lr", "loss", "grad_norm"])
    for r in losses:
        w.writerow(
            [
                r["step"],
                (r["step"] + 1) * B * W,
                repr(r["lr"]),
                repr(r["loss"]),
                repr(r["grad_norm"]),
            ]
        )
    io.write_text(out / "loss.csv", buf.getvalue())
    index = [
        {
            "name": checkpoint_name(s),
            "step": s,
            "tokens": s * B * W,
            "lr": lr_at(s - 1, t),
            "hash": hash_tree(ckpt_dir / checkpoint_name(s)),
        }
        for s in ckpt_steps
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
    tail = [r["loss"] for r in losses[-max(1, steps // 20) :]]
    meta = io.write_meta(
        out,
        "pretrain",
        files,
        config_hash=chash,
        inputs={"stream": stream.meta["hash"], "tokenizer": tok_meta["hash"]},
        info={
            "model": model_name,
            "params": sum(p.numel() for p in model.parameters()),
            "steps": steps,
            "tokens": steps * B * W,
            "final_loss": float(np.mean(tail)),
            "final_loss_window": len(tail),
            "checkpoints": [c["name"] for c in index],
            "final_checkpoint": index[-1]["name"],
        },
    )
    _barrier(dev)
    return meta


def checkpoints(paths: Paths, model_name: str) -> list[dict[str, Any]]:
    """The checkpoint index of a finished model (checked against its meta)."""
    io.read_meta(paths.model(model_name), "pretrain", verify=False)
    path = paths.checkpoints(model_name) / "index.json"
    if not path.is_file():
        raise ArtifactError(f"'{path}' is missing; rerun the pretrain step for model {model_name}")
    return json.loads(path.read_text())


def final_checkpoint(paths: Paths, model_name: str) -> Path:
    meta = io.read_meta(paths.model(model_name), "pretrain", verify=False)
    return paths.checkpoints(model_name) / meta["info"]["final_checkpoint"]
