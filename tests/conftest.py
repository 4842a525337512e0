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
