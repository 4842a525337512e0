"""The workflow on a real (single-node) Slurm cluster, through `--profile profiles/slurm`.

Needs root and the cluster of tests/slurm/start.sh: the session fixture starts it when it is
not up (and stops it again afterwards); .ci/run starts it too. Run only these tests with
`make test PYTEST_ARGS='-m slurm'`.

All runs use the smoke config, scaled down a little (tests/test_pretrain.py uses the same
override), with `-s <repo>/Snakefile -d <tmp workdir>`: the Snakefile's relative paths
(include:, the schema, `conda:` envs) resolve against the Snakefile, but `configfile:
"config.yaml"` resolves against the working directory, so every run passes the config files
explicitly. The target is the causal step's output (config, facts, corpus, tokenizer, streams, both twins,
causal ground truth: 9 Slurm jobs); set PLANTBENCH_SLURM_TARGETS="all" to run the whole study.

1. the DAG runs as one Slurm job per rule job, with the resources Snakemake asked for;
2. its artifact hashes equal a `--profile profiles/local` run of the same config;
3. a pretraining job killed by fault injection (PLANTBENCH_FAULT, forwarded to the jobs by
   `sbatch --export=ALL`) fails the run with `--retries 0`; the same command again reruns only
   that job and its downstream, resuming from the saved state, with identical results;
4. a pretraining job that gets Slurm's pre-time-limit signal (`--signal=URG@300` in the
   profile; here sent at once with `scancel --signal=URG`) saves its state, exits 75, and the
   retry (attempt 2, twice the runtime) resumes it to the same final weights.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"
SMOKE = ROOT / "tests" / "smoke" / "config.yaml"
START, STOP = ROOT / "tests" / "slurm" / "start.sh", ROOT / "tests" / "slurm" / "stop.sh"
SLURM_PROFILES = [ROOT / "profiles" / "slurm", ROOT / "profiles" / "slurm-cpu-test"]
LOCAL_PROFILES = [ROOT / "profiles" / "local"]
# the causal step's output (the rule has the replicate wildcard, so its name is not a target)
CAUSAL = "tests/smoke/results/causal/meta.json"
TARGETS = os.environ.get("PLANTBENCH_SLURM_TARGETS", CAUSAL).split()
OVERRIDE = {
    "corpus": {"max_bytes": 400_000},
    "train": {
        "steps": 50,
        "prefix_steps": 10,  # the shared prefix: one job, then the two twins
        "checkpoint_every_steps": 20,
        "state_every_steps": 10,
    },
    # the smoke config's oracle plug-in path is relative to the repository root, not the workdir
    "methods": {"plugins": []},
}
R = "tests/smoke/results"  # tests/smoke/config.yaml's results folder, inside each workdir
ARTIFACTS = ["facts", "corpus", "tokenizer", "stream/A", "stream/B", "models/prefix"]
ARTIFACTS += ["models/A", "models/B"]
ARTIFACTS += ["causal"]
RUN_TIMEOUT = 420  # seconds for one snakemake run (timeout -k 10)
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


# ------------------------------------------------------------------------------ cluster
def _node_state() -> str:
    if not shutil.which("sinfo"):
        return ""
    proc = subprocess.run(
        ["sinfo", "-h", "-N", "-n", "localhost", "-o", "%t"],
        capture_output=True, text=True, timeout=20, check=False,
    )  # fmt: skip
    return proc.stdout.strip() if proc.returncode == 0 else ""


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    """The single-node test cluster: reused when up, else started (and stopped afterwards)."""
    if _node_state() in ("idle", "mix", "alloc"):
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("Slurm cluster not up, and starting it (tests/slurm/start.sh) needs root")
    if not shutil.which("apt-get") and not shutil.which("slurmctld"):
        pytest.skip("Slurm cluster not up, and no apt-get to install slurm-wlm + munge")
    t0 = time.monotonic()
    proc = subprocess.run(
        ["timeout", "-k", "10", "600", "bash", str(START)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0 or _node_state() not in ("idle", "mix", "alloc"):
        pytest.fail(
            f"tests/slurm/start.sh failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    print(f"slurm cluster started in {time.monotonic() - t0:.1f} s")
    try:
        yield
    finally:
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120, check=False)


# ------------------------------------------------------------------------------ helpers
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANTBENCH_FAULT", "SLURM_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # jobs run `plantbench` from PATH
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def _cmd(workdir: Path, profiles: list[Path], *extra: str) -> list[str]:
    return [
        "timeout", "-k", "10", str(RUN_TIMEOUT), str(BIN / "snakemake"), *TARGETS,
        "-s", str(SNAKEFILE), "-d", str(workdir),
        "--configfile", *(str(workdir / f) for f in ("config.yaml", "smoke.yaml", "override.yaml")),
        *(a for p in profiles for a in ("--profile", str(p))),
        *extra,
    ]  # fmt: skip


def _new_workdir(path: Path, configs: Path) -> Path:
    """A fresh working directory with the config snapshot (config.yaml, smoke.yaml, override)."""
    shutil.copytree(configs, path)
    return path


def _copy_workdir(src: Path, dest: Path, drop: list[str]) -> Path:
    """A finished workdir (results and .snakemake metadata, mtimes kept) minus `drop`."""
    shutil.copytree(src, dest, symlinks=True, ignore=shutil.ignore_patterns("slurm_logs", "log"))
    for rel in drop:
        shutil.rmtree(dest / R / rel)
    for f in dest.glob("snakemake*.out"):
        f.unlink()
    return dest


class Run:
    """One snakemake invocation: its output and the Slurm jobs it submitted."""

    def __init__(self, workdir: Path, proc: subprocess.Popen[str], out: Path) -> None:
        self.workdir, self.proc, self.out = workdir, proc, out
        self.rc: int | None = None
        self.t0 = time.monotonic()
        self.wall = 0.0

    def wait(self) -> Run:
        self.rc = self.proc.wait(timeout=RUN_TIMEOUT + 30)
        self.wall = time.monotonic() - self.t0
        return self

    @property
    def log(self) -> str:
        return self.out.read_text()

    def tail(self) -> str:
        return self.log[-6000:]

    def jobs(self) -> list[dict[str, Any]]:
        """Submitted Slurm jobs in order, with what Snakemake asked for and what Slurm shows."""
        asked: dict[str, dict[str, Any]] = {}
        jobs = []
        for block in re.split(r"\n(?=(?:local)?rule \w+:)", self.log):
            m = re.match(r"(?:local)?rule (\w+):", block)
            if not m:
                continue
            jobid = re.search(r"^\s+jobid: (\d+)", block, re.M)
            res = re.search(r"^\s+resources: (.*)$", block, re.M)
            thr = re.search(r"^\s+threads: (\d+)", block, re.M)
            wc = re.search(r"^\s+wildcards: (.*)$", block, re.M)
            if jobid:
                resources = dict(kv.split("=", 1) for kv in res.group(1).split(", ")) if res else {}
                asked[jobid.group(1)] = {
                    "rule": m.group(1),
                    "wildcards": _wildcards(wc.group(1) if wc else ""),
                    "threads": int(thr.group(1)) if thr else 1,
                    "mem_mb": int(resources.get("mem_mb", 0)),
                    "runtime": int(resources.get("runtime", 0)),
                }
            for sm_id, slurm_id in re.findall(
                r"Job (\d+) has been submitted with SLURM jobid (\d+)", block
            ):
                jobs.append({**asked[sm_id], "slurm_id": slurm_id})
        if jobs:
            q = subprocess.run(
                ["squeue", "-h", "-t", "all", "-j", ",".join(j["slurm_id"] for j in jobs),
                 "-o", "%i|%T|%C|%m|%l|%k"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            seen = {}
            for line in q.stdout.splitlines():
                sid, state, cpus, mem, limit, comment = line.split("|")
                seen[sid] = {"state": state, "cpus": int(cpus), "mem": mem, "limit": limit,
                             "comment": comment}  # fmt: skip
            for j in jobs:
                j["slurm"] = seen.get(j["slurm_id"])
        return jobs


def _start(workdir: Path, profiles: list[Path], *extra: str, **env: str) -> Run:
    n = len(list(workdir.glob("snakemake*.out")))
    out = workdir / f"snakemake{n}.out"
    with open(out, "w") as fh:
        proc = subprocess.Popen(
            _cmd(workdir, profiles, *extra), cwd=workdir, env=_env(**env),
            stdout=fh, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    return Run(workdir, proc, out)


def _run(workdir: Path, profiles: list[Path], *extra: str, **env: str) -> Run:
    return _start(workdir, profiles, *extra, **env).wait()


def _hashes(workdir: Path) -> dict[str, str]:
    out = {}
    for name in ARTIFACTS:
        meta = workdir / R / name / "meta.json"
        assert meta.is_file(), f"{meta} missing"
        out[name] = json.loads(meta.read_text())["hash"]
    return out


def _mtimes(workdir: Path) -> dict[str, int]:
    return {
        p.relative_to(workdir).as_posix(): p.stat().st_mtime_ns
        for p in sorted((workdir / R).rglob("*"))
        if p.is_file() and not re.search(r"/(state|logs|benchmarks)/", p.as_posix())
    }


def _minutes(limit: str) -> int:
    days, _, hms = limit.rpartition("-")
    parts = [int(x) for x in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    return (int(days or 0) * 24 + h) * 60 + m + (1 if s else 0)


def _mem_mb(mem: str) -> int:
    num, unit = re.fullmatch(r"(\d+)([KMGT]?)", mem).groups()
    return int(num) * {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "": 1}[unit]


def _state_step(workdir: Path, model: str) -> int:
    import torch

    state = torch.load(workdir / R / "models" / model / "state" / "state.pt", weights_only=False)
    return int(state["step"])


def _wildcards(text: str) -> str:
    """A job's wildcards as Snakemake prints them, without replicate 0's empty ``rep=``."""
    return ", ".join(w for w in text.split(", ") if w and w != "rep=")


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot of the config files, taken once: every run of the module reads the same
    config even if config.yaml is edited meanwhile (the `config` rule's params are the whole
    config, so any change would rerun the entire DAG)."""
    snap = tmp_path_factory.mktemp("configs")
    shutil.copy2(ROOT / "config.yaml", snap / "config.yaml")
    shutil.copy2(SMOKE, snap / "smoke.yaml")
    (snap / "override.yaml").write_text(yaml.safe_dump(OVERRIDE))
    return snap


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None, configs: Path) -> Run:
    """The same config with profiles/local, started in the background (it overlaps the
    Slurm run, which mostly waits on status polls)."""
    return _start(_new_workdir(tmp_path_factory.mktemp("local") / "wd", configs), LOCAL_PROFILES)


@pytest.fixture(scope="module")
def local_hashes(local_run: Run) -> dict[str, str]:
    local_run.wait()
    assert local_run.rc == 0, local_run.tail()
    return _hashes(local_run.workdir)


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory: pytest.TempPathFactory, local_run: Run, configs: Path) -> Run:
    run = _run(_new_workdir(tmp_path_factory.mktemp("slurm") / "wd", configs), SLURM_PROFILES)
    print(f"smoke DAG ({' '.join(TARGETS)}) through Slurm: {run.wall:.1f} s")
    assert run.rc == 0, run.tail()
    return run


# ------------------------------------------------------------------------------ tests
def test_each_rule_runs_as_its_own_slurm_job_with_its_resources(slurm_run: Run) -> None:
    jobs = slurm_run.jobs()
    names = sorted(j["rule"] + (f"[{j['wildcards']}]" if j["wildcards"] else "") for j in jobs)
    expected = ["causal", "corpus", "facts", "pretrain[model=A]", "pretrain[model=B]"]
    expected += ["pretrain_prefix", "stream", "tokenizer"]
    if TARGETS == [CAUSAL]:
        assert names == sorted(expected), names
    assert len({j["slurm_id"] for j in jobs}) == len(jobs), "two rule jobs shared a Slurm job"
    assert "localrule" not in slurm_run.log.replace("localrule all", "")
    for j in jobs:
        s = j["slurm"]
        assert s is not None, f"Slurm job {j['slurm_id']} ({j['rule']}) unknown to squeue"
        assert s["state"] == "COMPLETED", (j, s)
        assert s["comment"].startswith(f"rule_{j['rule']}"), (j, s)
        assert s["cpus"] == j["threads"], (j, s)
        assert _mem_mb(s["mem"]) == j["mem_mb"], (j, s)
        assert _minutes(s["limit"]) == j["runtime"], (j, s)
    by_rule = {j["rule"]: j for j in jobs}
    # a rule with two threads (the shared prefix takes both twins' cores) asks Slurm for two
    prefix = by_rule["pretrain_prefix"]
    assert prefix["threads"] == 2 and prefix["slurm"]["cpus"] == 2
    # rule-declared resources reach Slurm (pretrain: mem 4000 * attempt, runtime 60 * attempt)
    assert (by_rule["pretrain"]["mem_mb"], by_rule["pretrain"]["runtime"]) == (4000, 60)
    assert (by_rule["facts"]["mem_mb"], by_rule["facts"]["runtime"]) == (2000, 10)
    # per-job Slurm logs are kept (slurm-keep-successful-logs in the test profile)
    logs = list((slurm_run.workdir / ".snakemake" / "slurm_logs").rglob("*.log"))
    assert len(logs) >= len(jobs)


