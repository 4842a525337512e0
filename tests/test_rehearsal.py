"""The paper preset rehearsed on the CPU (``workflow/presets/rehearsal.yaml``): the whole DAG,
suites included, at the paper's shapes (width 768, 12 heads, SwiGLU 2048, vocabulary 32,768,
1,024-token windows, float16 features, block curvature, every method, bf16 autocast, two gloo
processes per twin), counts shrunk; the corpus a local jsonl folder this test writes.

What would break at scale is checked here: every artifact present and verified, the shard and
query-chunk counts the layout plans, the feature store's dtype and dimensions, EK-FAC's chunked
scores equal to one chunk's, data-parallel training bitwise equal to one process, and the plan
within 2x of the run's benchmark files. ``SHRINK`` is all it changes from the preset: the
sketch's D (at 15,360 the one-block Fisher's float64 eigendecomposition alone costs about 10 CPU
minutes per twin and checkpoint; the preset itself keeps the paper's D, and
docs/results/2026-12.md reports a run of it under Slurm). This test's stage table is on
docs/results/2026-12-paper-plan.md. Part of ``make test`` (marked ``rehearsal``): 9 min 23 s on
two quiet cores (a 2-core Intel Xeon, measured at commit 32478f3).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from safetensors.numpy import load_file

from plantbench import config, layout
from plantbench.paths import MODELS, Paths
from smokerun import snakemake

pytestmark = [pytest.mark.slow, pytest.mark.rehearsal]

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ("workflow/presets/paper.yaml", "workflow/presets/rehearsal.yaml")
SHRINK = {"features": {"grad_dims": 1536}}
TIMEOUT = 1200


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from plantbench.data import corpus

    top = tmp_path_factory.mktemp("rehearsal")
    corpus.write_jsonl(top / "background", 2_000_000)
    overlay = {
        "results": str(top / "results"),
        "corpus": {"sources": [{"kind": "jsonl", "path": str(top / "background")}]},
        **SHRINK,
    }
    (top / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    files = [*PRESETS, str(top / "overlay.yaml")]
    proc = snakemake(top / "results", base=tuple(files), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = config.load([ROOT / "config.yaml", *(ROOT / f for f in files)])
    return {"cfg": cfg, "paths": Paths(cfg), "root": top / "results"}


def test_the_preset_keeps_the_paper_shapes() -> None:
    paper = config.load([ROOT / "config.yaml", ROOT / PRESETS[0]])
    rehearsal = config.load([ROOT / "config.yaml", *(ROOT / f for f in PRESETS)])
    for key in ("n_embd", "n_head", "intermediate", "tie_embeddings", "rope_theta"):
        assert rehearsal["model"][key] == paper["model"][key], key
    assert rehearsal["model"]["vocab_size"] == paper["tokenizer"]["vocab_size"] == 32768
    assert rehearsal["stream"]["window"] == paper["stream"]["window"] == 1024
    for key in ("projection", "grad_dims", "grad_dtype"):
        assert rehearsal["features"][key] == paper["features"][key], key
    assert rehearsal["curvature"]["mode"] == paper["curvature"]["mode"]
    assert rehearsal["methods"] == paper["methods"]
    assert rehearsal["train"]["precision"] == "bf16" and rehearsal["train"]["devices"] == 2
    assert layout.n_shards(rehearsal) > 1 and len(layout.tracin_checkpoints(rehearsal)) >= 2


def test_every_artifact_is_present_and_verified(rehearsal: dict[str, Any]) -> None:
    from plantbench.ops import verify

    checks = verify.run(rehearsal["cfg"], rehearsal["paths"])
    failed = [c for c in checks if c.status == "FAIL"]
    assert not failed, [(c.artifact, c.detail) for c in failed]
    assert (rehearsal["root"] / "report" / "report.md").is_file()


def test_the_model_has_the_paper_vocabulary(rehearsal: dict[str, Any]) -> None:
    p = rehearsal["paths"]
    for m in MODELS:
        meta = json.loads((p.model(m) / "meta.json").read_text())
        final = meta["info"]["final_checkpoint"]
        conf = json.loads((p.checkpoints(m) / final / "config.json").read_text())
        assert conf["vocab_size"] == 32768 and conf["hidden_size"] == 768
        assert conf["max_position_embeddings"] == 1024


def test_shards_and_feature_store_as_planned(rehearsal: dict[str, Any]) -> None:
    from plantbench.attribution.gradients.store import GradientStore

    cfg, root = rehearsal["cfg"], rehearsal["root"]
    n = layout.n_shards(cfg)
    assert n > 1
    for m in MODELS:
        for ck in layout.tracin_checkpoints(cfg):
            pool = root / "features" / m / "grads" / ck / "pool"
            shards = sorted(d for d in pool.glob("shard_*") if d.is_dir())
            assert len(shards) == n, (m, ck)
            store = GradientStore.open(shards)  # refuses shards whose metadata disagree
            assert store.dtype == np.dtype("<f2") and store.dims == cfg["features"]["grad_dims"]
            assert store.n_rows == layout.pool_size(cfg)
            rows = store.rows(0, store.n_rows)
            assert np.isfinite(rows).all() and np.abs(rows).max() > 0


def test_ekfac_ran_in_several_query_chunks(rehearsal: dict[str, Any]) -> None:
    cfg, root = rehearsal["cfg"], rehearsal["root"]
    from plantbench.ops.plan import shape_of

    p = shape_of(cfg).block_linear_params
    meta = rehearsal["paths"].ekfac("A") / "meta.json"
    queries = json.loads(meta.read_text())["info"]["n_queries"]
    chunks = layout.ekfac_query_chunks(queries, p, layout.ekfac_memory_bytes(cfg))
    assert len(chunks) > 1
    for m in MODELS:
        log = (root / "logs" / f"ekfac_{m}.log").read_text()
        assert f"queries {len(chunks)}/{len(chunks)}" in log


def test_ekfac_chunked_scores_equal_one_chunk(rehearsal: dict[str, Any]) -> None:
    """At the paper's shapes: EK-FAC fitted on two pool windows, the queries scored in the
    config's chunks and in one chunk give the same scores."""
    import torch

    from plantbench import artifacts
    from plantbench.attribution.ekfac import maths

    cfg, p = rehearsal["cfg"], rehearsal["paths"]
    stream, table, _ = artifacts.stream_and_pool(p, "A")
    qs, _ = artifacts.queries_table(p)
    entry = artifacts.checkpoint_entry(p, "A", layout.final_checkpoint(cfg))
    net = artifacts.load_checkpoint(p, "A", entry, attn="eager")
    windows = np.asarray(stream.windows[table["window"].to_numpy(np.int64)[:2]], dtype=np.int64)
    torch.set_num_threads(2)
    ek = maths.fit(net, windows, float(cfg["curvature"]["damping_ratio"]), batch=1)
    ids, attn, ans = artifacts.query_batch(p, qs)
    batch = (ids, ans, attn)
    budget = layout.ekfac_memory_bytes(cfg)
    n_params = sum(int(v.numel()) for v in ek.lam.values())
    assert len(layout.ekfac_query_chunks(ids.shape[0], n_params, budget)) > 1
    chunked = maths.chunked_scores(net, ek, batch, windows[:1], 1, budget=budget)
    whole = maths.chunked_scores(net, ek, batch, windows[:1], 1, budget=1 << 62)
    # bitwise: each query's gradient rows and score GEMMs do not depend on which other queries
    # share its chunk (float-pinned GEMMs round a row the same for any row count)
    assert np.array_equal(chunked, whole)
    assert np.abs(whole).max() > 0


