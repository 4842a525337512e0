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


def test_a_step_over_every_replicate_reads_each_under_its_own_index(
    smoke_cfg: dict[str, Any],
) -> None:
    """A step over every replicate (the summary, the report) accepts replicate r's artifact in
    replicate r's folder and refuses it anywhere else (the default study's replicates run
    stopped here: the summary judged replicate 1's analysis by replicate 0's index)."""
    cfg = {**smoke_cfg, "replicates": 3}
    results = Path(cfg["results"])
    one = {lineage.KEY: lineage.record({**cfg, "replicate": 1}, "causal")}
    lineage.begin(cfg, "replicates")
    try:
        lineage.check_read(one, results / "replicates" / "1" / "causal")
        for elsewhere in (results / "causal", results / "replicates" / "2" / "causal"):
            with pytest.raises(lineage.LineageError, match="replicate = 1"):
                lineage.check_read(one, elsewhere)
        lineage.begin({**cfg, "replicate": 2}, "analysis")  # a per-replicate step: its own index
        with pytest.raises(lineage.LineageError, match="replicate = 1"):
            lineage.check_read(one, results / "replicates" / "1" / "causal")
    finally:
        lineage.end()
    assert lineage.replicate_of(cfg, results / "replicates" / "2" / "models" / "A") == 2
    assert lineage.replicate_of(cfg, results / "models" / "A") == 0


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
    """The jobs a run with ``configfiles`` would do: a call that runs parses the workflow
    first (it writes the rules' sections files; its target, the facts, is up to date), then a
    dry run lists the jobs (a dry run itself writes nothing)."""
    from smokerun import snakemake

    facts = str(results / "facts" / "meta.json")
    proc = snakemake(results, "--", facts, configfiles=configfiles)
    assert proc.returncode == 0, proc.stderr[-3000:]
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


# --------------------------------------------------------------------------- one catalogue

SAMPLE = {
    "model": "B",
    "checkpoint": "step_0000080",
    "shard": "0003",
    "method": "grad_cos",
    "draw": "007",
}


def _filled(pattern: str) -> str:
    return pattern.format(**SAMPLE)


def _rules_of_folders(root: Path) -> dict[str, list[str]]:
    """Per folder of a replicate-0 run, the rows whose folders (glob patterns, as the lineage
    check reads them) hold it."""
    out: dict[str, list[str]] = {}
    for s in stages.STAGES:
        for f in {f for g in s.folders for f in root.glob(g)}:
            out.setdefault(f.relative_to(root).as_posix(), []).append(s.rule)
    return out


def _artifact_folders(root: Path) -> list[str]:
    from plantbench.ops import verify

    shards = [p.parent.relative_to(root).as_posix() for p in root.rglob("shard.json")]
    return [*verify.artifacts(root), *shards]


def test_verify_steps_derive_from_the_catalogue(tmp_path: Path) -> None:
    """Every row's folders, with its wildcards filled in, are made by that row's step: its rule,
    CLI command, meta stage and arguments (a valid CLI call); under ``replicates/<r>/`` too."""
    import shlex

    from plantbench.cli import build_parser
    from plantbench.ops import verify
    from plantbench.paths import MODELS

    assert stages.TWINS == MODELS
    paths = Paths(tmp_path / "results")
    for s in stages.STAGES:
        for place in s.places:
            name = _filled(place)
            step = verify.step_of(name)
            assert step is not None and step.rule == s.rule, name
            assert (step.stage, step.cli) == (s.meta_stage, s.command)
            argv = shlex.split(step.command(paths.config))
            args = build_parser().parse_args(argv[1:])
            number = {w: stages.WILDCARDS[w].number for w in s.wildcards}
            want = {w: int(SAMPLE[w]) if n else SAMPLE[w] for w, n in number.items()}
            assert {w: getattr(args, w) for w in want} == want, argv
            assert (
                stages.rule_of_command(
                    args.command,
                    queries=getattr(args, "queries", False),
                    checkpoint=getattr(args, "checkpoint", None),
                )
                == s.rule
            )
            again = verify.step_of(f"replicates/2/{name}")
            assert again is not None and again.args == f" --replicate 2{step.args}"
    assert verify.step_of("features/shared/hidden") is None
    assert verify.step_of("scores/bm25") is None


def test_every_artifact_folder_of_a_run_belongs_to_one_row(smoke_run: Path) -> None:
    """``verify.step_of`` gives, for every artifact folder of a finished run (and every
    gradient shard), the one row whose folders hold it, and the stage its meta.json records."""
    from plantbench.ops import verify

    names, rules = _artifact_folders(smoke_run), _rules_of_folders(smoke_run)
    assert len(names) > 50
    for name in names:
        step = verify.step_of(name)
        assert step is not None and rules.get(name) == [step.rule], name
        meta = smoke_run / name / "meta.json"
        if meta.is_file():
            assert json.loads(meta.read_text())["stage"] == step.stage, name


