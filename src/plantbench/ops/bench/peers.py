"""Benchmark: our featurizer against the peers' (bergson, dattri) on the same model and windows.

Per-example projected gradients of a causal LM, computed three ways in the same run:

* ``ours``: :func:`plantbench.attribution.gradients.capture.projected_grads` with the study's projector
  (:func:`plantbench.attribution.features.projector`, ``features.projection``: by default a count sketch of
  the exact gradients of the ``M`` block linears into ``D = features.grad_dims`` shared dims,
  :mod:`plantbench.attribution.sketch`; or LoGra's ``k_out x k_in`` per block linear).
* ``bergson`` (EleutherAI): its in-memory gradient index, ``InMemoryCollector`` driven by
  ``CollectorComputer`` (the loop ``bergson build`` runs), per-module double-sided random
  projection ``p x p`` (``projection_dim = p``, ``projection_type = normal``, summed loss), the
  model prepared as bergson prepares it (parameters frozen but the input embedding).
* ``dattri``: ``LoGraAttributor.cache`` (``hessian = Identity``, ``offload = none``,
  ``proj_dim = p^2``: ``p x p`` per module), loss = batch mean of the windows' summed losses
  (dattri multiplies the captured gradients by the batch size, so this gives every window the
  gradient of its summed loss).

* ``ours@logra``: ours with LoGra's projection at the peers' ``p x p`` per module: the same
  projection kind and the same ``D`` as theirs, so that its ratio to theirs compares the
  machinery alone (the default sketch does more work per window for a better product).
* ``bergson@32``, ``bergson@64`` (full run only): bergson at ``32 x 32`` and ``64 x 64`` per
  module (``D`` = 28,672 and 114,688 on the default model), the sizes a Kronecker projection
  needs to keep about the sketch's fidelity (measured on the twins before they read, A / B:
  LoGra 32 x 32: Spearman 0.87 / 0.88; the sketch at 4,096: 0.91 / 0.92;
  :mod:`plantbench.attribution.sketch`).
* ``floor``: no featurizer: the frozen model's forward and backward with our fused loss, nothing
  captured (:func:`_floor`). Every tool's time over the floor's (paired per round) is a row; a
  peer's is the most any featurizer sharing the model's pass could gain on it.

Both peers project every module square and Kronecker-structured (``(P_out delta)(P_in x)^T``,
LoGra's kind), so their ``D = M p^2`` with ``p`` the closest to ours (:func:`peer_side`; the
default ``D = 4,096`` over 28 modules gives ``p = 12``, ``D = 4,032``; LoGra 8 x 8 gives ``D``
exactly); both ``D`` are in the rows. Equal ``D`` is not equal fidelity: the sketch keeps more of
the exact gradient product than a Kronecker projection of the same size (:mod:`plantbench.attribution.sketch`)
and costs more (it forms every module's gradient). All three use the same block linears,
float32, ``features.batch_windows`` windows per batch, the summed next-token loss over every
position, eager attention and the same threads.

Model and windows: twin A's final checkpoint and the first pool windows when the study in
``{results}`` has them, else a fresh seeded model of the configured shape on seeded random
tokens (the setup row says which). Protocol: every tool runs in its own spawned process (its peak
memory is its own), set up once and warmed up on full-size batches (bergson generates its
projection matrices there, dattri compiles its ``torch.compile`` kernels); then the tools take
turns, ``rounds`` times (starting tool rotated each round), each turn one timed pass over the
same chunk of windows. Rates: best and median windows/s over the rounds. Memory: peak resident
size above the level after the warm-up (freed heap returned to the system first, so the rounds'
allocations count), sampled every 2 ms over all rounds. Checks per peer: its ``D``, all values
finite, and its mean per-window feature norm over ours (every projection here preserves norms
in expectation: ~1 when the gradients are those of the same loss; a batch-size or token-count
scaling would show as a factor of the batch size or of the token count).

A peer that is not installed (``make peers-bench`` installs both) or fails in its process gets
one log line and no rows. Run: ``python -m plantbench.ops.bench.peers [--quick] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import logging
import math
import multiprocessing as mp
import os
import statistics
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np

from plantbench import artifacts, layout
from plantbench.errors import PlantbenchError
from plantbench.ops.bench.measure import PeakMem, best_time, row
from plantbench.paths import MODELS, Paths

log = logging.getLogger(__name__)

PEERS = ("bergson", "dattri")
LARGER_SIDES = (32, 64)  # bergson also at these p x p per module (full run)
Featurizer = Callable[[Any], Any]  # input ids [n, T] -> features [n, D]

# --------------------------------------------------------------------------- windows and model


def _study_source(cfg: dict[str, Any], paths: Paths, n: int) -> dict[str, Any] | None:
    """Twin A's final checkpoint and its first ``n`` pool windows, or None without them."""

    if not (paths.pool(MODELS[0]) / "meta.json").is_file():
        return None
    try:
        entry = artifacts.checkpoint_entry(paths, MODELS[0], layout.final_checkpoint(cfg))
        stream, table, _ = artifacts.stream_and_pool(paths, MODELS[0])
    except (PlantbenchError, OSError) as exc:
        log.info("peer benchmark: the study's twin A is not usable (%s): fresh model", exc)
        return None
    keys = table["window"].to_numpy(np.int64)[:n]
    return {
        "model": {"checkpoint": entry},
        "ids": np.asarray(stream.windows[keys], dtype=np.int64),
        "what": f"twin A's final checkpoint {entry['name']}, first {len(keys)} pool windows",
    }


