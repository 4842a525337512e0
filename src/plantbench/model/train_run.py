"""One twin's training run, or the shared prefix's: its inputs, model, optimizer, schedule and
progress (rank-local), and where its files lie. :mod:`plantbench.model.pretrain` sets it up,
:mod:`plantbench.model.train_loop` advances it, :mod:`plantbench.model.train_state` saves and
restores it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from plantbench.data.stream import Stream
from plantbench.model.distributed import DistInfo
from plantbench.paths import Paths

STATE = "state.pt"
PREFIX = "prefix"  # models/prefix/: the shared prefix, trained once
FORK = "fork.pt"  # the prefix's full training state at the fork, both twins' start


@dataclass
class Run:
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
