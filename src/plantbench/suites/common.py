"""What the three suites share: the answer key they all build on and the twins' window.

Each suite (context, grounding, membership) builds its own contexts or samples from the causal
step's answer key and the in-context check, and fits them into the twins' window; those two
readers live here, so no suite reaches into another's modules.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from plantbench import artifacts, io
from plantbench.errors import ArtifactError
from plantbench.paths import MODELS, Paths
from plantbench.truth import in_context


def model_window(paths: Paths) -> int:
    """The twins' context window (``max_position_embeddings`` of twin A's final checkpoint)."""
    folder = artifacts.final_checkpoint_path(paths, MODELS[0])
    conf = json.loads((folder / "config.json").read_text())
    return int(conf["max_position_embeddings"])


def causal_table(paths: Paths) -> tuple[dict[str, Any], pd.DataFrame]:
    """The answer key (``causal/facts.parquet``) and its meta, refused without the in-context
    check every suite's provenance needs."""
    meta = io.read_meta(paths.causal, "causal")
    if in_context.TABLE not in meta["files"]:
        raise ArtifactError(
            f"'{paths.causal / in_context.TABLE}' is missing: the twins have no in-context check; "
            "rerun the causal step (snakemake --forcerun causal)"
        )
    return meta, io.read_parquet(paths.causal / "facts.parquet")
