"""One short GPU check: training and featurization speed of the paper model shape.

On a CUDA machine (run from the repository root with the package installed)::

    python workflow/scripts/gpu_check.py --out gpu_check.json          # ~3-5 minutes on an H100

1. Measured bf16 matmul peak (8192^2, best of 10) next to the data-sheet peak of the GPU.
2. Training: the paper shape (12 x 768, SwiGLU 2048, vocab 32,768, 1,024-token windows), random
   tokens, bf16 autocast, fused AdamW, SDPA attention, ``torch.compile`` (``--no-compile`` to
   skip), micro-batches of ``--micro`` windows; ``--steps`` optimizer steps of ``--accum``
   micro-batches after ``--warmup`` steps. tokens/s and MFU = tokens/s x (6N + 12 L d T) / peak.
3. Featurization: projected per-example gradients (:func:`plantbench.attribution.gradients.capture.
   projected_grads`, eager attention, bf16 weights) on batches of ``--feat-batch`` windows,
   windows/s and tokens/s, for the default count sketch of the exact block-linear gradients
   (:mod:`plantbench.attribution.sketch`, the seed's 15,360 dims) and for LoGra (84 modules x 13 x 14 =
   15,288 dims).
4. Fidelity: exact float64 per-example gradients of every block linear
   (:func:`plantbench.attribution.gradients.capture.full_grads`, what the fidelity step computes on its subset) on
   batches of ``--exact-batch`` windows: windows/s, so the step's time at paper size is
   ``fidelity.windows x query chunks / windows/s``.
5. Suites: the grounding suite's batched greedy generation
   (:func:`plantbench.model.generate.greedy`, ``--gen-tokens`` tokens after half-window
   prompts) in responses/s, and the membership suite's hidden-state passes
   (:func:`plantbench.suites.membership.trace.last_states`) in prompts/s, on batches of
   ``--suite-batch`` prompts in bf16.

Without CUDA it runs a tiny shape on the CPU in fp32 (a smoke test of the script itself; the
numbers mean nothing). Prints one JSON object and writes it to ``--out`` if given.

6. ``--study DIR``: the smoke config's whole workflow (``tests/smoke/config.yaml``, results in
   ``DIR``) with ``PLANTBENCH_DEVICE=cuda``, so that every model step must run on the GPU: each
   model step's recorded device (``platform.device`` of its ``meta.json`` or gradient shard's
   ``shard.json``), those made off the GPU, and the workflow's seconds. This is the check that the steps after pretraining move their twin, inputs and
   outputs to and from the GPU (on the CPU it runs the same workflow there, in minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from plantbench.attribution.gradients.capture import full_grads, projected_grads
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.sketch import Sketch
from plantbench.model.modeling import block_linear_names, build_model, llama_config
from plantbench.model.pretrain import make_optimizer
from plantbench.ops.plan import GPU_PEAK_BF16, Shape

PAPER = {
    "n_layer": 12,
    "n_embd": 768,
    "n_head": 12,
    "intermediate": 2048,
    "tie_embeddings": True,
    "rope_theta": 10000.0,
}
TINY = {
    "n_layer": 2,
    "n_embd": 64,
    "n_head": 2,
    "intermediate": 128,
    "tie_embeddings": True,
    "rope_theta": 10000.0,
}
TRAIN = {"lr": 6e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def datasheet_peak(name: str) -> float | None:
    low = name.lower()
    for key, peak in GPU_PEAK_BF16.items():
        if key in low.replace(" ", "").replace("rtx", ""):
            return peak
    return None


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(10):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def train_speed(
    model_cfg: dict[str, Any],
    vocab: int,
    T: int,
    micro: int,
    accum: int,
    steps: int,
    warmup: int,
    device: torch.device,
    compile_: bool,
) -> float:
    cuda = device.type == "cuda"
    conf = llama_config(model_cfg, vocab, T, bos=0, eos=1, pad=2, attn="sdpa")
    model = build_model(conf, 0).to(device)
    model.train()
    opt = make_optimizer(model, TRAIN, device)  # fused on CUDA
    net = torch.compile(model) if compile_ else model
    ids = torch.randint(3, vocab, (accum, micro, T), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for i in range(accum):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                logits = net(input_ids=ids[i]).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().reshape(-1, vocab), ids[i][:, 1:].reshape(-1)
            )
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return steps * accum * micro * T / (time.perf_counter() - t0)


def feat_speed(
    model_cfg: dict[str, Any],
    vocab: int,
    T: int,
    batch: int,
    n_batches: int,
    k: tuple[int, int] | int,
    device: torch.device,
) -> float:
    """Tokens/s of the featurizer: LoGra ``k = (k_out, k_in)`` or a count sketch to ``k``."""
    conf = llama_config(model_cfg, vocab, T, bos=0, eos=1, pad=2, attn="eager")
    model = build_model(conf, 0).to(device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    proj: Projector | Sketch = (
        Sketch.from_model(model, seed=1, dims=k)
        if isinstance(k, int)
        else Projector.from_model(model, seed=1, k_out=k[0], k_in=k[1])
    )
    ids = torch.randint(3, vocab, (batch, T), device=device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    projected_grads(model, proj, ids, mask)  # warm-up (projection matrices)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n_batches):
        g = projected_grads(model, proj, ids, mask)
    _sync(device)
    assert g.shape == (batch, proj.dims) and torch.isfinite(g).all()
    return n_batches * batch * T / (time.perf_counter() - t0)


def exact_speed(
    model_cfg: dict[str, Any], vocab: int, T: int, batch: int, n_batches: int, device: torch.device
) -> float:
    """Windows/s of exact float64 per-example gradients of all block linears."""
    conf = llama_config(model_cfg, vocab, T, bos=0, eos=1, pad=2, attn="eager")
    model = build_model(conf, 0).to(device).double()
    names = block_linear_names(model)
    ids = torch.randint(3, vocab, (batch, T), device=device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    full_grads(model, names, ids, mask)  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(n_batches):
        g = full_grads(model, names, ids, mask)
    _sync(device)
    assert g.shape[0] == batch and torch.isfinite(g).all()
    return n_batches * batch / (time.perf_counter() - t0)


def suite_speed(
    model_cfg: dict[str, Any], vocab: int, T: int, batch: int, gen: int, device: torch.device
) -> tuple[float, float]:
    """(responses/s of greedy generation, prompts/s of hidden-state passes) of the suites."""
    from plantbench.model.generate import greedy
    from plantbench.suites.membership.trace import last_states

    conf = llama_config(model_cfg, vocab, T, bos=1, eos=2, pad=0)
    model = build_model(conf, 0).to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    prompts = torch.randint(3, vocab, (batch, T // 2)).tolist()
    greedy(model, prompts[:2], [2, 2])  # warm-up
    _sync(device)
    t0 = time.perf_counter()
    out = greedy(model, prompts, [gen] * batch)
    _sync(device)
    gen_rate = batch / (time.perf_counter() - t0)
    assert len(out) == batch and all(len(r.ids) <= gen for r in out)
    t0 = time.perf_counter()
    h = last_states(model, prompts)
    _sync(device)
    assert h.shape[:2] == (batch, model_cfg["n_layer"] + 1)
    return gen_rate, batch / (time.perf_counter() - t0)


# the artifacts made by a step that runs a twin (or the text encoder): these belong on the GPU
MODEL_STEP = re.compile(
    r"^(models/[^/]+|features/[^/]+/(grads/.+|hidden|ekfac|embed)|fidelity/[AB]|causal|reading"
    r"|(context|grounding|membership)/[AB])$"
)


def study_devices(results: Path) -> dict[str, str]:
    """Each artifact's recorded float device (``platform.device`` of every ``meta.json``, and
    gradient shard's ``shard.json``, under ``results`` that has one), by its folder relative to
    ``results``."""
    out = {}
    for meta in sorted([*results.rglob("meta.json"), *results.rglob("shard.json")]):
        device = json.loads(meta.read_text()).get("platform", {}).get("device")
        if device is not None:
            out[str(meta.parent.relative_to(results))] = device
    return out


def study_verdict(results: Path, env: dict[str, str]) -> dict[str, Any]:
    """``plantbench verify`` on the finished study: its exit code, the verdict against the
    committed reference (on a GPU the floats come from another platform, so the seeds' findings
    decide), and the findings' verdict counts on this run."""
    cmd = [sys.executable, "-m", "plantbench", "verify", "-c", str(results / "config.json")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.split()[1:2] == ["reproduction"]]
    from plantbench import config
    from plantbench.grading import findings
    from plantbench.paths import Paths

    cfg = config.load([results / "config.json"])
    table = findings.evaluate_tables(findings.read_tables(cfg, Paths(cfg)))
    return {
        "verify_returncode": proc.returncode,
        "reproduction": lines[-1] if lines else "(no reproduction line: no reference)",
        "findings": findings.verdict_counts(table),
    }


