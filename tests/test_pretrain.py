"""Pretraining is deterministic and crash-safe on the CPU.

The upstream artifacts (facts, corpus, tokenizer, streams) of a scaled-down smoke config are
built once per module with the CLI; each training run then gets a private copy of them. Runs are
real subprocesses (`python -m plantbench.cli pretrain ...`), interrupted the way a cluster does
it: SIGTERM (scancel, preemption, time limit), and SIGKILL (crash, OOM killer) through the
PLANTBENCH_FAULT hook. Every resumed run must end bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from plantbench import lineage
from plantbench.errors import EXIT_PREEMPTED
from plantbench.model import pretrain
from plantbench.paths import Paths
from upstream import build_upstream

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "smoke" / "config.yaml"
STEPS, STATE_EVERY, CKPT_EVERY = 40, 10, 20
# smoke config, scaled down: 40 optimizer steps (~10 s on one core), state every 10 steps
OVERRIDE = {
    "corpus": {"max_bytes": 400_000},
    "train": {
        "steps": STEPS,
        "prefix_steps": 0,  # the twins from step 0 (the prefix and its fork: tests/test_recall.py)
        "checkpoint_every_steps": CKPT_EVERY,
        "state_every_steps": STATE_EVERY,
        "threads": 1,
    },
}
RUN_TIMEOUT = 300


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """results/ with config.json, facts, corpus, tokenizer and both streams (no models)."""
    return build_upstream(tmp_path_factory.mktemp("pretrain_upstream"), OVERRIDE)


def _workspace(upstream: Path, dest: Path) -> Path:
    """A private copy of the upstream artifacts; returns its config.json."""
    shutil.copytree(upstream, dest, ignore=shutil.ignore_patterns("models", "logs"))
    cfg = json.loads((dest / "config.json").read_text())
    cfg["results"] = str(dest)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return dest / "config.json"


def _cmd(cfg_json: Path, model: str = "A") -> list[str]:
    return [
        sys.executable, "-m", "plantbench.cli", "pretrain",
        "-c", str(cfg_json), "--model", model, "--threads", "1",
    ]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANTBENCH_FAULT")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _run(cfg_json: Path, model: str = "A", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cmd(cfg_json, model), env=_env(**env), capture_output=True, text=True,
        timeout=RUN_TIMEOUT, check=False,
    )  # fmt: skip


def _model_files(results: Path, model: str = "A") -> dict[str, str]:
    """sha256 of every file of the finished model artifact (resumable state excluded)."""
    folder = Paths(results).model(model)
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and rel.parts[0] != "state":
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _state_step(results: Path, model: str = "A") -> int:
    state = pretrain.load_state(Paths(results).train_state(model) / pretrain.STATE)
    assert state is not None, "no resumable state was left behind"
    return int(state["step"])


def _assert_no_outputs(results: Path, model: str = "A") -> None:
    folder = Paths(results).model(model)
    for name in ("meta.json", "loss.csv"):
        assert not (folder / name).exists(), f"{name} exists after an interrupted run"
    assert not (Paths(results).checkpoints(model) / "index.json").exists()


@pytest.fixture(scope="module")
def reference(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted subprocess run: its files and its meta."""
    results = tmp_path_factory.mktemp("pretrain_ref") / "results"
    cfg_json = _workspace(upstream, results)
    proc = _run(cfg_json)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((results / "models" / "A" / "meta.json").read_text())
    return {"results": results, "files": _model_files(results), "meta": meta}


def test_reference_run_is_complete(reference: dict[str, Any]) -> None:
    files, meta = reference["files"], reference["meta"]
    assert meta["info"]["steps"] == STEPS
    assert meta["info"]["checkpoints"] == ["step_0000020", "step_0000040"]
    assert {"meta.json", "loss.csv", "checkpoints/index.json"} <= set(files)
    assert any(f.startswith("checkpoints/step_0000040/") for f in files)
    # Adam's second moments beside every checkpoint, outside the meta (the model's hash as before)
    moments = {f for f in files if f.startswith("moments/")}
    assert moments == {"moments/step_0000020.pt", "moments/step_0000040.pt"}
    assert set(meta["files"]) == set(files) - {"meta.json"} - moments


