"""The report's central figure: the forest plot of raw and controlled correlations, and the raw
scatter."""

from __future__ import annotations

import numpy as np
import pandas as pd
from PIL import Image

from plantbench.report import figures


def _corr() -> pd.DataFrame:
    rows = []
    for m, raw, ctl in [("bm25", 0.1, -0.05), ("influence", 0.4, 0.02), ("trackstar", 0.3, 0.2)]:
        rows.append(
            {"method": m, "raw": raw, "raw_lo": raw - 0.1, "raw_hi": raw + 0.1,
             "controlled": ctl, "controlled_lo": ctl - 0.1, "controlled_hi": ctl + 0.1}
        )  # fmt: skip
    rows.append({"method": "oracle", "raw": np.nan, "controlled": np.nan})
    return pd.DataFrame(rows)


def test_forest_sorts_by_the_controlled_correlation_and_leaves_out_undefined_ones():
    assert figures.forest_order(_corr()) == ["trackstar", "influence", "bm25"]


def test_the_paper_config_is_the_seeds_grid_and_model_shape():
    paper = {
        "facts": {"n_docs": [2, 8, 32, 128], "facts_per_cell": 11},
        "model": {"n_layer": 12, "n_embd": 768},
    }
    assert figures.is_paper(paper)
    assert not figures.is_paper({**paper, "model": {"n_layer": 4, "n_embd": 128}})
    assert set(figures.SEED_CORRELATIONS) <= {
        "bm25", "embedding", "hidden", "grad_dot", "grad_cos", "tracin_dot",
        "tracin_influence", "influence",
    }  # fmt: skip
    for raw, lo, hi, ctl, clo, chi in figures.SEED_CORRELATIONS.values():
        assert lo <= raw <= hi and clo <= ctl <= chi


def test_figures_are_written(tmp_path):
    for paper in (False, True):
        out = tmp_path / f"forest_{paper}.png"
        figures.mass_figure(_corr(), out, paper=paper)
        assert Image.open(out).size[0] > 100
    pf = pd.DataFrame(
        {
            "method": ["bm25"] * 4 + ["oracle"] * 2,
            "effect": [0.1, 0.5, -0.2, 1.0, 0.3, 0.4],
            "mass": [1.0, 2.0, 0.5, 3.0, np.nan, np.nan],
            "learned": [False, True, False, True, False, True],
        }
    )
    figures.scatter_figure(pf, tmp_path / "scatter.png")
    assert (tmp_path / "scatter.png").stat().st_size > 1000
