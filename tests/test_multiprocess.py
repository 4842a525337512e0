"""Data-parallel pretraining: 1 and 2 processes (gloo on the CPU) train on the same global batches
and give bitwise the same weights.

The upstream artifacts of a scaled-down smoke config (20 steps x 8 windows, micro-batches of 2)
are built once. One run is the plain single-process CLI; the other is the same CLI under
``torch.distributed.run --nproc_per_node 2`` (what ``accelerate launch --multi_gpu`` runs on GPUs).
Each rank records the window indices and token hashes it trained on
(``PLANTBENCH_TRACE_WINDOWS``).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from plantbench.data.stream import open_stream
from plantbench.paths import Paths
from upstream import build_upstream

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "smoke" / "config.yaml"
STEPS, B, MICRO = 20, 8, 2
OVERRIDE = {
    "corpus": {"max_bytes": 400_000},
    "train": {
        "steps": STEPS,
        "prefix_steps": 0,
        "batch_windows": B,
        "micro_batch_windows": MICRO,
        "checkpoint_every_steps": 10,
        "state_every_steps": 10,
        "threads": 1,
    },
}
TIMEOUT = 600


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_upstream(tmp_path_factory.mktemp("mp_upstream"), OVERRIDE)


def _train(upstream: Path, dest: Path, nproc: int) -> dict[str, Any]:
    """Copy the upstream, pretrain model A with ``nproc`` processes; return what it wrote."""
    shutil.copytree(upstream, dest / "results", ignore=shutil.ignore_patterns("models", "logs"))
    cfg_json = dest / "results" / "config.json"
    cfg = json.loads(cfg_json.read_text())
    cfg["results"] = str(dest / "results")
    cfg_json.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    trace = dest / "trace"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANTBENCH_", "WORLD_SIZE"))}
    env.update(PLANTBENCH_TRACE_WINDOWS=str(trace), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    args = [
        "-m",
        "plantbench.cli",
        "pretrain",
        "-c",
        str(cfg_json),
        "--model",
        "A",
        "--threads",
        "1",
    ]
    if nproc == 1:
        cmd = [sys.executable, *args]
    else:
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd = [sys.executable, *launcher, *args]
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = {}
    for r in range(nproc):
        lines = (trace / f"rank{r}.jsonl").read_text().splitlines()
        ranks[r] = [json.loads(x) for x in lines]
    with open(dest / "results" / "models" / "A" / "loss.csv", newline="") as fh:
        loss = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]
    paths = Paths(cfg)
    final = json.loads((paths.model("A") / "meta.json").read_text())["info"]["final_checkpoint"]
    weights = load_file(str(paths.checkpoints("A") / final / "model.safetensors"))
    return {
        "ranks": ranks,
        "loss": loss,
        "weights": weights,
        "results": dest / "results",
        "stdout": proc.stdout,
    }


@pytest.fixture(scope="module")
def runs(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    return {n: _train(upstream, tmp_path_factory.mktemp(f"mp{n}"), n) for n in (1, 2)}


def test_every_rank_reads_its_slice_of_the_same_global_batches(
    upstream: Path, runs: dict[int, dict[str, Any]]
) -> None:
    manifest = open_stream(Paths(upstream).stream("A"), verify=False).manifest
    want_hash = manifest["hash"].to_numpy()
    one, two = runs[1]["ranks"], runs[2]["ranks"]
    assert [r["step"] for r in one[0]] == list(range(STEPS))
    for n, ranks in ((1, one), (2, two)):
        for r, rows in ranks.items():
            assert [x["step"] for x in rows] == list(range(STEPS))
            for x in rows:
                # rank r of n takes micro-batches r, r + n, ... of step b's batch
                want = [
                    x["step"] * B + (k * n + r) * MICRO + i
                    for k in range(B // n // MICRO)
                    for i in range(MICRO)
                ]
                assert x["windows"] == want
                # ... and what it trained on is what the manifest says those windows hold
                assert x["hashes"] == [int(h) for h in want_hash[x["windows"]]]
    for step in range(STEPS):
        union = sorted(two[0][step]["windows"] + two[1][step]["windows"])
        assert union == one[0][step]["windows"] == list(range(step * B, (step + 1) * B))


def test_one_and_two_processes_follow_the_same_loss_curve(runs: dict[int, dict[str, Any]]) -> None:
    a, b = runs[1]["loss"], runs[2]["loss"]
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(STEPS))
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert [r["lr"] for r in a] == [r["lr"] for r in b]
    la, lb = np.array([r["loss"] for r in a]), np.array([r["loss"] for r in b])
    np.testing.assert_allclose(lb, la, rtol=1e-5)
    assert la[-1] < la[0] - 0.5, "the loss did not fall: the comparison would be vacuous"
    ga, gb = np.array([r["grad_norm"] for r in a]), np.array([r["grad_norm"] for r in b])
    assert ga.tolist() == gb.tolist()  # the same gradients, bit for bit (see the weights)


def test_final_weights_are_bitwise_one_process(runs: dict[int, dict[str, Any]]) -> None:
    wa, wb = runs[1]["weights"], runs[2]["weights"]
    assert sorted(wa) == sorted(wb)
    moved = 0.0
    for k in wa:  # on the CPU the ranks' gradients are added in one process's order: bitwise
        assert wa[k].tobytes() == wb[k].tobytes(), k
        moved = max(moved, float(np.abs(wa[k]).max()))
    assert moved > 0


def test_only_rank_zero_wrote_the_artifact(runs: dict[int, dict[str, Any]]) -> None:
    for n in (1, 2):
        results = runs[n]["results"]
        meta = json.loads((results / "models" / "A" / "meta.json").read_text())
        assert meta["info"]["checkpoints"] == ["step_0000010", "step_0000020"]
        ckpts = Paths(results).checkpoints("A")
        assert sorted(p.name for p in ckpts.iterdir()) == [
            "index.json",
            "step_0000010",
            "step_0000020",
        ]
    # same config hash whatever the world size: the artifacts are interchangeable
    m1 = json.loads((runs[1]["results"] / "models" / "A" / "meta.json").read_text())
    m2 = json.loads((runs[2]["results"] / "models" / "A" / "meta.json").read_text())
    assert m1["config_hash"] == m2["config_hash"]
    # each process printed the result line (rank 1 reads rank 0's meta after the barrier)
    assert runs[2]["stdout"].count("pretrain A ") == 2