def test_slurm_results_equal_local_results(slurm_run: Run, local_hashes: dict[str, str]) -> None:
    assert _hashes(slurm_run.workdir) == local_hashes


def test_failed_job_reruns_alone_and_resumes(
    slurm_run: Run, local_hashes: dict[str, str], tmp_path: Path
) -> None:
    wd = _copy_workdir(slurm_run.workdir, tmp_path / "wd", drop=["models/A", "models/B", "causal"])
    fault = {
        "PLANTBENCH_FAULT": "pretrain:A:25",  # SIGKILL after step 25; state saved at step 20
        "PLANTBENCH_FAULT_ONCE": str(tmp_path / "fault-fired"),
    }
    first = _run(wd, SLURM_PROFILES, "--retries", "0", **fault)
    assert first.rc not in (0, 124, 137), first.tail()
    assert (tmp_path / "fault-fired").exists(), "the fault never fired: env not forwarded?"
    failed = [j for j in first.jobs() if j["slurm"]["state"] != "COMPLETED"]
    assert [(j["rule"], j["wildcards"]) for j in failed] == [("pretrain", "model=A")], failed
    assert not (wd / R / "models" / "A" / "meta.json").exists()
    assert (wd / R / "models" / "B" / "meta.json").exists(), "keep-going: B should finish"
    assert _state_step(wd, "A") == 20
    before = _mtimes(wd)

    second = _run(wd, SLURM_PROFILES, "--retries", "0", **fault)  # the very same command
    assert second.rc == 0, second.tail()
    rerun = sorted((j["rule"], j["wildcards"]) for j in second.jobs())
    assert {("causal", ""), ("pretrain", "model=A")} <= set(rerun), rerun
    upstream = {"facts", "corpus", "tokenizer", "stream"}
    assert not [r for r in rerun if r[0] in upstream or r == ("pretrain", "model=B")], rerun
    after = _mtimes(wd)
    kept = {f: t for f, t in before.items() if "/models/A/" not in f}
    assert {f: after[f] for f in kept} == kept, "a finished job's outputs were rewritten"
    assert "resuming A from step 20" in (wd / R / "logs" / "pretrain_A.log").read_text()
    assert _hashes(wd) == local_hashes


