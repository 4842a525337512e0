"""`plantbench bench` and the GPU check script: they run and write well-formed rows (no timed
assertions: speed on a shared machine is not a property of the code)."""

from __future__ import annotations

import csv
import importlib.util
import math
from pathlib import Path

from plantbench import bench
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
    path = bench.run(cfg, Paths(cfg), threads=1, quick=True, skip=("features", "scoring"))
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and list(rows[0]) == bench.COLUMNS
    by = {(r["stage"], r["what"].split(" (")[0].split(",")[0]): r for r in rows}
    peak = float(by[("peak", "fp32 matmul 2048^2")]["value"])
    mfu = next(r for r in rows if r["what"].startswith("model FLOP/s (best"))
    assert peak > 0 and float(mfu["reference"]) == peak
    assert math.isclose(float(mfu["ratio"]), float(mfu["value"]) / peak, rel_tol=1e-4)
    assert (Paths(cfg).benchmarks / bench.PROFILE_NAME).read_text().count("aten::") > 5


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
    assert res["feat_dims"] == 7 * 2 * 16
