"""`plantbench plan`: the arithmetic of the work / disk / GPU-hour estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from plantbench import cli, config
from plantbench.model.modeling import llama_config
from plantbench.ops import plan

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "workflow" / "presets" / "paper.yaml"


@pytest.fixture(scope="module")
def paper() -> dict:
    return config.load([ROOT / "config.yaml", PAPER])


def _stage(stages: list[plan.Stage], name: str) -> plan.Stage:
    return next(s for s in stages if s.stage == name)


def test_paper_preset_numbers(paper: dict) -> None:
    t = paper["train"]
    assert t["steps"] * t["batch_windows"] * paper["stream"]["window"] == 4_999_872_512  # 5.00B
    assert t["batch_windows"] * paper["stream"]["window"] == 262_144
    assert plan.n_facts(paper) == 528
    assert plan.grad_dims(paper) == 15_360  # the seed's, as a count sketch
    logra = {**paper, "features": {**paper["features"], "projection": "logra"}}
    assert plan.grad_dims(logra) == 84 * 13 * 14 == 15_288
    s = plan.shape_of(paper)
    assert s.total_params(tied=True) == 110_119_680


def test_param_count_matches_the_real_model() -> None:
    import torch
    from transformers import LlamaForCausalLM

    m = {
        "n_layer": 3,
        "n_embd": 96,
        "n_head": 4,
        "intermediate": 200,
        "tie_embeddings": True,
        "rope_theta": 1e4,
    }
    for tied in (True, False):
        conf = llama_config({**m, "tie_embeddings": tied}, 1000, 64, bos=0, eos=1, pad=2)
        with torch.device("meta"):
            model = LlamaForCausalLM(conf)
        want = sum(p.numel() for p in model.parameters())
        assert plan.Shape(3, 96, 200, 1000, 64).total_params(tied) == want


def test_pretrain_tokens_and_flops(paper: dict) -> None:
    st = _stage(plan.plan(paper), "pretrain")
    t = paper["train"]
    tokens = 2 * t["steps"] * t["batch_windows"] * paper["stream"]["window"]
    assert st.tokens == tokens
    s = plan.shape_of(paper)
    n = 12 * (4 * 768**2 + 3 * 768 * 2048) + 32768 * 768
    assert s.matmul_params == n
    per_token = 6 * n + 12 * 12 * 768 * 1024
    assert st.flops == pytest.approx(tokens * per_token, rel=1e-12)
    # 6N dominates: the attention term is 12 L d T / 6N = 15% here
    assert 0.1 < 12 * 12 * 768 * 1024 / (6 * n) < 0.2


def test_gpu_hours(paper: dict) -> None:
    assert plan.gpu_hours(989e12 * 0.4 * 3600, "h100", 0.4) == pytest.approx(1.0)
    assert plan.gpu_hours(1e18, "a100", 0.5) == pytest.approx(1e18 / (312e12 * 0.5) / 3600)
    with pytest.raises(ValueError):
        plan.gpu_hours(1.0, "tpu")
    # one model on `train.devices` GPUs: half the pretrain row, divided by the devices
    st = _stage(plan.plan(paper), "pretrain")
    one = plan.wall_hours_pretrain(paper, "h200")
    assert one == pytest.approx(plan.gpu_hours(st.flops / 2, "h200"))
    four = plan.wall_hours_pretrain({**paper, "train": {**paper["train"], "devices": 4}}, "h200")
    assert four == pytest.approx(one / 4)


def test_disk_and_job_counts(paper: dict) -> None:
    stages = plan.plan(paper)
    plan.check_finite(stages)
    stream = _stage(stages, "stream")
    assert stream.disk_bytes >= 2 * 4_999_872_512 * 2  # uint16 tokens, both twins
    grads = _stage(stages, "grads")
    n_pool = 11_220 + 1_056 + 100_000
    assert grads.jobs == 2 * 4 * (14 + 1)
    assert grads.disk_bytes == 2 * 4 * (n_pool + 1_056) * 15_360 * 2  # float16
    curv = _stage(stages, "curvature")
    assert curv.disk_bytes == 2 * 4 * 15_360**2 * 8 * 2  # a sketch is one block
    pre = _stage(stages, "pretrain")
    assert pre.disk_bytes == 2 * (11 * 110_119_680 * 4 + 110_119_680 * 16)


def test_cli_prints_a_markdown_table(paper: dict, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(
        [
            "plan",
            "-c",
            str(ROOT / "config.yaml"),
            "-c",
            str(PAPER),
            "--gpu",
            "h200",
            "--gpu",
            "a4500",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| stage | jobs |")
    assert "H200 h" in out and "A4500 h" in out and "| pretrain | 2 |" in out
    assert cli.main(["plan", "-c", str(ROOT / "config.yaml"), "--gpu", "tpu"]) == 2


def test_plan_against_measurement_reads_benchmark_files(paper: dict, tmp_path: Path) -> None:
    """plan_vs_measured.md: the pretrain stage calibrates the CPU FLOP rate (its ratio is 1),
    stages are matched by rule, and a stage off by more than 2x is flagged."""
    from plantbench.ops import plan_measured

    stages = {st.stage: st for st in plan.plan(paper)}
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    pre_mb = stages["pretrain"].mem_bytes / 1e6
    for name, cpu, rss in (
        ("pretrain_A", 1000.0, pre_mb),
        ("pretrain_B", 1000.0, pre_mb),
        ("hidden_A", 1.0, 10 * stages["hidden"].mem_bytes / 1e6),
        ("facts", 1.0, 100.0),
    ):
        (tmp_path / f"{name}.tsv").write_text(head + f"{cpu}\t0\t{rss}\t0\t0\t0\t0\t0\t0\t{cpu}\n")
    text = plan_measured.markdown(paper, tmp_path)
    table = plan_measured.rows(paper, plan_measured.read_jobs(tmp_path))
    rate = plan_measured.cpu_rate(table)
    assert rate == stages["pretrain"].flops / 2000.0
    pre = next(r for r in table if r.stage == "pretrain")
    assert pre.jobs_measured == 2 and pre.mem_ratio() == pytest.approx(1.0)
    assert "hidden memory x10.00" in plan_measured.off(table, rate)
    assert "| facts (no plan) |" in text and "| pretrain | 2 / 2 |" in text
