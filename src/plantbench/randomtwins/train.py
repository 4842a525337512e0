"""Train random twin ``draw`` (:mod:`plantbench.randomtwins.draws`): the twins' training step on
its mixed stream, from the shared prefix's fork, resumable like a twin
(:mod:`plantbench.model.pretrain`). Its folder is ``models/random/<draw>/``: checkpoints, loss
log, state and a ``pretrain`` meta that records both streams' hashes and the draw's sides."""

from __future__ import annotations

from typing import Any

from plantbench import io, layout
from plantbench.errors import ConfigError
from plantbench.model import pretrain
from plantbench.paths import Paths, random_twin_name
from plantbench.randomtwins import draws


def train_draw(
    cfg: dict[str, Any], paths: Paths, draw: int, *, threads: int | None = None
) -> dict[str, Any]:
    if not layout.prefix_steps(cfg):
        raise ConfigError(
            "random twins fork from the shared prefix, and config key 'train.prefix_steps' is 0; "
            "set it (the default study's is 4800) or set random_twins.m to 0"
        )
    io.read_meta(paths.facts, "facts")
    facts = io.read_parquet(paths.facts / "facts.parquet")
    stream = draws.stream_of(cfg, paths, facts, draw)
    return pretrain.train(cfg, paths, random_twin_name(draw), threads=threads, stream=stream)
