"""The workflow as a Snakemake user runs it: plain `snakemake` (the default workflow profile, no
activated venv), one-line config errors, a failure summary at the end, use as a module."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
SMOKE = "tests/smoke/config.yaml"
# no venv on PATH: the jobs must find the package through the interpreter, not through PATH
BARE_PATH = os.pathsep.join(
    p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != SNAKEMAKE.parent
)


def _bare_env() -> dict[str, str]:
    drop = ("SNAKEMAKE_PROFILE", "VIRTUAL_ENV", "PLANTBENCH_SOURCE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = BARE_PATH
    return env


def _snakemake(*args: str, cwd: Path = ROOT, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = ["timeout", "-k", "10", str(timeout), str(SNAKEMAKE), *args]
    return subprocess.run(cmd, cwd=cwd, env=_bare_env(), capture_output=True, text=True)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bare_path_has_no_plantbench() -> None:
    assert shutil.which("plantbench", path=BARE_PATH) in (None, "")
    assert shutil.which("snakemake", path=BARE_PATH) != str(SNAKEMAKE)


def test_plain_snakemake_runs_a_target(tmp_path: Path) -> None:
    """No --profile, no --cores, no venv on PATH: the default profile runs it on this machine."""
    results = tmp_path / "r e"
    target = results / "facts" / "meta.json"
    proc = _snakemake("--configfile", SMOKE, "--config", f"results={results}", "--", str(target))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workflow specific profile profiles/default" in proc.stderr
    assert "Provided cores: 2" in proc.stdout + proc.stderr
    assert json.loads(target.read_text())["hash"]
    # the job ran the package through Snakemake's own interpreter (the venv's, not from PATH)
    cmd = re.search(
        r"^Shell command: (\S+) -m plantbench facts -c ", proc.stdout + proc.stderr, re.M
    )
    assert cmd, proc.stderr[-3000:]
    assert Path(cmd.group(1)).parent == SNAKEMAKE.parent


def _stderr_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [("train:\n  steps: -1\n", "train.steps"), ("nonsense: 1\n", "nonsense")],
    ids=["bad-value", "unknown-key"],
)
def test_config_error_is_one_line(tmp_path: Path, yaml_text: str, key: str) -> None:
    results = tmp_path / "results"
    bad = _write(tmp_path / "bad.yaml", f"results: '{results}'\n{yaml_text}")
    proc = _snakemake("--configfile", SMOKE, str(bad))
    assert proc.returncode != 0
    lines = _stderr_lines(proc)
    errors = [line for line in lines if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("plantbench: config error: ") and key in errors[0], errors
    assert lines[-1] == errors[0]
    assert not [line for line in lines if "Traceback" in line or 'File "' in line], proc.stderr
    assert not results.exists()


def test_failed_run_ends_with_rule_log_and_cause(tmp_path: Path) -> None:
    results = tmp_path / "results"
    missing = tmp_path / "no such corpus"
    cfg = _write(
        tmp_path / "fail.yaml",
        json.dumps(
            {
                "results": str(results),
                "corpus": {"sources": [{"kind": "text", "path": str(missing)}]},
            }
        ),
    )
    target = results / "corpus" / "meta.json"
    proc = _snakemake("--configfile", SMOKE, str(cfg), "--", str(target))
    assert proc.returncode != 0
    tail = _stderr_lines(proc)[-8:]
    text = "\n".join(tail)
    assert "plantbench: rule corpus failed" in text, proc.stderr[-3000:]
    assert f"log: {results / 'logs' / 'corpus.log'}" in text
    assert "does not exist" in text and str(missing) in text


@pytest.mark.slow
def test_module_workflow(tmp_path: Path) -> None:
    """tests/module/Snakefile uses the workflow as a module from an unrelated working directory:
    its config, includes, report captions and envs resolve from the workflow's own source."""
    work = tmp_path / "work dir"
    work.mkdir()
    results = tmp_path / "module results"
    snakefile = str(ROOT / "tests" / "module" / "Snakefile")
    common = ("-s", snakefile, "-d", str(work), "--config", f"results={results}")
    causal = results / "causal" / "meta.json"
    proc = _snakemake(*common, "--cores", "2", "--", str(causal), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(causal.read_text())["hash"]
    # the module's onstart (called by the using workflow) wrote the run config the jobs read
    assert list((results / ".plantbench" / "config").glob("*.json"))
    # the rest of the study is planned from there: nothing already made runs again
    dry = _snakemake(*common, "-n", "--", "all", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-3000:]
    planned = dry.stdout + dry.stderr
    for rule in ("report", "analysis", "score", "grads_pool"):
        assert f"rule {rule}:" in planned, rule
    for rule in ("facts", "corpus", "tokenizer", "stream", "pretrain_prefix", "pretrain", "causal"):
        assert f"rule {rule}:" not in planned, rule
    assert not (ROOT / "tests" / "module" / ".snakemake").exists()
