"""Data-parallel plumbing of pretraining (:mod:`plantbench.model.pretrain`): this process's place
in the run, the collectives the loop uses, which rows of a global batch each rank trains on, and
the exact gradient sum of CPU (gloo) runs.

With one process none of it runs a collective. With ``P`` processes rank ``r`` trains on
micro-batches ``r, r + P, r + 2P, ...`` of every global batch (:func:`rank_rows`); on GPUs DDP
all-reduces the gradients, on the CPU :func:`exact_sum` gathers each micro-batch round's
gradients and adds them in rank order, the order one process accumulates them in, so ``P``
processes give bitwise the weights of one (``tests/test_multiprocess.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from plantbench.data.stream import Stream
from plantbench.model.modeling import compute_device


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


def all_reduce(value: float, dev: DistInfo, op: str = "sum") -> float:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=dev.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return float(t.item())


def barrier(dev: DistInfo) -> None:
    if dev.world > 1:
        import torch.distributed as dist

        dist.barrier()


def rank_rows(batch: int, micro: int, world: int, rank: int) -> np.ndarray:
    """The rows of a global batch that ``rank`` trains on, in its micro-batch order: its k-th
    micro-batch is the batch's micro-batch ``k * world + rank``, so the ranks' k-th
    micro-batches are consecutive in the batch (what makes :func:`exact_sum` the
    single-process accumulation order)."""
    local = batch // world
    return np.concatenate(
        [
            np.arange((k * world + rank) * micro, (k * world + rank + 1) * micro)
            for k in range(local // micro)
        ]
    ).astype(np.int64)


def uses_exact_sum(dev: DistInfo) -> bool:
    """Data-parallel on the CPU: the ranks' gradients are gathered and added in the
    single-process order (bitwise one process); on GPUs DDP's all-reduce."""
    return dev.world > 1 and dev.device.type == "cpu"


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat(
        [p.grad.reshape(-1) if p.grad is not None else p.new_zeros(p.numel()) for p in params]
    )


def exact_sum(params: list[torch.nn.Parameter], acc: torch.Tensor | None) -> torch.Tensor:
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


def set_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    start = 0
    for p in params:
        p.grad = flat[start : start + p.numel()].view_as(p)  # views of this step's sum
        start += p.numel()


def trace_windows(
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