def test_the_timeline_names_each_workflow_job_by_its_rule() -> None:
    """Every rule's benchmark file (as the workflow names it) is the rule's job in the
    timeline and the plan check."""
    import re

    from plantbench.ops import timeline

    bench = re.compile(r'^rule (\w+):|bench_of\("([^"]+)"\)', re.M)
    seen = 0
    for f in (ROOT / "workflow" / "rules").glob("*.smk"):
        rule = None
        for found in bench.finditer(f.read_text()):
            rule = found[1] or rule
            if found[2] and rule in stages.BY_RULE:
                assert timeline.stage_of(_filled(found[2])) == rule, found[2]
                seen += 1
    assert seen == len(stages.STAGES)
    assert timeline.stage_of("not_a_job_A") == "not_a_job_A"


# Where a module names a stage for that stage's own work (not to list the stages), by top-level
# definition: everything else about a stage comes from plantbench.stages.
OWN_WORK = {
    # the reference records the token artifacts (bit-portable) and a few float ones by name
    ("ops/verify.py", "PORTABLE"): "the token artifacts a reference records",
    ("ops/verify.py", "FLOAT_REFERENCED"): "the float artifacts a reference records",
    ("ops/verify.py", "_portable_skip"): "facts and the stdlib corpus, the reference's rule",
    # the info checks recompute what each stage's meta summarizes, keyed by its meta stage
    ("ops/verify.py", "INFO_CHECKS"): "each stage's own info check",
    ("ops/verify.py", "_analysis_info"): "the analysis config section",
    ("ops/verify.py", "present_hashes"): "the gradient store's pool/ and queries/ subfolders",
    ("ops/verify.py", "_bundle_meta"): "a release bundle is the export stage's artifact",
    ("ops/verify.py", "bundle_key_checks"): "the bundle's facts table",
    # the plan check's calibration: plan rows (named as the rules) with their own rates and costs
    ("ops/plan_measured.py", "TRAIN_STAGES"): "the plan rows at the training precision's rate",
    ("ops/plan_measured.py", "LOADS_ENCODER"): "the plan rows whose jobs load the text encoder",
    ("ops/plan_measured.py", "cpu_rate"): "the pretrain row calibrates the CPU FLOP rate",
}
DERIVING = ("ops/verify.py", "ops/plan_measured.py", "ops/timeline.py", "runconfig.py")


def _definition(node: Any) -> str:
    """The name a top-level statement defines (its target, function or class)."""
    import ast

    if isinstance(node, ast.Assign | ast.AnnAssign):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        return ast.unparse(target)
    return getattr(node, "name", ast.unparse(node)[:40])


def test_no_module_restates_the_stage_list() -> None:
    """The rule-name check: no rule name of the catalogue is a string literal in the modules
    that derive from it, except where one does that stage's own work (:data:`OWN_WORK`)."""
    import ast

    found = set()
    for mod in DERIVING:
        tree = ast.parse((ROOT / "src" / "plantbench" / mod).read_text())
        for top in tree.body:
            names = {
                n.value
                for n in ast.walk(top)
                if isinstance(n, ast.Constant) and n.value in stages.BY_RULE
            }
            if names:
                found.add((mod, _definition(top)))
                assert (mod, _definition(top)) in OWN_WORK, (mod, _definition(top), names)
    assert found == set(OWN_WORK)  # no stale exception


# --------------------------------------------------------------------------- start-up writes


@pytest.mark.parametrize(
    ("argv", "looks"),
    [
        (["-n"], True),
        (["-np", "--cores", "2"], True),
        (["--dry-run"], True),
        (["--lint"], True),
        (["--report", "r.html"], True),
        (["--profile", "profiles/slurm", "--cores", "2"], False),
        (["--configfile", "my.yaml", "--config", "results=x"], False),
    ],
)
def test_a_look_only_call_is_told_from_a_run(argv: list[str], looks: bool) -> None:
    assert runconfig.looks_only(argv) is looks


def test_a_full_disk_at_start_up_is_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    import os

    from plantbench.errors import PlantbenchError

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    target = tmp_path / "results" / "config.json"
    with pytest.raises(PlantbenchError) as err:
        runconfig.startup_write(target, "{}\n")
    assert str(err.value).startswith("No space left on device '")
    assert str(target) in str(err.value) and "free disk space and rerun" in str(err.value)
    assert not target.exists()


def test_snakemake_reports_a_start_up_write_it_cannot_make_in_one_line(tmp_path: Path) -> None:
    """The parse-time write of a rule's config values fails (a file where its folder belongs):
    one line naming the file and the fix, exit 1, no traceback from a rules file, nothing run."""
    from smokerun import snakemake

    results = tmp_path / "results"
    (results / runconfig.RUN_DIR).mkdir(parents=True)
    (results / runconfig.RUN_DIR / "sections").write_text("in the way\n")
    proc = snakemake(results, "--", str(results / "facts" / "meta.json"))  # a call that runs
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("plantbench: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "sections" in lines[0] and "the workflow's start-up" in lines[0]
    assert "Traceback" not in proc.stderr
