"""The whole DAG on the smoke configuration, through Snakemake with the local profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plantbench import io, queries, tokenizer
from plantbench.causal import FACT_COLUMNS
from plantbench.modeling import load_model
from plantbench.paths import Paths
from plantbench.pretrain import final_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def snakemake(results: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [
        "timeout",
        "-k",
        "10",
        "1200",
        str(Path(sys.executable).parent / "snakemake"),
        "--profile",
        "profiles/local",
        "--configfile",
        "tests/smoke/config.yaml",
        "--config",
        f"results={results}",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    results = tmp_path_factory.mktemp("smoke_dag") / "results"
    proc = snakemake(results)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return results


def test_dag_produces_report_and_answer_key(smoke_run):
    report = (smoke_run / "report" / "report.md").read_text()
    assert "Which facts the twins learned" in report
    facts = io.read_parquet(smoke_run / "causal" / "facts.parquet")
    assert list(facts.columns[: len(FACT_COLUMNS)]) == FACT_COLUMNS
    assert np.allclose(facts["effect"], facts["logp_reader"] - facts["logp_other"])
    assert (facts["learned"] == ((facts["effect"] > 0) & (facts["rank"] == 1))).all()
    assert np.allclose(facts["difficulty"], -facts["logp_other"])
    for rule in ("facts", "stream", "pretrain_A", "pretrain_B", "causal", "report"):
        assert (smoke_run / "benchmarks" / f"{rule}.tsv").is_file()


def test_causal_logprob_matches_an_independent_computation(smoke_run):
    """Recompute one fact's answer log-probability token by token, without batching."""
    import torch

    p = Paths(str(smoke_run))
    facts = io.read_parquet(smoke_run / "causal" / "facts.parquet")
    qs = io.read_parquet(smoke_run / "facts" / "queries.parquet")
    row = facts.iloc[0]
    tok = tokenizer.load(p.tokenizer)
    reader = load_model(final_checkpoint(p, row["reader"]))
    total = 0.0
    for q in qs[qs["fact_id"] == row["fact_id"]].itertuples():
        ids, n_ans = queries.encode(tok, [q.prompt], [q.answer])[0]
        with torch.no_grad():
            logits = reader(input_ids=torch.tensor([ids])).logits[0].double()
        logp = torch.log_softmax(logits, dim=-1)
        total += sum(float(logp[t - 1, ids[t]]) for t in range(len(ids) - n_ans, len(ids)))
    assert total / 2 == pytest.approx(row["logp_reader"], rel=1e-4, abs=1e-4)


def test_rerun_is_a_no_op(smoke_run):
    proc = snakemake(smoke_run, "-n")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr
