"""``plantbench bench``: how fast every stage is against its physical limit, on this machine.

Writes ``{results}/benchmarks/benchmarks.csv`` (one row per measurement: ``stage, what, value,
unit, reference, ratio``; ``ratio = value / reference`` where a reference exists) and
``{results}/benchmarks/train_profile.txt`` (the top operators of one training step). Nothing
here is asserted: timings on a shared machine are noisy; each rate is the best (and the median)
of several timed repeats.

* ``peak``: the machine's measured fp32 matmul peak, ``2 n^3`` FLOPs of an ``n x n`` matmul, best
  of ``repeats``, with the thread count the training benchmark uses.
* ``pretrain``: the configured model shape (``model``, ``tokenizer.vocab_size``,
  ``stream.window``), random tokens, the training step of :mod:`plantbench.model.pretrain` (micro-batches
  of ``train.micro_batch_windows`` up to ``train.batch_windows``, cross-entropy, backward, clip,
  AdamW). tokens/s and model FLOP utilisation = tokens/s x (6N + 12 L d T) / peak
  (:meth:`plantbench.ops.plan.Shape.train_flops_per_token`). The MFU row divides FLOP per
  CPU-second of this process on both sides (process CPU time x threads), so that other
  processes sharing the cores do not bias the ratio; wall-clock rates are reported too.
  The float pin's cost (:mod:`plantbench.floats`): the same step's tokens/s in fresh processes
  with the pin and without it (``PLANTBENCH_FLOAT_PIN=off``), arms alternated, best of each.
* ``features``: :func:`plantbench.ops.bench.gradients.run_benchmark` (LoGra vs per-example full
  gradients projected to the same dims by the Kronecker-structured ``P_out kron P_in`` and by an
  unstructured seeded Rademacher ``[P, D]`` matrix, regenerated per batch or held; LoGra's peak
  memory at 1x and 2x width; the flop model). A LoGra row's reference is the baseline it is
  compared with (ratio = LoGra's rate over the baseline's, or its memory over the baseline's).
  With ``features.projection: sketch`` (the default) also the count sketch's windows/s against
  LoGra's and its peak memory at 1x and 2x width (``sketch`` and ``scaling`` rows).
* ``peers``: :func:`plantbench.ops.bench.peers.run_peers`: featurization windows/s and peak memory of
  ours (:func:`plantbench.attribution.gradients.capture.projected_grads`) against bergson's and dattri's own
  per-example projected-gradient featurizers at the same ``D``, on twin A's final checkpoint and
  first pool windows when ``{results}`` holds a finished study (else a fresh model on random
  tokens), each tool in its own process, taking turns over the rounds. A ``ours vs <peer>`` row's
  reference is the peer's value (ratio = ours over the peer's); every tool's time over the
  floor's (the frozen model's forward and backward, nothing captured) bounds what a featurizer
  sharing that pass could gain. A peer that is not installed (an optional extra: ``make
  peers-bench``) is logged and has no rows.
* ``scoring``: pairs/s of every enabled method on a finished study's features (model A, the
  configured tiles), when ``{results}`` holds one; and the tile engine
  (:func:`plantbench.attribution.scoring.score_tiled`, dot products of synthetic vectors read tile by tile from
  disk) at two pool sizes, with the peak anonymous memory (the process's own allocations) and
  the peak resident size including file-backed pages (the engine's on-disk scratch), each in a
  fresh process.
* ``server``: the audit server's latency (``POST /audit`` through an in-process HTTP client, on
  twin A's membership probe; median and 95th percentile in ms) when the study's membership suite
  has run.
* ``study``: wall time of every rule of the study in ``{results}``, from the rules'
  ``benchmark:`` files (column ``s``).
"""

from __future__ import annotations

import csv
import io as _io
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from plantbench import io
from plantbench.ops.bench.measure import COLUMNS, PeakMem, row, spawn
from plantbench.paths import MODELS, Paths

log = logging.getLogger(__name__)

CSV_NAME = "benchmarks.csv"
PROFILE_NAME = "train_profile.txt"
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn_matmul")


# --------------------------------------------------------------------------- peak matmul


def matmul_peak(threads: int, n: int = 2048, repeats: int = 7) -> tuple[float, float, float]:
    """Best and median fp32 FLOP/s (wall clock) of an ``n x n`` matmul on ``threads`` threads,
    and the best FLOP per CPU-second x threads (process CPU time: what the cores delivered while
    this process ran on them, robust to other processes sharing the machine)."""
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g)
    b = torch.randn(n, n, generator=g)
    c = torch.empty(n, n)
    torch.mm(a, b, out=c)
    rates, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=c)
        rates.append(2.0 * n**3 / (time.perf_counter() - t0))
        cpu.append(2.0 * n**3 * threads / max(1e-9, time.process_time() - c0))
    return max(rates), statistics.median(rates), max(cpu)


# --------------------------------------------------------------------------- training


def _train_setup(cfg: dict[str, Any], threads: int) -> tuple[Any, Any, Any, int, int, int]:
    import torch

    from plantbench.model.modeling import build_model, llama_config
    from plantbench.model.pretrain import make_optimizer

    torch.set_num_threads(threads)
    vocab, window = int(cfg["tokenizer"]["vocab_size"]), int(cfg["stream"]["window"])
    conf = llama_config(cfg["model"], vocab, window, bos=0, eos=1, pad=2, attn="sdpa")
    model = build_model(conf, 0)
    opt = make_optimizer(model, cfg["train"], torch.device("cpu"))
    model.train()
    return model, opt, conf, vocab, window, int(cfg["train"]["batch_windows"])


def _train_step(model: Any, opt: Any, batch: Any, micro: int, clip: float) -> float:
    import torch

    opt.zero_grad(set_to_none=True)
    B = batch.size(0)
    total = 0.0
    for m0 in range(0, B, micro):
        ids = batch[m0 : m0 + micro]
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)
        )
        (loss * (ids.size(0) / B)).backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return total


def train_benchmark(
    cfg: dict[str, Any],
    threads: int,
    steps: int = 6,
    repeats: int = 3,
    profile_path: Path | None = None,
) -> dict[str, Any]:
    """tokens/s of the training step (best and median over ``repeats`` timed runs of ``steps``)
    and, optionally, a torch.profiler table of one step."""
    import torch

    model, opt, _, vocab, window, B = _train_setup(cfg, threads)
    micro, clip = int(cfg["train"]["micro_batch_windows"]), float(cfg["train"]["grad_clip"])
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(3, vocab, (B, window), generator=g)
    for _ in range(2):  # warm-up: allocator, Adam states
        _train_step(model, opt, batch, micro, clip)
    rates, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            _train_step(model, opt, batch, micro, clip)
        rates.append(steps * B * window / (time.perf_counter() - t0))
        cpu.append(steps * B * window * threads / max(1e-9, time.process_time() - c0))
    out: dict[str, Any] = {
        "cpu": max(cpu),
        "best": max(rates),
        "median": statistics.median(rates),
        "params": sum(p.numel() for p in model.parameters()),
    }
    if profile_path is not None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _train_step(model, opt, batch, micro, clip)
        avg = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in avg)
        mm = sum(e.self_cpu_time_total for e in avg if e.key in MATMUL_OPS)
        out["matmul_share"] = mm / total if total else 0.0
        table = avg.table(sort_by="self_cpu_time_total", row_limit=20)
        io.write_text(
            profile_path,
            f"one training step, {threads} thread(s)\n"
            f"matmul share of self CPU time: {out['matmul_share']:.1%}\n\n{table}\n",
        )
    return out


# --------------------------------------------------------------------------- scoring


def _tile_child(job: dict[str, Any]) -> dict[str, Any]:
    """Score ``n_q`` synthetic query vectors against ``n_pool`` pool vectors stored on disk,
    reading one pool tile at a time (as the gradient store is read)."""
    from threadpoolctl import threadpool_limits

    from plantbench.attribution.scoring import score_tiled

    n_q, n_pool, dim = job["n_q"], job["n_pool"], job["dim"]
    with tempfile.TemporaryDirectory(dir=job.get("tmp")) as tmp:
        path = Path(tmp) / "pool.f32"
        rng = np.random.default_rng(0)
        with open(path, "wb") as fh:
            for p0 in range(0, n_pool, 8192):
                rng.standard_normal((min(8192, n_pool - p0), dim), dtype=np.float32).tofile(fh)
        queries = rng.standard_normal((n_q, dim), dtype=np.float32)
        row_bytes = dim * 4

        def fn(q: np.ndarray, p: np.ndarray) -> np.ndarray:
            block = np.fromfile(
                path, dtype=np.float32, count=len(p) * dim, offset=int(p[0]) * row_bytes
            ).reshape(len(p), dim)
            return queries[q] @ block.T

        own_q = np.arange(n_q, dtype=np.int64)
        own_p = (own_q * 7919) % n_pool
        with threadpool_limits(limits=job["threads"]), PeakMem() as mem:
            t0 = time.perf_counter()
            score_tiled(
                fn,
                n_q,
                n_pool,
                query_block=job["query_block"],
                pool_block=job["pool_block"],
                top_k=job["top_k"],
                own_query=own_q,
                own_pool=own_p,
                scratch_dir=tmp,
            )
            sec = time.perf_counter() - t0
    return {"seconds": sec, "anon_mb": mem.anon_mb, "rss_mb": mem.rss_mb}


