"""envs/*.yaml (the conda environments of `--sdm conda`) agree with the pinned dependencies."""

from __future__ import annotations

import re
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
