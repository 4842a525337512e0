"""TrackStar: Adam's second moments beside each checkpoint, the corrected projected gradients
held against a dense float64 definition, the mixed-curvature whitening and the method's score."""
# ruff: noqa: F811  (the fixtures of test_gradients)

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from plantbench.attribution import trackstar
from plantbench.attribution.gradients.capture import projected_grads
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.gradients.reference import dense_projections, exact_grads_flat
from plantbench.attribution.methods import registry
from plantbench.attribution.sketch import Sketch
from plantbench.errors import ArtifactError
from plantbench.model.pretrain import save_moments, second_moments
from test_gradients import T, V, batch, model64, rel  # noqa: F401  (fixtures)


def _scales(model: torch.nn.Module, names: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """Positive, uneven per-weight scales, like 1 / (sqrt(v) + eps)."""
    g = torch.Generator().manual_seed(seed)
    mods = dict(model.named_modules())
    return {
        n: torch.rand(mods[n].weight.shape, generator=g, dtype=torch.float64) * 3 + 0.1
        for n in names
    }


def _dense_reference(model, names, scales, ids, loss_mask, attn) -> torch.Tensor:
    """float64 definition: every example's exact gradient (autograd, one example at a time),
    divided elementwise, flattened like :func:`exact_grads_flat`."""
    flat = exact_grads_flat(model, names, ids, loss_mask, attn, torch.float64)
    return flat * torch.cat([scales[n].reshape(-1) for n in names])


def test_corrected_sketch_is_the_sketch_of_the_elementwise_corrected_exact_gradient(model64, batch):
    ids, loss_mask, attn = batch
    sk = Sketch.from_model(model64, seed=3, dims=61)
    scales = _scales(model64, sk.module_names)
    fast = projected_grads(model64, sk, ids, loss_mask, attn, torch.float64, scales=scales)
    ref = _dense_reference(model64, sk.module_names, scales, ids, loss_mask, attn) @ sk.dense()
    for n in range(len(ids)):
        assert rel(fast[n], ref[n]) < 1e-10, n
    plain = projected_grads(model64, sk, ids, loss_mask, attn, torch.float64)
    assert rel(plain[0], fast[0]) > 1e-3  # the correction changes the features


def test_corrected_logra_is_the_kronecker_projection_of_the_corrected_exact_gradient(
    model64, batch
):
    ids, loss_mask, attn = batch
    proj = Projector.from_model(model64, seed=5, k_in=3, k_out=2)
    scales = _scales(model64, proj.module_names, seed=1)
    fast = projected_grads(model64, proj, ids, loss_mask, attn, torch.float64, scales=scales)
    flat = _dense_reference(model64, proj.module_names, scales, ids, loss_mask, attn)
    dense = dense_projections(proj)
    start = 0
    for s in proj.specs:
        size = s.in_features * s.out_features
        block = flat[:, start : start + size] @ dense[s.name].T
        assert rel(fast[:, proj.slices[s.name]], block) < 1e-10, s.name
        start += size


def test_unit_scales_give_the_plain_features(model64, batch):
    ids, loss_mask, attn = batch
    sk = Sketch.from_model(model64, seed=2, dims=40)
    ones = {n: torch.ones(1, dtype=torch.float64) for n in sk.module_names}
    a = projected_grads(model64, sk, ids, loss_mask, attn, torch.float64, scales=ones)
    b = projected_grads(model64, sk, ids, loss_mask, attn, torch.float64)
    assert rel(a, b) < 1e-12


def _inverse_sqrt(r: np.ndarray) -> np.ndarray:
    w, u = np.linalg.eigh(r)
    return u @ np.diag(w**-0.5) @ u.T


def test_features_are_unit_cosines_in_the_mixed_whitened_metric():
    rng = np.random.default_rng(0)
    pool, queries = rng.normal(size=(50, 6)) * [1, 2, 3, 4, 5, 6], rng.normal(size=(20, 6)) * 9
    pf, qf = trackstar.features(pool, queries, mix=0.25, damping=0.0)
    assert np.allclose(np.linalg.norm(pf, axis=1), 1) and np.allclose(np.linalg.norm(qf, axis=1), 1)
    # the definition, written out: each Fisher at mean eigenvalue 1, mixed 3:1, R^{-1/2}, unit
    rp, rq = pool.T @ pool / 50, queries.T @ queries / 20
    r = 0.75 * rp / np.trace(rp) * 6 + 0.25 * rq / np.trace(rq) * 6
    w = _inverse_sqrt(r)
    want = (queries @ w) @ (pool @ w).T
    want /= np.outer(np.linalg.norm(queries @ w, axis=1), np.linalg.norm(pool @ w, axis=1))
    assert np.allclose(qf @ pf.T, want, atol=1e-12)
    # scaling a row or a whole side changes nothing (unit features, trace-normalised Fishers)
    pf2, qf2 = trackstar.features(pool * 7.0, queries * 0.01, mix=0.25, damping=0.0)
    assert np.allclose(qf2 @ pf2.T, want, atol=1e-10)


def test_whitener_inverts_the_square_root_of_the_mixed_curvature():
    rng = np.random.default_rng(1)
    pool, queries = rng.normal(size=(40, 5)), rng.normal(size=(10, 5))
    w = trackstar.whitener(pool, queries, mix=0.5, damping=0.0)
    rp, rq = pool.T @ pool / 40, queries.T @ queries / 10
    r = 0.5 * rp / (np.trace(rp) / 5) + 0.5 * rq / (np.trace(rq) / 5)
    assert np.allclose(w @ r @ w, np.eye(5), atol=1e-10)


def test_second_moments_are_adams_exp_avg_sq_and_belong_to_their_checkpoint(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4, bias=False), torch.nn.Linear(4, 2))
    opt = torch.optim.AdamW(net.parameters(), lr=0.1, eps=1e-6)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(8, 3)).pow(2).sum().backward()
        opt.step()
    v = second_moments(net, opt)
    assert set(v) == {"0.weight", "1.weight", "1.bias"}
    assert torch.equal(v["0.weight"], opt.state[net[0].weight]["exp_avg_sq"])
    path = tmp_path / "moments" / "step_0000003.pt"
    save_moments(path, net, opt, "abc")
    scales = trackstar.load_scales(path, ["0", "1"], "abc")
    assert torch.allclose(scales["0"], 1 / (torch.sqrt(v["0.weight"].double()) + 1e-6))
    with pytest.raises(ArtifactError, match="another checkpoint"):
        trackstar.load_scales(path, ["0"], "other")
    with pytest.raises(ArtifactError, match="missing"):
        trackstar.load_scales(tmp_path / "none.pt", ["0"], "abc")


