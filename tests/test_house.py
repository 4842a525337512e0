"""The package's layout: no import loop (imports inside functions counted), one package or module
per rules file, a small package root, and a job graph that parses without importing torch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plantbench import config
from plantbench.attribution.methods import registry

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "plantbench"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (functions included)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        here = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                r = resolve(t) if t.startswith("plantbench") else None
                if r and r != m and not (mods[r].name == "__init__.py" and m.startswith(r + ".")):
                    edges[m].add(r)
    return edges


def _loops(edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(comp)

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            visit(v)
    return loops


def test_no_import_loop_in_the_package() -> None:
    assert _loops(_edges(_modules())) == []


def test_the_loop_finder_finds_a_loop() -> None:
    """The check above would see a loop, through an import inside a function too."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _loops(edges) == [{"a", "b", "c"}]


def test_every_rules_file_has_its_package_or_module() -> None:
    names = {p.stem for p in PKG.rglob("*.py")} | {p.name for p in PKG.rglob("*") if p.is_dir()}
    rules = sorted(p.stem for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    assert rules and [r for r in rules if r not in names] == []


def test_the_package_root_is_small() -> None:
    root = [p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(root) <= 16, sorted(root)


def test_every_builtin_method_is_one_module_and_registered() -> None:
    """The schema's built-in list is the registry's: one module each, registered by name."""
    builtins = config.builtin_methods()
    for name in builtins:
        assert (PKG / "attribution" / "methods" / f"{name}.py").is_file(), name
        assert registry.get(name).name == name
    assert set(builtins) <= set(registry.available())


@pytest.mark.slow
def test_the_job_graph_parses_without_torch(tmp_path: Path) -> None:
    """A dry run with a torch that cannot be imported: the rules files import no stage."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('torch imported while parsing')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", "tests/smoke/config.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "torch imported" not in proc.stdout + proc.stderr