def test_the_plan_is_within_2x_of_the_measurement(rehearsal: dict[str, Any]) -> None:
    from plantbench.ops import plan_measured
    from plantbench.ops.timeline import read_jobs

    bench = rehearsal["root"] / "benchmarks"
    assert (bench / plan_measured.TABLE).is_file()  # written by the Snakefile's onsuccess
    cfg, jobs = rehearsal["cfg"], read_jobs(bench)
    table = plan_measured.rows(cfg, jobs, plan_measured.disk_mb(cfg))
    assert {r.stage for r in table} >= {"pretrain", "grads", "curvature", "ekfac", "score"}
    assert plan_measured.unmeasured(jobs) == []  # every rule has a plan row
    for r in table:
        assert r.jobs_measured == r.jobs_planned, r.stage
    assert plan_measured.off(table, plan_measured.rates(cfg, table)) == []
    disk = {r.stage: r.disk_ratio() for r in table if r.disk_ratio() is not None}
    assert set(disk) >= {"pretrain", "grads", "curvature"}  # the stages whose disk scales
    assert all(0.5 <= x <= 2 for x in disk.values()), disk


# what twin A's single-process rerun needs from the rehearsal (the rest is not copied)
UPSTREAM = ("config.json", "facts", "corpus", "tokenizer", "stream")


@pytest.fixture(scope="module")
def one_process(rehearsal: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twin A pretrained again from the rehearsal's stream in one process (no launcher), with
    the thread count each of the rehearsal's two gloo processes had; its results folder."""
    src, dest = rehearsal["root"], tmp_path_factory.mktemp("one_process") / "results"
    dest.mkdir()
    for name in UPSTREAM:
        (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, dest / name)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["results"] = str(dest)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANTBENCH_", "WORLD_SIZE"))}
    cmd = [sys.executable, "-m", "plantbench.cli", "pretrain", "-c", str(dest / "config.json")]
    cmd += ["--model", "A", "--threads", str(cfg["train"]["threads"])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dest


def _final_weights(results: Path) -> dict[str, np.ndarray]:
    p = Paths(json.loads((results / "config.json").read_text()))
    final = json.loads((p.model("A") / "meta.json").read_text())["info"]["final_checkpoint"]
    return load_file(str(p.checkpoints("A") / final / "model.safetensors"))


def test_data_parallel_training_is_bitwise_one_process(
    rehearsal: dict[str, Any], one_process: Path
) -> None:
    """At the paper's shapes, in bf16 autocast: the rehearsal's twin A (two gloo processes,
    micro-batches of one window) and one process give the same weights, bit for bit."""
    two, one = _final_weights(rehearsal["root"]), _final_weights(one_process)
    assert sorted(two) == sorted(one) and two
    for k in two:
        assert two[k].tobytes() == one[k].tobytes(), k
    two_log, one_log = (_loss(r) for r in (rehearsal["root"], one_process))
    assert two_log["grad_norm"].tolist() == one_log["grad_norm"].tolist()
    # the logged loss is the ranks' shares all-reduced: a sum in another order
    np.testing.assert_allclose(two_log["loss"], one_log["loss"], rtol=1e-6)


def _loss(results: Path) -> pd.DataFrame:
    return pd.read_csv(results / "models" / "A" / "loss.csv")