def _fresh_source(cfg: dict[str, Any], n: int) -> dict[str, Any]:
    """A fresh seeded model of the configured shape and ``n`` seeded random windows."""
    vocab, window = int(cfg["tokenizer"]["vocab_size"]), int(cfg["stream"]["window"])
    rng = np.random.default_rng(2)
    return {
        "model": {"fresh": {"model": dict(cfg["model"]), "vocab": vocab, "window": window}},
        "ids": rng.integers(3, vocab, size=(n, window), dtype=np.int64),
        "what": f"fresh seeded model (no finished study), {n} seeded random windows",
    }


def _load(job: dict[str, Any]) -> Any:
    """The job's model in eval mode, eager attention (what ``projected_grads`` requires)."""
    spec = job["model"]
    if "checkpoint" in spec:
        net = artifacts.load_checkpoint(
            Paths(job["cfg"]), MODELS[0], spec["checkpoint"], attn="eager"
        )
    else:
        from plantbench.model.modeling import build_model, llama_config

        f = spec["fresh"]
        conf = llama_config(f["model"], f["vocab"], f["window"], bos=0, eos=1, pad=2, attn="eager")
        net = build_model(conf, 0)
    return net.eval()


def peer_side(dims: int, n_modules: int) -> int:
    """The peers' per-side projection ``p``: they project every module ``p x p``, so ``p`` is
    the one whose ``n_modules p^2`` is closest to our ``dims``."""
    p = max(1, math.isqrt(dims // n_modules))
    return min((p, p + 1), key=lambda q: (abs(n_modules * q * q - dims), q))


def _describe(proj: Any) -> str:
    """Our projection in words (``features.projection``)."""
    m = len(proj.module_names)
    if proj.kind == "sketch":
        return f"count sketch of the exact gradients of {m} block linears into D={proj.dims}"
    k_out, k_in = proj.module_dims[0]
    return f"LoGra {k_out}x{k_in} per block linear x {m} = D={proj.dims}"


# --------------------------------------------------------------------------- featurizers


def _ours(job: dict[str, Any], model: Any, proj: Any) -> Featurizer:
    import torch

    from plantbench.attribution.gradients.capture import projected_grads

    b = job["batch"]

    def run(ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids, dtype=torch.bool)
        parts = [
            projected_grads(model, proj, ids[s : s + b], mask[s : s + b])
            for s in range(0, len(ids), b)
        ]
        return torch.cat(parts)

    return run


def _floor(job: dict[str, Any], model: Any, proj: Any) -> Featurizer:
    """No featurizer: the frozen model's forward and backward with our fused loss and nothing
    captured, the work every featurizer of ours pays (its features: each window's loss). A
    peer's time over the floor's is the most any featurizer sharing that pass could gain."""
    import torch

    from plantbench.attribution.gradients.capture import frozen_pass

    b = job["batch"]

    def run(ids: torch.Tensor) -> torch.Tensor:
        mask = torch.ones_like(ids, dtype=torch.bool)
        parts = [frozen_pass(model, ids[s : s + b], mask[s : s + b]) for s in range(0, len(ids), b)]
        return torch.cat(parts)[:, None]

    return run


def _bergson(job: dict[str, Any], model: Any, proj: Any) -> Featurizer:
    import torch
    from bergson import CollectorComputer, IndexConfig, InMemoryCollector
    from bergson.utils.worker_utils import processor_for
    from datasets import Dataset

    model.requires_grad_(False)  # as bergson's setup_model_and_peft prepares a model
    model.get_input_embeddings().requires_grad_(True)
    prefix = model.base_model_prefix + "."
    targets = [n.removeprefix(prefix) for n in proj.module_names]
    cfg = IndexConfig(
        run_path=os.path.join(job["tmp"], "index"),
        projection_dim=job["side"],
        projection_type="normal",
        loss_reduction="sum",
    )
    cfg.partial_run_path.mkdir(parents=True, exist_ok=True)
    processor = processor_for(cfg)  # keeps its projection matrices between calls
    b = job["batch"]

    def run(ids: torch.Tensor) -> torch.Tensor:
        data = Dataset.from_dict({"input_ids": ids.tolist()})
        batches = [list(range(s, min(len(ids), s + b))) for s in range(0, len(ids), b)]
        col = InMemoryCollector(
            model=model.base_model,
            data=data,
            cfg=cfg,
            processor=processor,
            target_modules=set(targets),
        )
        CollectorComputer(
            model=model, data=data, collector=col, batches=batches, cfg=cfg
        ).run_with_collector_hooks()
        return torch.cat([col.gradients[n] for n in targets], dim=1)

    return run


def _dattri_loss(model: Any, batch: dict[str, Any], device: Any) -> Any:
    """Batch mean of every window's summed next-token loss (dattri scales by the batch size)."""
    import torch

    x = batch["input_ids"].to(device)
    logits = model(input_ids=x).logits[:, :-1]
    ce = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1), reduction="none"
    )
    return ce.view(len(x), -1).sum(1).mean()


