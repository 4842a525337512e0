"""Build the smoke configuration's upstream (facts, corpus, tokenizer, both streams) with the CLI,
for tests that need real streams but not the whole DAG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from plantbench import cli

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "tests" / "smoke" / "config.yaml"


def build_upstream(base: Path, override: dict[str, Any] | None = None) -> Path:
    """``base/results`` with config.json, facts, corpus, tokenizer and both streams."""
    over = base / "override.yaml"
    over.write_text(yaml.safe_dump({**(override or {}), "results": str(base / "results")}))
    files = ["-c", str(ROOT / "config.yaml"), "-c", str(SMOKE), "-c", str(over)]
    assert cli.main(["config", *files]) == 0
    cfg_json = str(base / "results" / "config.json")
    for step in ("facts", "corpus", "tokenizer", "stream"):
        assert cli.main([step, "-c", cfg_json]) == 0, step
    return base / "results"
