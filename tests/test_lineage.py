"""Config lineage: every artifact records the config values it was made under; a step, the
report and verify refuse artifacts made under other values (one line: the artifact, the key, both
values, the fix), and Snakemake sees a config change in a results folder copied without its
metadata, rerunning exactly what the change touches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from plantbench import lineage, runconfig, stages
from plantbench.cli import main
from plantbench.paths import Paths

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the catalogue


def test_every_rule_of_the_workflow_is_one_stage_row() -> None:
    rules: set[str] = set()
    for f in (ROOT / "workflow" / "rules").glob("*.smk"):
        rules |= {
            line.split()[1].rstrip(":")
            for line in f.read_text().splitlines()
            if line.startswith("rule ")
        }
    assert rules == set(stages.BY_RULE)
    assert set(runconfig.RULE_SECTIONS) == set(stages.BY_RULE)


def test_every_upstream_rule_is_a_stage() -> None:
    for s in stages.STAGES:
        assert set(s.upstream) <= set(stages.BY_RULE), s.rule
        assert s.rule not in stages.upstream_closure(s.rule)


def test_cli_commands_map_to_their_rules() -> None:
    assert stages.rule_of_command("prefix") == "pretrain_prefix"
    assert stages.rule_of_command("grads", queries=True) == "grads_queries"
    assert stages.rule_of_command("grads") == "grads_pool"
    assert stages.rule_of_command("ekfac", checkpoint="step_1") == "ekfac_tracin"
    assert stages.rule_of_command("context-attribute") == "context_attribute"
    assert stages.rule_of_command("plan") is None


# --------------------------------------------------------------------------- the record


def test_record_flattens_the_rules_sections_to_dotted_keys(smoke_cfg: dict[str, Any]) -> None:
    values = lineage.config_values(smoke_cfg, "pretrain")
    assert values["train.lr"] == smoke_cfg["train"]["lr"]
    assert values["model.n_layer"] == smoke_cfg["model"]["n_layer"]
    assert values["replicate"] == 0
    assert "train.threads" not in values  # how it runs, not what it makes
    assert not any(k.startswith(("facts.", "analysis.")) for k in values)
    report = lineage.config_values(smoke_cfg, "report")
    assert "results" not in report and "analysis.bootstrap" in report


def test_problem_names_the_key_and_both_values(smoke_cfg: dict[str, Any]) -> None:
    meta = {lineage.KEY: lineage.record(smoke_cfg, "pretrain")}
    assert lineage.problem(smoke_cfg, meta, "models/A") is None
    other = json.loads(json.dumps(smoke_cfg))
    other["train"]["lr"] = 0.5
    found = lineage.problem(other, meta, "models/A")
    assert found is not None
    lr = smoke_cfg["train"]["lr"]
    assert f"with train.lr = {lr}, but the config at hand has train.lr = 0.5" in found
    other["train"]["threads"] = 7  # execution only: not a lineage key
    other["train"]["lr"] = smoke_cfg["train"]["lr"]
    assert lineage.problem(other, meta, "models/A") is None


def test_an_artifact_without_a_record_is_not_judged(smoke_cfg: dict[str, Any]) -> None:
    assert lineage.problem(smoke_cfg, {"stage": "pretrain"}, "models/A") is None


def test_a_replicates_artifact_records_its_index(smoke_cfg: dict[str, Any]) -> None:
    rep = {**smoke_cfg, "replicates": 2, "replicate": 1}
    meta = {lineage.KEY: lineage.record(rep, "pretrain")}
    found = lineage.problem(smoke_cfg, meta, "replicates/1/models/A")
    assert found is not None and "replicate = 1" in found
    facts = {lineage.KEY: lineage.record(rep, "facts")}  # shared by every replicate
    assert lineage.problem(smoke_cfg, facts, "facts") is None


# --------------------------------------------------------------------------- on a finished run


@pytest.fixture
def copied_run(smoke_run: Path, tmp_path: Path) -> Path:
    """The smoke run copied elsewhere as `cp -a` would (no Snakemake metadata comes along)."""
    dst = tmp_path / "copy" / "results"
    shutil.copytree(smoke_run, dst, symlinks=True)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["results"] = str(dst)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _changed(results: Path, tmp: Path, **train: Any) -> Path:
    cfg = json.loads((results / "config.json").read_text())
    cfg["train"].update(train)
    path = tmp / "changed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_every_artifact_of_a_run_records_its_lineage(smoke_run: Path) -> None:
    cfg = json.loads((smoke_run / "config.json").read_text())
    paths = Paths(cfg)
    n = 0
    for s in stages.STAGES:
        for folder, meta in lineage.artifact_records(paths, s.rule):
            assert meta[lineage.KEY]["rule"] == s.rule, folder
            assert lineage.problem(cfg, meta, str(folder)) is None
            n += 1
    assert n > 30


@pytest.mark.parametrize("step", [["report"], ["analysis"], ["causal"]])
def test_a_step_refuses_inputs_made_under_another_config(
    copied_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], step: list[str]
) -> None:
    changed = _changed(copied_run, tmp_path, lr=0.123)
    before = {p: p.stat().st_mtime_ns for p in copied_run.rglob("*") if p.is_file()}
    assert main([*step, "-c", str(changed)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert f"step '{step[0]}' refuses an input: '" in err[0]
    assert "was made (rule pretrain) with train.lr = " in err[0]
    assert "but the config at hand has train.lr = 0.123" in err[0]
    assert "snakemake --forcerun pretrain" in err[0]
    after = {p: p.stat().st_mtime_ns for p in copied_run.rglob("*") if p.is_file()}
    assert after == before  # nothing written


def test_execution_only_keys_do_not_break_lineage(
    copied_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = _changed(copied_run, tmp_path, threads=2, state_every_steps=7)
    assert main(["analysis", "-c", str(changed)]) == 0, capsys.readouterr().err


def _jobs(text: str) -> set[str]:
    """The rules a `snakemake -n --quiet rules` run lists."""
    names = set(stages.BY_RULE) | {"all"}
    return {w for line in text.splitlines() for w in line.split()[:1] if w in names}


def _dry_jobs(results: Path, *configfiles: str) -> set[str]:
    from smokerun import snakemake

    proc = snakemake(results, "-n", "--quiet", "rules", configfiles=configfiles)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _jobs(proc.stdout + proc.stderr)


def test_a_copied_run_reruns_exactly_what_a_config_change_touches(
    copied_run: Path, plugin_config: Path
) -> None:
    assert _dry_jobs(copied_run, str(plugin_config)) <= {"all"}
    change = copied_run.parent / "change.yaml"
    change.write_text(yaml.safe_dump({"train": {"lr": 0.0123}}))
    jobs = _dry_jobs(copied_run, str(plugin_config), str(change))
    assert {"pretrain_prefix", "pretrain", "causal", "analysis", "report"} <= jobs
    assert not jobs & {"facts", "corpus", "tokenizer", "stream", "pool"}
    change.write_text(yaml.safe_dump({"analysis": {"bootstrap": 37}}))
    jobs = _dry_jobs(copied_run, str(plugin_config), str(change))
    assert {"analysis", "report"} <= jobs
    assert not jobs & {"pretrain", "pretrain_prefix", "causal", "score", "stream"}


def test_verify_fails_artifacts_made_under_another_config(
    copied_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = _changed(copied_run, tmp_path, lr=0.123)
    assert main(["verify", "-c", str(changed)]) != 0
    out = capsys.readouterr().out.splitlines()
    failed = {ln.split()[1] for ln in out if ln.startswith("FAIL") and "(config)" in ln}
    assert {"models/prefix", "models/A", "models/B", "report"} <= failed
    assert not {"facts", "stream/A", "pool/A"} & failed  # made before train.lr matters
    line = next(ln for ln in out if ln.startswith("FAIL  models/A (config)"))
    assert "with train.lr = " in line and "has train.lr = 0.123" in line
    assert main(["verify", "-c", str(copied_run / "config.json")]) == 0