def _method_child(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from threadpoolctl import threadpool_limits

    from plantbench.attribution.methods import registry
    from plantbench.attribution.methods.scoring_context import Context
    from plantbench.attribution.scoring import own_pairs, score_tiled

    torch.set_num_threads(job["threads"])
    cfg = job["cfg"]
    registry.load_plugins(cfg)
    m = registry.get(job["method"])
    ctx = Context(cfg, Paths(cfg), job["model"])
    ctx.prepare(m.needs)
    pairs = own_pairs(ctx.queries, ctx.pool)
    sc = cfg["scoring"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        threadpool_limits(limits=job["threads"]),
        PeakMem() as mem,
    ):
        t0 = time.perf_counter()
        score_tiled(
            lambda q, p: m.score(ctx, q, p),
            ctx.n_queries,
            ctx.n_pool,
            query_block=int(sc["query_block"]),
            pool_block=int(sc["pool_block"]),
            top_k=int(sc["top_k"]),
            own_query=pairs["q"].to_numpy(),
            own_pool=pairs["row"].to_numpy(),
            scratch_dir=tmp,
        )
        sec = time.perf_counter() - t0
    return {"seconds": sec, "pairs": ctx.n_queries * ctx.n_pool, "anon_mb": mem.anon_mb}


def _train_child(job: dict[str, Any]) -> dict[str, Any]:
    from plantbench import floats

    out = train_benchmark(job["cfg"], job["threads"], steps=job["steps"], repeats=job["repeats"])
    rec = floats.record()
    return {**out, "pin": rec["pin"], "capability": rec["cpu_capability"]}


def pin_benchmark(
    cfg: dict[str, Any], threads: int, steps: int, repeats: int
) -> list[dict[str, Any]]:
    """Training tokens/s with the float pin and without it (``PLANTBENCH_FLOAT_PIN=off``), each
    in a fresh process, alternating arms so that drift of a shared machine hits both."""
    from plantbench import floats

    job = {"cfg": cfg, "threads": threads, "steps": steps, "repeats": 1}
    arms: dict[str, list[float]] = {"pinned": [], "unpinned": []}
    tags: dict[str, str] = {}
    for _ in range(repeats):
        for arm, env in (("pinned", None), ("unpinned", floats.unpinned_env())):
            res = spawn(_train_child, job, env)
            arms[arm].append(res["best"])
            tags[arm] = f"pin {res['pin']}, ATen {res['capability']}"
    best = {arm: max(v) for arm, v in arms.items()}
    return [
        row(
            "pretrain",
            f"tokens/s without the float pin ({tags['unpinned']}), best",
            best["unpinned"],
            "tokens/s",
        ),
        row(
            "pretrain",
            f"tokens/s with the float pin ({tags['pinned']}), best; ratio: vs without",
            best["pinned"],
            "tokens/s",
            best["unpinned"],
        ),
    ]


def _study_ready(cfg: dict[str, Any]) -> bool:
    p = Paths(cfg)
    return (p.pool(MODELS[0]) / "meta.json").is_file() and (p.causal / "meta.json").is_file()


# --------------------------------------------------------------------------- study wall time


def study_times(bench_dir: Path) -> list[dict[str, Any]]:
    """Wall seconds of every rule's ``benchmark:`` file (``*.tsv``, column ``s``)."""
    import pandas as pd

    rows, total = [], 0.0
    for f in sorted(bench_dir.glob("*.tsv")):
        try:
            s = float(pd.read_csv(f, sep="\t")["s"].sum())
        except (KeyError, ValueError, pd.errors.ParserError):
            log.warning("skipping %s: no 's' column", f)
            continue
        rows.append(row("study", f.stem, s, "s"))
        total += s
    if rows:
        rows.append(row("study", f"sum over {len(rows)} rule jobs (serial time)", total, "s"))
    return rows


# --------------------------------------------------------------------------- driver


def _pretrain_rows(cfg: dict[str, Any], thr: int, quick: bool, out_dir: Path, peaks: tuple) -> list:
    from plantbench.ops.plan import shape_of

    peak, peak_cpu = peaks
    reps = 2 if quick else 5
    shape = shape_of(cfg)
    fpt = shape.train_flops_per_token()
    tr = train_benchmark(
        cfg, thr, steps=2 if quick else 6, repeats=reps, profile_path=out_dir / PROFILE_NAME
    )
    desc = (
        f"{shape.n_layer}L x {shape.width}, vocab {shape.vocab}, T={shape.window}, "
        f"{tr['params'] / 1e6:.2f}M params, batch {cfg['train']['batch_windows']} "
        f"(micro {cfg['train']['micro_batch_windows']}), {thr} thread(s)"
    )
    rows = [
        row("pretrain", f"tokens/s, best ({desc})", tr["best"], "tokens/s"),
        row("pretrain", "tokens/s, median", tr["median"], "tokens/s", tr["best"]),
        row("pretrain", "FLOPs/token = 6N + 12 L d T", fpt, "FLOP"),
        row(
            "pretrain",
            "MFU: model FLOP per CPU-second vs matmul FLOP per CPU-second",
            tr["cpu"] * fpt,
            "FLOP/s",
            peak_cpu,
        ),
        row(
            "pretrain",
            "model FLOP/s (best, wall clock) vs measured matmul peak",
            tr["best"] * fpt,
            "FLOP/s",
            peak,
        ),
        row(
            "pretrain",
            "model FLOP/s (median) vs measured matmul peak",
            tr["median"] * fpt,
            "FLOP/s",
            peak,
        ),
        row("pretrain", "matmul share of one step's CPU time (profile)", tr["matmul_share"], ""),
    ]
    log.info("training %.0f tokens/s, MFU %.1f%%", tr["best"], 100 * tr["cpu"] * fpt / peak_cpu)
    rows += pin_benchmark(cfg, thr, steps=2 if quick else 4, repeats=2 if quick else 3)
    log.info("float pin: %s", ", ".join(f"{r['value']:.0f}" for r in rows[-2:]))
    return rows


def _feature_rows(cfg: dict[str, Any], thr: int, quick: bool) -> list:
    from plantbench.ops.bench.gradients import run_benchmark

    f = cfg["features"]
    grows = run_benchmark(
        threads=thr,
        windows=32 if quick else 64,
        exact_windows=4 if quick else 8,
        batch=int(f["batch_windows"]),
        k_in=int(f["grad_k_in"]),
        k_out=int(f["grad_k_out"]),
        model=dict(cfg["model"]),
        vocab=int(cfg["tokenizer"]["vocab_size"]),
        window=int(cfg["stream"]["window"]),
        repeats=2 if quick else 3,
        sketch_dims=int(f["grad_dims"]) if f["projection"] == "sketch" else None,
    )
    return [
        row("features", f"{r['stage']}: {r['what']}", r["value"], r["unit"], r["reference"])
        for r in grows
    ]


def _peer_rows(cfg: dict[str, Any], paths: Paths, thr: int, quick: bool) -> list:
    from plantbench.ops.bench.peers import run_peers

    return run_peers(cfg, paths, threads=thr, quick=quick)


def _tile_rows(cfg: dict[str, Any], thr: int, quick: bool) -> list:
    from plantbench.ops.plan import grad_dims

    sc = cfg["scoring"]
    dim = grad_dims(cfg)
    n_q = 2 * int(sc["query_block"])
    rows = []
    for n_pool in (8192, 32768) if quick else (16384, 131072):
        job = {
            "n_q": n_q,
            "n_pool": n_pool,
            "dim": dim,
            "threads": thr,
            "top_k": int(sc["top_k"]),
            "query_block": int(sc["query_block"]),
            "pool_block": int(sc["pool_block"]),
        }
        res = spawn(_tile_child, job)
        tag = f"tile engine, dot product D={dim}, {n_q} queries x {n_pool:,} windows"
        rows += [
            row("scoring", f"{tag}: pairs/s", n_q * n_pool / res["seconds"], "pairs/s"),
            row("scoring", f"{tag}: peak anonymous memory", res["anon_mb"], "MiB"),
            row("scoring", f"{tag}: peak resident incl. file-backed scratch", res["rss_mb"], "MiB"),
        ]
    return rows


def _method_rows(cfg: dict[str, Any], thr: int) -> list:
    from plantbench.attribution.methods import registry

    registry.load_plugins(cfg)
    rows = []
    for method in cfg["methods"]["enabled"] + [p["name"] for p in cfg["methods"]["plugins"]]:
        try:
            res = spawn(
                _method_child, {"cfg": cfg, "method": method, "model": MODELS[0], "threads": thr}
            )
        except Exception as exc:  # a missing feature of one method must not stop the rest
            log.warning("scoring benchmark of %s skipped: %s", method, exc)
            continue
        rows += [
            row(
                "scoring",
                f"{method} (model A, study features): pairs/s",
                res["pairs"] / res["seconds"],
                "pairs/s",
            ),
            row("scoring", f"{method}: peak anonymous memory", res["anon_mb"], "MiB"),
        ]
    return rows


def _server_rows(paths: Paths, thr: int, repeats: int = 50) -> list:
    """The audit server's latency over HTTP (in-process client) on twin A's probe, when the
    study's membership suite has run."""
    if not (paths.membership(MODELS[0]) / "probe.json").is_file():
        log.info("no membership probe under %s: the server benchmark is skipped", paths.root)
        return []
    import torch
    from fastapi.testclient import TestClient

    from plantbench.suites.membership import serve

    torch.set_num_threads(thr)
    samples = io.read_parquet(paths.membership("samples") / "samples.parquet")
    mine = samples[samples["model"] == MODELS[0]].head(repeats)
    client = TestClient(serve.app(serve.load(paths, MODELS[0])))
    ms = []
    for ctx, query in zip(mine["context"], mine["query"], strict=True):
        t0 = time.perf_counter()
        r = client.post("/audit", json={"context": ctx, "query": query})
        ms.append(1000 * (time.perf_counter() - t0))
        if r.status_code != 200:
            log.warning("server benchmark: %s", r.text)
    ms = ms[5:] or ms  # the first requests warm up the model
    return [
        row(
            "server",
            f"POST /audit on twin A, median of {len(ms)} requests",
            float(np.median(ms)),
            "ms",
        ),
        row("server", "POST /audit, 95th percentile", float(np.percentile(ms, 95)), "ms"),
    ]


def _write_rows(path: Path, rows: list) -> None:
    buf = _io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                k: ("" if r[k] is None else (f"{r[k]:.6g}" if isinstance(r[k], float) else r[k]))
                for k in COLUMNS
            }
        )
    io.write_text(path, buf.getvalue())


