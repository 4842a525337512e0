"""Projected Fisher curvature: accumulation, damping, inverse, files."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import block_diag

from plantbench.attribution.curvature import CovarianceAccumulator, Curvature
from plantbench.errors import ArtifactError


def grads(n=300, d=12, seed=0, correlated=True):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, d)) * rng.uniform(0.1, 3.0, d)
    if correlated:
        g = g @ rng.standard_normal((d, d))  # cross-block covariance, non-isotropic
    return g


def test_block_and_full_agree_with_one_module():
    g = grads(d=9)
    b = Curvature.fit([g], mode="block", block_sizes=[9], damping_ratio=0.1)
    f = Curvature.fit([g], mode="full", damping_ratio=0.1)
    x = np.random.default_rng(1).standard_normal((4, 9))
    np.testing.assert_allclose(b.apply_inverse(x), f.apply_inverse(x), rtol=1e-12)
    assert b.damping == pytest.approx(f.damping, rel=1e-14)


def test_fisher_is_block_diagonal_mean_outer_product():
    g = grads(d=12)
    sizes = [3, 5, 4]
    c = Curvature.fit([g], mode="block", block_sizes=sizes)
    fisher = g.T @ g / len(g)
    bounds = np.cumsum([0, *sizes])
    expect = block_diag(*[fisher[a:b, a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    np.testing.assert_allclose(c.dense(), expect, rtol=1e-10, atol=1e-12)
    full = Curvature.fit([g], mode="full")
    np.testing.assert_allclose(full.dense(), fisher, rtol=1e-10, atol=1e-12)
    # with cross-module covariance the two modes really differ
    x = np.random.default_rng(2).standard_normal(12)
    assert not np.allclose(c.apply_inverse(x), full.apply_inverse(x), rtol=1e-3)


@pytest.mark.parametrize("mode", ["block", "full"])
def test_apply_inverse_inverts_fisher_with_tiny_damping(mode):
    g = grads(n=500, d=10)  # full rank
    c = Curvature.fit([g], mode=mode, block_sizes=[4, 6], damping_ratio=1e-12)
    x = np.random.default_rng(3).standard_normal((5, 10))
    fx = x @ c.dense().T
    np.testing.assert_allclose(c.apply_inverse(fx), x, rtol=1e-6, atol=1e-8)
    # and with ordinary damping it inverts F + lambda I exactly
    c = Curvature.fit([g], mode=mode, block_sizes=[4, 6], damping_ratio=0.1)
    np.testing.assert_allclose(c.apply_inverse(x) @ c.dense(damped=True).T, x, atol=1e-10)
    half = c.apply(x, -0.5)
    np.testing.assert_allclose(c.apply(half, -0.5), c.apply_inverse(x), rtol=1e-10, atol=1e-12)
    assert c.apply_inverse(x[0]).shape == (10,)


@pytest.mark.parametrize("ratio", [0.1, 0.37])
def test_damping_is_ratio_times_mean_eigenvalue_per_block(ratio):
    g = grads(d=9)
    sizes = [2, 7]
    c = Curvature.fit([g], mode="block", block_sizes=sizes, damping_ratio=ratio)
    fisher = g.T @ g / len(g)
    for lam, sl in zip(c.damping, [slice(0, 2), slice(2, 9)], strict=True):
        ev = np.linalg.eigvalsh(fisher[sl, sl])
        assert lam == pytest.approx(ratio * ev.mean(), rel=1e-12)
        assert lam == pytest.approx(ratio * np.trace(fisher[sl, sl]) / ev.size, rel=1e-12)
    assert c.damping[0] != pytest.approx(c.damping[1])  # damping is per block
    f = Curvature.fit([g], mode="full", damping_ratio=ratio)
    assert f.damping[0] == pytest.approx(ratio * np.trace(fisher) / 9, rel=1e-12)


def test_chunked_float64_accumulation_equals_one_shot():
    g = grads(n=257, d=8).astype(np.float16)  # low-precision features, like a float16 store
    one = CovarianceAccumulator([3, 5], "block")
    one.update(g)
    many = CovarianceAccumulator([3, 5], "block")
    for a, b in [(0, 7), (7, 100), (100, 101), (101, 257)]:
        many.update(g[a:b])
    assert one.n == many.n == 257
    g64 = g.astype(np.float64)
    for s, x, y in zip(one.slices, one.sums, many.sums, strict=True):
        assert x.dtype == y.dtype == np.float64
        np.testing.assert_allclose(x, y, rtol=1e-13)
        np.testing.assert_allclose(x, g64[:, s].T @ g64[:, s], rtol=1e-13)
    c1 = Curvature.from_accumulator(one)
    c2 = Curvature.fit(iter([g[:50], g[50:]]), mode="block", block_sizes=[3, 5])
    for e1, e2 in zip(c1.eigvals, c2.eigvals, strict=True):
        np.testing.assert_allclose(e1, e2, rtol=1e-12)


def test_save_load_roundtrip_and_corrupt_file(tmp_path):
    g = grads(d=6)
    c = Curvature.fit([g], mode="block", block_sizes=[2, 4], damping_ratio=0.2)
    c.source = "abc"
    p = tmp_path / "curv.npz"
    c.save(p)
    d = Curvature.load(p)
    assert d.info() == c.info()
    x = np.random.default_rng(0).standard_normal((3, 6))
    np.testing.assert_array_equal(d.apply_inverse(x), c.apply_inverse(x))
    assert list(tmp_path.iterdir()) == [p]  # no temp files left behind
    p.write_bytes(p.read_bytes()[:100])
    with pytest.raises(ArtifactError, match="curvature"):
        Curvature.load(p)


def test_all_zero_block_is_refused():
    g = grads(d=6)
    g[:, 2:4] = 0
    with pytest.raises(ArtifactError, match="block 1"):
        Curvature.fit([g], mode="block", block_sizes=[2, 2, 2])


def test_fit_streams_a_gradient_store(tmp_path):
    import torch  # noqa: F401  (model construction needs it)

    from plantbench.attribution.gradients.projector import Projector
    from plantbench.attribution.gradients.store import GradientStore
    from plantbench.attribution.gradients.writer import ShardWriter, shard_identity
    from plantbench.model.modeling import build_model, llama_config

    cfg = llama_config(
        {
            "n_embd": 16,
            "intermediate": 32,
            "n_layer": 1,
            "n_head": 2,
            "tie_embeddings": True,
            "rope_theta": 10000.0,
        },
        32,
        8,
        bos=0,
        eos=1,
        pad=2,
        attn="eager",
    )
    proj = Projector.from_model(build_model(cfg, 0), seed=5, k_in=2, k_out=3)
    idt = shard_identity(
        proj, checkpoint="final", checkpoint_step=1, manifest_hash="m", config_hash="c"
    )
    g = grads(n=40, d=proj.dims, seed=4).astype(np.float32)
    for name, rows in (("s0", range(0, 25)), ("s1", range(25, 40))):
        w = ShardWriter(tmp_path / name, list(rows), idt)
        w.write(0, g[rows.start : rows.stop])
        w.finalize()
    store = GradientStore.open([tmp_path / "s0", tmp_path / "s1"])
    c = Curvature.fit(store, chunk_rows=7)
    assert c.source == store.hash and c.module_names == proj.module_names
    assert c.block_sizes == [6] * 7 and c.n == 40
    ref = Curvature.fit([g], mode="block", block_sizes=[6] * 7)
    x = g[:3]
    np.testing.assert_allclose(c.apply_inverse(x), ref.apply_inverse(x), rtol=1e-10)
