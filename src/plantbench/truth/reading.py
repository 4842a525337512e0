"""The reading curve: how well each twin reads a fact from its context, checkpoint by checkpoint.

At the fork (the shared prefix's last step, when there is one) and at every checkpoint of each
twin, the in-context check's ``context`` condition (:mod:`plantbench.data.prompts`: the fact's
sentence among ``causal.context_segments`` segments, plain format) on the facts that twin never
read: the share whose true answer ranks first of the candidates. Never-read facts measure
reading alone (the twin cannot have memorized them); chance is one in the candidates.
``reading/reading_curve.parquet``: one row per (twin, checkpoint); its own step (``plantbench
reading``), beside the causal step rather than inside it, so the two run on two cores at once.
"""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd
import torch

from plantbench import artifacts, io, layout
from plantbench.config import config_hash
from plantbench.data import prompts as prompt_sets
from plantbench.model.modeling import load_model
from plantbench.paths import MODELS, Paths
from plantbench.truth import in_context
from plantbench.truth.causal import SECTIONS, read_inputs

log = logging.getLogger(__name__)

TABLE = "reading_curve.parquet"
COLUMNS = ["model", "checkpoint", "step", "tokens", "n_queries", "reading_rate", "mean_rank"]


def _never_read(prompts: pd.DataFrame, facts: pd.DataFrame, model: str) -> pd.DataFrame:
    """The ``context`` prompts of the facts ``model`` never read."""
    other = set(facts.loc[facts["reader"] != model, "fact_id"])
    sel = (prompts["condition"] == "context") & prompts["fact_id"].isin(other)
    return prompts[sel].reset_index(drop=True)


def _row(model: str, name: str, step: int, tokens: int, scored: pd.DataFrame) -> dict[str, Any]:
    return {
        "model": model,
        "checkpoint": name,
        "step": step,
        "tokens": tokens,
        "n_queries": len(scored),
        "reading_rate": float((scored["rank_true"] == 1).mean()),
        "mean_rank": float(scored["rank_true"].mean()),
    }


def _fork_model(paths: Paths) -> torch.nn.Module:
    """The shared prefix's weights at the fork, in twin A's architecture."""
    from plantbench.model import pretrain

    io.read_meta(paths.model(pretrain.PREFIX), "prefix")  # the fork's bytes checked
    state = pretrain.load_state(paths.model(pretrain.PREFIX) / pretrain.FORK)
    model = load_model(artifacts.final_checkpoint_path(paths, MODELS[0]), attn="sdpa")
    model.load_state_dict(state["model"])
    return model.eval()


def curve(
    cfg: dict[str, Any],
    paths: Paths,
    tok: Any,
    facts: pd.DataFrame,
    prompts: pd.DataFrame,
    candidates: pd.DataFrame,
) -> pd.DataFrame:
    """The reading curve (:data:`COLUMNS`): the fork, then every checkpoint of each twin."""
    rows = []
    tokens_per_step = int(cfg["train"]["batch_windows"]) * int(cfg["stream"]["window"])
    fork = layout.prefix_steps(cfg)
    if fork:
        model = _fork_model(paths)
        for m in MODELS:  # both twins at the fork: the same weights, each on its own facts
            scored = in_context.score(model, tok, _never_read(prompts, facts, m), candidates)
            rows.append(_row(m, "fork", fork, fork * tokens_per_step, scored))
    for m in MODELS:
        for entry in artifacts.checkpoint_index(paths, m):
            model = artifacts.load_checkpoint(paths, m, entry, attn="sdpa").eval()
            scored = in_context.score(model, tok, _never_read(prompts, facts, m), candidates)
            rows.append(_row(m, entry["name"], int(entry["step"]), int(entry["tokens"]), scored))
            log.info(
                "reading curve: %s %s %.0f%%", m, entry["name"], 100 * rows[-1]["reading_rate"]
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def run(cfg: dict[str, Any], paths: Paths, *, threads: int = 1) -> dict[str, Any]:
    """Write ``reading/reading_curve.parquet`` and its meta."""
    torch.set_num_threads(threads)
    inp = read_inputs(cfg, paths)
    ic_prompts = prompt_sets.config_prompts(cfg, inp.facts, inp.candidates, inp.queries)
    table = curve(cfg, paths, inp.tok, inp.facts, ic_prompts, inp.candidates)
    with io.atomic_dir(paths.reading) as tmp:
        io.write_parquet(tmp / TABLE, table)
        meta = io.write_meta(
            tmp,
            "reading",
            [TABLE],
            config_hash=config_hash(cfg, list(SECTIONS)),
            inputs={k: v["hash"] for k, v in inp.metas.items()},
            info={
                "n_rows": len(table),
                "final": {
                    r["model"]: r["reading_rate"]
                    for r in table.drop_duplicates("model", keep="last").to_dict("records")
                },
            },
        )
    log.info("reading curve: %d rows -> %s", len(table), paths.reading)
    return meta