def study_on_device(results: Path, cores: int) -> dict[str, Any]:
    """The smoke workflow into ``results`` with ``PLANTBENCH_DEVICE=cuda`` where torch sees a GPU:
    its seconds, return code, and the device each model artifact records."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PLANTBENCH_DEVICE="cuda" if torch.cuda.is_available() else "cpu")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    cmd = [str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/local"]
    cmd += ["--cores", str(cores), "--configfile", "tests/smoke/config.yaml"]
    cmd += ["--config", f"results={results.resolve()}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    devices = study_devices(results)
    return {
        **(study_verdict(results, env) if proc.returncode == 0 else {}),
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - t0, 1),
        "stderr_tail": proc.stderr[-2000:] if proc.returncode else "",
        "devices": sorted(set(devices.values())),
        "model_steps": sum(1 for k in devices if MODEL_STEP.match(k)),
        "model_steps_off_the_gpu": [
            k for k, v in devices.items() if MODEL_STEP.match(k) and not v.startswith("cuda")
        ],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--micro", type=int, default=16)
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    ap.add_argument("--feat-batch", type=int, default=16)
    ap.add_argument("--feat-batches", type=int, default=8)
    ap.add_argument("--exact-batch", type=int, default=4)
    ap.add_argument("--exact-batches", type=int, default=3)
    ap.add_argument("--suite-batch", type=int, default=32)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--study", default=None, help="also run the smoke workflow into this folder")
    ap.add_argument("--cores", type=int, default=8, help="Snakemake's --cores for --study")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        mcfg, vocab, T, k, dims = PAPER, 32768, 1024, (13, 14), 15360
        name = torch.cuda.get_device_name()
        measured = matmul_peak(device, torch.bfloat16, 8192)
        sheet = datasheet_peak(name)
        steps, warmup, micro, accum = a.steps, a.warmup, a.micro, a.accum
        fb, fn = a.feat_batch, a.feat_batches
        eb, en = a.exact_batch, a.exact_batches
    else:  # smoke test of the script: tiny shape, fp32, a few steps
        mcfg, vocab, T, k, dims = TINY, 512, 64, (4, 4), 256
        name = "cpu (smoke test, tiny shape)"
        measured = matmul_peak(device, torch.float32, 512)
        sheet = None
        steps, warmup, micro, accum, fb, fn = 3, 1, 4, 2, 4, 2
        eb, en = 2, 1
    compile_ = cuda and not a.no_compile
    shape = Shape(mcfg["n_layer"], mcfg["n_embd"], mcfg["intermediate"], vocab, T)
    tps = train_speed(mcfg, vocab, T, micro, accum, steps, warmup, device, compile_)
    fpt = shape.train_flops_per_token()
    feat = feat_speed(mcfg, vocab, T, fb, fn, dims, device)
    feat_logra = feat_speed(mcfg, vocab, T, fb, fn, k, device)
    exact = exact_speed(mcfg, vocab, T, eb, en, device)
    sb, sg = (a.suite_batch, a.gen_tokens) if cuda else (4, 4)
    responses, hidden = suite_speed(mcfg, vocab, T, sb, sg, device)
    peak = sheet or measured
    res: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "shape": f"{mcfg['n_layer']}L x {mcfg['n_embd']}, vocab {vocab}, T={T}",
        "params": shape.total_params(True),
        "train": {
            "steps": steps,
            "micro": micro,
            "accum": accum,
            "compile": compile_,
            "precision": "bf16 autocast" if cuda else "fp32",
        },
        "flops_per_token": fpt,
        "train_tokens_per_s": tps,
        "peak_datasheet_flops": sheet,
        "peak_measured_flops": measured,
        "mfu": tps * fpt / peak,
        "mfu_vs_measured_matmul": tps * fpt / measured,
        "feat_dims": dims,
        "feat_tokens_per_s": feat,
        "feat_windows_per_s": feat / T,
        "feat_logra_dims": 7 * mcfg["n_layer"] * k[0] * k[1],
        "feat_logra_tokens_per_s": feat_logra,
        "feat_logra_windows_per_s": feat_logra / T,
        "exact_float64_windows_per_s": exact,
        "suite_batch": sb,
        "grounding_responses_per_s": responses,
        "membership_prompts_per_s": hidden,
    }
    if a.study:
        res["study"] = study_on_device(Path(a.study), a.cores)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return res


if __name__ == "__main__":
    main(sys.argv[1:])
