"""Benchmark: LoGra projected gradients vs per-example full gradients + dense projection.

Both produce the same ``[n, D]`` features (same projections; the float32 relative difference is
reported as a check). On the default model shape (``config.yaml``'s ``model`` section, vocab 4096,
128-token windows, eager attention, random weights and tokens: the cost does not depend on them):

* ``logra``: :func:`plantbench.gradients.projected_grads` on batches of windows: one forward and
  one activation-only backward per batch, hooks project inputs and output gradients.
* ``exact+dense``: :func:`plantbench.gradients.exact_grads_projected`: one forward/backward per
  window computing every block weight gradient, then each module's gradient multiplied by the
  materialised ``P_out kron P_in`` (``k_out k_in x out in``). Building those matrices is a
  one-off cost, reported on its own row and not counted in the rate. Each route is timed
  ``repeats`` times and the best pass reported.

Each side runs in a fresh spawned process with a fixed thread count; peak memory is the peak
resident set size (sampled every 2 ms) minus the resident size after the model was built.

Scaling with the parameter count ``P`` of the block linears (``T`` tokens per window, ``k`` the
per-side projection size, ``D = M k^2`` for ``M`` modules): LoGra costs one forward + an
activation-only backward (``~4 T P`` flops) plus ``O(T k (i + o))`` per module for the
projections, and its extra memory is ``O(n T M k)`` for the projected activations, independent of
``P``. The exact route costs a full forward/backward (``~6 T P``) per window at batch 1 plus
``2 D_m P_m`` per module for the dense projection (``2 k^2 P`` in total, i.e. linear in ``P``
with a ``k^2`` factor; ``O(T P)`` vs ``O(k^2 P)`` means it dominates once ``k^2 > T``), and it
must hold the dense matrices, ``k^2 P`` values (353 MB in float32 at the default shape, 22 GB at
the 768-wide, 12-layer paper shape with 16 x 16): memory linear in ``P``. An unstructured
(TRAK-style) projection of the whole gradient to ``D`` dims would need ``D P`` values (10 GB at
the default shape), which is why the dense baseline here is already the Kronecker-structured one.

Consequence: both routes are linear in ``P``, so against this (strongest) dense baseline the
flop ratio is bounded, ``(6T + 2k^2) / 4T = 1.5 + k^2 / 2T`` (1.75 at T=128, k=8; 2.5 at k=16),
plus what batching buys over batch-1 passes; measured 2-4x on one CPU thread. The order-of-
magnitude gains are in memory (``k^2 P`` dense values vs ``O(n T M k)``) and against an
unstructured projection (flop ratio ``(6T + 2D) / 4T``: 8.5x at the default shape, 9x at the
paper shape, with a ``D x P`` matrix that cannot be held).

Run: ``python -m plantbench.bench_gradients [--threads 1] [--windows 64] [--exact-windows 8]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil

DEFAULT_MODEL = {
    "n_layer": 4,
    "n_embd": 128,
    "n_head": 4,
    "intermediate": 512,
    "tie_embeddings": True,
    "rope_theta": 10000.0,
}


def _model_section(config_path: str | Path | None) -> dict[str, Any]:
    if config_path is None:
        here = Path(__file__).resolve().parents[2] / "config.yaml"
        config_path = here if here.is_file() else None
    if config_path is None:
        return dict(DEFAULT_MODEL)
    import yaml

    return dict(yaml.safe_load(Path(config_path).read_text())["model"])


class _PeakRSS:
    def __init__(self, interval: float = 0.002):
        self.proc = psutil.Process(os.getpid())
        self.interval = interval
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> _PeakRSS:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def _child(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from .gradients import Projector, dense_projections, exact_grads_projected, projected_grads
    from .modeling import build_model, llama_config

    torch.set_num_threads(job["threads"])
    cfg = llama_config(job["model"], job["vocab"], job["window"], bos=0, eos=1, pad=2, attn="eager")
    model = build_model(cfg, 0).eval()
    proj = Projector.from_model(model, seed=1, k_in=job["k_in"], k_out=job["k_out"])
    n_block = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)
    g = torch.Generator().manual_seed(2)
    n = job["n"]
    ids = torch.randint(3, job["vocab"], (n, job["window"]), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    out: dict[str, Any] = {
        "params": sum(p.numel() for p in model.parameters()),
        "block_params": n_block,
        "dims": proj.dims,
    }
    reps = job["repeats"]
    if job["kind"] == "logra":
        b = job["batch"]
        projected_grads(model, proj, ids[:b], mask[:b])  # warm-up (allocator, projections)
        times = []
        with _PeakRSS() as mem:
            for _ in range(reps):
                t0 = time.perf_counter()
                for s in range(0, n, b):
                    projected_grads(model, proj, ids[s : s + b], mask[s : s + b])
                times.append(time.perf_counter() - t0)
        out["seconds"] = min(times)
        out["peak_mb"] = mem.delta_mb
    else:
        times = []
        with _PeakRSS() as mem:
            t0 = time.perf_counter()
            dense = dense_projections(proj, torch.float32)
            out["build_seconds"] = time.perf_counter() - t0
            kw = {"dtype": torch.float32, "dense": dense}
            exact_grads_projected(model, proj, ids[:1], mask[:1], **kw)  # warm-up
            for _ in range(reps):
                t0 = time.perf_counter()
                ref = exact_grads_projected(model, proj, ids, mask, **kw)
                times.append(time.perf_counter() - t0)
        out["seconds"] = min(times)
        out["peak_mb"] = mem.delta_mb
        fast = projected_grads(model, proj, ids, mask)
        out["rel_diff"] = float((fast - ref).norm() / ref.norm())
    return out


def _run_child(job: dict[str, Any]) -> dict[str, Any]:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_child, (job,))


def run_benchmark(
    *,
    threads: int = 1,
    windows: int = 64,
    exact_windows: int = 8,
    batch: int = 16,
    k_in: int = 8,
    k_out: int = 8,
    model: dict[str, Any] | None = None,
    vocab: int = 4096,
    window: int = 128,
    config_path: str | Path | None = None,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """Time both routes; rows ``{stage, what, value, unit, ratio}`` (ratio = LoGra's advantage:
    baseline time or memory over LoGra's, on the LoGra rows). Rates are the best of
    ``repeats`` timed passes (the machine may be shared); memory is the peak over all of them."""
    mcfg = model if model is not None else _model_section(config_path)
    common = dict(
        model=mcfg, vocab=vocab, window=window, threads=threads, k_in=k_in, k_out=k_out,
        repeats=repeats,
    )  # fmt: skip
    lg = _run_child({**common, "kind": "logra", "n": windows, "batch": batch})
    ex = _run_child({**common, "kind": "exact", "n": exact_windows})
    lg_wps = windows / lg["seconds"]
    ex_wps = exact_windows / ex["seconds"]
    shape = (
        f"{mcfg['n_layer']}L x {mcfg['n_embd']} (int {mcfg['intermediate']}), vocab {vocab}, "
        f"T={window}, {lg['params'] / 1e6:.2f}M params ({lg['block_params'] / 1e6:.2f}M in block "
        f"linears), D={lg['dims']} ({k_out}x{k_in}/module), threads={threads}"
    )
    rows = [
        {"stage": "setup", "what": shape, "value": lg["params"], "unit": "params", "ratio": None},
        {"stage": "logra", "what": f"windows/s (batch {batch}, {windows} windows)",
         "value": lg_wps, "unit": "windows/s", "ratio": lg_wps / ex_wps},
        {"stage": "logra", "what": "tokens/s", "value": lg_wps * window, "unit": "tokens/s",
         "ratio": lg_wps / ex_wps},
        {"stage": "logra", "what": "peak RSS increase", "value": lg["peak_mb"], "unit": "MiB",
         "ratio": ex["peak_mb"] / max(lg["peak_mb"], 1e-9)},
        {"stage": "exact+dense", "what": f"windows/s (per-example, {exact_windows} windows)",
         "value": ex_wps, "unit": "windows/s", "ratio": 1.0},
        {"stage": "exact+dense", "what": "tokens/s", "value": ex_wps * window, "unit": "tokens/s",
         "ratio": 1.0},
        {"stage": "exact+dense", "what": "peak RSS increase (incl. dense matrices)",
         "value": ex["peak_mb"], "unit": "MiB", "ratio": 1.0},
        {"stage": "exact+dense", "what": "one-off dense matrix build", "value":
         ex["build_seconds"], "unit": "s", "ratio": None},
        {"stage": "check", "what": "float32 |logra - exact| / |exact|", "value": ex["rel_diff"],
         "unit": "", "ratio": None},
    ]  # fmt: skip
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        v = r["value"]
        val = f"{v:.4g}" if isinstance(v, float) else str(v)
        ratio = "" if r["ratio"] is None else f"  (x{r['ratio']:.2f})"
        lines.append(f"{r['stage']:<12} {r['what']:<48} {val:>10} {r['unit']}{ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--exact-windows", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=8, help="k_in = k_out per module")
    ap.add_argument("--width", type=int, default=None, help="override n_embd (scaling runs)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default=None)
    a = ap.parse_args(argv)
    mcfg = _model_section(a.config)
    if a.width:
        mcfg = {**mcfg, "n_embd": a.width, "intermediate": 4 * a.width}
    rows = run_benchmark(
        threads=a.threads,
        windows=a.windows,
        exact_windows=a.exact_windows,
        batch=a.batch,
        k_in=a.k,
        k_out=a.k,
        model=mcfg,
        repeats=a.repeats,
    )
    print(format_rows(rows))


if __name__ == "__main__":
    main()
