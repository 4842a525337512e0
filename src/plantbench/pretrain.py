"""Pretrain one twin from scratch on its stream, resumably.

- Ordered loader: optimizer step ``s`` reads exactly manifest windows ``[s*B, (s+1)*B)``.
- AdamW (weight decay on matrices only), linear warm-up then cosine decay to
  ``lr * min_lr_ratio``, gradient clipping, bf16 autocast on CUDA (``train.precision``).
- Both twins start from the same initial weights (seed ``derive_seed(seed, "init")``).
- Resumable state (model, optimizer, scheduler, step, loss log, every RNG state) is saved
  atomically every ``train.state_every_steps`` steps and when SIGTERM / SIGUSR1 arrives (Slurm
  sends one before a time limit or preemption; SIGURG too); the job then exits with code 75 so that it is
  retried, and the retry resumes from the state. On the CPU the resumed run is bit-identical.
- HF checkpoints (``save_pretrained``) every ``train.checkpoint_every_steps`` steps and at the end.
"""

from __future__ import annotations

import csv
import io as _io
import json
import logging
import math
import os
import random
import signal
import time
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

def train_config_hash(cfg: dict[str, Any]) -> str:
    sub = {"seed": cfg["seed"], "model": cfg["model"], "train": {k: v for k, v in cfg["train"].items() if k != "threads"}}
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


def _autocast(precision: str, device: torch.device) -> Any:
    use_bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return torch.autocast(device_type=device.type, enabled=False)


def make_optimizer(model: torch.nn.Module, t: dict[str, Any], device: torch.device) -> torch.optim.AdamW:
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
            f"resumable state '{path}' is unreadable ({type(exc).__name__}); delete it to restart training"
        ) from None


def _fault_injection(model_name: str, step: int) -> None:
    """Test hook: ``PLANTBENCH_FAULT=pretrain:<model>:<step>`` kills this process (SIGKILL)
    right after that step completes, as a crash would."""
    spec = os.environ.get("PLANTBENCH_FAULT", "")
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if len(parts) == 3 and parts[0] == "pretrain" and parts[1] in (model_name, "*") and int(parts[2]) == step:
            marker = os.environ.get("PLANTBENCH_FAULT_ONCE")
            if marker:
                m = Path(marker)
                if m.exists():
                    return
                m.write_text(item)
            log.error("fault injection: killing pretraining of %s after step %d", model_name, step)
            os.kill(os.getpid(), signal.SIGKILL)


def train(cfg: dict[str, Any], paths: Paths, model_name: str, *, threads: int | None = None) -> dict[str, Any]:
    t = cfg["train"]
    torch.set_num_threads(int(threads or t["threads"]))
    device = _device()
    stream = open_stream(paths.stream(model_name))
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    io.check_input(stream.meta, "tokenizer", tok_meta, str(paths.stream(model_name)))
    info = stream.meta["info"]
    if int(info["steps"]) != int(t["steps"]) or int(info["batch_windows"]) != int(t["batch_windows"]):
        raise ArtifactError(
            f"stream '{stream.folder}' was built for {info['steps']} steps x {info['batch_windows']} windows "
            "but train.* asks otherwise; rerun the stream step"
        )
    W = int(info["window"])
    conf = llama_config(cfg["model"], int(info["vocab_size"]), W, bos=tokenizer.BOS_ID,
                        eos=tokenizer.EOS_ID, pad=tokenizer.PAD_ID, attn="sdpa")
    model = build_model(conf, derive_seed(cfg["seed"], "init")).to(device)
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
    B, micro = int(t["batch_windows"]), int(t["micro_batch_windows"])
    ckpt_steps = checkpoint_steps(t)
    model.train()
    t0, tok_seen = time.time(), 0
    try:
        for step in range(start, steps):
            batch = torch.from_numpy(stream.batch(step).astype(np.int64)).to(device)
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for m0 in range(0, B, micro):
                ids = batch[m0 : m0 + micro]
                with _autocast(t["precision"], device):
                    logits = model(input_ids=ids).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
                )
                (loss * (ids.size(0) / B)).backward()
                total += float(loss.detach()) * ids.size(0) / B
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), float(t["grad_clip"]))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            sched.step()
            losses.append({"step": step, "lr": lr, "loss": total, "grad_norm": float(gnorm)})
            tok_seen += B * W
            done = step + 1
            if done in ckpt_steps:
                with io.atomic_dir(ckpt_dir / checkpoint_name(done)) as tmp:
                    model.save_pretrained(tmp)
            if done % int(t["state_every_steps"]) == 0 or done == steps or flag.signal is not None:
                save_state(state_path, snapshot(done))
            if flag.signal is not None and done < steps:
                raise Preempted(f"stopped by signal {flag.signal} after step {done}; state saved to '{state_path}'")
            if done % max(1, steps // 20) == 0 or done == steps:
                rate = tok_seen / max(1e-9, time.time() - t0)
                log.info("%s step %d/%d loss %.4f lr %.2e %.0f tok/s", model_name, done, steps, total, lr, rate)
            _fault_injection(model_name, done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)

    # loss log and checkpoint index, then the artifact meta (written last)
    buf = _io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["step", "tokens", "lr", "loss", "grad_norm"])
    for r in losses:
        w.writerow([r["step"], (r["step"] + 1) * B * W, repr(r["lr"]), repr(r["loss"]), repr(r["grad_norm"])])
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
    files += sorted(p.relative_to(out).as_posix() for p in ckpt_dir.rglob("*") if p.is_file() and p.name != "index.json")
    tail = [r["loss"] for r in losses[-max(1, steps // 20) :]]
    return io.write_meta(
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
