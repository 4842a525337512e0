"""`plantbench bench` and the GPU check script: they run and write well-formed rows (no timed
assertions: speed on a shared machine is not a property of the code)."""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

from plantbench.ops.bench import groups as bench
from plantbench.paths import Paths

ROOT = Path(__file__).resolve().parents[1]


def test_study_times_reads_the_rules_benchmark_files(tmp_path: Path) -> None:
    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    (tmp_path / "facts.tsv").write_text(header + "1.5\t0:00:01\t1\t1\t1\t1\t0\t0\t0\t1\n")
    (tmp_path / "pretrain_A.tsv").write_text(header + "10.25\t0:00:10\t1\t1\t1\t1\t0\t0\t0\t1\n")
    (tmp_path / "broken.tsv").write_text("nothing here\n")
    rows = bench.study_times(tmp_path)
    got = {r["what"]: r["value"] for r in rows}
    assert got["facts"] == 1.5 and got["pretrain_A"] == 10.25
    assert got["sum over 2 rule jobs (serial time)"] == 11.75
    assert all(r["stage"] == "study" and r["unit"] == "s" for r in rows)


def test_bench_run_writes_the_csv(smoke_cfg: dict, tmp_path: Path) -> None:
    cfg = {**smoke_cfg, "results": str(tmp_path / "results")}
    path = bench.run(cfg, Paths(cfg), threads=1, quick=True, skip=("features", "peers", "scoring"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and list(rows[0]) == bench.COLUMNS
    by = {(r["stage"], r["what"].split(" (")[0].split(",")[0]): r for r in rows}
    peak = float(by[("peak", "fp32 matmul 2048^2")]["value"])
    mfu = next(r for r in rows if r["what"].startswith("model FLOP/s (best"))
    assert peak > 0 and float(mfu["reference"]) == peak
    assert math.isclose(float(mfu["ratio"]), float(mfu["value"]) / peak, rel_tol=1e-4)
    assert (Paths(cfg).benchmarks / bench.PROFILE_NAME).read_text().count("aten::") > 5
    unpinned, pinned = [r for r in rows if "float pin" in r["what"]]
    assert "pin off" in unpinned["what"] and "pin off" not in pinned["what"]
    assert pinned["reference"] == unpinned["value"]  # the ratio is pinned over unpinned


def test_gpu_check_cpu_fallback(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location(
        "gpu_check", ROOT / "workflow/scripts/gpu_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    res = mod.main(["--out", str(tmp_path / "out.json")])
    assert (tmp_path / "out.json").is_file()
    for key in ("train_tokens_per_s", "feat_tokens_per_s", "mfu", "peak_measured_flops"):
        assert res[key] > 0 and math.isfinite(res[key])
    assert res["feat_dims"] == 256 and res["feat_logra_dims"] == 7 * 2 * 16


def test_flop_model_matches_the_documented_shapes() -> None:
    from plantbench.ops.bench.gradients import DEFAULT_MODEL, flops_per_window

    paper = {**DEFAULT_MODEL, "n_layer": 12, "n_embd": 768, "n_head": 12, "intermediate": 2048}
    f = flops_per_window(paper, 32768, 1024, 14, 13)
    assert f["P"] == 84_934_656 and f["D"] == 15_288  # workflow/presets/paper.yaml
    held = (f["exact"] + f["dense"]) / f["logra"]
    assert 5.5 < held < 6.0  # the module docstring's 5.8x: below 10x on flops
    d = flops_per_window(DEFAULT_MODEL, 4096, 128, 8, 8)
    assert d["P"] == 1_048_576 and d["D"] == 1792 and d["signs"] == d["P"] * d["D"]
    assert 5.2 < (d["exact"] + d["dense"]) / d["logra"] < 5.4
    assert 1.3 < (d["exact"] + d["kron"]) / d["logra"] < 1.5


def test_feature_rows_account_generation_and_compare_each_baseline(monkeypatch) -> None:
    from plantbench.ops.bench import gradients as bg

    base = {"params": 10, "linear_params": 1000, "dims": 64}
    fake = {
        "logra": {"seconds": 2.0, "peak_mb": 10.0},
        "kron": {"seconds": 1.0, "peak_mb": 40.0, "build_seconds": 0.1, "rel_diff": 1e-7},
        "dense": {
            "grad_seconds": 1.0, "proj_seconds": 3.0, "gen_seconds": 2.5, "matmul_seconds": 0.4,
            "held_matmul_seconds": 1.0, "held_block_mb": 1.0, "peak_mb": 80.0, "norm_ratio": 1.0,
        },
    }  # fmt: skip

    def child(job: dict) -> dict:
        wide = job["model"]["n_embd"] == 2 * bg.DEFAULT_MODEL["n_embd"]
        res = {**base, **fake[job["kind"]]}
        return {**res, "linear_params": 4000, "peak_mb": 12.0} if wide else res

    monkeypatch.setattr(bg, "_run_child", child)
    rows = bg.run_benchmark(model=dict(bg.DEFAULT_MODEL), windows=64, exact_windows=8)
    by = {(r["stage"], r["what"]): r for r in rows}
    assert by[("logra", "windows/s vs exact+kron")]["ratio"] == 32 / 8
    assert by[("logra", "windows/s vs exact+dense, R regenerated per batch")]["ratio"] == 32 / 2
    assert by[("logra", "windows/s vs exact+dense, R held")]["ratio"] == 32 / 4
    assert by[("logra", "peak RSS increase vs exact+dense (regenerating)")]["ratio"] == 10 / 80
    scaling = [r for r in rows if r["stage"] == "scaling"]
    assert [r["value"] for r in scaling if "logra" in r["what"]] == [10.0, 12.0]
    held = [r["value"] for r in scaling if "held R" in r["what"]]
    assert held == [1000 * 64 * 4 / 2**20, 4000 * 64 * 4 / 2**20]
    assert all(set(r) == {"stage", "what", "value", "unit", "reference", "ratio"} for r in rows)
