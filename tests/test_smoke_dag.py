"""The whole DAG on the smoke configuration, through Snakemake with the local profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plantbench import artifacts, io
from plantbench.data import tokenizer
from plantbench.model import queries
from plantbench.model.modeling import load_model
from plantbench.paths import Paths
from plantbench.truth.causal import FACT_COLUMNS
from smokerun import snakemake

ROOT = Path(__file__).resolve().parents[1]


def test_dag_produces_report_and_answer_key(smoke_run):
    report = (smoke_run / "report" / "report.md").read_text()
    assert "Which facts the twins learned" in report
    facts = io.read_parquet(smoke_run / "causal" / "facts.parquet")
    assert list(facts.columns[: len(FACT_COLUMNS)]) == FACT_COLUMNS
    assert np.allclose(facts["effect"], facts["logp_reader"] - facts["logp_other"])
    assert (facts["learned"] == ((facts["effect"] > 0) & (facts["rank"] == 1))).all()
    assert np.allclose(facts["difficulty"], -facts["logp_other"])
    for rule in (
        "facts",
        "stream",
        "pretrain_prefix",
        "pretrain_A",
        "pretrain_B",
        "causal",
        "report",
    ):
        assert (smoke_run / "benchmarks" / f"{rule}.tsv").is_file()


def test_causal_logprob_matches_an_independent_computation(smoke_run):
    """Recompute one fact's answer log-probability token by token, without batching."""
    import torch

    p = Paths(str(smoke_run))
    facts = io.read_parquet(smoke_run / "causal" / "facts.parquet")
    qs = io.read_parquet(smoke_run / "facts" / "queries.parquet")
    row = facts.iloc[0]
    tok = tokenizer.load(p.tokenizer)
    reader = load_model(artifacts.final_checkpoint_path(p, row["reader"]))
    total = 0.0
    for q in qs[qs["fact_id"] == row["fact_id"]].itertuples():
        ids, n_ans = queries.encode(tok, [q.prompt], [q.answer])[0]
        with torch.no_grad():
            logits = reader(input_ids=torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        total += sum(float(logp[t - 1, ids[t]]) for t in range(len(ids) - n_ans, len(ids)))
    assert total / 2 == pytest.approx(row["logp_reader"], rel=1e-4, abs=1e-4)


def test_every_method_is_graded_and_the_oracle_plugin_is_perfect(smoke_run):
    import pandas as pd

    retrieval = pd.read_csv(smoke_run / "analysis" / "retrieval.csv")
    methods = set(retrieval["method"])
    cfg = json.loads((smoke_run / "config.json").read_text())
    expected = {*cfg["methods"]["enabled"], "oracle"}
    assert len(expected) == 10  # the nine built-in methods and the plug-in
    assert expected <= methods
    oracle = retrieval[(retrieval["method"] == "oracle") & retrieval["model"].isin(["A", "B"])]
    assert np.allclose(oracle["ap"], 1.0)
    bm25 = retrieval[(retrieval["method"] == "bm25") & (retrieval["model"] == "all")]
    assert float(bm25["ap"].iloc[0]) > 0.9  # invented names are unique to their documents
    corr = pd.read_csv(smoke_run / "analysis" / "correlations.csv")
    assert expected <= set(corr["method"])
    report = (smoke_run / "report" / "report.md").read_text()
    assert "oracle" in report


def test_changing_only_the_analysis_reruns_only_analysis_and_report(
    smoke_run, plugin_config, tmp_path
):
    override = tmp_path / "analysis.yaml"
    override.write_text("analysis:\n  bootstrap: 50\n")
    proc = snakemake(smoke_run, "-n", configfiles=(str(plugin_config), str(override)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "analysis" in out and "report" in out
    for rule in ("pretrain", "stream", "grads_pool", "score"):
        assert f"rule {rule}:" not in out, out[-3000:]


def test_rerun_is_a_no_op(smoke_run, plugin_config):
    proc = snakemake(smoke_run, "-n", configfiles=(str(plugin_config),))
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def _copy_without(src: Path, dst: Path, drop: tuple[str, ...]) -> None:
    import shutil

    shutil.copytree(src, dst)
    for name in drop:
        shutil.rmtree(dst / name, ignore_errors=True)


def test_killed_during_feature_extraction_resumes_to_identical_scores(smoke_run, tmp_path):
    """SIGKILL the whole Snakemake run (its process group) once some gradient shards are
    finished; rerun: finished shards are kept, the rest recomputed, the scores identical. The
    target is twin A's TracIn scores: every gradient shard of A, at both checkpoints (the other
    features and methods add time, not cases)."""
    import json
    import signal
    import time

    results = tmp_path / "results"
    _copy_without(smoke_run, results, ("features", "scores", "analysis", "report"))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # 96-window shards (a multiple of features.batch_windows, so batches are the same windows
    # as in the one-shard run and the features are bit-identical)
    override = tmp_path / "shards.yaml"
    override.write_text("features:\n  shard_windows: 96\n")
    target = "scores/tracin_dot/A/meta.json"
    args = [
        str(Path(sys.executable).parent / "snakemake"),
        str(results / target),
        "--profile",
        "profiles/local",
        "--cores",
        "1",
        "--configfile",
        "tests/smoke/config.yaml",
        str(override),
        "--config",
        f"results={results}",
    ]
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    done: list[Path] = []
    while time.time() < deadline and proc.poll() is None:
        done = sorted(results.glob("features/*/grads/*/pool/shard_*/shard.json"))
        if len(done) >= 2:
            break
        time.sleep(0.2)
    # give Snakemake a moment to record those jobs as finished (a job whose output exists but
    # whose completion Snakemake never saw is incomplete, and is rightly rerun)
    time.sleep(4)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {p: p.stat().st_mtime_ns for p in done}
    assert not (results / target).exists()

    subprocess.run([*args, "--unlock"], cwd=ROOT, env=env, capture_output=True, check=True)
    i = args.index("--cores")
    again = args[:i] + args[i + 2 :]  # the rerun may use both cores
    rerun = subprocess.run(again, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for p, mtime in kept.items():
        assert p.stat().st_mtime_ns == mtime, f"{p} was recomputed"
    assert sorted(
        p.relative_to(results).as_posix() for p in results.glob("scores/*/*/meta.json")
    ) == [target]
    assert (
        json.loads((results / target).read_text())["hash"]
        == json.loads((smoke_run / target).read_text())["hash"]
    )


def test_ekfac_takes_its_factors_from_the_final_checkpoints_gradient_pass(smoke_run):
    """The final checkpoint's grads_pool shards carry EK-FAC's factor sums (and only they: no
    EK-FAC fit follows at the other TracIn checkpoint by default); the ekfac job used them and
    records those shards as an input."""
    import json

    from plantbench.attribution.gradients.store import GradientStore

    for model in ("A", "B"):
        meta = json.loads((smoke_run / f"features/{model}/ekfac/meta.json").read_text())
        final = meta["info"]["checkpoint"]
        assert meta["info"]["factors_from"] == "the grads_pool shards' pass"
        for shard in sorted(smoke_run.glob(f"features/{model}/grads/*/pool/shard_*")):
            record = json.loads((shard / "shard.json").read_text()).get("factors")
            assert (record is not None) == (shard.parent.parent.name == final), shard
        shards = sorted(smoke_run.glob(f"features/{model}/grads/{final}/pool/shard_*"))
        assert meta["inputs"]["factors"] == GradientStore.open(shards).hash


def test_flipped_byte_in_a_checkpoint_is_refused(smoke_run, tmp_path):
    import json

    from plantbench.cli import main
    from plantbench.ops import verify

    results = tmp_path / "results"
    _copy_without(smoke_run, results, ("features", "scores", "analysis", "report"))
    weights = sorted(results.glob("models/A/checkpoints/step_*/model.safetensors"))[-1]
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x10
    weights.write_bytes(bytes(data))
    cfg = json.loads((smoke_run / "config.json").read_text())
    cfg["results"] = str(results)
    checks = verify.run(cfg, Paths(str(results)))
    failed = [c for c in checks if c.status == "FAIL"]
    assert failed and "model.safetensors" in failed[0].detail
    cfg_path = tmp_path / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    assert main(["causal", "-c", str(cfg_path)]) == 2  # the next reader refuses too


# --------------------------------------------------------------------------------------------
# Nothing silently wrong: what a job reads is what it was scheduled with
# --------------------------------------------------------------------------------------------


def planned_jobs(out: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run: rule -> number of jobs."""
    lines = out.splitlines()
    if "Job stats:" not in lines:
        return {}
    rows: dict[str, int] = {}
    for line in lines[lines.index("Job stats:") + 3 :]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        rows[parts[0]] = int(parts[1])
    rows.pop("total", None)
    return rows


def artifact_hashes(results: Path) -> dict[str, str]:
    return {
        meta.parent.relative_to(results).as_posix(): json.loads(meta.read_text())["hash"]
        for meta in sorted(results.rglob("meta.json"))
        if "/." not in f"/{meta.parent.relative_to(results).as_posix()}"
    }


def test_dry_run_lint_and_a_refused_call_write_nothing(tmp_path, plugin_config):
    results = tmp_path / "run"
    for extra in (("-n",), ("--lint",)):
        proc = snakemake(results, *extra, configfiles=(str(plugin_config),))
        assert proc.returncode == 0, (extra, proc.stderr[-2000:])
        assert not results.exists(), f"{extra} wrote {sorted(results.rglob('*'))}"
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods:\n  enabled: [no_such_method]\n")
    proc = snakemake(results, "-n", configfiles=(str(bad),))
    assert proc.returncode != 0
    assert "unknown method 'no_such_method'" in proc.stdout + proc.stderr
    assert not results.exists()


def test_dry_run_and_report_on_a_finished_run_leave_its_config_alone(
    smoke_run, plugin_config, tmp_path
):
    before = {p: p.read_bytes() for p in sorted(smoke_run.glob("**/config*.json"))}
    before |= {p: p.read_bytes() for p in sorted((smoke_run / ".plantbench").rglob("*.json"))}
    override = tmp_path / "other.yaml"
    override.write_text("analysis:\n  bootstrap: 50\n")
    proc = snakemake(smoke_run, "-n", configfiles=(str(plugin_config), str(override)))
    assert proc.returncode == 0
    report = tmp_path / "report.html"
    proc = snakemake(
        smoke_run, "--report", str(report), configfiles=(str(plugin_config), str(override))
    )
    assert proc.returncode == 0 and report.is_file(), proc.stderr[-2000:]
    after = {p: p.read_bytes() for p in sorted(smoke_run.glob("**/config*.json"))}
    after |= {p: p.read_bytes() for p in sorted((smoke_run / ".plantbench").rglob("*.json"))}
    assert after == before


def test_changing_the_learning_rate_retrains_without_rebuilding_the_stream(
    smoke_run, plugin_config, tmp_path
):
    override = tmp_path / "lr.yaml"
    override.write_text("train:\n  lr: 2.0e-3\n")
    proc = snakemake(smoke_run, "-n", configfiles=(str(plugin_config), str(override)))
    jobs = planned_jobs(proc.stdout)
    assert proc.returncode == 0 and jobs.get("pretrain") == 2, proc.stdout[-3000:]
    assert jobs.get("pretrain_prefix") == 1  # the shared prefix is trained with the same lr
    for rule in ("facts", "corpus", "tokenizer", "stream", "pool", "embed"):
        assert rule not in jobs, jobs


def test_editing_a_plugin_reruns_exactly_its_two_score_jobs(smoke_run, plugin_config):
    plugin = Path(json.loads(plugin_config.read_text())["methods"]["plugins"][0]["path"])
    text, stat = plugin.read_text(), plugin.stat()
    try:
        plugin.write_text(text + "\n# an edit that changes the code's hash\n")
        os.utime(plugin, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # params alone must see it
        proc = snakemake(smoke_run, "-n", configfiles=(str(plugin_config),))
        jobs = planned_jobs(proc.stdout)
        assert jobs == {"score": 2, "analysis": 1, "report": 1, "all": 1}, proc.stdout[-3000:]
        assert "score_oracle_A" in proc.stdout and "score_oracle_B" in proc.stdout
        # a reader handed the stale scores refuses them
        from plantbench.cli import main

        run_cfg = sorted((smoke_run / ".plantbench" / "config").glob("*.json"))[0]
        assert main(["analysis", "-c", str(run_cfg)]) == 2
    finally:
        plugin.write_text(text)
        os.utime(plugin, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_adding_a_plugin_reruns_no_other_method(smoke_run, plugin_config, tmp_path):
    cfg = json.loads(plugin_config.read_text())
    second = tmp_path / "second_method.py"
    second.write_text(Path(cfg["methods"]["plugins"][0]["path"]).read_text())
    cfg["methods"]["plugins"].append({"name": "second", "path": str(second)})
    two = tmp_path / "two_plugins.yaml"
    two.write_text(json.dumps(cfg))
    proc = snakemake(smoke_run, "-n", configfiles=(str(two),))
    jobs = planned_jobs(proc.stdout)
    assert jobs == {"score": 2, "analysis": 1, "report": 1, "all": 1}, proc.stdout[-3000:]
    assert "score_second_A" in proc.stdout and "score_oracle_A" not in proc.stdout


def test_a_refused_second_invocation_cannot_change_the_running_one(
    smoke_run, plugin_config, tmp_path
):
    """Start a run; while it trains, start another on the same folder with another learning
    rate (the lock refuses it); the first run must finish exactly as an undisturbed one. The
    target is the causal step (data steps, both twins, their causal effects): the second run's
    setting would change them all, and the later stages add time, not cases."""
    import time

    results = tmp_path / "rés ults"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    base = [
        str(Path(sys.executable).parent / "snakemake"),
        "--profile",
        "profiles/local",
        "--configfile",
        "tests/smoke/config.yaml",
        str(plugin_config),
    ]
    targets = [str(results / "causal" / "meta.json")]  # its inputs: the data steps, both twins
    first = subprocess.Popen(
        [base[0], *targets, *base[1:], "--config", f"results={results}"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 600
        while time.time() < deadline and first.poll() is None:
            if (results / "logs" / "pretrain_A.log").is_file():
                break
            time.sleep(0.2)
        assert first.poll() is None, "the first run ended before the second could start"
        other = tmp_path / "other.yaml"
        other.write_text("train:\n  lr: 1.0e-3\n")
        second = subprocess.run(
            [base[0], *targets, *base[1:], str(other), "--config", f"results={results}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert second.returncode != 0
        assert "cannot be locked" in second.stdout + second.stderr
        assert first.wait(timeout=1200) == 0
    finally:
        if first.poll() is None:
            os.killpg(first.pid, 9)
    made, undisturbed = artifact_hashes(results), artifact_hashes(smoke_run)
    assert set(made) == {
        "facts",
        "corpus",
        "tokenizer",
        "stream/A",
        "stream/B",
        "models/prefix",
        "models/A",
        "models/B",
        "causal",
    }
    assert made == {k: undisturbed[k] for k in made}
    lr = json.loads((results / "config.json").read_text())["train"]["lr"]
    assert lr == json.loads((smoke_run / "config.json").read_text())["train"]["lr"] != 1.0e-3


def test_a_second_replicate_adds_its_own_jobs_and_reuses_replicate_zero(
    smoke_run, plugin_config, tmp_path
):
    """replicates: 2 on a finished run: one more set of per-replicate jobs (each writing under
    replicates/1/), the summary and the report; nothing of replicate 0 reruns."""
    override = tmp_path / "two.yaml"
    override.write_text("replicates: 2\n")
    proc = snakemake(smoke_run, "-n", "-p", configfiles=(str(plugin_config), str(override)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = planned_jobs(proc.stdout)
    assert jobs.get("pretrain") == 2 and jobs.get("stream") == 1 and jobs.get("causal") == 1
    assert jobs.get("pretrain_prefix") == 1
    assert jobs.get("replicates") == 1 and jobs.get("report") == 1
    for rule in ("facts", "corpus", "tokenizer"):
        assert rule not in jobs, jobs
    commands = [line for line in proc.stdout.splitlines() if " -m plantbench pretrain " in line]
    assert len(commands) == 2 and all("--replicate 1 " in c for c in commands), commands
    assert all("replicates/1/logs/" in c for c in commands)
