"""The training loop, read in one sitting: model, batches, learning rate, step, checkpoint.

- :func:`train_steps`: optimizer steps from the run's start to its stop; each step's loss, the
  clipped update, the loss log, the checkpoint and the resumable state when due, the progress
  line; a stop signal ends it after the current step with the state saved.
- :func:`_step_loss`: step ``s`` reads exactly manifest windows ``[s*B, (s+1)*B)`` (the stream's
  batch ``s``), in micro-batches of ``train.micro_batch_windows`` (gradient accumulation), the
  cross-entropy of the target tokens summed over the global batch's target count.
- :func:`lr_factor`: linear warm-up then cosine decay to ``lr * min_lr_ratio``.
- :func:`make_optimizer`: AdamW, weight decay on matrices only, fused on CUDA.
- :func:`_save_progress`: the HF checkpoint (with its model card and Adam's moments) every
  ``train.checkpoint_every_steps`` steps, the resumable state every ``train.state_every_steps``.

Beside it: the run it advances (:mod:`plantbench.model.train_run`), the state it saves
(:mod:`plantbench.model.train_state`), the data-parallel plumbing
(:mod:`plantbench.model.distributed`) and the stop signals and fault hook
(:mod:`plantbench.model.interrupts`); :mod:`plantbench.model.pretrain` sets a run up, decides
where it starts and writes its outputs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from plantbench import floats, io, layout
from plantbench.errors import Preempted
from plantbench.hashing import hash_tree
from plantbench.model import modelcard
from plantbench.model.distributed import (
    all_reduce,
    barrier,
    exact_sum,
    rank_rows,
    set_grads,
    trace_windows,
    uses_exact_sum,
)
from plantbench.model.interrupts import STOP_SIGNALS, StopFlag, fault_injection
from plantbench.model.train_run import Run
from plantbench.model.train_state import save_moments, save_state, snapshot

log = logging.getLogger("plantbench.model.pretrain")  # the pretrain step's log (one name)


def train_steps(run: Run) -> None:
    """Optimizer steps from ``run.start`` to the end; a stop signal saves the state and raises
    :class:`Preempted` after the current step."""
    flag = StopFlag()
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
                total = all_reduce(total, dev)
                if all_reduce(float(flag.signal or 0), dev, "max") and flag.signal is None:
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
                barrier(dev)  # the state is on disk before any rank exits
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
            fault_injection(run.name, done)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _step_loss(run: Run, net: Any, ddp: Any, step: int) -> float:
    """Forward and backward of this rank's share of optimizer step ``step``'s batch; returns
    its share of the batch's loss: the summed cross-entropy of the target tokens (a recall
    window's loss mask, every next token elsewhere) over the global batch's target count."""
    t, dev, B_local = run.t, run.dev, run.local_batch
    micro = int(t["micro_batch_windows"])
    idx = rank_rows(run.batch, micro, dev.world, dev.rank)
    rows = run.stream.batch(step)[idx]
    trace_windows(run.stream, dev.rank, step, step * run.batch + idx, rows)
    mask = run.stream.batch_mask(step)[:, 1:].astype(bool)
    n_targets = max(1, int(mask.sum()))  # the global batch's, the same on every rank
    batch = torch.from_numpy(rows.astype(np.int64)).to(dev.device)
    sel_all = torch.from_numpy(mask[idx]).to(dev.device)
    run.opt.zero_grad(set_to_none=True)
    exact = uses_exact_sum(dev)
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
            with autocast(t["precision"], dev.device):
                logits = net(ids, sel)
            loss = torch.nn.functional.cross_entropy(
                logits.float(), ids[:, 1:][sel], reduction="sum"
            )
            (loss * scale).backward()
        if exact:
            acc = exact_sum(params, acc)
        total += float(loss.detach()) / n_targets
    if acc is not None:
        set_grads(params, acc)
    return total


def _save_progress(run: Run, done: int, stopping: bool) -> None:
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
        save_state(run.state_path, snapshot(run, done))


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


def _network(run: Run) -> tuple[Any, Any]:
    """(the module that runs forward/backward, the DDP wrapper or None): the model's
    target-loss forward in a single process; with P > 1 on GPUs wrapped in DDP (gradient
    all-reduce = mean over ranks; on the CPU :func:`exact_sum` instead); optionally compiled."""
    ddp: Any = None
    net: Any = _TargetLoss(run.model)
    if run.dev.world > 1 and not uses_exact_sum(run.dev):
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


def autocast(precision: str, device: torch.device) -> Any:
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


def _log_rank(run: Run) -> None:
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
