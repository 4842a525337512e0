"""Every file of the shared prefix and of the twins is byte-identical whichever way it was
reached: straight through, or killed right after a save of the resumable state and resumed.

The smoke config, scaled down (24 steps, a prefix of 8, a state every 4 steps). The straight
run trains in-process; each interrupted run is a real subprocess that the PLANTBENCH_FAULT hook
kills (SIGKILL) right after the step whose state it saved, then the rerun resumes from it.
Issue 45: the prefix's ``fork.pt``, a torch pickle, once depended on which equal strings were
one Python object (a resumed run holds the loaded loss log and optimizer keys), and a twin
resumed from its own state wrote a meta.json without its input ``prefix``.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from plantbench.model import pretrain
from plantbench.paths import Paths
from test_pretrain import RUN_TIMEOUT, _env, _model_files, _state_step, _workspace
from upstream import build_upstream

ARTIFACTS = (pretrain.PREFIX, "A", "B")
# a save of each: the prefix mid-way, A at a state only, B at a state and a checkpoint
KILL_AFTER = {pretrain.PREFIX: 4, "A": 12, "B": 16}
OVERRIDE = {
    "facts": {"n_docs": [2]},
    "corpus": {"max_bytes": 400_000},
    "train": {
        "steps": 24,
        "prefix_steps": 8,
        "checkpoint_every_steps": 8,
        "state_every_steps": 4,
        "threads": 1,
    },
}


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_upstream(tmp_path_factory.mktemp("resume_bytes"), OVERRIDE)


def _train(cfg_json: Path, model: str) -> None:
    """Train ``model`` in this process (resuming from its state if there is one)."""
    cfg = json.loads(cfg_json.read_text())
    threads = torch.get_num_threads()
    try:
        pretrain.train(cfg, Paths(cfg), model, threads=1)
    finally:
        torch.set_num_threads(threads)


def _killed(cfg_json: Path, model: str, step: int) -> subprocess.CompletedProcess[str]:
    """``model`` trained in a subprocess that the fault hook kills right after ``step``."""
    command = "prefix" if model == pretrain.PREFIX else "pretrain"
    cmd = [sys.executable, "-m", "plantbench.cli", command, "-c", str(cfg_json), "--threads", "1"]
    cmd += [] if model == pretrain.PREFIX else ["--model", model]
    env = _env(PLANTBENCH_FAULT=f"pretrain:{model}:{step}")
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )


def _files(results: Path) -> dict[str, str]:
    return {f"{m}/{f}": h for m in ARTIFACTS for f, h in _model_files(results, m).items()}


def test_a_run_resumed_at_a_save_writes_the_bytes_of_a_straight_run(
    upstream: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    straight = _workspace(upstream, tmp_path / "straight" / "results")
    for model in ARTIFACTS:
        _train(straight, model)
    resumed = _workspace(upstream, tmp_path / "resumed" / "results")
    for model, step in KILL_AFTER.items():
        proc = _killed(resumed, model, step)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        assert _state_step(resumed.parent, model) == step  # killed right after a save
        with caplog.at_level(logging.INFO, logger=pretrain.__name__):
            _train(resumed, model)
        assert f"resuming {model} from step {step}" in caplog.text
    want = _files(straight.parent)
    assert {f"{pretrain.PREFIX}/{pretrain.FORK}", "B/moments/step_0000016.pt"} <= set(want)
    got = _files(resumed.parent)
    assert [f for f in want if want[f] != got.get(f)] == [], "differ from the straight run"
    assert got == want