def run(
    cfg: dict[str, Any],
    paths: Paths,
    *,
    threads: int | None = None,
    quick: bool = False,
    skip: tuple[str, ...] = (),
) -> Path:
    """Measure everything, write ``benchmarks.csv`` (atomically); returns its path."""
    thr = int(threads or cfg["train"]["threads"])
    out_dir = paths.benchmarks
    peak, peak_med, peak_cpu = matmul_peak(
        thr, n=1024 if quick else 2048, repeats=3 if quick else 7
    )
    rows: list[dict[str, Any]] = [
        row("peak", f"fp32 matmul 2048^2, {thr} thread(s), best", peak, "FLOP/s"),
        row("peak", "fp32 matmul, median", peak_med, "FLOP/s", peak),
        row("peak", "fp32 matmul per CPU-second (process CPU time x threads)", peak_cpu, "FLOP/s"),
    ]
    log.info("matmul peak %.1f GFLOP/s", peak / 1e9)
    if "pretrain" not in skip:
        rows += _pretrain_rows(cfg, thr, quick, out_dir, (peak, peak_cpu))
    if "features" not in skip:
        rows += _feature_rows(cfg, thr, quick)
    if "peers" not in skip:
        rows += _peer_rows(cfg, paths, thr, quick)
    if "scoring" not in skip:
        rows += _tile_rows(cfg, thr, quick)
        if _study_ready(cfg):
            rows += _method_rows(cfg, thr)
        else:
            log.info("no finished study under %s: per-method scoring rates skipped", paths.root)
    if "server" not in skip:
        rows += _server_rows(paths, thr)
    rows += study_times(out_dir)
    path = out_dir / CSV_NAME
    _write_rows(path, rows)
    return path


def format_csv(path: Path) -> str:
    lines = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            ratio = f"  (x{float(r['ratio']):.3g})" if r["ratio"] else ""
            lines.append(
                f"{r['stage']:<9} {r['what'][:86]:<86} {r['value']:>12} {r['unit']}{ratio}"
            )
    return "\n".join(lines)
