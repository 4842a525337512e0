"""Where a step runs its model: ``plantbench.model.modeling.compute_device`` (the job's GPU when
it has one, ``PLANTBENCH_DEVICE`` to force the CPU or demand a GPU), ``load_model`` placing every
twin there, and ``workflow/scripts/gpu_check.py --study`` reading back the device each artifact
records. On the CPU the placement is the identity: the bitwise reference tests cover that."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from plantbench.errors import ConfigError
from plantbench.model import modeling
from tiny_models import tiny_llama

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("env", "cuda", "want"),
    [("", False, "cpu"), ("auto", True, "cuda"), ("cpu", True, "cpu"), ("CUDA", True, "cuda")],
)
def test_compute_device_follows_the_gpu_and_the_override(
    monkeypatch: pytest.MonkeyPatch, env: str, cuda: bool, want: str
) -> None:
    monkeypatch.setenv(modeling.DEVICE_ENV, env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert modeling.compute_device().type == want


@pytest.mark.parametrize("env", ["cuda", "gpu0"])
def test_a_gpu_demanded_without_one_or_a_bad_value_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    monkeypatch.setenv(modeling.DEVICE_ENV, env)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=modeling.DEVICE_ENV):
        modeling.compute_device()


def test_load_model_puts_the_twin_on_the_compute_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tiny_llama(n_layer=1, vocab=64, window=16, seed=0).save_pretrained(tmp_path)
    assert modeling.device_of(modeling.load_model(tmp_path)).type == "cpu"
    # the meta device stands in for a GPU: the loader asks compute_device, and moves there
    monkeypatch.setattr(modeling, "compute_device", lambda: torch.device("meta"))
    net = modeling.load_model(tmp_path)
    assert modeling.device_of(net).type == "meta" and not net.training
    assert modeling.device_of(modeling.load_model(tmp_path, device="cpu")).type == "cpu"


def test_to_numpy_copies_nothing_on_the_cpu() -> None:
    t = torch.arange(6.0).reshape(2, 3).requires_grad_()
    a = modeling.to_numpy(t)
    assert a.shape == (2, 3) and a[1, 2] == 5.0
    assert a.__array_interface__["data"][0] == t.data_ptr()


def test_gpu_check_reads_each_artifacts_device(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gpu_check", ROOT / "workflow/scripts/gpu_check.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for folder, platform, name in (
        ("facts", {"machine": "x86_64"}, "meta.json"),  # a token step: no device recorded
        ("features/A/hidden", {"device": "cuda NVIDIA H200"}, "meta.json"),
        ("causal", {"device": "cpu"}, "meta.json"),
        ("features/B/grads/step_0000160/pool/shard_0000", {"device": "cpu"}, "shard.json"),
        ("scores/bm25/A", {"device": "cpu"}, "meta.json"),  # no twin: the CPU is right
    ):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / name).write_text(json.dumps({"platform": platform}))
    got = mod.study_devices(tmp_path)
    assert got["features/A/hidden"] == "cuda NVIDIA H200" and "facts" not in got
    off = [k for k, v in got.items() if mod.MODEL_STEP.match(k) and not v.startswith("cuda")]
    assert off == ["causal", "features/B/grads/step_0000160/pool/shard_0000"]
