"""Adversarial cases for a trained model: every damage is a FAIL of ``plantbench verify`` whose
printed recovery works when followed, and rerunning pretraining never loops on a stale state.

One model (smoke config without the shared prefix, 160 steps) is trained once per module with
the CLI on its own smoke upstream; each test damages a private copy of that run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from plantbench import io, layout
from plantbench.cli import main
from plantbench.hashing import hash_file, hash_tree
from plantbench.model import pretrain
from plantbench.ops import verify
from plantbench.paths import Paths

RECOVERY = re.compile(r"recover: delete '([^']+)' and rerun `([^`]+)`")
TIMEOUT = 300


def _copy_run(src: Path, dst: Path) -> tuple[dict[str, Any], Path]:
    """A private copy of the results folder ``src`` at ``dst`` with its own config.json."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["results"] = str(dst)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return cfg, dst / "config.json"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke upstream without the shared prefix (these cases are the twin's own: the
    prefix and its fork are tests/test_recall.py's) and model A trained to the end (state,
    checkpoints, meta)."""
    from upstream import build_upstream

    src = build_upstream(tmp_path_factory.mktemp("recovery"), {"train": {"prefix_steps": 0}})
    _, cfg_path = _copy_run(src, tmp_path_factory.mktemp("trained") / "results")
    threads = torch.get_num_threads()
    try:
        assert main(["pretrain", "-c", str(cfg_path), "--model", "A"]) == 0
    finally:
        torch.set_num_threads(threads)
    return cfg_path.parent


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> tuple[dict[str, Any], Path]:
    return _copy_run(trained, tmp_path / "results")


def _pretrain(cfg_path: Path) -> int:
    threads = torch.get_num_threads()
    try:
        return main(["pretrain", "-c", str(cfg_path), "--model", "A"])
    finally:
        torch.set_num_threads(threads)


def _fails(cfg: dict[str, Any]) -> dict[str, str]:
    """FAIL lines of verify (reference hashes left out: they depend on the machine)."""
    checks = verify.run(cfg, Paths(cfg), ref_dir=Path(cfg["results"]) / "no-reference")
    return {c.artifact: c.detail for c in checks if c.status == "FAIL"}


def _model_meta(cfg: dict[str, Any]) -> dict[str, Any]:
    return json.loads((Paths(cfg).model("A") / io.META).read_text())


def _assert_meta_and_index_agree(cfg: dict[str, Any]) -> None:
    """The model's index lists exactly its checkpoints, as on disk, and nothing else is there."""
    paths = Paths(cfg)
    meta = _model_meta(cfg)
    index = json.loads((paths.checkpoints("A") / "index.json").read_text())
    assert [c["name"] for c in index] == meta["info"]["checkpoints"]
    assert [c["name"] for c in index] == layout.checkpoint_names(cfg)
    for c in index:
        assert hash_tree(paths.checkpoints("A") / c["name"]) == c["hash"]
    on_disk = {
        p.relative_to(paths.model("A")).as_posix()
        for p in paths.model("A").rglob("*")
        if p.is_file() and "state" not in p.relative_to(paths.model("A")).parts
    }
    moments = {f"moments/{c['name']}.pt" for c in index}  # Adam's moments, outside the meta
    assert on_disk == set(meta["files"]) | {io.META} | moments


def test_deleted_checkpoint_fails_verify_and_the_printed_recovery_restores_it(
    run_copy: tuple[dict[str, Any], Path], trained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, cfg_path = run_copy
    original = json.loads((trained / "models" / "A" / io.META).read_text())
    shutil.rmtree(Paths(cfg).checkpoints("A") / "step_0000080")

    assert main(["verify", "-c", str(cfg_path)]) == 2
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("FAIL  models/A "))
    assert "step_0000080" in line
    folder, command = RECOVERY.search(line).groups()
    assert Path(folder) == Paths(cfg).model("A")
    assert shlex.split(command)[:2] == ["plantbench", "pretrain"]

    shutil.rmtree(folder)  # follow the recovery as printed
    threads = torch.get_num_threads()
    try:
        assert main(shlex.split(command)[1:]) == 0
    finally:
        torch.set_num_threads(threads)
    assert _fails(cfg) == {}
    _assert_meta_and_index_agree(cfg)
    meta = _model_meta(cfg)
    assert meta["hash"] == original["hash"] and meta["files"] == original["files"]


