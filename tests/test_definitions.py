"""What is attributed and the grid's arithmetic are each defined once (plantbench.layout), and
the model, the plan, the benchmarks and the config check count with those definitions."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plantbench import layout
from plantbench.errors import ArtifactError
from plantbench.model.modeling import block_linear_names
from plantbench.ops import plan
from plantbench.ops.bench import gradients as bench_gradients
from tiny_models import tiny_llama


def test_the_models_block_linears_are_the_tracked_ones() -> None:
    model = tiny_llama(n_layer=3, vocab=64, window=16, seed=0)
    names = block_linear_names(model)
    assert len(names) == layout.tracked_linears(3) == 21
    assert [n.rsplit(".", 1)[-1] for n in names[:7]] == list(layout.BLOCK_LINEARS)


def test_a_model_with_other_block_linears_is_refused() -> None:
    model = tiny_llama(n_layer=1, vocab=64, window=16, seed=0)
    layer = model.model.layers[0]
    layer.mlp.extra_proj = torch.nn.Linear(4, 4)
    with pytest.raises(ArtifactError, match="extra_proj"):
        block_linear_names(model)


def test_the_plan_and_the_benchmark_count_the_tracked_linears(default_cfg: dict[str, Any]) -> None:
    cfg = {**default_cfg, "features": {**default_cfg["features"], "projection": "logra"}}
    f = cfg["features"]
    want = layout.tracked_linears(cfg["model"]["n_layer"]) * f["grad_k_in"] * f["grad_k_out"]
    assert plan.grad_dims(cfg) == want
    m = cfg["model"]
    costs = bench_gradients.flops_per_window(m, 32, 128, f["grad_k_in"], f["grad_k_out"])
    assert costs["D"] == layout.tracked_linears(m["n_layer"]) * f["grad_k_in"] * f["grad_k_out"]


def test_the_grid_arithmetic_is_one(default_cfg: dict[str, Any]) -> None:
    f = default_cfg["facts"]
    assert layout.n_facts(default_cfg) == plan.n_facts(default_cfg)
    assert layout.n_facts(default_cfg) == layout.n_cells(default_cfg) * f["facts_per_cell"]
    planted = layout.pool_counts(default_cfg)["planted"]
    assert planted == layout.planted_per_position(default_cfg) * len(f["positions"])
    assert planted == len(f["domains"]) * len(f["positions"]) * f["facts_per_cell"] * sum(
        f["n_docs"]
    )