def _dattri(job: dict[str, Any], model: Any, proj: Any) -> Featurizer:
    import torch
    import torch._inductor.config as inductor
    from dattri.algorithm.logra import LoGraAttributor
    from dattri.task import AttributionTask

    inductor.compile_threads = 1  # its compressors are torch.compile'd: no compile workers
    task = AttributionTask(loss_func=_dattri_loss, model=model, checkpoints=model.state_dict())
    att = LoGraAttributor(
        task,
        layer_names=list(proj.module_names),
        hessian="Identity",
        proj_dim=job["side"] ** 2,
        offload="none",
        cache_dir=job["tmp"],
    )
    b = job["batch"]

    def run(ids: torch.Tensor) -> torch.Tensor:
        loader = torch.utils.data.DataLoader([{"input_ids": r} for r in ids], batch_size=b)
        att.cache(loader)
        got = att.offload_manager.cached_gradients  # batch index -> [rows, D]
        return torch.cat([got[i] for i in range(len(loader))])

    return run


FEATURIZERS: dict[str, Callable[[dict[str, Any], Any, Any], Featurizer]] = {
    "ours": _ours,
    "floor": _floor,
    "bergson": _bergson,
    "dattri": _dattri,
}

# --------------------------------------------------------------------------- worker process

_W: dict[str, Any] = {}  # one tool's state in its spawned worker


def _release_heap() -> None:
    """Collect garbage and return freed heap pages to the system (glibc), so that a later
    allocation of the same size shows in the resident size again."""
    import ctypes

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _quiet() -> None:
    """Only warnings from the worker's loggers (bergson's import sets the root logger to INFO
    with a handler on stdout and gives its own loggers level INFO)."""
    root = logging.getLogger()
    for h in [root, *root.handlers, logging.getLogger("dattri")]:
        h.setLevel(logging.WARNING)


