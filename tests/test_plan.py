"""`plantbench plan`: the arithmetic of the work / disk / GPU-hour estimates."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plantbench import cli, config, layout
from plantbench.model.modeling import llama_config
from plantbench.ops import plan

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "workflow" / "presets" / "paper.yaml"
REHEARSAL = ROOT / "workflow" / "presets" / "rehearsal.yaml"
RULE = re.compile(r"^rule (\w+):", re.M)


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
    rows = 2 * 4 * (n_pool + 1_056) * 15_360 * 2  # float16
    # + the final checkpoint's 14 shards' float64 Kronecker factor sums (EK-FAC), per twin
    factors = 2 * 14 * 8 * 12 * (8 * 768**2 + 3 * (768**2 + 2048**2))
    assert grads.disk_bytes == rows + factors
    curv = _stage(stages, "curvature")
    assert curv.disk_bytes == 2 * 4 * 15_360**2 * 8  # one block (a sketch): float64 eigenvectors
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
        ("hidden_A", 10.0, 10 * stages["hidden"].mem_bytes / 1e6),
        ("facts", 1.0, 100.0),
        ("corpus", 0.6, 3.0),  # sampled only as its shell started: shown, not judged
    ):
        (tmp_path / f"{name}.tsv").write_text(head + f"{cpu}\t0\t{rss}\t0\t0\t0\t0\t0\t0\t{cpu}\n")
    text = plan_measured.markdown(paper, tmp_path)
    table = plan_measured.rows(paper, plan_measured.read_jobs(tmp_path))
    rate = plan_measured.cpu_rate(table)
    assert rate == stages["pretrain"].flops / 2000.0
    stage_rates = plan_measured.rates(paper, table)
    pre = next(r for r in table if r.stage == "pretrain")
    assert pre.jobs_measured == 2 and pre.mem_ratio() == pytest.approx(1.0)
    assert "hidden memory x10.00" in plan_measured.off(table, stage_rates)
    corpus = next(r for r in table if r.stage == "corpus")
    assert corpus.mem_measured_mb == 3.0 and corpus.mem_ratio() is None
    assert not any(b.startswith("corpus") for b in plan_measured.off(table, stage_rates))
    assert "| facts (no plan) |" not in text and "| pretrain | 2 / 2 |" in text
    (tmp_path / "bench.tsv").write_text(head + "1.0\t0\t100\t0\t0\t0\t0\t0\t0\t1.0\n")
    assert "| bench (no plan) |" in plan_measured.markdown(paper, tmp_path)


def _with(cfg: dict, section: str, **values: Any) -> dict:
    """``cfg`` with ``values`` set in ``section``."""
    return {**cfg, section: {**(cfg.get(section) or {}), **values}}


def _flops(cfg: dict, stage: str) -> float:
    return _stage(plan.plan(cfg), stage).flops


def test_every_workflow_rule_has_a_plan_row_or_a_reason() -> None:
    """Every ``rule NAME:`` of the workflow maps to a stage of the plan, or is listed (with its
    reason) as unplanned; the rules the default study runs all map."""
    from plantbench import replicates
    from plantbench.ops import plan_measured as pm

    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    rules = {name for f in files for name in RULE.findall(f.read_text())}
    assert {"facts", "reading", "fidelity", "context_attribute", "grounding_respond"} <= rules
    assert not set(pm.STAGE_OF_RULE) & set(pm.UNPLANNED)
    assert rules == set(pm.STAGE_OF_RULE) | set(pm.UNPLANNED)
    default = config.load([ROOT / "config.yaml"])
    # the unplanned rules are not in the default study's DAG (asked for by name, or off)
    assert "trackstar" not in default["methods"]["enabled"] and replicates.count(default) == 1
    enabled = [*default["methods"]["enabled"], "tracin_ekfac"]  # + the optional ekfac_tracin
    full = _with(_with(default, "methods", enabled=enabled), "random_twins", m=4)
    stages = {st.stage for st in plan.plan(full)}
    assert set(pm.STAGE_OF_RULE.values()) <= stages


def test_suite_job_counts(paper: dict) -> None:
    """One job per twin where the rule has a {model} wildcard, one for the others (the
    rehearsal's counts, which tests/test_rehearsal.py compares with the run's)."""
    cfg = config.load([ROOT / "config.yaml", PAPER, REHEARSAL])
    jobs = {st.stage: st.jobs for st in plan.plan(cfg)}
    per_twin = ["fidelity", "context_attribute", "membership_detect", "grounding_respond"]
    once = ["facts", "reading", "context_build", "context_analysis", "membership_samples"]
    once += ["membership_analysis", "grounding_build", "grounding_analysis"]
    assert {s: jobs[s] for s in per_twin} == dict.fromkeys(per_twin, 2)
    assert {s: jobs[s] for s in once} == dict.fromkeys(once, 1)
    gpu = {st.stage for st in plan.plan(paper) if st.gpu}
    assert set(per_twin) | {"reading"} <= gpu
    assert not {"facts", "context_build", "membership_analysis"} & gpu


def test_context_methods_are_the_registered_ones() -> None:
    from plantbench.suites.context.methods import registry

    registry.names()
    builtin = {
        name
        for name, m in registry._REGISTRY.items()
        if m.fn.__module__.startswith("plantbench.suites.context.methods.")
    }
    assert set(plan.CONTEXT_METHODS) == builtin


def _run_context_query(monkeypatch: pytest.MonkeyPatch, cfg: dict) -> tuple[int, list[list[int]]]:
    """One query through every context method and the learned rows with a stand-in twin:
    (prompt passes run, the kept segments of each batch's prompts)."""
    from plantbench.suites.context import attribute
    from plantbench.suites.context import oracle as om
    from plantbench.suites.context.settings import settings

    batches: list[list[int]] = []

    def logprobs(model: Any, prefixes: list, cands: list) -> tuple[np.ndarray, np.ndarray]:
        batches.append([len(p) - 1 for p in prefixes])
        r = np.random.default_rng(len(batches))
        return r.normal(-5, 1, (len(prefixes), len(cands))), np.zeros((len(prefixes), len(cands)))

    class Stand(om.Oracle):
        def _attention(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            owner = np.array([-1, *np.flatnonzero(mask), -1])
            return np.random.default_rng(0).random((1, 2, 1, len(owner))), owner

    monkeypatch.setattr(om, "batch_candidate_logprobs", logprobs)
    # one token per kept segment: a prompt's length tells how many segments it keeps
    monkeypatch.setattr(
        om.tokenizer, "encode_batch", lambda tok, t: [[0] * x.count("\n") for x in t]
    )
    st = settings(cfg)
    o = Stand(None, None, [f"s{j}" for j in range(st.segments)], "q", [[1], [2]], 0, st.batch)
    records: dict = {}
    attribute.attribute_query(o, st, "q1", records)
    attribute.learned_rows({"q1": o}, st, records, {"q1": "f1"})
    return o.passes, batches


def test_context_masks_are_what_the_oracle_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2^k <= context.lattice: the 2^k masks in batches of consecutive keys, padded as
    planned; without the lattice, about the expected distinct masks the methods ask for."""
    from plantbench.suites.context.settings import DEFAULTS

    default = config.load([ROOT / "config.yaml"])
    for k in (4, 6):
        cfg = _with(default, "context", segments=k)
        sec = {**DEFAULTS, **cfg["context"]}
        masks, padded = plan._context_masks(sec, k, plan.CONTEXT_METHODS)
        passes, batches = _run_context_query(monkeypatch, cfg)
        assert passes == masks == 2**k
        assert padded == pytest.approx(sum(len(b) * max(b) for b in batches) / 2**k)
    for k in (8, 10):  # without the lattice: the expected distinct masks the methods ask for
        cfg = _with(default, "context", segments=k, lattice=1)
        sec = {**DEFAULTS, **cfg["context"]}
        masks, padded = plan._context_masks(sec, k, plan.CONTEXT_METHODS)
        passes, _ = _run_context_query(monkeypatch, cfg)
        assert padded == k and 0.8 < passes / masks < 1.25


def test_context_flops_scale_with_ablations_and_queries(paper: dict) -> None:
    # without the lattice (2^10 masks > 1) the ablations add masks, the FLOPs linear in them
    from plantbench.suites.context.settings import DEFAULTS

    base = _with(paper, "context", segments=10, lattice=1)
    m, f = [], []
    for a in (8, 16, 24):
        cfg = _with(base, "context", ablations=a)
        m.append(plan._context_masks({**DEFAULTS, **cfg["context"]}, 10, plan.CONTEXT_METHODS)[0])
        f.append(_flops(cfg, "context_attribute"))
    assert m[0] < m[1] < m[2]
    assert (f[2] - f[1]) / (m[2] - m[1]) == pytest.approx((f[1] - f[0]) / (m[1] - m[0]))
    # with it every mask runs once, whatever the ablations
    assert _flops(_with(paper, "context", ablations=8), "context_attribute") == pytest.approx(
        _flops(_with(paper, "context", ablations=64), "context_attribute")
    )
    # per query: linear in the facts
    one = _flops(_with(paper, "facts", facts_per_cell=1), "context_attribute")
    assert _flops(paper, "context_attribute") == pytest.approx(11 * one)
    # AttnTrace's subsamples add attention passes
    more = _with(paper, "context", attntrace_subsamples=16)
    assert _flops(more, "context_attribute") > _flops(paper, "context_attribute")


def test_membership_flops_scale_with_samples(paper: dict) -> None:
    f = {
        n: _flops(_with(paper, "membership", samples=n, distractors=0), "membership_detect")
        for n in (40, 80)
    }
    assert f[80] == pytest.approx(2 * f[40])
    dis = _with(paper, "membership", samples=40, distractors=20)
    assert f[40] < _flops(dis, "membership_detect") < f[80]  # distractors: one run, not six
    longer = _with(paper, "membership", samples=40, distractors=0, generate_tokens=24)
    assert _flops(longer, "membership_detect") > f[40]
    st = _stage(plan.plan(paper), "membership_detect")  # the seed's 250 / 50 fit the paper grid
    assert "250 samples + 50 distractors" in st.work


def test_grounding_flops_scale_with_contexts_and_tokens(paper: dict) -> None:
    st = _stage(plan.plan(paper), "grounding_respond")
    assert "2,112 contexts" in st.work  # 528 facts x 4 conditions
    two = _with(paper, "grounding", conditions=["factual", "counterfactual"])
    assert _flops(two, "grounding_respond") == pytest.approx(st.flops / 2)
    assert _flops(_with(paper, "grounding", max_new_tokens=64), "grounding_respond") > st.flops
    assert _flops(_with(paper, "grounding", max_new_tokens=1), "grounding_respond") < st.flops


def test_fidelity_chunks_windows_and_methods(paper: dict) -> None:
    st = _stage(plan.plan(paper), "fidelity")
    p = plan.shape_of(paper).block_linear_params
    chunks = math.ceil(1056 / (layout.FIDELITY_MEMORY_BYTES // (8 * p)))
    assert chunks == 264 and f"({chunks} chunks)" in st.work
    # one pass over the subset per chunk: linear in the windows
    bare = _with(paper, "fidelity", sweep=[], sketch_sweep=[])
    f = [_flops(_with(bare, "fidelity", windows=w), "fidelity") for w in (100, 200, 300)]
    assert f[2] - f[1] == pytest.approx(f[1] - f[0]) and f[0] > 0
    assert st.flops > f[2]  # the paper's sweep sizes add passes
    none = _with(paper, "methods", enabled=["bm25", "hidden", "ekfac"])
    assert "fidelity" not in {s.stage for s in plan.plan(none)}


def test_reading_counts_checkpoints_and_the_fork() -> None:
    default = config.load([ROOT / "config.yaml"])
    st = _stage(plan.plan(default), "reading")
    n = len(layout.checkpoint_steps(default["train"]))
    assert st.work.startswith(f"2 x {n + 1} checkpoints x 72 never-read facts")
    flat = _with(default, "train", prefix_steps=0)
    m = len(layout.checkpoint_steps(flat["train"]))
    assert _flops(flat, "reading") == pytest.approx(st.flops * m / (n + 1))


def test_the_shared_prefix_is_trained_once(paper: dict) -> None:
    default = config.load([ROOT / "config.yaml"])
    t, w = default["train"], default["stream"]["window"]
    stages = plan.plan(default)
    pre, twins = _stage(stages, "pretrain_prefix"), _stage(stages, "pretrain")
    assert pre.jobs == 1 and pre.tokens == t["prefix_steps"] * t["batch_windows"] * w
    assert twins.tokens == 2 * (t["steps"] - t["prefix_steps"]) * t["batch_windows"] * w
    assert "pretrain_prefix" not in {s.stage for s in plan.plan(paper)}
    both = plan.gpu_hours(pre.flops + twins.flops / 2, "h100")
    assert plan.wall_hours_pretrain(default, "h100") == pytest.approx(both)


def test_suite_memory_follows_what_the_jobs_hold(paper: dict) -> None:
    """context: a batch of masks' candidate rows and every query's attention weights (kept
    until AT2 fits); membership: a batch's float64 log-distributions; fidelity: a chunk of
    float64 query gradients (at most FIDELITY_MEMORY_BYTES)."""

    def mem(cfg: dict, stage: str) -> float:
        return _stage(plan.plan(cfg), stage).mem_bytes

    ctx = mem(paper, "context_attribute")
    assert mem(_with(paper, "context", batch=32), "context_attribute") > ctx
    assert mem(_with(paper, "facts", facts_per_cell=22), "context_attribute") > ctx
    s = plan.shape_of(paper)
    one = mem(_with(paper, "membership", batch=1), "membership_detect")
    two = mem(_with(paper, "membership", batch=2), "membership_detect")
    c = plan.PAD * (plan.DOC_TOKENS + plan.PROMPT_TOKENS) + 12  # + generate_tokens
    assert two - one == pytest.approx(c * s.vocab * 16)
    p = s.block_linear_params
    small = {**paper, "methods": {**paper["methods"], "enabled": ["grad_dot"]}}
    assert mem(small, "fidelity") > (layout.FIDELITY_MEMORY_BYTES // (8 * p)) * p * 8


def test_rule_memory_follows_the_plan() -> None:
    """The rules' mem_mb (workflow/rules/config.smk, plan_mem_mb): the plan's per-job peak
    plus a quarter where that is above the rule's floor, the floor otherwise."""
    paper = plan.plan(config.load([ROOT / "config.yaml", ROOT / "workflow/presets/paper.yaml"]))
    mem = {st.stage: st.mem_bytes for st in paper}
    assert plan.rule_mem_mb(paper, "grads", 3000) == math.ceil(1.25 * mem["grads"] / 1e6) > 20000
    assert plan.rule_mem_mb(paper, "ekfac", 4000) > 1.25 * mem["ekfac"] / 1e6 - 1
    assert plan.rule_mem_mb(paper, "pretrain_prefix", 4000) == 4000  # no prefix at paper scale
    smoke = plan.plan(config.load([ROOT / "config.yaml", ROOT / "tests/smoke/config.yaml"]))
    assert plan.rule_mem_mb(smoke, "grads", 3000) == 3000


def test_every_planned_rule_asks_the_plan_for_its_memory() -> None:
    """One memory model: each rule the plan counts (the data steps included) takes its mem_mb
    from its plan row (``plan_mem_mb("<row>", floor)``); only the unplanned rules (the stage
    catalogue's ``unplanned`` reason) keep a fixed request."""
    from plantbench import stages

    files = [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]
    text = "\n".join(f.read_text() for f in files)
    blocks = dict(re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S))
    for stage in stages.STAGES:
        asked = re.search(r"mem_mb=(.*),", blocks[stage.rule])
        assert asked, stage.rule
        if stage.plan_stage is None:
            assert "plan_mem_mb" not in asked[1], stage.rule
        else:
            assert asked[1].startswith(f'plan_mem_mb("{stage.plan_stage}", '), stage.rule


def test_the_data_steps_hold_their_duplicate_filter_and_manifest(paper: dict) -> None:
    """The corpus step holds a digest per document (counted at one a kB of text), the stream
    step one model's manifest; at the paper preset the corpus asks more than its floor."""
    mem = {st.stage: st.mem_bytes for st in plan.plan(paper)}
    text = paper["corpus"]["max_bytes"]
    batch = min(text, plan.ROW_GROUP_CHARS) * 4.0
    dedup = text / plan.DOC_BYTES * plan.DEDUP_BYTES_PER_DOC
    assert mem["corpus"] == plan.BASE_BYTES + batch + dedup
    small = config.deep_merge(paper, {"train": {"steps": paper["train"]["steps"] // 2}})
    n_win = paper["train"]["steps"] * paper["train"]["batch_windows"]
    half = (paper["train"]["steps"] // 2) * paper["train"]["batch_windows"]
    drop = mem["stream"] - _stage(plan.plan(small), "stream").mem_bytes
    # the recall windows scale with the steps too: the drop is at least the manifest's
    assert drop >= (n_win - half) * plan.MANIFEST_BYTES_PER_WINDOW
    assert plan.rule_mem_mb(plan.plan(paper), "corpus", 4000) > 4000


def test_every_planned_stage_has_its_artifact_folders() -> None:
    """``plan --measured``'s disk column: each stage of the plan (default and paper) is measured
    on the folders its rules write, all inside the results folder."""
    from plantbench.ops import plan_measured

    for files in (["config.yaml"], ["config.yaml", "workflow/presets/paper.yaml"]):
        cfg = config.load([ROOT / f for f in files])
        folders = plan_measured.artifact_folders(cfg)
        assert {st.stage for st in plan.plan(cfg)} <= set(folders)
        root = Path(cfg["results"]).resolve()
        for fs in folders.values():
            assert all(root in Path(f).resolve().parents for f in fs)


def test_an_influence_score_job_holds_the_fisher() -> None:
    """A score job of an influence method loads the Fisher's float64 eigenvectors (and a copy):
    at the paper's one 15,360-dim sketch block that is 3.8 GB beside the features."""
    cfg = config.load([ROOT / "config.yaml", PAPER])
    with_fisher = next(st for st in plan.plan(cfg) if st.stage == "score").mem_bytes
    cfg["methods"]["enabled"] = [m for m in cfg["methods"]["enabled"] if "influence" not in m]
    without = next(st for st in plan.plan(cfg) if st.stage == "score").mem_bytes
    assert with_fisher - without == 2 * 15_360**2 * 8


def test_the_stream_step_holds_its_recall_windows() -> None:
    """Every recall window is held until both streams are written: its ids in the stream's
    token dtype, its uint8 mask and its objects (the default study: 40,960 windows of 128)."""
    cfg = config.load([ROOT / "config.yaml"])
    n = sum(layout.recall_counts(cfg).values())
    with_recall = _stage(plan.plan(cfg), "stream").mem_bytes
    off = config.deep_merge(cfg, {"stream": {"recall": {"prefix_share": 0.0, "paired_share": 0.0}}})
    without = _stage(plan.plan(off), "stream").mem_bytes
    assert n == 40_960 and with_recall - without == n * ((2 + 1) * 128 + plan.RECALL_WINDOW_BYTES)


def test_embed_counts_each_distinct_text_once_at_the_encoders_matmuls() -> None:
    """The shared job encodes the pool windows both twins hold and the queries, each twin only
    its own planted windows: 2 FLOPs per token per matmul parameter (MiniLM: 6 x 12 x 384^2)."""
    cfg = config.load([ROOT / "config.yaml"])
    counts = layout.pool_counts(cfg)
    n_pool, n_q = sum(counts.values()), 2 * layout.n_facts(cfg)  # two query forms a fact
    embed = _stage(plan.plan(cfg), "embed")
    tokens = (n_pool + counts["planted"]) * 128 + n_q * 32
    assert plan.MINILM[1] == 6 * 12 * 384**2 and plan.ENCODER[1] == 12 * 12 * 768**2
    assert embed.tokens == tokens and embed.flops == tokens * 2 * plan.MINILM[1]


def test_a_job_that_loads_the_encoder_adds_its_load_time() -> None:
    from plantbench.ops import plan_measured as pm

    row = dict(jobs_planned=3, jobs_measured=3, flops=2e9, cpu_s=1.0, wall_s=1.0)
    mem = dict(mem_planned_mb=1.0, mem_measured_mb=1.0)
    embed = pm.Row("embed", **row, **mem).seconds_planned(1e9)
    hidden = pm.Row("hidden", **row, **mem).seconds_planned(1e9)
    assert hidden == 2.0 + 3 * pm.JOB_CPU_S and embed - hidden == 3 * pm.ENCODER_LOAD_CPU_S


def test_a_logged_peak_is_judged_however_short_the_job(paper: dict, tmp_path: Path) -> None:
    """The exact peak a step's log ends with (plantbench.ops.process.report_peak) replaces the
    benchmark's sampled max_rss where it is larger, and makes a short job's memory count; the
    ranks of a data-parallel step add up."""
    from plantbench.ops import plan_measured, process

    bench, logs = tmp_path / "benchmarks", tmp_path / "logs"
    bench.mkdir()
    logs.mkdir()
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for name in ("corpus", "stream", "pretrain_A"):
        (bench / f"{name}.tsv").write_text(head + "0.6\t0\t3.0\t0\t0\t0\t0\t0\t0\t0.5\n")
    (logs / "corpus.log").write_text(f"step output\n{process.PEAK_LINE} 143.5 MB\n")
    ranks = f"{process.PEAK_LINE} 1000.0 MB\nother\n{process.PEAK_LINE} 900.5 MB\n"
    (logs / "pretrain_A.log").write_text(ranks)
    jobs = {j.name: j for j in plan_measured.read_jobs(bench)}
    assert jobs["corpus"].rss_mb == 143.5 and jobs["corpus"].rss_logged
    assert jobs["pretrain_A"].rss_mb == 1900.5
    assert jobs["stream"].rss_mb == 3.0 and not jobs["stream"].rss_logged
    table = {r.stage: r for r in plan_measured.rows(paper, list(jobs.values()))}
    assert table["corpus"].mem_ratio() is not None and table["stream"].mem_ratio() is None


def test_report_peak_writes_what_logged_peak_reads(tmp_path: Path) -> None:
    import io as _io
    import resource

    from plantbench.ops import process

    buf = _io.StringIO()
    process.report_peak(buf)
    (tmp_path / "step.log").write_text("INFO a step\n" + buf.getvalue())
    got = process.logged_peak_mb(tmp_path / "step.log")
    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    assert got is not None and 0 <= mine - got + 0.05 < 64  # rounded to 0.1 MB; may grow since
    assert process.logged_peak_mb(tmp_path / "absent.log") is None


def test_float32_stages_of_a_bf16_run_are_planned_at_the_gradients_rate(
    paper: dict, tmp_path: Path
) -> None:
    """bf16 training (the paper preset) calibrates the training stages; the float32 rest runs at
    the pool gradients' rate. A float32 run plans every stage at the pretrain stage's rate."""
    from plantbench.ops import plan_measured

    stages = {st.stage: st for st in plan.plan(paper)}
    head = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    for name, cpu in (("pretrain_A", 100.0), ("grads_pool_A_step_0000003_0000", 300.0)):
        (tmp_path / f"{name}.tsv").write_text(head + f"{cpu}\t0\t1\t0\t0\t0\t0\t0\t0\t{cpu}\n")
    (tmp_path / "hidden_A.tsv").write_text(head + "5.0\t0\t1\t0\t0\t0\t0\t0\t0\t5.0\n")
    table = plan_measured.rows(paper, plan_measured.read_jobs(tmp_path))
    bf16 = plan_measured.rates(paper, table)
    assert bf16["pretrain"] == stages["pretrain"].flops / 100.0
    assert bf16["grads"] == bf16["hidden"] == stages["grads"].flops / 300.0
    fp32 = plan_measured.rates(_with(paper, "train", precision="fp32"), table)
    assert fp32["grads"] == fp32["hidden"] == fp32["pretrain"] == bf16["pretrain"]
    assert "the grads stage's" in plan_measured.markdown(paper, tmp_path)