def test_forced_pretrain_with_a_missing_final_checkpoint_retrains_instead_of_looping(
    run_copy: tuple[dict[str, Any], Path], trained: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The state is at the last step; resuming would regenerate nothing. The rerun must
    restart from step 0, regenerate the checkpoint, and write a meta its index agrees with."""
    cfg, cfg_path = run_copy
    original = json.loads((trained / "models" / "A" / io.META).read_text())
    shutil.rmtree(Paths(cfg).checkpoints("A") / "step_0000120")
    assert "models/A" in _fails(cfg)

    with caplog.at_level(logging.WARNING, logger="plantbench.model.pretrain"):
        assert _pretrain(cfg_path) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "checkpoint step_0000120 is missing" in w and "restarting from step 0" in w
        for w in warnings
    ), warnings
    assert _fails(cfg) == {}
    _assert_meta_and_index_agree(cfg)
    meta = _model_meta(cfg)
    assert meta["hash"] == original["hash"] and meta["files"] == original["files"]


def test_verify_fails_a_meta_and_index_that_omit_a_deleted_checkpoint(
    run_copy: tuple[dict[str, Any], Path],
) -> None:
    """What the looping resume used to write: a meta without the checkpoint's files, and an
    index that still lists it (hashed as an empty folder). Every file the meta lists is intact,
    so only the checkpoint check can see it."""
    cfg, _ = run_copy
    folder = Paths(cfg).model("A")
    ckpt = Paths(cfg).checkpoints("A") / "step_0000120"
    shutil.rmtree(ckpt)
    index = json.loads((folder / "checkpoints" / "index.json").read_text())
    index[-1]["hash"] = hash_tree(ckpt)
    io.write_json(folder / "checkpoints" / "index.json", index)
    meta = _model_meta(cfg)
    files = [f for f in meta["files"] if not f.startswith("checkpoints/step_0000120/")]
    io.write_meta(
        folder,
        "pretrain",
        files,
        config_hash=meta["config_hash"],
        inputs=meta["inputs"],
        info=meta["info"],
    )

    fails = _fails(cfg)
    assert "models/A" not in fails  # the files it lists are all there
    detail = fails["models/A (info)"]
    assert f"checkpoint '{ckpt}' listed in checkpoints/index.json is missing" in detail
    assert RECOVERY.search(detail).group(1) == str(folder)


@pytest.mark.parametrize(
    ("field", "value", "source"),
    [
        ("final_loss", 0.5, "loss.csv"),
        ("steps", 1200, "loss.csv"),
        ("final_checkpoint", "step_0000040", "checkpoints/index.json"),
        ("params", 1, "the final checkpoint"),
    ],
)
def test_edited_model_info_is_a_fail_naming_the_field(
    run_copy: tuple[dict[str, Any], Path], field: str, value: Any, source: str
) -> None:
    """The report prints these numbers; a hand edit of meta.json must not pass."""
    cfg, _ = run_copy
    path = Paths(cfg).model("A") / io.META
    meta = json.loads(path.read_text())
    recorded = meta["info"][field]
    meta["info"][field] = value
    path.write_text(json.dumps(meta))
    before = {p: hash_file(p) for p in Paths(cfg).model("A").rglob("*") if p.is_file()}

    fails = _fails(cfg)
    assert set(fails) == {"models/A (info)"}
    detail = fails["models/A (info)"]
    assert f"info.{field} is {json.dumps(value)}, recomputed {json.dumps(recorded)}" in detail
    assert f"from {source}" in detail
    assert "plantbench pretrain -c" in detail and "--model A" in detail
    after = {p: hash_file(p) for p in Paths(cfg).model("A").rglob("*") if p.is_file()}
    assert after == before  # verify wrote nothing


def test_changed_train_lr_restarts_pretraining_with_a_warning(
    run_copy: tuple[dict[str, Any], Path],
) -> None:
    """A state of another train config is not resumed and not refused: one warning line, the
    stale state, checkpoints and meta are removed, and training starts from step 0 (the run is
    killed after step 2, before any new state or checkpoint)."""
    cfg, cfg_path = run_copy
    cfg["train"]["lr"] = 2.0e-3
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANTBENCH_FAULT")}
    env["PLANTBENCH_FAULT"] = "pretrain:A:2"
    cmd = [sys.executable, "-m", "plantbench.cli", "pretrain", "-c", str(cfg_path)]
    proc = subprocess.run(
        [*cmd, "--model", "A"], env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    warnings = [x for x in proc.stderr.splitlines() if " WARNING " in x]
    assert len(warnings) == 1, warnings
    assert "another train config or stream; restarting from step 0" in warnings[0]
    assert "belongs to another config" not in proc.stderr
    assert "killing pretraining of A after step 2" in proc.stderr  # it trained from step 0
    paths = Paths(cfg)
    assert not (paths.train_state("A") / pretrain.STATE).exists()
    assert not (paths.model("A") / io.META).exists()
    assert not (paths.model("A") / "loss.csv").exists()
    assert not paths.checkpoints("A").exists()
