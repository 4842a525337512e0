"""Where every artifact lives, relative to the configured ``results`` folder.

The Snakefile and the CLI both use these functions, so a path is defined once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODELS = ("A", "B")


class Paths:
    def __init__(self, cfg: dict[str, Any] | str | Path):
        root = cfg["results"] if isinstance(cfg, dict) else cfg
        self.root = Path(root)

    # configuration actually used (written by the `config` step)
    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def facts(self) -> Path:
        return self.root / "facts"

    @property
    def corpus(self) -> Path:
        return self.root / "corpus"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    def stream(self, model: str) -> Path:
        return self.root / "stream" / model

    def model(self, model: str) -> Path:
        return self.root / "models" / model

    def checkpoints(self, model: str) -> Path:
        return self.model(model) / "checkpoints"

    def train_state(self, model: str) -> Path:
        return self.model(model) / "state"

    @property
    def causal(self) -> Path:
        return self.root / "causal"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks"