def _variant(tool: str, proj: Any, model: Any) -> tuple[str, int, Any]:
    """``(featurizer, side p, our projector)`` of a tool key: ``name`` (the peers' side
    :func:`peer_side`, ours with the study's projection), ``name@p`` (a peer at ``p x p`` per
    module) or ``ours@logra`` (ours with LoGra at the peers' ``p x p``: the same projection
    kind and ``D`` as theirs)."""
    from plantbench.attribution.gradients.projector import Projector

    name, _, variant = tool.partition("@")
    side = peer_side(proj.dims, len(proj.module_names))
    if variant == "logra":
        proj = Projector.from_model(model, proj.seed, k_in=side, k_out=side)
    elif variant:
        side = int(variant)
    return name, side, proj


def _w_setup(job: dict[str, Any]) -> dict[str, Any]:
    """Build the tool on the job's model, warm it up on full-size batches, start the memory
    sampler; returns the one-off setup seconds and the feature dims."""
    os.environ["TQDM_DISABLE"] = "1"  # the peers' progress bars
    import time

    import torch

    from plantbench.attribution.features import projector

    torch.set_num_threads(job["threads"])
    model = _load(job)
    name, side, proj = _variant(job["tool"], projector(job["cfg"], model), model)
    ids = torch.as_tensor(job["ids"])
    tmp = tempfile.TemporaryDirectory(prefix=f"plantbench-{name}-")
    t0 = time.perf_counter()
    feats = FEATURIZERS[name]({**job, "tmp": tmp.name, "side": side}, model, proj)
    _quiet()
    out = feats(ids[: job["batch"]])
    if len(ids) % job["batch"]:  # the last, shorter batch's shape too
        feats(ids[-(len(ids) % job["batch"]) :])
    setup = time.perf_counter() - t0
    _release_heap()
    _W.update(feats=feats, ids=ids, tmp=tmp, last=out, mem=PeakMem().__enter__())
    return {"setup_seconds": setup, "projection": _describe(proj), "side": side}


def _w_round(_: Any = None) -> float:
    """One timed pass over the chunk (seconds)."""
    seconds, _W["last"] = best_time(lambda: _W["feats"](_W["ids"]), 1)
    return seconds


def _w_finish(_: Any = None) -> dict[str, Any]:
    """Stop the memory sampler; the peak and the last pass's features (checks)."""
    import torch

    _W["mem"].__exit__(None, None, None)
    f = _W["last"].detach().to(torch.float64)
    _W["tmp"].cleanup()
    return {
        "peak_mb": _W["mem"].rss_mb,
        "dims": int(f.shape[1]),
        "finite": bool(torch.isfinite(f).all()),
        "norms": f.norm(dim=1).numpy(),
    }


# --------------------------------------------------------------------------- driver


def peer_status(name: str) -> str | None:
    """None when ``name`` is installed, else why it is skipped (the parent never imports a
    peer: bergson's import reconfigures the root logger)."""
    if importlib.util.find_spec(name) is None:
        return f"{name} is not installed (make peers-bench installs it)"
    return None


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _is_ours(tool: str) -> bool:
    """Ours (``ours``, ``ours@...``) or the floor: not a peer."""
    return tool.startswith("ours") or tool == "floor"


def _start(tools: list[str], job: dict[str, Any], stack: contextlib.ExitStack) -> dict:
    """One spawned worker per tool, set up; a peer whose setup fails is logged and dropped."""
    workers: dict[str, tuple[Any, dict[str, Any]]] = {}
    for tool in tools:
        pool = stack.enter_context(mp.get_context("spawn").Pool(1))
        try:
            workers[tool] = (pool, pool.apply(_w_setup, ({**job, "tool": tool},)))
        except Exception as exc:  # a peer's import or API failure must not stop the group
            if _is_ours(tool):
                raise
            log.warning(
                "peer benchmark: %s failed (%s: %s): skipped", tool, type(exc).__name__, exc
            )
    return workers


