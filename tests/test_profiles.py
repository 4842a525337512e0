"""The Slurm profiles name real rules, and GPU rules ask for GPUs (paper scale)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
import yte

ROOT = Path(__file__).resolve().parents[1]
GPU_RULES = {"pretrain", "grads_pool", "grads_queries", "hidden", "embed"}


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
