"""Run the workflow on the smoke configuration through Snakemake with the local profile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def snakemake(
    results: Path,
    *extra: str,
    configfiles: tuple[str, ...] = (),
    base: tuple[str, ...] = ("tests/smoke/config.yaml",),
    timeout: int = 1200,
) -> subprocess.CompletedProcess[str]:
    """Snakemake with the local profile on ``base`` and then ``configfiles`` (all after one
    ``--configfile``), results in ``results``, killed after ``timeout`` seconds."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [
        "timeout",
        "-k",
        "10",
        str(timeout),
        str(Path(sys.executable).parent / "snakemake"),
        "--profile",
        "profiles/local",
        "--configfile",
        *base,
        *configfiles,
        "--config",
        f"results={results}",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)


def planned_jobs(results: Path, *configfiles: str) -> dict[str, int]:
    """Rule -> job count of a dry run of ``config.yaml`` with ``configfiles`` over it."""
    proc = snakemake(
        results, "-n", "--quiet", "rules", configfiles=configfiles, base=("config.yaml",)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = (line.split() for line in proc.stdout.splitlines())
    return {p[0]: int(p[1]) for p in rows if len(p) == 2 and p[1].isdigit()}