def test_training_twice_is_bit_identical(
    upstream: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    """(a) a second, independent run (here in-process) writes byte-identical files."""
    cfg_json = _workspace(upstream, tmp_path / "results")
    cfg = json.loads(cfg_json.read_text())
    torch_threads = torch.get_num_threads()
    lineage.begin(cfg, "pretrain")  # as the CLI step declares itself (meta.json's lineage)
    try:
        meta = pretrain.train(cfg, Paths(cfg), "A", threads=1)
    finally:
        torch.set_num_threads(torch_threads)
        lineage.end()
    assert meta["hash"] == reference["meta"]["hash"]
    assert _model_files(tmp_path / "results") == reference["files"]


def test_sigterm_saves_state_exits_75_and_resumes_bit_identical(
    upstream: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    """(b)+(d) SIGTERM mid-run: exit 75, resumable state, no declared outputs; the rerun
    resumes and ends bit-identical (weights, loss log, meta)."""
    results = tmp_path / "results"
    cfg_json = _workspace(upstream, results)
    state_file = Paths(results).train_state("A") / pretrain.STATE
    proc = subprocess.Popen(
        _cmd(cfg_json), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not state_file.exists():  # the first state (step 10): the handler is installed
            assert proc.poll() is None, "training ended before the signal could be sent"
            assert time.monotonic() < deadline, "no resumable state appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_PREEMPTED, err[-3000:]
    assert "preempted" in err
    stopped_at = _state_step(results)
    assert STATE_EVERY <= stopped_at < STEPS, f"stopped at step {stopped_at}: not mid-run"
    _assert_no_outputs(results)

    rerun = _run(cfg_json)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming A from step {stopped_at}" in rerun.stderr
    assert _model_files(results) == reference["files"]
    loss = (results / "models" / "A" / "loss.csv").read_text()
    assert loss == (reference["results"] / "models" / "A" / "loss.csv").read_text()


@pytest.mark.parametrize("kill_after", [5, 25])
def test_kill9_then_rerun_is_bit_identical(
    upstream: Path, reference: dict[str, Any], tmp_path: Path, kill_after: int
) -> None:
    """(c)+(d) SIGKILL after step 5 (no state yet: restart from 0) or step 25 (state of step 20,
    steps 21-25 are recomputed); PLANTBENCH_FAULT_ONCE makes the same command succeed next."""
    results = tmp_path / "results"
    cfg_json = _workspace(upstream, results)
    env = {
        "PLANTBENCH_FAULT": f"pretrain:A:{kill_after}",
        "PLANTBENCH_FAULT_ONCE": str(tmp_path / "fault.fired"),
    }
    first = _run(cfg_json, **env)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert "fault injection" in first.stderr
    _assert_no_outputs(results)
    state_file = Paths(results).train_state("A") / pretrain.STATE
    if kill_after < STATE_EVERY:
        assert not state_file.exists()
    else:
        assert _state_step(results) == kill_after // STATE_EVERY * STATE_EVERY

    second = _run(cfg_json, **env)  # same command, same environment: the fault fired once
    assert second.returncode == 0, second.stderr[-3000:]
    assert _model_files(results) == reference["files"]


def test_stale_checkpoint_temp_dir_is_not_part_of_the_artifact(
    upstream: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    """A kill inside a checkpoint write leaves a hidden temp folder; the artifact ignores it."""
    results = tmp_path / "results"
    cfg_json = _workspace(upstream, results)
    first = _run(cfg_json, PLANTBENCH_FAULT="pretrain:A:30")
    assert first.returncode == -signal.SIGKILL
    junk = Paths(results).checkpoints("A") / ".step_0000040.x1y2.tmp"
    junk.mkdir(parents=True)
    (junk / "model.safetensors").write_bytes(b"half written")
    second = _run(cfg_json)
    assert second.returncode == 0, second.stderr[-3000:]
    meta = json.loads((results / "models" / "A" / "meta.json").read_text())
    assert meta["hash"] == reference["meta"]["hash"]
    assert not any(".tmp" in f for f in meta["files"])


def test_loss_log_is_complete_and_matches_the_schedule(reference: dict[str, Any]) -> None:
    results = reference["results"]
    cfg = json.loads((results / "config.json").read_text())
    with open(results / "models" / "A" / "loss.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["step"]) for r in rows] == list(range(STEPS))
    for r in rows:
        assert float(r["lr"]) == pytest.approx(
            pretrain.lr_at(int(r["step"]), cfg["train"]), rel=1e-12
        )
        assert math.isfinite(float(r["loss"])) and math.isfinite(float(r["grad_norm"]))
    window = cfg["stream"]["window"]
    assert int(rows[-1]["tokens"]) == STEPS * cfg["train"]["batch_windows"] * window


@pytest.mark.parametrize(
    ("steps", "warmup_fraction", "floor"), [(1200, 0.03, 0.3), (120, 0.03, 0.3), (40, 0.25, 0.1)]
)
def test_lr_schedule(steps: int, warmup_fraction: float, floor: float) -> None:
    t = {"steps": steps, "warmup_fraction": warmup_fraction, "min_lr_ratio": floor, "lr": 4e-3}
    warm = max(1, round(warmup_fraction * steps))
    f = [pretrain.lr_factor(s, t) for s in range(steps + 1)]
    # linear warm-up from lr/warm to the peak
    assert f[:warm] == pytest.approx([(s + 1) / warm for s in range(warm)])
    assert f[warm - 1] == pytest.approx(1.0) and f[warm] == pytest.approx(1.0)
    # cosine decay: never increases, never goes below the floor, reaches it at the end
    decay = f[warm:]
    assert all(b <= a + 1e-15 for a, b in zip(decay, decay[1:], strict=False))
    assert min(decay) >= floor - 1e-12
    assert f[steps] == pytest.approx(floor)
    assert f[steps - 1] > floor
    mid = warm + (steps - warm) // 2
    assert f[mid] == pytest.approx(floor + (1 - floor) / 2, abs=2 / steps)
    # past the end the floor holds; lr_at scales by the peak lr
    assert pretrain.lr_factor(steps + 50, t) == pytest.approx(floor)
    assert pretrain.lr_at(warm, t) == pytest.approx(4e-3)
