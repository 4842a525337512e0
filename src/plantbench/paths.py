"""Where every artifact lives, relative to the configured ``results`` folder.

The Snakefile and the CLI both use these functions, so a path is defined once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODELS = ("A", "B")
# the checkout the package runs from (src/plantbench/paths.py -> the repository root): its
# config.yaml and results/reference/ (an installed, non-editable copy has neither)
CHECKOUT = Path(__file__).resolve().parents[2]


class Paths:
    """``shared``: the results folder (config, facts, corpus, tokenizer: the same for every
    replicate); ``root``: this replicate's folder (the results folder for replicate 0, see
    :mod:`plantbench.replicates`), which holds everything from the streams on."""

    def __init__(self, cfg: dict[str, Any] | str | Path):
        from plantbench.replicates import folder, index

        root = cfg["results"] if isinstance(cfg, dict) else cfg
        self.shared = Path(root)
        self.replicate = index(cfg) if isinstance(cfg, dict) else 0
        self.root = folder(self.shared, self.replicate)

    # configuration actually used (written by the `config` step)
    @property
    def config(self) -> Path:
        return self.shared / "config.json"

    @property
    def facts(self) -> Path:
        return self.shared / "facts"

    @property
    def corpus(self) -> Path:
        return self.shared / "corpus"

    @property
    def tokenizer(self) -> Path:
        return self.shared / "tokenizer"

    def replicate_root(self, r: int) -> Path:
        from plantbench.replicates import folder

        return folder(self.shared, r)

    @property
    def replicate_summary(self) -> Path:
        return self.shared / "replicates" / "summary"

    def stream(self, model: str) -> Path:
        return self.root / "stream" / model

    def model(self, model: str) -> Path:
        return self.root / "models" / model

    def checkpoints(self, model: str) -> Path:
        return self.model(model) / "checkpoints"

    def moments(self, model: str, checkpoint: str) -> Path:
        """Adam's second moments at a checkpoint (beside the checkpoints, outside the meta)."""
        return self.model(model) / "moments" / f"{checkpoint}.pt"

    def train_state(self, model: str) -> Path:
        return self.model(model) / "state"

    # attribution: pool, features, scores
    def pool(self, model: str) -> Path:
        return self.root / "pool" / model

    def features(self, model: str) -> Path:
        return self.root / "features" / model

    def grads(self, model: str, checkpoint: str) -> Path:
        return self.features(model) / "grads" / checkpoint

    def pool_shard(self, model: str, checkpoint: str, shard: int) -> Path:
        return self.grads(model, checkpoint) / "pool" / f"shard_{int(shard):04d}"

    def query_grads(self, model: str, checkpoint: str) -> Path:
        return self.grads(model, checkpoint) / "queries"

    def curvature(self, model: str, checkpoint: str) -> Path:
        return self.features(model) / "curvature" / checkpoint / "curvature.npz"

    def ekfac(self, model: str, checkpoint: str | None = None) -> Path:
        """EK-FAC scores at the final checkpoint (``None``), or at another TracIn one."""
        if checkpoint is None:
            return self.features(model) / "ekfac"
        return self.features(model) / "ekfac_tracin" / checkpoint

    def trackstar(self, model: str) -> Path:
        return self.features(model) / "trackstar"

    def hidden(self, model: str) -> Path:
        return self.features(model) / "hidden"

    def embed(self, model: str) -> Path:
        return self.features(model) / "embed"

    def scores(self, method: str, model: str) -> Path:
        return self.root / "scores" / method / model

    def fidelity(self, model: str) -> Path:
        return self.root / "fidelity" / model

    def context(self, part: str) -> Path:
        """The context suite: ``contexts``, one folder per twin, ``analysis``."""
        return self.root / "context" / part

    def grounding(self, part: str) -> Path:
        """The grounding suite: ``contexts``, one folder per twin, ``analysis``."""
        return self.root / "grounding" / part

    def membership(self, part: str) -> Path:
        """The membership suite: ``samples``, one folder per twin, ``analysis``."""
        return self.root / "membership" / part

    @property
    def causal(self) -> Path:
        return self.root / "causal"

    @property
    def reading(self) -> Path:
        return self.root / "reading"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def benchmarks(self) -> Path:
        return self.root / "benchmarks"
