"""The fidelity stage: exact unprojected gradient products and per-query rank agreement."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from plantbench import layout
from plantbench.attribution import fidelity
from plantbench.attribution.gradients.capture import full_grads, projected_grads
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.gradients.reference import exact_grads_flat
from plantbench.errors import ConfigError
from plantbench.model.modeling import block_linear_names
from test_gradients import V, batch, model64, rel  # noqa: F401  (fixtures)


def test_batched_full_gradient_equals_one_autograd_pass_per_example(model64, batch):  # noqa: F811
    ids, loss_mask, attn = batch
    names = block_linear_names(model64)
    fast = full_grads(model64, names, ids, loss_mask, attn)
    slow = exact_grads_flat(model64, names, ids, loss_mask, attn)
    assert fast.dtype == torch.float64 and fast.shape == slow.shape
    for n in range(ids.shape[0]):  # padded rows (1: right, 3: left) included
        assert rel(fast[n], slow[n]) < 1e-11, n
    # an empty loss mask gives zero gradients, not an error
    zero = full_grads(model64, names, ids[:2], torch.zeros_like(loss_mask[:2]), attn[:2])
    assert float(zero.abs().max()) == 0.0


def test_exact_products_are_the_flat_gradients_dot_and_do_not_depend_on_chunks(
    model64,  # noqa: F811
    batch,  # noqa: F811
):
    ids, loss_mask, attn = batch
    g = torch.Generator().manual_seed(9)
    windows = torch.randint(3, V, (7, ids.shape[1]), generator=g).numpy()
    names = block_linear_names(model64)
    gq = exact_grads_flat(model64, names, ids, loss_mask, attn)
    gw = exact_grads_flat(
        model64, names, torch.as_tensor(windows), torch.ones(windows.shape, dtype=torch.bool)
    )
    want = (gq @ gw.T).numpy()
    one = fidelity.exact_products(model64, windows, (ids, attn, loss_mask), batch=3)
    n_params = gq.shape[1]
    many = fidelity.exact_products(
        model64, windows, (ids, attn, loss_mask), batch=2, budget=8 * n_params * 2
    )
    assert len(layout.query_chunks(ids.shape[0], n_params, 8, 8 * n_params * 2)) == 3
    np.testing.assert_allclose(one.dot, want, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(many.dot, one.dot, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(one.q_norm, gq.norm(dim=1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(many.w_norm, gw.norm(dim=1).numpy(), rtol=1e-12)
    cos = want / np.outer(gq.norm(dim=1).numpy(), gw.norm(dim=1).numpy())
    np.testing.assert_allclose(one.cos, cos, rtol=1e-10)


def test_spearman_rows_known_values():
    a = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [3.0, 1.0, 2.0, 2.0]])
    b = np.array([[10.0, 20.0, 30.0, 40.0], [4.0, 3.0, 2.0, 1.0], [0.5, 0.1, 9.0, 0.2]])
    rho = fidelity.spearman_rows(a, b)
    assert rho[0] == pytest.approx(1.0) and rho[1] == pytest.approx(-1.0)
    assert rho[2] == pytest.approx(spearmanr(a[2], b[2]).statistic)  # ties: average ranks
    const = fidelity.spearman_rows(np.ones((1, 4)), b[:1])
    nan = fidelity.spearman_rows(np.array([[1.0, np.nan, 2.0, 3.0]]), b[:1])
    assert np.isnan(const[0]) and np.isnan(nan[0])
    with pytest.raises(ValueError):
        fidelity.spearman_rows(a, b[:2])


def test_projection_fidelity_grows_with_the_projection_and_is_one_for_the_exact_dot(
    model64,  # noqa: F811
    batch,  # noqa: F811
):
    ids, loss_mask, attn = batch
    g = torch.Generator().manual_seed(3)
    windows = torch.randint(3, V, (40, ids.shape[1]), generator=g)
    ones = torch.ones(windows.shape, dtype=torch.bool)
    exact = fidelity.exact_products(model64, windows.numpy(), (ids, attn, loss_mask))
    assert np.allclose(fidelity.spearman_rows(exact.dot, exact.dot), 1.0)
    sweep, seconds = fidelity.projection_sweep(
        model64,
        windows.numpy(),
        (ids, attn, loss_mask),
        exact,
        4,
        (1, 8, 128),
        batch=16,
        sketch_sizes=(16, 4096),
    )
    assert list(sweep.columns) == fidelity.SWEEP_COLUMNS
    assert set(seconds) == {"logra 1", "logra 8", "logra 128", "sketch 16", "sketch 4096"}
    assert sweep["projection"].tolist() == ["logra"] * 3 + ["sketch"] * 2
    rhos = sweep["mean"].to_numpy()
    assert rhos[0] < rhos[1] < rhos[2] and rhos[2] > 0.9, rhos
    assert rhos[3] < rhos[4] and rhos[4] > 0.9, rhos  # the sketch tends to the exact dot too
    assert sweep["dims"].tolist()[3:] == [16, 4096]
    sweep = sweep.iloc[:3]
    # the k = 8 row is the projected dot product's own agreement with the exact one
    proj = Projector.from_model(model64, seed=4, k_in=8, k_out=8)
    pq = projected_grads(model64, proj, ids, loss_mask, attn, dtype=torch.float32)
    pw = projected_grads(model64, proj, windows, ones, None, dtype=torch.float32)
    want = fidelity.spearman_rows(pq.double().numpy() @ pw.double().numpy().T, exact.dot)
    assert sweep["mean"].iloc[1] == pytest.approx(np.nanmean(want), abs=1e-9)
    assert sweep["dims"].tolist() == [
        Projector.from_model(model64, seed=4, k_in=k, k_out=k).dims for k in (1, 8, 128)
    ]
    assert sweep["store_bytes_per_window"].tolist() == [4 * d for d in sweep["dims"]]


def test_subset_rows_are_seeded_sorted_distinct_and_bounded():
    cfg = {"seed": 7, "fidelity": {"windows": 30}}
    a = fidelity.subset_rows(cfg, 100, "A")
    assert np.array_equal(a, fidelity.subset_rows(cfg, 100, "A"))
    assert not np.array_equal(a, fidelity.subset_rows(cfg, 100, "B"))
    assert len(np.unique(a)) == 30 and np.all(np.diff(a) > 0) and a.max() < 100
    assert np.array_equal(fidelity.subset_rows(cfg, 12, "A"), np.arange(12))
    with pytest.raises(ConfigError, match="at least 2"):
        fidelity.subset_rows(cfg, 1, "A")
    assert layout.fidelity_windows({"seed": 1}) == 300  # the optional section's default


def test_table_references_and_summary():
    qs = pd.DataFrame({"query_id": ["q0", "q1"], "fact_id": ["f0", "f1"], "form": ["a", "b"]})
    dot = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])
    exact = fidelity.Exact(dot, np.array([1.0, 2.0]), np.array([1.0, 1.0, 10.0]))
    scores = {"grad_dot": dot.copy(), "grad_cos": exact.cos, "influence": -dot}
    table = fidelity.fidelity_table(qs, scores, exact)
    assert list(table.columns) == fidelity.TABLE_COLUMNS
    s = fidelity.summarize(table)
    assert s["grad_dot"]["reference"] == "dot" and s["grad_dot"]["mean"] == pytest.approx(1.0)
    assert s["grad_cos"]["reference"] == "cos" and s["grad_cos"]["min"] == pytest.approx(1.0)
    assert s["influence"]["mean"] == pytest.approx(-1.0) and s["influence"]["n_nan"] == 0
    assert fidelity.fidelity_table(qs, {}, exact).empty


def test_report_rows_name_each_method_once_with_both_twins():
    from plantbench.report.tables import fidelity_rows

    row = {"reference": "dot", "mean": 0.5, "min": 0.25, "max": 0.75}
    cos = {"reference": "cos", "mean": None, "min": None, "max": None}
    rows = fidelity_rows(
        {"A": {"grad_dot": row, "grad_cos": cos}, "B": {"grad_dot": {**row, "mean": 0.625}}}
    )
    assert rows["method"].tolist() == ["Gradient dot product", "Gradient cosine"]
    assert (
        rows.loc[0, "model A"] == "0.50 [0.25, 0.75]"
        and rows.loc[0, "model B"] == "0.62 [0.25, 0.75]"
    )
    assert rows.loc[1, "model A"] == "n/a" and rows.loc[1, "model B"] == "n/a"
    assert rows["compared with"].tolist() == ["exact dot", "exact cos"]
