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
