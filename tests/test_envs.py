"""envs/*.yaml (the conda environments of `--sdm conda`) agree with the pinned dependencies."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ENVS = sorted((ROOT / "envs").glob("*.yaml"))
RULE_FILES = sorted((ROOT / "workflow" / "rules").glob("*.smk"))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lines: list[str], where: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):  # pip options such as -c / -e
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", line)
        assert m, f"{where}: '{line}' is not pinned exactly (name==version)"
        pins[_norm(m.group(1))] = m.group(2)
    return pins


def _pyproject_pins() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return _pins(project["dependencies"], "pyproject.toml")


def _constraints() -> dict[str, str]:
    return _pins((ROOT / "constraints.txt").read_text().splitlines(), "constraints.txt")


def _env_pip(env: Path) -> tuple[dict[str, str], list[str]]:
    doc = yaml.safe_load(env.read_text())
    conda, pip = [], []
    for dep in doc["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
        else:
            conda.append(str(dep))
    return _pins(pip, str(env)), conda


def test_there_is_an_env() -> None:
    assert ENVS, "envs/ holds no conda environment file"


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_pins_equal_pyproject(env: Path) -> None:
    pip, conda = _env_pip(env)
    project = _pyproject_pins()
    missing = sorted(set(project) - set(pip))
    extra = sorted(set(pip) - set(project))
    differ = {n: (pip[n], project[n]) for n in set(pip) & set(project) if pip[n] != project[n]}
    assert not missing, f"{env.name} lacks pyproject dependencies {missing}"
    assert not extra, f"{env.name} pins packages pyproject.toml does not list: {extra}"
    assert not differ, f"{env.name} pins differ from pyproject.toml (env, pyproject): {differ}"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = re.fullmatch(r">=\s*(\d+\.\d+)", requires)
    assert minor, requires
    assert f"python={minor.group(1)}" in conda, f"{env.name} must pin python={minor.group(1)}"


@pytest.mark.parametrize("env", ENVS, ids=lambda p: p.name)
def test_env_pins_equal_constraints(env: Path) -> None:
    pip, _ = _env_pip(env)
    lock = _constraints()
    differ = {n: (v, lock.get(n)) for n, v in pip.items() if lock.get(n) != v}
    assert not differ, f"{env.name} pins differ from constraints.txt (env, constraints): {differ}"


def test_pyproject_pins_equal_constraints() -> None:
    lock = _constraints()
    project = _pyproject_pins()
    differ = {n: (v, lock.get(n)) for n, v in project.items() if lock.get(n) != v}
    assert not differ, f"pyproject.toml pins differ from constraints.txt: {differ}"


def test_post_deploy_installs_the_package() -> None:
    for env in ENVS:
        script = env.with_name(env.name.removesuffix(".yaml") + ".post-deploy.sh")
        assert script.is_file(), f"{script.name} missing: nothing would install plantbench"
        assert "pip install" in script.read_text()


def _rules(path: Path) -> dict[str, str]:
    """rule name -> its block of text (up to the next top-level statement)."""
    blocks: dict[str, str] = {}
    name = None
    for line in path.read_text().splitlines():
        m = re.match(r"^(?:rule|checkpoint)\s+(\w+)\s*:", line)
        if m:
            name = m.group(1)
            blocks[name] = ""
        elif line.strip() and not line[0].isspace():
            name = None
        elif name is not None:
            blocks[name] += line + "\n"
    return blocks


@pytest.mark.parametrize("rule_file", RULE_FILES, ids=lambda p: p.name)
def test_every_rule_uses_an_env(rule_file: Path) -> None:
    for name, block in _rules(rule_file).items():
        if not re.search(r"^\s{4}(shell|run|script|notebook|wrapper):", block, re.M):
            continue  # a target rule: nothing runs
        m = re.search(r'^\s{4}conda:\s*\n\s+"([^"]+)"', block, re.M)
        assert m, f"rule {name} in {rule_file.name} has no `conda:` environment"
        env = (rule_file.parent / m.group(1)).resolve()
        assert env in [e.resolve() for e in ENVS], (
            f"rule {name}: conda env {m.group(1)} not in envs/"
        )


# --- envs/plantbench.post-deploy.sh installs the workflow's own source tree ---------------------
POST_DEPLOY = ROOT / "envs" / "plantbench.post-deploy.sh"


def _post_deploy(
    tmp_path: Path, cwd: Path, script: Path | None = None, **env: str
) -> tuple[subprocess.CompletedProcess, str]:
    """Run the script with bash, by default from a copy elsewhere as Snakemake does, with a stub
    `python` that records its arguments instead of installing."""
    stub = tmp_path / "bin"
    stub.mkdir(exist_ok=True)
    calls = tmp_path / "calls.txt"
    (stub / "python").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n')
    (stub / "python").chmod(0o755)
    if script is None:
        script = tmp_path / "conda" / "0123abcd.post-deploy.sh"  # where Snakemake runs it
        script.parent.mkdir(exist_ok=True)
        shutil.copy(POST_DEPLOY, script)
    base = {k: v for k, v in os.environ.items() if k != "PLANTBENCH_SOURCE"}
    run_env = dict(base, PATH=f"{stub}{os.pathsep}{os.environ['PATH']}", **env)
    proc = subprocess.run(
        ["bash", str(script)], cwd=cwd, env=run_env, capture_output=True, text=True, timeout=60
    )
    return proc, calls.read_text() if calls.exists() else ""


def test_post_deploy_installs_the_workflow_source_from_any_cwd(tmp_path: Path) -> None:
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    proc, calls = _post_deploy(tmp_path, elsewhere, PLANTBENCH_SOURCE=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert calls.split() == ["-m", "pip", "install", "--no-deps", "-e", str(ROOT)]


def test_post_deploy_refuses_a_tree_that_is_not_plantbench(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    proc, calls = _post_deploy(tmp_path, ROOT, PLANTBENCH_SOURCE=str(other))
    assert proc.returncode != 0 and not calls  # nothing installed, not even from the cwd (ROOT)
    assert f"'{other}' is not a plantbench source tree" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_post_deploy_by_hand_uses_its_own_checkout(tmp_path: Path) -> None:
    """Run from its place in a checkout without PLANTBENCH_SOURCE: that checkout."""
    proc, calls = _post_deploy(tmp_path, tmp_path, script=POST_DEPLOY)
    assert proc.returncode == 0, proc.stderr
    assert calls.split()[-1] == str(ROOT)


def test_workflow_names_its_source_for_the_post_deploy_script() -> None:
    """The script reads the variable workflow/rules/config.smk sets."""
    common = (ROOT / "workflow" / "rules" / "config.smk").read_text()
    assert "PLANTBENCH_SOURCE=" in common
    assert "${PLANTBENCH_SOURCE" in POST_DEPLOY.read_text()
