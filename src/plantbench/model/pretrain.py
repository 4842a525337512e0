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

Layout
------
This module is the step: :func:`train` sets a run up (:func:`_setup`), decides where it starts
(:func:`_resume`: its own state, the prefix's at the fork, or step 0 with the stale outputs
removed), runs the loop and writes the loss log, checkpoint index, fork and meta. Beside it:

- :mod:`plantbench.model.train_loop`: the training loop, read in one sitting (model, batches,
  learning rate, step, checkpoint).
- :mod:`plantbench.model.train_run`: the run the loop advances (its inputs, model, optimizer,
  progress, file places) and the names ``prefix``, ``state.pt``, ``fork.pt``.
- :mod:`plantbench.model.train_state`: the resumable state (snapshot, RNG states, save and load,
  why a state is stale, continuing from one), the hashes it is checked against, Adam's moments.
- :mod:`plantbench.model.canonical`: torch pickles whose bytes depend on their values only.
- :mod:`plantbench.model.distributed`: the process group, collectives, :func:`rank_rows`, the
  exact CPU gradient sum.
- :mod:`plantbench.model.interrupts`: the stop signals and the fault-injection test hook.

The names other modules use are re-exported here (``__all__``). ``load_state`` is read through
this module's name: ``workflow/scripts/memorize_sweep.py`` replaces ``pretrain.load_state``.
"""

from __future__ import annotations

import csv
import io as _io
import logging
import shutil
from typing import Any

import numpy as np
import torch

from plantbench import io, layout, replicates
from plantbench.data import tokenizer
from plantbench.data.stream import Stream, open_stream
from plantbench.errors import EXIT_PREEMPTED, ArtifactError, Preempted
from plantbench.hashing import hash_tree
from plantbench.model import modelcard
from plantbench.model.canonical import canonical, torch_bytes
from plantbench.model.distributed import DistInfo, barrier, init_distributed, rank_rows
from plantbench.model.modeling import build_model, llama_config
from plantbench.model.train_loop import lr_at, lr_factor, make_optimizer, train_steps
from plantbench.model.train_run import FORK, PREFIX, STATE, Run
from plantbench.model.train_state import (
    apply_state,
    load_state,
    prefix_hash,
    save_moments,
    save_state,
    second_moments,
    seed_global_rngs,
    snapshot,
    stale_reason,
    train_config_hash,
)
from plantbench.paths import MODELS, Paths
from plantbench.rng import derive_seed

log = logging.getLogger(__name__)

__all__ = [
    "EXIT_PREEMPTED",
    "FORK",
    "PREFIX",
    "STATE",
    "Preempted",
    "canonical",
    "init_distributed",
    "load_state",
    "lr_at",
    "lr_factor",
    "make_optimizer",
    "prefix_hash",
    "rank_rows",
    "save_moments",
    "save_state",
    "second_moments",
    "torch_bytes",
    "train",
    "train_config_hash",
]


def _open_inputs(
    cfg: dict[str, Any], paths: Paths, model_name: str, stream: Stream | None = None
) -> tuple[Stream, dict[str, Any]]:
    """The twin's stream (or ``stream``: a random twin's, :mod:`plantbench.randomtwins`) and
    the tokenizer meta, checked against each other and train.*."""
    t = cfg["train"]
    replicates.check_owner(paths.model(model_name), io.peek_meta(paths.model(model_name)), cfg)
    stream = stream or open_stream(paths.stream(model_name))
    replicates.check_owner(stream.folder, stream.meta, cfg)
    tok_meta = io.read_meta(paths.tokenizer, "tokenizer")
    io.check_input(stream.meta, "tokenizer", tok_meta, str(stream.folder))
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


def _setup(
    cfg: dict[str, Any], paths: Paths, model_name: str, dev: DistInfo, stream: Stream | None
) -> Run:
    """Inputs, the initial model (same seed for both twins), optimizer and schedule."""
    t = cfg["train"]
    name = MODELS[0] if model_name == PREFIX else model_name
    stream, tok_meta = _open_inputs(cfg, paths, name, stream)
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
    seed_global_rngs(derive_seed(cfg["seed"], "global-rng", *replicates.seed_tags(cfg)))
    B, micro = int(t["batch_windows"]), int(t["micro_batch_windows"])
    if B % dev.world or (B // dev.world) % micro:
        raise ArtifactError(
            f"train.batch_windows = {B} must split evenly over {dev.world} processes into "
            f"micro-batches of train.micro_batch_windows = {micro}; change the launch or the config"
        )
    opt = make_optimizer(model, t, dev.device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))
    chash = train_config_hash(cfg)
    run = Run(cfg, paths, model_name, dev, stream, tok_meta, model, opt, sched, chash)
    run.stop = layout.prefix_steps(cfg) if model_name == PREFIX else int(t["steps"])
    run.data_hash = prefix_hash(cfg, paths) if model_name == PREFIX else stream.meta["hash"]
    return run


def _load_valid_state(run: Run) -> dict[str, Any] | None:
    """The resumable state if it can be resumed; otherwise None, after one warning line."""
    try:
        state = load_state(run.state_path)
    except ArtifactError:
        state, reason = None, "it is unreadable"
    else:
        reason = None if state is None else stale_reason(run, state)
    if reason is not None:
        log.warning(
            "%s: not resuming from '%s': %s; restarting from step 0",
            run.name,
            run.state_path,
            reason,
        )
        return None
    return state


def _clear_outputs(run: Run) -> None:
    """Before training from step 0: the meta first (the folder is then unfinished), the loss
    log, every checkpoint with its index, and any stale resumable state."""
    for f in (run.out / io.META, run.out / "loss.csv", run.state_path):
        f.unlink(missing_ok=True)
    shutil.rmtree(run.ckpt_dir, ignore_errors=True)
    shutil.rmtree(run.paths.moments(run.name, "x").parent, ignore_errors=True)


def _forks(run: Run) -> bool:
    """A twin of a config with a shared prefix: it starts from the prefix's state at the fork."""
    return run.name != PREFIX and layout.prefix_steps(run.cfg) > 0