def _rounds(workers: dict, rounds: int) -> dict[str, list[float]]:
    """Timed passes, the tools taking turns (the first one rotated every round)."""
    names = list(workers)
    secs: dict[str, list[float]] = {t: [] for t in names}
    for r in range(rounds):
        for tool in names[r % len(names) :] + names[: r % len(names)]:
            secs[tool].append(workers[tool][0].apply(_w_round))
    return secs


def measure(
    cfg: dict[str, Any], source: dict[str, Any], *, threads: int, rounds: int, peers: list[str]
) -> dict[str, dict[str, Any]]:
    """Per tool (``ours`` + the given peers that start): setup, per-round seconds, finish."""
    job = {
        "cfg": cfg,
        "model": source["model"],
        "ids": source["ids"],
        "threads": threads,
        "batch": int(cfg["features"]["batch_windows"]),
    }
    with contextlib.ExitStack() as stack:
        workers = _start(["ours", *peers], job, stack)
        secs = _rounds(workers, rounds)
        return {
            t: {**info, "seconds": secs[t], **pool.apply(_w_finish)}
            for t, (pool, info) in workers.items()
        }


def _rates(res: dict[str, Any], n: int) -> tuple[float, float]:
    """Best and median windows/s over the rounds."""
    return n / min(res["seconds"]), n / statistics.median(res["seconds"])


def _tool_rows(tool: str, res: dict[str, Any], n: int, label: str) -> list[dict[str, Any]]:
    best, med = _rates(res, n)
    return [
        row("peers", f"{label}: windows/s, best", best, "windows/s"),
        row("peers", f"{tool}: windows/s, median", med, "windows/s", best),
        row("peers", f"{tool}: peak RSS increase over the rounds", res["peak_mb"], "MiB"),
        row("peers", f"{tool}: one-off setup + full-size warm-up", res["setup_seconds"], "s"),
    ]


API = {
    "bergson": "InMemoryCollector + CollectorComputer, per-module normal projection",
    "dattri": "LoGraAttributor.cache, hessian=Identity",
}


def _peer_rows(key: str, res: dict, ours: dict, n: int) -> list[dict[str, Any]]:
    """A peer's rows (``key``: ``name`` or ``name@p``) and ours vs it."""
    peer = key.partition("@")[0]
    d, p = ours["dims"], res["side"]
    dims = f"D={res['dims']} ({p}x{p} per module)" + ("" if res["dims"] == d else f", ours D={d}")
    label = f"{key} {_version(peer)} ({API[peer]}), {dims}"
    return _tool_rows(key, res, n, label) + _versus("ours", ours, key, res, n) + [
        row("peers", f"check {key}: feature dims vs ours (all finite: {res['finite']})",
             res["dims"], "dims", d),
        row("peers", f"check {key}: mean per-window feature norm vs ours (same gradients: ~1)",
             float(res["norms"].mean()), "", float(ours["norms"].mean())),
    ]  # fmt: skip


