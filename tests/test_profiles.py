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
    config = ("--configfile", str(ROOT / "config.yaml"))  # none in the working directory
    args = _effective(monkeypatch, tmp_path, "-s", str(ROOT / "Snakefile"), *config, *profiles)
    assert args.cores is None and args.latency_wait == 5 and args.keep_going is True
    defaults = _resources(args.default_resources)
    assert defaults["slurm_partition"] == "debug" and defaults["mem_mb"] == 1000
    assert not _resources(args.resources)


def test_other_executor_gets_no_local_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _effective(monkeypatch, ROOT, "--executor", "slurm", "--jobs", "3")
    assert args.cores is None and not _resources(args.resources)
    assert not _resources(args.default_resources)


# --- the Slurm profile's SITE SPECIFICS block: each value checked in one line ------------------

SLURM_LABEL = "plantbench: profiles/slurm/config.yaml: "


def _slurm_profile_with(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of profiles/slurm whose SITE line ``old`` is edited to ``new``."""
    text = (ROOT / "profiles" / "slurm" / "config.yaml").read_text()
    assert text.count(old) == 1, old
    folder = tmp_path / "slurm"
    folder.mkdir()
    (folder / "config.yaml").write_text(text.replace(old, new))
    return folder


def test_the_site_values_reach_the_profile() -> None:
    sr = _profile("slurm")["set-resources"]
    assert sr["pretrain"]["slurm_partition"] == "gpu" and sr["pretrain"]["cpus_per_gpu"] == 8
    assert "slurm_account" not in sr["pretrain"]  # ACCOUNT = None
    assert _profile("slurm")["default-resources"]["slurm_partition"] == "compute"


def test_an_unquoted_site_value_is_one_line_before_snakemake_parses(tmp_path: Path) -> None:
    """Snakemake would print its whole usage text and a NameError."""
    import subprocess

    folder = _slurm_profile_with(tmp_path, 'GPU_PARTITION = "gpu"', "GPU_PARTITION = gpu")
    snakemake = Path(sys.executable).parent / "snakemake"
    cmd = [str(snakemake), "--profile", str(folder), "-n"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1] == (
        f"{SLURM_LABEL}SITE value GPU_PARTITION = gpu is not a quoted string; write "
        'GPU_PARTITION = "gpu"'
    )
    assert "usage:" not in proc.stderr and "NameError" not in proc.stderr
    assert "Traceback" not in proc.stderr and not proc.stdout.strip()


SITE_CASES = [
    ('CPU_PARTITION = "compute"', "CPU_PARTITION = compute",
     'SITE value CPU_PARTITION = compute is not a quoted string; write CPU_PARTITION = "compute"'),
    ("ACCOUNT = None", "ACCOUNT = plantbench",
     'SITE value ACCOUNT = plantbench is not a quoted string or None; write ACCOUNT = "plantbench"'),
    ("GPU_CONSTRAINT = None", "GPU_CONSTRAINT = a100|h100",
     "SITE value GPU_CONSTRAINT = a100|h100 is not a quoted string or None; write "
     'GPU_CONSTRAINT = "a100|h100"'),
    ("CPUS_PER_GPU = 8", 'CPUS_PER_GPU = "8"',
     'SITE value CPUS_PER_GPU = "8" is not a whole number >= 1; write CPUS_PER_GPU = 8'),
    ("CPUS_PER_GPU = 8", "CPUS_PER_GPU = eight",
     "SITE value CPUS_PER_GPU = eight is not a whole number >= 1; write CPUS_PER_GPU = 8"),
    ('GPU_PARTITION = "gpu"', 'GPU_PARTITION = "gpu',
     'SITE line `GPU_PARTITION = "gpu # sbatch -p for GPU rules` is not NAME = value (Python); '
     'write e.g. GPU_PARTITION = "gpu"'),
    ("GPU_MODEL = None", "GPU_MODL = None",
     "SITE line `GPU_MODL = None` does not set one of CPU_PARTITION, GPU_PARTITION, ACCOUNT, "
     "GPU_MODEL, GPU_CONSTRAINT, CPUS_PER_GPU; write NAME = value"),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "expect"), SITE_CASES, ids=[c[1] for c in SITE_CASES])
def test_a_wrong_site_value_is_one_line_saying_how_to_write_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expect: str
) -> None:
    """As Snakemake evaluates the profile (YTE), one line on stderr and exit 1."""
    folder = _slurm_profile_with(tmp_path, old, new)
    with pytest.raises(SystemExit) as stop:
        yte.process_yaml((folder / "config.yaml").read_text())
    assert stop.value.code == 1
    assert capsys.readouterr().err.splitlines() == [SLURM_LABEL + expect]
