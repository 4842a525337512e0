from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from plantbench import config

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "smoke" / "config.yaml"


@pytest.fixture
def default_cfg() -> dict[str, Any]:
    return config.load([ROOT / "config.yaml"])


@pytest.fixture
def smoke_cfg(tmp_path: Path) -> dict[str, Any]:
    return config.load([ROOT / "config.yaml", SMOKE], {"results": str(tmp_path / "results")})


@pytest.fixture(scope="session")
def smoke_stream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The smoke config's upstream (facts, corpus, tokenizer, both streams), built once."""
    from upstream import build_upstream

    root = tmp_path_factory.mktemp("smoke_stream")
    build_upstream(root)
    cfg = config.load([ROOT / "config.yaml", SMOKE], {"results": str(root / "results")})
    cfg_path = root / "results" / "config.json"
    return {"cfg": cfg, "config": cfg_path, "root": root}


@pytest.fixture(scope="session")
def plugin_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oracle plug-in as a copy the tests may edit, and the config file that names it."""
    base = tmp_path_factory.mktemp("plug ins")
    plugin = base / "oracle_method.py"
    plugin.write_text((ROOT / "tests" / "plugins" / "oracle_method.py").read_text())
    cfg = base / "plugins.yaml"
    cfg.write_text(json.dumps({"methods": {"plugins": [{"name": "oracle", "path": str(plugin)}]}}))
    return cfg


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, plugin_config: Path) -> Path:
    """The whole smoke DAG, in a results path with a space and a non-ASCII character."""
    results = tmp_path_factory.mktemp("smoke dag") / "résults"
    from smokerun import snakemake

    proc = snakemake(results, configfiles=(str(plugin_config),))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return results