def paired_speedup(ours: list[float], theirs: list[float]) -> float:
    """Median over the rounds of ``theirs[r] / ours[r]``: each round's two passes ran minutes
    apart at most, so a drift of the machine's speed between rounds cancels in each ratio."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"paired rounds: {len(ours)} vs {len(theirs)} passes")
    return statistics.median(t / o for o, t in zip(ours, theirs, strict=True))


def _versus(us: str, ours: dict, key: str, res: dict, n: int) -> list[dict[str, Any]]:
    """``us`` vs ``key``: best and median windows/s, the median per-round speed-up and peak
    memory (ratio = ours / theirs)."""
    (ob, om), (pb, pm) = _rates(ours, n), _rates(res, n)
    paired = paired_speedup(ours["seconds"], res["seconds"])
    return [
        row("peers", f"{us} vs {key}: windows/s, best", ob, "windows/s", pb),
        row("peers", f"{us} vs {key}: windows/s, median", om, "windows/s", pm),
        row("peers", f"{us} vs {key}: speed-up, median over rounds of the round's ratio",
             paired, "x", 1.0),
        row("peers", f"{us} vs {key}: peak RSS increase", ours["peak_mb"], "MiB", res["peak_mb"]),
    ]  # fmt: skip


def rows_of(
    cfg: dict[str, Any], source: dict[str, Any], got: dict, threads: int, rounds: int
) -> list[dict[str, Any]]:
    """The group's rows from :func:`measure`'s results: ours, then each peer against ours
    (and against ``ours@logra``, ours with their projection kind and ``D``, when it ran)."""
    ours, n, m = got["ours"], len(source["ids"]), cfg["model"]
    setup = (
        f"{source['what']}; {m['n_layer']}L x {m['n_embd']}, T={source['ids'].shape[1]}; ours: "
        f"{ours['projection']}; batch {cfg['features']['batch_windows']}, float32, {threads} "
        f"thread(s), {rounds} rounds over the same {n} windows, tools alternating"
    )
    rows = [row("peers", setup, n, "windows")]
    rows += _tool_rows("ours", ours, n, "ours (plantbench projected_grads)")
    same = got.get("ours@logra")
    if same is not None:
        rows += _tool_rows("ours@logra", same, n, f"ours@logra ({same['projection']})")
    for key in (k for k in got if not _is_ours(k)):
        rows += _peer_rows(key, got[key], ours, n)
        if same is not None and got[key]["side"] == same["side"]:
            rows += _versus("ours@logra", same, key, got[key], n)
    if "floor" in got:
        rows += _floor_rows(got, n)
    return rows


def _floor_rows(got: dict, n: int) -> list[dict[str, Any]]:
    """The floor's rate, and every tool's time over the floor's (median over rounds of the
    round's ratio): for a peer, the most a featurizer that pays only the floor could be faster
    than it."""
    floor = got["floor"]["seconds"]
    rows = _tool_rows(
        "floor", got["floor"], n, "floor (frozen forward + backward, fused loss, nothing captured)"
    )
    for key in (k for k in got if k != "floor"):
        rows.append(
            row("peers", f"{key}: time over the floor's, median over rounds of the round's ratio",
                paired_speedup(floor, got[key]["seconds"]), "x", 1.0)
        )  # fmt: skip
    return rows


def _tools(quick: bool) -> list[str]:
    """Tool keys besides ``ours``: ours with LoGra at the peers' ``D``, the floor
    (:func:`_floor`), each installed peer at
    that ``D``, and (full run) bergson at 32 x 32 and 64 x 64 per module, the sizes at which a
    Kronecker projection keeps about the sketch's fidelity (:mod:`plantbench.attribution.sketch`)."""
    tools = ["ours@logra", "floor"]
    for peer in PEERS:
        if (why := peer_status(peer)) is not None:
            log.warning("peer benchmark: %s: skipped", why)
        else:
            tools.append(peer)
    if "bergson" in tools and not quick:
        tools += [f"bergson@{p}" for p in LARGER_SIDES]
    return tools


def run_peers(
    cfg: dict[str, Any], paths: Paths, *, threads: int = 1, quick: bool = False
) -> list[dict[str, Any]]:
    """The ``peers`` group of ``plantbench bench``: rows ``{stage, what, value, unit,
    reference, ratio}``; a peer that is not installed is logged and has no rows."""
    batch = int(cfg["features"]["batch_windows"])
    n, rounds = (32, 3) if quick else (96, 7)
    source = _study_source(cfg, paths, n) or _fresh_source(cfg, n)
    if len(source["ids"]) >= batch:  # whole batches: no odd-shaped last batch
        source["ids"] = source["ids"][: len(source["ids"]) // batch * batch]
    peers = _tools(quick)
    got = measure(cfg, source, threads=threads, rounds=rounds, peers=peers)
    return rows_of(cfg, source, got, threads, rounds)


def main(argv: list[str] | None = None) -> None:
    from plantbench import config
    from plantbench.ops.bench.gradients import format_rows

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--config", default=None, help="default: results/config.json, config.yaml")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = a.config or ("results/config.json" if os.path.isfile("results/config.json") else None)
    cfg = config.load([path or "config.yaml"])
    print(format_rows(run_peers(cfg, Paths(cfg), threads=a.threads, quick=a.quick)))


if __name__ == "__main__":
    main()
