"""The float-path pin (plantbench.floats) and verify's float-reference comparison.

The pin test trains a small Llama for a few AdamW steps in fresh processes that ask for another
ATen CPU capability or another MKL branch: pinned, the weights are byte-identical; unpinned
(PLANTBENCH_FLOAT_PIN=off), they differ. The second half is what makes the first meaningful: it
fails if the knobs stop mattering, and the first fails if the pin is removed.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from typing import Any

import pytest

from plantbench import floats
from plantbench.ops import verify
from plantbench.paths import MODELS

TRAIN = r"""
import hashlib
import plantbench  # the pin is applied here, before torch runs a kernel
import torch
from plantbench.model.modeling import build_model, llama_config
torch.set_num_threads(1)
shape = dict(n_embd=64, intermediate=128, n_layer=2, n_head=4, tie_embeddings=True, rope_theta=1e4)
model = build_model(llama_config(shape, 512, 64, bos=1, eos=2, pad=0), 0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
for _ in range(12):
    ids = torch.randint(0, 512, (8, 64), generator=g)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
h = hashlib.sha256()
for _, v in sorted(model.state_dict().items()):
    h.update(v.detach().numpy().tobytes())
print(torch.backends.cpu.get_cpu_capability(), h.hexdigest())
"""

AVX2 = floats.branch_for(os.uname().machine, floats._cpu_flags()) == "avx2"
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the pin test needs an x86-64 CPU with AVX2")
KNOBS = [{"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "COMPATIBLE"}]


@functools.cache
def _train(env: tuple[tuple[str, str], ...]) -> tuple[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in (*floats.PIN_KEYS, floats.OFF_ENV)}
    out = subprocess.run(
        [sys.executable, "-c", TRAIN],
        env={**base, **dict(env)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[-2], out[-1]


def _weights(env: dict[str, str]) -> tuple[str, str]:
    """(CPU capability, sha256 of the weights) of a fresh process run with ``env`` added."""
    return _train(tuple(sorted(env.items())))


@needs_avx2
@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: next(iter(k)))
def test_pinned_weights_do_not_depend_on_the_knob(knob):
    assert _weights(knob) == _weights({})


@needs_avx2
@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: next(iter(k)))
def test_unpinned_weights_depend_on_the_knob(knob):
    off = {floats.OFF_ENV: "off"}
    assert _weights({**off, **knob})[1] != _weights(off)[1]


def test_branch_for_the_cpu():
    assert floats.branch_for("x86_64", {"avx2", "fma", "sse2"}) == "avx2"
    assert floats.branch_for("x86_64", {"avx", "sse2"}) == "default"
    assert floats.branch_for("aarch64", {"avx2", "fma"}) is None


def test_this_process_is_pinned():
    """The package pinned the environment on import (the test session imported it)."""
    if floats.pin() not in floats.BRANCHES:
        pytest.skip("not an x86-64 CPU, or PLANTBENCH_FLOAT_PIN=off")
    for key, value in floats.BRANCHES[floats.pin()].items():
        assert os.environ[key] == value
    rec = floats.record()
    assert rec["pin"] == floats.pin() and rec["mkl_cbwr"] == os.environ["MKL_CBWR"]


def test_unpinned_env_restores_what_was_there():
    env = floats.unpinned_env()
    assert env[floats.OFF_ENV] == "off"
    for key, before in floats._before.items():
        assert env.get(key) == before


def test_differences_name_each_key():
    a = {"machine": "x86_64", "cpu_capability": "AVX2", "threads": 1, "torch": "2.13.0+cpu"}
    b = {**a, "cpu_capability": "AVX512", "threads": 2}
    assert floats.differences(a, a) == []
    diff = floats.differences(b, a)
    assert "cpu_capability AVX512 (reference AVX2)" in diff and "threads 2 (reference 1)" in diff
    assert len(diff) == 2


# --------------------------------------------------------------------------------------------
# verify: float hashes compared only on the recorded float path
# --------------------------------------------------------------------------------------------

HERE: dict[str, Any] = {
    "machine": "x86_64",
    "python": "3.11.7",
    "torch": "2.13.0+cpu",
    "cpu_capability": "AVX2",
    "blas": "mkl 2024.2",
    "mkl_cbwr": "AVX2",
    "threads": 1,
    "device": "cpu",
}


def _case(tmp_path, cfg, *, made: dict[str, Any], ref_float: dict[str, Any], same: bool):
    import json

    name = f"models/{MODELS[0]}"
    metas = {
        "facts": {"hash": "f" * 32, "platform": {}},
        name: {"hash": "a" * 32, "platform": made},
    }
    whole = {k: {"hash": "f" * 32, "platform": ref_float} for k in verify.referenced(cfg)}
    ref = verify.reference_record(
        cfg, {**whole, name: {"hash": "a" * 32, "platform": ref_float}}, "t"
    )
    if not same:
        ref["hashes"][name] = "b" * 32
    (tmp_path / "t.json").write_text(json.dumps(ref))
    checks = verify.check_reference(cfg, metas, tmp_path)
    return {c.artifact: c for c in checks}, name


def test_float_hash_compared_on_the_same_path(tmp_path, smoke_cfg):
    got, name = _case(tmp_path, smoke_cfg, made=HERE, ref_float=HERE, same=True)
    assert got[f"reference {name}"].status == "PASS"
    got, name = _case(tmp_path, smoke_cfg, made=HERE, ref_float=HERE, same=False)
    assert got[f"reference {name}"].status == "FAIL"


def test_float_hash_on_another_path_is_a_skip_naming_it(tmp_path, smoke_cfg):
    other = {**HERE, "cpu_capability": "AVX512", "mkl_cbwr": "unset"}
    got, name = _case(tmp_path, smoke_cfg, made=other, ref_float=HERE, same=False)
    line = got[f"reference {name}"]
    assert line.status == "SKIP"
    assert "cpu_capability AVX512 (reference AVX2)" in line.detail
    assert "mkl_cbwr unset (reference AVX2)" in line.detail
    assert got["reference facts"].status == "PASS"  # token artifacts are always compared


def test_reference_without_float_paths_is_malformed(tmp_path, smoke_cfg):
    import json

    got, name = _case(tmp_path, smoke_cfg, made=HERE, ref_float=HERE, same=True)
    ref = json.loads((tmp_path / "t.json").read_text())
    del ref["float_platforms"][name]
    (tmp_path / "t.json").write_text(json.dumps(ref))
    (line,) = verify.check_reference(smoke_cfg, {}, tmp_path)
    assert line.status == "FAIL" and f"'float_platforms' lacks {name}" in line.detail
    assert "--write-reference" in line.detail


BF16_ATTENTION = """
import plantbench  # the pin, before torch runs a kernel
import torch
from plantbench.model import train_loop
q = torch.randn(1, 12, 256, 64, requires_grad=True)
with train_loop.autocast("bf16", torch.device("cpu")):
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
out.float().sum().backward()
print(out.dtype, bool(torch.isfinite(q.grad).all()))
"""


def test_bf16_attention_runs_under_the_pin():
    """bf16 autocast on the CPU under the AVX2 pin: ATen's flash kernel fails on CPUs with AMX
    ("pack_vnni2 is only supported when avx512 is supported"); pretraining's autocast runs the
    math kernel instead (on other CPUs this passes either way)."""
    out = subprocess.run(
        [sys.executable, "-c", BF16_ATTENTION], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["torch.bfloat16", "True"]