def test_time_limit_signal_resumes_pretraining(
    slurm_run: Run, local_hashes: dict[str, str], tmp_path: Path
) -> None:
    wd = _copy_workdir(slurm_run.workdir, tmp_path / "wd", drop=["models/B", "causal"])
    state = wd / R / "models" / "B" / "state" / "state.pt"
    run = _start(wd, SLURM_PROFILES, "--retries", "1")
    job = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while job is None:
            assert run.proc.poll() is None, run.tail()
            assert time.monotonic() < deadline, "pretrain B never started"
            if state.exists():  # training is past step 10, its handler installed
                q = subprocess.run(
                    ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"],
                    capture_output=True, text=True, timeout=30, check=True,
                )  # fmt: skip
                ids = [i for i, c in (ln.split("|") for ln in q.stdout.splitlines())
                       if re.fullmatch(r"rule_pretrain_wildcards_+B", c)]  # fmt: skip
                if ids:
                    job = ids[0]
            time.sleep(0.1)
        # what Slurm sends ahead of the time limit (profiles/slurm: --signal=URG@300)
        subprocess.run(["scancel", "--signal=URG", job], check=True, timeout=30)
    finally:
        run.wait()
    assert run.rc == 0, run.tail()
    attempts = [j for j in run.jobs() if j["rule"] == "pretrain"]
    assert [j["wildcards"] for j in attempts] == ["model=B", "model=B"], attempts
    assert [j["slurm"]["state"] for j in attempts] == ["FAILED", "COMPLETED"], attempts
    assert attempts[0]["slurm_id"] == job
    # the retry is attempt 2: runtime and memory scale with `attempt`
    assert _minutes(attempts[1]["slurm"]["limit"]) == 2 * _minutes(attempts[0]["slurm"]["limit"])
    assert re.search(
        r"resuming B from step [1-3]\d\b", (wd / R / "logs" / "pretrain_B.log").read_text()
    )
    assert _hashes(wd) == local_hashes
