"""Benchmark: LoGra projected gradients vs per-example full gradients + a projection to the same D.

Three routes on the default model shape (``config.yaml``'s ``model`` section, vocab 4096,
128-token windows, eager attention, random weights and tokens: the cost does not depend on them),
all producing ``[n, D]`` features, ``D = M k_out k_in`` for the ``M`` block linears:

* ``logra``: :func:`plantbench.attribution.gradients.capture.projected_grads` on batches of windows: one forward and
  one activation-only backward per batch, hooks project inputs and output gradients.
* ``exact+kron``: :func:`plantbench.attribution.gradients.reference.exact_grads_projected`: every block weight gradient
  by a batch-1 forward/backward per window (:func:`~plantbench.attribution.gradients.reference.exact_grads_flat`), each
  module's block times the materialised ``P_out kron P_in``. This is LoGra's own projection
  computed the slow way (same features; the float32 difference is the ``check`` row). Building
  the Kronecker matrices is a one-off cost, on its own row, not in the rate.
* ``exact+dense``: the same per-example gradients flattened to ``[n, P]`` (``P`` = weights of
  the block linears) times an unstructured seeded Rademacher ``[P, D]`` matrix
  (:func:`plantbench.attribution.gradients.reference.dense_random_projection`, TRAK-style): the usual "dense
  projection" baseline. At the default shape the matrix is 7.5 GB in float32, so it is
  regenerated from its seed once per batch of ``exact_windows`` windows (blocks of 16,384 rows,
  1 random bit per entry, expanded 1,024 rows at a time). Timed separately in one process: the
  per-example gradients, the generation, and the matmuls. "Held" rates count the matmuls against
  a 117 MB block of ``R`` kept in memory (larger than the cache, so it is streamed from memory
  like a held matrix would be) instead of generation + in-cache matmuls.

Every timing is the best of ``repeats`` passes (per component for ``exact+dense``, which favours
the baseline). Each route runs in a fresh spawned process with a fixed thread count; peak memory
is the peak resident set size (sampled every 2 ms) above the level after a one-short-window
warm-up (which loads the code pages but allocates little), so the full-size warm-up and every
allocation of the route count. ``scaling`` rows repeat LoGra's memory measurement at twice the
width (``n_embd`` and ``intermediate`` doubled: ~4x the block parameters; not timed) and give
the dense route's memory needs at both widths, computed, not measured.

Flops per window (``T`` tokens, ``P_b`` block-linear weights, ``P_h = V d`` head weights, ``A =
12 L T^2 d`` for eager attention forward + backward, ``k_in, k_out`` per module, ``B`` windows
per batch):

* LoGra: forward + activation-only backward ``4 T (P_b + P_h) + A``, plus the hook projections
  ``2 T sum_m (i_m k_in + o_m k_out)`` (2.6% at the default shape).
* exact per-example gradient: ``6 T P_b + 4 T P_h + A`` (the head's weight gradient is not
  requested), at batch 1.
* Kronecker projection: ``2 k_out k_in P_b``; dense projection: ``2 P_b D`` per window, plus
  ``P_b D`` random signs per batch if regenerated (``P_b D / B`` per window).

Default shape (4 x 128, int 512, V 4096, T 128, D 1,792, P_b = 1.05M): LoGra 0.93 GFLOP, exact
gradient 1.17, Kronecker projection 0.13, dense projection 3.76 GFLOP; 1.88e9 random signs per
batch. Paper shape (``workflow/presets/paper.yaml``: 12 x 768, int 2048, V 32,768, T 1024,
D 15,288 = 84 x 13 x 14, P_b = 84.9M): LoGra 572 GFLOP, exact gradient 741, dense projection
2,597 GFLOP; the ``[P_b, D]`` matrix is 5.2 TB in float32.

Flop-bound LoGra ratio (the speed-up if both routes ran at the same flop rate): against
exact+kron ``(6T P_b + 4T P_h + A + 2 k_out k_in P_b) / (4T (P_b + P_h) + A + hooks)``: 1.41x at
the default shape, 1.35x at the paper shape. Against exact+dense with a held matrix (``2 P_b D``
in place of the Kronecker term): 5.3x default, 5.8x paper (6.0x and 7.1x with attention and the
hooks left out). So ``>= 10x`` against a held matrix is not reachable on flops at either shape.
A measured ratio differs from the flop bound where the routes run at different flop rates
(batch-1 passes; ``[B, P] @ [P, D]`` matmuls bound by reading ``R`` at small ``B``, faster than
LoGra's passes at large ``B``), and against the regenerated matrix it adds the ``P_b D`` random
signs per batch. The ``flops`` rows give these numbers for the benchmarked shape.

Measured (default shape, 1 thread on a shared 2-core AMD EPYC, noisy): LoGra 42 windows/s;
exact+kron 1.8x slower. exact+dense at ``B = exact_windows = 8``: per window 36 ms of
per-example gradient, 166 ms generating ``R`` and 136 ms of in-cache matmuls (143 ms against a
held block), so LoGra is 14x faster than the regenerating route and 7.6x faster than with a held
matrix. Both ratios fall with ``B``: at ``--exact-windows 64`` generation is 24 ms per window
and the held matmuls 58 ms (the ``[B, P] @ [P, D]`` matmul stops being bound by reading ``R``),
and the ratios are 4.8x (regenerated) and 3.7x (held, below the flop bound). So 10x or more was
measured only against regeneration at a small batch. Peak RSS increase: LoGra 346 MiB at width
128 and 420 MiB at width 256 (+21% for 4x the block parameters: activations and logits); the
regenerating dense route 108 MiB at ``B = 8`` (568 MiB at ``B = 64``), whose ``B P_b`` gradient
buffer and ``P_b D`` signs per batch grow 4x with the width.

Memory: LoGra's extra memory is its batch's activations and logits (``O(B T (L (d + i) + V))``
values) and ``O(B T M k)`` projected values, nothing of size ``P_b``. The dense route needs ``B
P_b`` gradient values and either the held matrix, ``P_b D`` values (7.5 GB at the default
shape, 30 GB at twice the width, 5.2 TB at the paper shape, in float32), or its regeneration.

Run: ``python -m plantbench.ops.bench.gradients [--threads 1] [--windows 64] [--exact-windows 8]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from plantbench import layout
from plantbench.ops.bench.measure import PeakMem, best_time, spawn
from plantbench.paths import CHECKOUT

DEFAULT_MODEL = {
    "n_layer": 4,
    "n_embd": 128,
    "n_head": 4,
    "intermediate": 512,
    "tie_embeddings": True,
    "rope_theta": 10000.0,
}
DENSE_SEED = 3


def _model_section(config_path: str | Path | None) -> dict[str, Any]:
    if config_path is None:
        here = CHECKOUT / "config.yaml"
        config_path = here if here.is_file() else None
    if config_path is None:
        return dict(DEFAULT_MODEL)
    import yaml

    return dict(yaml.safe_load(Path(config_path).read_text())["model"])


def doubled_width(mcfg: dict[str, Any]) -> dict[str, Any]:
    """The model section at twice the width (``n_embd`` and ``intermediate`` doubled, same
    heads and layers): ~4x the block-linear parameters."""
    return {
        **mcfg,
        "n_embd": 2 * int(mcfg["n_embd"]),
        "intermediate": 2 * int(mcfg["intermediate"]),
    }


def flops_per_window(
    mcfg: dict[str, Any], vocab: int, window: int, k_in: int, k_out: int
) -> dict[str, float]:
    """Flop model of the module docstring for a Llama block stack (q, k, v, o, gate, up, down):
    per window ``logra``, ``exact`` (per-example gradient), ``kron`` and ``dense`` (projection
    matmuls), and ``signs`` (random values of ``R`` per batch); ``P`` and ``D``."""
    from plantbench.ops.plan import Shape

    L, d, i, T = int(mcfg["n_layer"]), int(mcfg["n_embd"]), int(mcfg["intermediate"]), window
    shape = Shape(L, d, i, vocab, T)
    shapes = [(d, d)] * 4 + [(d, i)] * 2 + [(i, d)]  # (in, out) per module of one layer
    p_b = shape.block_linear_params
    p_h = shape.matmul_params - p_b
    m = layout.tracked_linears(L)
    dims = m * k_in * k_out
    attn = 12 * L * T * T * d
    hooks = 2 * T * L * sum(a * k_in + b * k_out for a, b in shapes) + 2 * T * dims
    return {
        "P": p_b,
        "D": dims,
        "logra": 4 * T * (p_b + p_h) + attn + hooks,
        "exact": 6 * T * p_b + 4 * T * p_h + attn,
        "kron": 2 * k_in * k_out * p_b,
        "dense": 2 * p_b * dims,
        "signs": p_b * dims,
    }


def _small(ids: Any, mask: Any) -> tuple[Any, Any]:
    """One short window: a warm-up before the memory baseline that loads the code paths
    (file-backed pages of the torch libraries count in the resident size) but allocates little."""
    return ids[:1, :8], mask[:1, :8]


def _logra(job: dict[str, Any], model: Any, proj: Any, ids: Any, mask: Any) -> dict[str, Any]:
    from plantbench.attribution.gradients.capture import projected_grads

    n, b = len(ids), job["batch"]

    def one_pass() -> None:
        for s in range(0, n, b):
            projected_grads(model, proj, ids[s : s + b], mask[s : s + b])

    projected_grads(model, proj, *_small(ids, mask))
    with PeakMem() as mem:
        projected_grads(model, proj, ids[:b], mask[:b])  # full-size warm-up
        seconds, _ = best_time(one_pass, job["repeats"])
    return {"seconds": seconds, "peak_mb": mem.rss_mb}


def _kron(job: dict[str, Any], model: Any, proj: Any, ids: Any, mask: Any) -> dict[str, Any]:
    import torch

    from plantbench.attribution.gradients.capture import projected_grads
    from plantbench.attribution.gradients.reference import dense_projections, exact_grads_projected

    exact_grads_projected(model, proj, *_small(ids, mask), dtype=torch.float32)
    with PeakMem() as mem:
        t0 = time.perf_counter()
        kw = {"dtype": torch.float32, "dense": dense_projections(proj, torch.float32)}
        build = time.perf_counter() - t0
        exact_grads_projected(model, proj, ids[:1], mask[:1], **kw)  # full-size warm-up
        seconds, ref = best_time(
            lambda: exact_grads_projected(model, proj, ids, mask, **kw), job["repeats"]
        )
    fast = projected_grads(model, proj, ids, mask)
    rel = float((fast - ref).norm() / ref.norm())
    return {"seconds": seconds, "peak_mb": mem.rss_mb, "build_seconds": build, "rel_diff": rel}


def _dense(job: dict[str, Any], model: Any, proj: Any, ids: Any, mask: Any) -> dict[str, Any]:
    import torch

    from plantbench.attribution.gradients.reference import (
        RADEMACHER_BLOCK_ROWS,
        dense_random_projection,
        exact_grads_flat,
        rademacher_block,
    )

    names, dims, reps = proj.module_names, proj.dims, job["repeats"]
    grad_s, proj_s, gen_s, mm_s = [], [], [], []
    small = exact_grads_flat(model, names, *_small(ids, mask), dtype=torch.float32)
    dense_random_projection(small[:, :4096], dims, DENSE_SEED)
    with PeakMem() as mem:
        exact_grads_flat(model, names, ids[:1], mask[:1], dtype=torch.float32)  # full-size warm-up
        for _ in range(reps):
            t0 = time.perf_counter()
            flat = exact_grads_flat(model, names, ids, mask, dtype=torch.float32)
            t1 = time.perf_counter()
            times: dict[str, float] = {}
            feats = dense_random_projection(flat, dims, DENSE_SEED, times=times)
            grad_s.append(t1 - t0)
            proj_s.append(time.perf_counter() - t1)
            gen_s.append(times["generate"])
            mm_s.append(times["matmul"])
    p = flat.shape[1]
    held = rademacher_block(DENSE_SEED, 0, min(RADEMACHER_BLOCK_ROWS, p), dims)

    def held_matmul() -> Any:
        out = torch.zeros(len(ids), dims)
        for s in range(0, p, len(held)):
            out.addmm_(flat[:, s : s + len(held)], held[: min(len(held), p - s)])
        return out

    held_s, _ = best_time(held_matmul, reps)
    return {
        "grad_seconds": min(grad_s),
        "proj_seconds": min(proj_s),
        "gen_seconds": min(gen_s),
        "matmul_seconds": min(mm_s),
        "held_matmul_seconds": held_s,
        "held_block_mb": held.numel() * 4 / 2**20,
        "peak_mb": mem.rss_mb,
        "norm_ratio": float(feats.norm() / flat.norm()),
    }


def _child(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from plantbench.attribution.gradients.projector import Projector
    from plantbench.attribution.sketch import Sketch
    from plantbench.model.modeling import build_model, llama_config

    torch.set_num_threads(job["threads"])
    cfg = llama_config(job["model"], job["vocab"], job["window"], bos=0, eos=1, pad=2, attn="eager")
    model = build_model(cfg, 0).eval()
    proj: Projector | Sketch = (
        Sketch.from_model(model, seed=1, dims=job["dims"])
        if job["kind"] == "sketch"
        else Projector.from_model(model, seed=1, k_in=job["k_in"], k_out=job["k_out"])
    )
    mods = dict(model.named_modules())
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, job["vocab"], (job["n"], job["window"]), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    route = {"logra": _logra, "sketch": _logra, "kron": _kron, "dense": _dense}[job["kind"]]
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "linear_params": sum(mods[n].weight.numel() for n in proj.module_names),
        "dims": proj.dims,
        **route(job, model, proj, ids, mask),
    }


def _run_child(job: dict[str, Any]) -> dict[str, Any]:
    return spawn(_child, job)


def row(
    stage: str, what: str, value: float, unit: str, reference: float | None = None
) -> dict[str, Any]:
    ratio = None if not reference else value / reference
    return {
        "stage": stage,
        "what": what,
        "value": value,
        "unit": unit,
        "reference": reference,
        "ratio": ratio,
    }


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
    sketch_dims: int | None = None,
) -> list[dict[str, Any]]:
    """Time the three routes; rows ``{stage, what, value, unit, reference, ratio}`` with
    ``ratio = value / reference`` where a row compares with another measurement (LoGra's rate
    over a baseline's: LoGra's speed-up; LoGra's memory over a baseline's). Rates are the best of
    ``repeats`` timed passes (the machine may be shared); memory is the peak over all of them."""
    mcfg = model if model is not None else _model_section(config_path)
    common = dict(
        model=mcfg, vocab=vocab, window=window, threads=threads, k_in=k_in, k_out=k_out,
        repeats=repeats,
    )  # fmt: skip
    lg = _run_child({**common, "kind": "logra", "n": windows, "batch": batch})
    kr = _run_child({**common, "kind": "kron", "n": exact_windows})
    de = _run_child({**common, "kind": "dense", "n": exact_windows})
    wide = doubled_width(mcfg)
    lg2 = _run_child(
        {**common, "model": wide, "kind": "logra", "n": batch, "batch": batch, "repeats": 1}
    )
    sketch = (
        []
        if sketch_dims is None
        else _sketch_rows(common, wide, windows, batch, window, int(sketch_dims), lg, lg2)
    )
    return (
        sketch
        + _setup_rows(mcfg, vocab, window, k_in, k_out, threads, lg)
        + _route_rows(lg, kr, de, windows, exact_windows, batch, window)
        + _scaling_rows(mcfg, wide, lg, lg2, exact_windows, batch)
        + _flop_rows(mcfg, vocab, window, k_in, k_out, exact_windows)
        + [
            row("check", "float32 |logra - exact+kron| / |exact+kron|", kr["rel_diff"], ""),
            row("check", "exact+dense |G R| / |G| (norm kept: ~1)", de["norm_ratio"], ""),
        ]
    )


def _sketch_rows(
    common: dict[str, Any],
    wide: dict[str, Any],
    windows: int,
    batch: int,
    window: int,
    dims: int,
    lg: dict[str, Any],
    lg2: dict[str, Any],
) -> list[dict[str, Any]]:
    """The count sketch (the default projection) against LoGra: windows/s, and peak memory at
    the configured width and at twice the width (the same jobs as LoGra's)."""
    base = {**common, "kind": "sketch", "dims": dims, "batch": batch}
    sk = _run_child({**base, "n": windows})
    sk2 = _run_child({**base, "model": wide, "n": batch, "repeats": 1})
    wps = windows / sk["seconds"]
    tag = f"D={dims}, batch {batch}, {windows} windows"
    return [
        row("sketch", f"windows/s ({tag})", wps, "windows/s"),
        row("sketch", "tokens/s", wps * window, "tokens/s"),
        row("sketch", f"windows/s vs logra (D={lg['dims']})", wps, "windows/s",
             windows / lg["seconds"]),
        row("sketch", "peak RSS increase vs logra", sk["peak_mb"], "MiB", lg["peak_mb"]),
        row("scaling", f"sketch peak RSS increase, batch {batch}, width "
             f"{common['model']['n_embd']}, measured", sk["peak_mb"], "MiB"),
        row("scaling", f"sketch peak RSS increase, batch {batch}, width {wide['n_embd']}, "
             "measured (vs the configured width)", sk2["peak_mb"], "MiB", sk["peak_mb"]),
        row("scaling", f"sketch vs logra peak RSS increase at width {wide['n_embd']}",
             sk2["peak_mb"], "MiB", lg2["peak_mb"]),
    ]  # fmt: skip


def _setup_rows(
    mcfg: dict[str, Any],
    vocab: int,
    window: int,
    k_in: int,
    k_out: int,
    threads: int,
    lg: dict[str, Any],
) -> list[dict[str, Any]]:
    shape = (
        f"{mcfg['n_layer']}L x {mcfg['n_embd']} (int {mcfg['intermediate']}), vocab {vocab}, "
        f"T={window}, {lg['params'] / 1e6:.2f}M params ({lg['linear_params'] / 1e6:.2f}M in "
        f"block linears = P), D={lg['dims']} ({k_out}x{k_in}/module), threads={threads}"
    )
    return [row("setup", shape, lg["params"], "params")]


def _route_rows(
    lg: dict[str, Any],
    kr: dict[str, Any],
    de: dict[str, Any],
    windows: int,
    n: int,
    batch: int,
    window: int,
) -> list[dict[str, Any]]:
    lg_wps = windows / lg["seconds"]
    kr_wps = n / kr["seconds"]
    regen_wps = n / (de["grad_seconds"] + de["proj_seconds"])
    held_wps = n / (de["grad_seconds"] + de["held_matmul_seconds"])
    held_gb = lg["linear_params"] * lg["dims"] * 4 / 1e9
    per_win = {
        k: de[k] / n
        for k in ("grad_seconds", "gen_seconds", "matmul_seconds", "held_matmul_seconds")
    }
    return [
        row("logra", f"windows/s (batch {batch}, {windows} windows)", lg_wps, "windows/s"),
        row("logra", "tokens/s", lg_wps * window, "tokens/s"),
        row("logra", "windows/s vs exact+kron", lg_wps, "windows/s", kr_wps),
        row("logra", "windows/s vs exact+dense, R regenerated per batch", lg_wps, "windows/s",
             regen_wps),
        row("logra", "windows/s vs exact+dense, R held", lg_wps, "windows/s", held_wps),
        row("logra", "peak RSS increase", lg["peak_mb"], "MiB"),
        row("logra", "peak RSS increase vs exact+kron", lg["peak_mb"], "MiB", kr["peak_mb"]),
        row("logra", "peak RSS increase vs exact+dense (regenerating)", lg["peak_mb"], "MiB",
             de["peak_mb"]),
        row("exact+kron", f"windows/s (per-example, {n} windows)", kr_wps, "windows/s"),
        row("exact+kron", "tokens/s", kr_wps * window, "tokens/s"),
        row("exact+kron", "peak RSS increase (incl. Kronecker matrices)", kr["peak_mb"], "MiB"),
        row("exact+kron", "one-off Kronecker matrix build", kr["build_seconds"], "s"),
        row("exact+dense", "per-example gradients, s per window", per_win["grad_seconds"], "s"),
        row("exact+dense", f"generating R, s per window (P*D signs per {n} windows)",
             per_win["gen_seconds"], "s"),
        row("exact+dense", "matmuls with in-cache R tiles, s per window",
             per_win["matmul_seconds"], "s"),
        row("exact+dense", f"matmuls with a held {de['held_block_mb']:.0f} MiB R block, s per "
             "window", per_win["held_matmul_seconds"], "s"),
        row("exact+dense", f"windows/s (R regenerated per batch of {n})", regen_wps, "windows/s"),
        row("exact+dense", "tokens/s (R regenerated)", regen_wps * window, "tokens/s"),
        row("exact+dense", f"windows/s excluding generation (R held: {held_gb:.1f} GB fp32)",
             held_wps, "windows/s"),
        row("exact+dense", "tokens/s (R held)", held_wps * window, "tokens/s"),
        row("exact+dense", f"peak RSS increase (regenerating, batch {n})", de["peak_mb"], "MiB"),
    ]  # fmt: skip


def _scaling_rows(
    mcfg: dict[str, Any],
    wide: dict[str, Any],
    lg: dict[str, Any],
    lg2: dict[str, Any],
    n: int,
    batch: int,
) -> list[dict[str, Any]]:
    rows = []
    for cfg, res in ((mcfg, lg), (wide, lg2)):
        tag = f"width {cfg['n_embd']} (P={res['linear_params'] / 1e6:.2f}M)"
        grads, held = n * res["linear_params"] * 4, res["linear_params"] * res["dims"] * 4
        ref = lg["peak_mb"] if res is lg2 else None
        rows += [
            row("scaling", f"logra peak RSS increase, batch {batch}, {tag}, measured",
                 res["peak_mb"], "MiB", ref),
            row("scaling", f"exact+dense gradient buffer n*P*4 (n={n}), {tag}, computed",
                 grads / 2**20, "MiB"),
            row("scaling", f"exact+dense held R P*D*4 ({held / 1e9:.1f} GB), {tag}, computed",
                 held / 2**20, "MiB"),
        ]  # fmt: skip
    return rows


def _flop_rows(
    mcfg: dict[str, Any], vocab: int, window: int, k_in: int, k_out: int, n: int
) -> list[dict[str, Any]]:
    f = flops_per_window(mcfg, vocab, window, k_in, k_out)
    kron = (f["exact"] + f["kron"]) / f["logra"]
    held = (f["exact"] + f["dense"]) / f["logra"]
    return [
        row("flops", "per window: logra (fwd + activation backward + hooks)", f["logra"], "FLOP"),
        row("flops", "per window: exact per-example gradient", f["exact"], "FLOP"),
        row("flops", "per window: dense projection 2*P*D", f["dense"], "FLOP"),
        row("flops", f"random signs of R per batch of {n} (P*D)", f["signs"], "values"),
        row("flops", "flop-bound logra ratio vs exact+kron, computed", kron, "x"),
        row("flops", "flop-bound logra ratio vs exact+dense, R held, computed", held, "x"),
    ]


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        v = r["value"]
        val = f"{v:.4g}" if isinstance(v, float) else str(v)
        ratio = "" if r["ratio"] is None else f"  (x{r['ratio']:.3g} of {r['reference']:.4g})"
        lines.append(f"{r['stage']:<12} {r['what']:<66} {val:>10} {r['unit']}{ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--exact-windows", type=int, default=8, help="per-example batch (and R reuse)")
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