def _fork_state(run: Run) -> dict[str, Any] | None:
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


def _resume(run: Run, fork: bool = True) -> None:
    """Resume from the state; else, for a twin of a config with a prefix, start from the
    prefix's state at the fork (``fork=False``: from step 0 on the twin's own stream, the same
    run computed whole); else from step 0. Stale outputs are removed first."""
    state = _load_valid_state(run)
    barrier(run.dev)  # every rank has decided before rank 0 removes anything
    if state is not None:
        apply_state(run, state)
        if fork and _forks(run):  # the prefix it forked from: its meta's inputs, as a fork's
            run.prefix_meta = io.read_meta(run.paths.model(PREFIX), "prefix")
        log.info("resuming %s from step %d (%s)", run.name, run.start, run.state_path)
        return
    if run.dev.main:
        _clear_outputs(run)
    start = _fork_state(run) if fork else None
    if start is not None:
        apply_state(run, start)
        log.info("%s: forked from the shared prefix at step %d", run.name, run.start)


def _loss_csv(run: Run) -> str:
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


def _write_outputs(run: Run) -> dict[str, Any]:
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
            # a random twin's stream is stream A with B's windows at some slots: both streams
            **run.stream.meta.get("twin_inputs", {"stream": run.stream.meta["hash"]}),
            "tokenizer": run.tok_meta["hash"],
            **({"prefix": run.prefix_meta["hash"]} if run.prefix_meta else {}),
        },
        info={
            "model": run.name,
            **run.stream.meta.get("twin_info", {}),
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
    stream: Stream | None = None,
) -> dict[str, Any]:
    """Train one twin to ``train.steps`` (or, ``model_name`` = ``prefix``, the shared prefix to
    ``train.prefix_steps``), resuming from its state when that state is for this config and
    stream and every checkpoint it has passed is still on disk; otherwise (one warning line)
    from the prefix's state at the fork, or from step 0, with the stale state and checkpoints
    removed. ``fork=False`` trains a twin whole from step 0 (the same run: a test's check).
    ``stream``: the stream to train on instead of the twin's own (a random twin's, which reads
    A's or B's window at each planted slot; :mod:`plantbench.randomtwins.draws`)."""
    torch.set_num_threads(int(threads or cfg["train"]["threads"]))
    dev = init_distributed()
    run = _setup(cfg, paths, model_name, dev, stream)
    _resume(run, fork=fork)
    train_steps(run)
    if not dev.main:
        barrier(dev)  # rank 0 writes the loss log and the meta
        return io.read_meta(run.out, "prefix" if model_name == PREFIX else "pretrain", verify=False)
    meta = _write_prefix_outputs(run) if model_name == PREFIX else _write_outputs(run)
    barrier(dev)
    return meta


def _write_prefix_outputs(run: Run) -> dict[str, Any]:
    """Rank 0: the prefix's loss log and its full state at the fork, then the meta."""
    out, B, W = run.out, run.batch, run.window
    io.write_text(out / "loss.csv", _loss_csv(run))
    save_state(out / FORK, snapshot(run, run.stop))
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
