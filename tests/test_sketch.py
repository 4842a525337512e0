"""The count sketch of the exact per-example gradients (the default projection)."""
# ruff: noqa: F811  (the fixtures of test_gradients)

from __future__ import annotations

import numpy as np
import pytest
import torch

from plantbench.attribution import sketch as sketch_mod
from plantbench.attribution.gradients.capture import projected_grads
from plantbench.attribution.gradients.projector import check_blocks_nonzero
from plantbench.attribution.gradients.reference import exact_grads_flat
from plantbench.attribution.gradients.store import GradientStore
from plantbench.attribution.gradients.writer import extract_to_shard, shard_identity
from plantbench.attribution.sketch import Sketch
from plantbench.errors import ArtifactError
from plantbench.model.modeling import block_linear_names
from test_gradients import T, V, batch, model64, rel  # noqa: F401  (fixtures)


def test_sketch_equals_explicit_sketch_matrix_times_exact_gradient(model64, batch):
    """float64: the hooks' sketch is exactly S^T vec(G) with S the seeded sparse sign matrix."""
    ids, loss_mask, attn = batch
    sk = Sketch.from_model(model64, seed=3, dims=97)
    fast = projected_grads(model64, sk, ids, loss_mask, attn, dtype=torch.float64)
    flat = exact_grads_flat(model64, sk.module_names, ids, loss_mask, attn, torch.float64)
    dense = sk.dense()
    assert dense.shape == (flat.shape[1], 97)
    # one signed unit entry per weight: the sketch moves each weight to exactly one bucket
    assert torch.equal((dense != 0).sum(1), torch.ones(dense.shape[0], dtype=torch.long))
    assert torch.equal(dense.abs().sum(1), torch.ones(dense.shape[0], dtype=torch.float64))
    ref = flat @ dense
    assert fast.shape == (5, 97)
    for n in range(5):
        assert rel(fast[n], ref[n]) < 1e-10, n
    check_blocks_nonzero(fast, sk)


def test_sketch_mixes_every_module_into_shared_buckets(model64):
    sk = Sketch.from_model(model64, seed=3, dims=64)
    assert sk.module_names == block_linear_names(model64) and sk.block_sizes == [64]
    for name in sk.module_names:
        buckets, s_out, s_in = sk.tables(name, torch.float64)
        assert len(set(buckets.tolist())) > 32, name  # spread over the shared dims
        assert set(s_out.tolist()) == {-1.0, 1.0} and set(s_in.tolist()) == {-1.0, 1.0}
    again = Sketch.from_model(model64, seed=3, dims=64)
    other = Sketch.from_model(model64, seed=4, dims=64)
    n0 = sk.module_names[0]
    assert torch.equal(sk.tables(n0)[0], again.tables(n0)[0])
    assert not torch.equal(sk.tables(n0)[0], other.tables(n0)[0])
    assert sk.describe()["projection"] == "sketch"


def test_sketch_dot_is_unbiased_for_the_exact_gradient_product(model64, batch):
    """Averaged over seeds, <s_q, s_d> tends to the exact <G_q, G_d> (a property a wrong sign
    or bucket rule breaks); each seed alone is off by about |G_q||G_d| / sqrt(D)."""
    ids, loss_mask, attn = batch
    names = block_linear_names(model64)
    flat = exact_grads_flat(model64, names, ids, loss_mask, attn, torch.float64)
    exact = flat @ flat.T
    scale = float(torch.outer(flat.norm(dim=1), flat.norm(dim=1)).max())
    est = torch.zeros_like(exact)
    seeds = 200
    for seed in range(seeds):
        dense = Sketch.from_model(model64, seed=seed, dims=16).dense()
        s = flat @ dense
        est += s @ s.T / seeds
    # 200 seeds of D = 16: the mean's error is ~ scale * sqrt(2 / (16 * 200)) = 0.025 scale
    assert float((est - exact).abs().max()) < 0.1 * scale


def test_chunks_and_batches_do_not_change_the_sketch(model64, batch, monkeypatch):
    ids, loss_mask, attn = batch
    sk = Sketch.from_model(model64, seed=5, dims=50)
    whole = projected_grads(model64, sk, ids, loss_mask, attn, dtype=torch.float64)
    monkeypatch.setattr(sketch_mod, "CHUNK_BYTES", 1)  # one example at a time
    chunked = projected_grads(model64, sk, ids, loss_mask, attn, dtype=torch.float64)
    assert rel(chunked, whole) < 1e-12
    for n in range(5):
        one = projected_grads(
            model64, sk, ids[n : n + 1], loss_mask[n : n + 1], attn[n : n + 1], torch.float64
        )
        assert rel(one[0], whole[n]) < 1e-10


def test_sketch_store_is_one_curvature_block_and_names_its_projection(model64, tmp_path):
    g = torch.Generator().manual_seed(9)
    windows = torch.randint(3, V, (6, T), generator=g).numpy()
    sk = Sketch.from_model(model64, seed=17, dims=40)
    idt = shard_identity(
        sk, checkpoint="final", checkpoint_step=1, manifest_hash="m", config_hash="c", model="A"
    )
    extract_to_shard(model64, sk, windows, np.arange(6), tmp_path / "s", idt, batch_rows=4)
    store = GradientStore.open([tmp_path / "s"])
    assert store.projection == "sketch" and store.block_sizes == [40] and store.dims == 40
    assert store.identity["projection"] == "sketch"
    assert np.abs(store.rows(0, 6)).max() > 0


def test_check_rows_catches_zero_and_nonfinite(model64):
    sk = Sketch.from_model(model64, seed=1, dims=8)
    with pytest.raises(ArtifactError, match="all zero"):
        check_blocks_nonzero(np.zeros((3, 8)), sk)
    bad = np.ones((3, 8))
    bad[1, 2] = np.nan
    with pytest.raises(ArtifactError, match="inf/NaN"):
        check_blocks_nonzero(bad, sk)
