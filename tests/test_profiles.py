"""The Slurm profiles name real rules, and GPU rules ask for GPUs (paper scale)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pytest
import yaml
import yte

ROOT = Path(__file__).resolve().parents[1]
GPU_RULES = {
    "pretrain_prefix",
    "pretrain",
    "grads_pool",
    "grads_queries",
    "hidden",
    "embed",
    "ekfac",
    "fidelity",
    "context_attribute",
    "grounding_respond",
    "membership_detect",
}


def _rule_names() -> set[str]:
    names = set()
    for f in [ROOT / "Snakefile", *sorted((ROOT / "workflow" / "rules").glob("*.smk"))]:
        names |= set(re.findall(r"^(?:rule|checkpoint)\s+(\w+)\s*:", f.read_text(), re.M))
    return names


def _profile(name: str) -> dict:
    text = (ROOT / "profiles" / name / "config.yaml").read_text()
    return yte.process_yaml(text) if "__use_yte__" in text else yaml.safe_load(text)


def test_set_resources_name_real_rules() -> None:
    rules = _rule_names()
    for name in ("slurm", "slurm-cpu-test"):
        prof = _profile(name) or yaml.safe_load(
            (ROOT / "profiles" / name / "config.yaml").read_text()
        )
        unknown = sorted(set(prof.get("set-resources", {})) - rules)
        assert not unknown, f"profiles/{name} set-resources names no rule: {unknown}"


def test_gpu_rules_ask_for_one_gpu_each() -> None:
    prof = _profile("slurm")
    sr = prof["set-resources"]
    assert GPU_RULES <= set(sr), sorted(GPU_RULES - set(sr))
    for rule in GPU_RULES:
        assert int(sr[rule]["gpu"]) >= 1, rule
        assert "cpus_per_task" not in prof["default-resources"]
    # pretrain runs one job per twin, each with its own GPU: the pair runs concurrently
    assert int(prof["jobs"]) >= 2


def test_cpu_test_profile_asks_for_no_gpu() -> None:
    prof = yaml.safe_load((ROOT / "profiles" / "slurm-cpu-test" / "config.yaml").read_text())
    for rule, res in prof.get("set-resources", {}).items():
        assert not {"gpu", "gpu_model", "cpus_per_gpu"} & set(res), rule


# --- the default workflow profile (profiles/default, next to the Snakefile) ---------------------
# Snakemake always adds it after every --profile, and it wins on each key it sets: it must match
# profiles/local on a plain run and set nothing when a profile or another executor is named.


def _effective(monkeypatch: pytest.MonkeyPatch, cwd: Path, *argv: str) -> argparse.Namespace:
    """The arguments Snakemake's own command-line parsing yields for ``snakemake *argv``."""
    from snakemake.cli import parse_args

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("SNAKEMAKE_PROFILE", raising=False)
    monkeypatch.setattr(sys, "argv", ["snakemake", *argv])  # what the profile's YTE reads
    return parse_args(list(argv))[1]


def _resources(res: object) -> dict[str, object]:
    """name -> raw value (a number, a string, or the expression a profile gave)."""
    return {name: r.raw for name, r in dict(res or {}).items()}


def _settings(args: argparse.Namespace) -> dict[str, object]:
    keys = ("cores", "jobs", "keep_going", "latency_wait", "rerun_incomplete", "printshellcmds")
    out: dict[str, object] = {k: getattr(args, k) for k in keys}
    out["resources"] = _resources(args.resources)
    out["default_resources"] = _resources(args.default_resources)
    out["show_failed_logs"] = args.show_failed_logs
    return out


def test_plain_snakemake_is_the_local_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _settings(_effective(monkeypatch, ROOT))
    local = _settings(_effective(monkeypatch, ROOT, "--profile", "profiles/local"))
    assert plain == local
    assert plain["cores"] == 2 and plain["resources"] == {"mem_mb": 20000}


@pytest.mark.parametrize(
    "argv",
    [
        ("--profile", "profiles/slurm"),
        ("--profile=profiles/slurm", "-n"),
        ("--prof", "profiles/slurm"),  # argparse accepts the abbreviation; so does the check
    ],
    ids=["profile", "profile=", "abbreviated"],
)
def test_default_profile_leaves_slurm_alone(
    monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    args = _effective(monkeypatch, ROOT, *argv)
    assert args.executor == "slurm" and args.cores is None and int(args.jobs) == 100
    assert args.keep_going is True and args.latency_wait == 60
    assert "mem_mb" not in _resources(args.resources)  # no global 20 GB cap
    assert "slurm_partition" in _resources(args.default_resources)


def test_default_profile_leaves_the_cpu_test_cluster_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As tests/test_slurm.py calls it: -s <repo>/Snakefile from another working directory."""
    profiles = ("--profile", str(ROOT / "profiles" / "slurm"))
    profiles += ("--profile", str(ROOT / "profiles" / "slurm-cpu-test"))
    args = _effective(monkeypatch, tmp_path, "-s", str(ROOT / "Snakefile"), *profiles)
    assert args.cores is None and args.latency_wait == 5 and args.keep_going is True
    defaults = _resources(args.default_resources)
    assert defaults["slurm_partition"] == "debug" and defaults["mem_mb"] == 1000
    assert not _resources(args.resources)


def test_other_executor_gets_no_local_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _effective(monkeypatch, ROOT, "--executor", "slurm", "--jobs", "3")
    assert args.cores is None and not _resources(args.resources)
    assert not _resources(args.default_resources)
