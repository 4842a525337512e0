from __future__ import annotations

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