def test_method_scores_are_the_feature_cosines():
    m = registry.get("trackstar")
    assert m.needs == ("trackstar",) and "cosine" in m.scale
    rng = np.random.default_rng(2)
    pool, queries = trackstar.unit(rng.normal(size=(7, 4))), trackstar.unit(rng.normal(size=(3, 4)))
    ctx = SimpleNamespace(trackstar=lambda: (pool, queries))
    out = m.score(ctx, np.array([2, 0]), np.array([1, 5, 6]))
    assert np.allclose(out, queries[[2, 0]] @ pool[[1, 5, 6]].T)
    assert np.all(np.abs(out) <= 1 + 1e-12)


def test_the_mixing_comes_from_the_config_or_the_defaults():
    assert trackstar.mixing({"features": {}}) == (trackstar.MIX, trackstar.DAMPING)
    cfg = {"features": {"trackstar_mix": 0.0, "trackstar_damping": 0.1}}
    assert trackstar.mixing(cfg) == (0.0, 0.1)


def test_verify_counts_the_moments_files_as_inputs_of_the_run(tmp_path):
    from plantbench.hashing import hash_file
    from plantbench.ops import verify

    path = tmp_path / "models" / "A" / "moments" / "step_0000010.pt"
    path.parent.mkdir(parents=True)
    torch.save({"exp_avg_sq": {}, "eps": 1e-8, "checkpoint_hash": "h"}, path)
    assert hash_file(path) in verify.present_hashes(tmp_path, {})
