"""ASTRA on EK-FAC (:mod:`plantbench.attribution.ekfac.astra`, the ``ekfac_astra`` method).

The Gauss-Newton products against an explicit Gauss-Newton matrix, zero steps against EK-FAC,
the iteration with the exact curvature as its preconditioner (nothing to refine) and with EK-FAC
(the residual falls with the automatic step, grows with step 1), and bergson 2.5.1's ``astra``
(the ``peers-bench`` install) on the same model, windows, queries, factors, damping and steps:
the refined vectors agree to 6.3e-8 relative (measured; bergson rounds each residual to float32
before its preconditioner) and the scores to 6.8e-8 of their largest, Spearman 1.0 per query.

The models are float64, but Hugging Face's Llama computes its RMSNorm and attention softmax in
float32 whatever the model's dtype, so derivatives through them carry float32 rounding: the
products match the explicit matrix to 2.8e-8 relative (measured), not to float64 precision.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from plantbench import config, layout
from plantbench.attribution.ekfac import astra, store
from plantbench.attribution.ekfac import maths as ekfac
from plantbench.attribution.gradients.capture import target_mask
from plantbench.attribution.methods import registry
from plantbench.errors import ArtifactError
from plantbench.model.modeling import block_linear_names, build_model, llama_config
from plantbench.paths import Paths
from test_gradients import V, batch, model64, rel  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
RATIO = 0.1  # the damping ratio of EK-FAC and of ASTRA here (the defaults)
SMALL_V, SMALL_T = 32, 6  # the explicit-matrix model: 2,560 block weights, 480 logits


def _small_model() -> torch.nn.Module:
    """A 16-wide one-layer Llama small enough for an explicit Gauss-Newton matrix."""
    shape = {"n_embd": 16, "intermediate": 32, "n_layer": 1, "n_head": 2}
    conf = llama_config(
        {**shape, "tie_embeddings": True, "rope_theta": 1e4},
        SMALL_V,
        SMALL_T,
        bos=0,
        eos=1,
        pad=2,
        attn="eager",
    )
    return build_model(conf, seed=3).eval().double()


def _flat(v: dict[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    return torch.cat([v[n].reshape(-1) for n in names])


def _split(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for n, t in like.items():
        out[n] = flat[start : start + t.numel()].reshape(t.shape)
        start += t.numel()
    return out


def _explicit_gn(net: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """``(1 / N) sum_w sum_t J_wt^T (diag p - p p^T) J_wt`` with ``J`` the Jacobian of every
    logit by every block weight, one backward per logit."""
    mods = dict(net.named_modules())
    weights = [
        mods[n].weight.detach().clone().requires_grad_(True) for n in block_linear_names(net)
    ]
    params = {f"{n}.weight": w for n, w in zip(block_linear_names(net), weights, strict=True)}
    logits = torch.func.functional_call(net, params, (), {"input_ids": windows}).logits[:, :-1]
    rows = [
        torch.cat([g.reshape(-1) for g in torch.autograd.grad(x, weights, retain_graph=True)])
        for x in logits.reshape(-1)
    ]
    jac = torch.stack(rows).reshape(*logits.shape, -1)
    keep = target_mask(torch.ones_like(windows, dtype=torch.bool), None)
    p = torch.softmax(logits.detach(), -1)
    h = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]
    h = h * keep[..., None, None]
    return torch.einsum("wtvp,wtvu,wtuq->pq", jac, h, jac) / len(windows)


@pytest.fixture(scope="module")
def small():
    net = _small_model()
    g = torch.Generator().manual_seed(7)
    windows = torch.randint(3, SMALL_V, (3, SMALL_T), generator=g)
    return net, windows, _explicit_gn(net, windows)


@pytest.fixture(scope="module")
def windows():
    g = torch.Generator().manual_seed(21)
    return torch.randint(3, V, (24, 12), generator=g).numpy()


@pytest.fixture(scope="module")
def fitted(model64, windows):  # noqa: F811
    return ekfac.fit(model64, windows, RATIO, batch=8, dtype=torch.float64)


@pytest.fixture(scope="module")
def queries():
    """Four queries with the loss on their last six tokens."""
    g = torch.Generator().manual_seed(22)
    ids = torch.randint(3, V, (4, 12), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, :6] = False
    return ids, mask, None


def _astra(net, ek, windows, steps, step_size=None) -> astra.Astra:
    return astra.Astra(
        net, ek, windows, steps=steps, damping_ratio=RATIO, step_size=step_size, batch=8, seed=1
    )


# --------------------------------------------------------------------------- the maths


def test_gauss_newton_products_are_the_explicit_matrix(small):
    """Forward-mode ``J v``, the softmax's Hessian, reverse-mode ``J^T``: the explicit matrix
    times ``v``, the modules coupled (measured 2.8e-8 relative: float32 inside the model)."""
    net, windows, gn = small
    names = block_linear_names(net)
    prod = astra.GaussNewton(net, names, list(ekfac.window_batches(windows.numpy(), 2)))
    mods = dict(net.named_modules())
    g = torch.Generator().manual_seed(8)
    v = {n: torch.randn(mods[n].weight.shape, generator=g, dtype=torch.float64) for n in names}
    got = _flat(prod(v), names)
    assert rel(got, gn @ _flat(v, names)) < 1e-6
    one = {n: v[n] * (n == names[0]) for n in names}  # one module's vector reaches the others
    assert _flat(prod(one), names)[mods[names[0]].weight.numel() :].abs().max() > 0


def test_zero_steps_is_ekfac_exactly(model64, fitted, windows, batch):  # noqa: F811
    """Zero steps: EK-FAC's preconditioned query gradients in float64 (bit for bit on one
    thread; on two, the query batches' matrix products part at 2e-12 relative); through the
    scoring pass the ASTRA scores are EK-FAC's to float32 rounding."""
    got = _astra(model64, fitted, windows, 0)(batch, torch.float64)
    want = ekfac.preconditioned_queries(model64, fitted, batch, torch.float64)
    for n in fitted.names:
        w = want[n].numpy()
        np.testing.assert_allclose(got[n].numpy(), w, rtol=1e-10, atol=1e-12 * np.abs(w).max())
    extra = [_astra(model64, fitted, windows, 0)]
    ek, ast = ekfac.chunked_scores_of(model64, fitted, batch, windows, 4, extra)
    alone = ekfac.chunked_scores(model64, fitted, batch, windows, 4)
    np.testing.assert_allclose(ek, alone, rtol=1e-6, atol=1e-9 * np.abs(alone).max())
    np.testing.assert_allclose(ast, alone, rtol=1e-5, atol=1e-6 * np.abs(alone).max())


def test_exact_preconditioner_leaves_nothing_to_refine(small):
    """``P = G + lambda`` itself: ``v_0`` solves the system, a step changes it by the products'
    rounding only, and the automatic step is 1 (``P^-1 (G + lambda)`` = I)."""
    net, windows, gn = small
    names = block_linear_names(net)
    prod = astra.GaussNewton(net, names, list(ekfac.window_batches(windows.numpy(), 3)))
    mods = dict(net.named_modules())
    lam = {n: 1e-3 * (i + 1) for i, n in enumerate(names)}
    damp = torch.cat([torch.full((mods[n].weight.numel(),), lam[n]) for n in names]).double()
    chol = torch.linalg.cholesky(gn + torch.diag(damp))
    like = {n: mods[n].weight.detach().double() for n in names}

    def a(v):
        gv = prod(v)
        return {n: gv[n] + lam[n] * v[n] for n in names}

    def solve(r):
        return _split(torch.cholesky_solve(_flat(r, names)[:, None], chol)[:, 0], like)

    g = torch.Generator().manual_seed(9)
    q = {n: torch.randn(like[n].shape, generator=g, dtype=torch.float64) for n in names}
    v0 = solve(q)
    v1, res = astra.richardson(a, solve, q, v0, 1, 1.0)
    assert res[0] < 1e-6
    assert rel(_flat(v1, names), _flat(v0, names)) < 1e-6
    mu = astra.largest_eigenvalue(a, solve, q, layout.ASTRA_POWER_STEPS)
    assert mu == pytest.approx(1.0, abs=1e-6)


def test_residual_falls_with_the_automatic_step(model64, fitted, windows, queries):  # noqa: F811
    """EK-FAC preconditioning: with ``1 / mu_max`` every step lowers ``||g - (G + lambda) v||``
    (17.7 -> 2.5 x ||g|| in four steps, mean over the queries, measured; mu_max 55); step 1,
    the plain Neumann series, multiplies it by about 40 a step here."""
    run = _astra(model64, fitted, windows, 4)
    out = run(queries, torch.float64)
    after = []
    for q in range(len(queries[0])):
        g, _ = astra.query_gradient(run.ek, astra.query_tokens(model64, run.ek, queries), q)
        v = {n: out[n][q].reshape(g[n].shape) for n in g}
        av = run.damped(v)
        after.append(astra._norm({n: g[n] - av[n] for n in g}) / astra._norm(g))
    res = np.concatenate([np.concatenate(run.residuals), np.array(after)[:, None]], axis=1)
    print("relative residuals by step", res.mean(0).round(3), "mu_max", run.mu_max)
    assert (np.diff(res, axis=1) < 0).all()
    assert 20 < run.mu_max < 200 and run.info()["step_size"] == pytest.approx(1 / run.mu_max)
    plain = _astra(model64, fitted, windows, 2, step_size=1.0)
    plain(queries, torch.float64)
    grown = np.concatenate(plain.residuals)
    assert (grown[:, 1] > 10 * grown[:, 0]).all()


# --------------------------------------------------------------------------- the peer


def _bergson():
    """bergson's modules, imported without leaving its logging on the root logger."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    from bergson.config import AstraConfig, IndexConfig, InversionConfig
    from bergson.hessians.astra import Astra, GaussNewtonProduct
    from bergson.hessians.preconditioner import FactoredPreconditioner

    root.setLevel(level)
    root.handlers[:] = handlers
    return (
        AstraConfig,
        IndexConfig,
        InversionConfig,
        Astra,
        GaussNewtonProduct,
        FactoredPreconditioner,
    )


def _bergson_refined(net, ek, windows, queries, steps, step, tmp_path) -> torch.Tensor:
    """bergson's ``Astra.refine`` (its ``sgd`` solver, momentum 0, learning rate ``step``, every
    window in each product, summed-token loss) from its own ``FactoredPreconditioner``'s
    solution on our factors: one row per query, the modules concatenated."""
    from datasets import Dataset

    AstraConfig, IndexConfig, InversionConfig, Astra, GaussNewtonProduct, Precond = _bergson()
    prefix = net.base_model_prefix + "."
    short = {n: n.removeprefix(prefix) for n in ek.names}
    precond = Precond(
        {short[n]: ek.q_in[n] for n in ek.names},
        {short[n]: ek.q_out[n] for n in ek.names},
        {short[n]: ek.lam[n] for n in ek.names},
        inversion_cfg=InversionConfig(damping_factor=RATIO),
        sharded=False,
    )
    cfg = AstraConfig(
        num_steps=steps,
        lr=step,
        momentum=0.0,
        batch_size=len(windows),
        micro_batch_size=8,
        lr_decay_interval=10**9,
        loss_reduction="sum",
    )
    peer = object.__new__(Astra)  # its refine() on in-memory parts instead of its run paths
    peer.cfg, peer.logger, peer.device = cfg, logging.getLogger("bergson-astra"), "cpu"
    peer.preconditioner, peer.names, peer.num_docs = precond, list(short.values()), len(windows)
    peer.damping = {s: RATIO * precond.lambdas[s].mean() for s in short.values()}
    index = IndexConfig(run_path=str(tmp_path / "index"), loss_reduction="sum")
    data = Dataset.from_dict({"input_ids": windows.tolist()})
    peer.hvp = GaussNewtonProduct(net, data, index, peer.names, "sum", 8)
    tokens = astra.query_tokens(net, ek, queries)
    rows = []
    for q in range(len(queries[0])):
        g, _ = astra.query_gradient(ek, tokens, q)
        qd = {short[n]: g[n].reshape(-1) for n in ek.names}
        x0 = precond.apply({s: v[None] for s, v in qd.items()})
        x = peer.refine(qd, {s: v[0].clone() for s, v in x0.items()}, q)
        rows.append(torch.cat([x[short[n]] for n in ek.names]))
    return torch.stack(rows)


@pytest.mark.skipif(
    importlib.util.find_spec("bergson") is None or importlib.util.find_spec("datasets") is None,
    reason="bergson is not installed (make peers-bench)",
)
def test_refined_vectors_and_scores_are_bergsons(
    model64,  # noqa: F811
    fitted,
    windows,
    queries,
    tmp_path,
):
    """Four steps at our automatic step size: the same vectors (measured 6.3e-8 relative at
    most, cosine 1 - 2.2e-15) and scores (6.8e-8 of the largest; Spearman 1.0 per query)."""
    run = _astra(model64, fitted, windows, 4)
    ours = run(queries, torch.float64)
    peer_net = copy.deepcopy(model64)  # bergson turns the tracked layers' gradients on
    theirs = _bergson_refined(peer_net, fitted, windows, queries, 4, run.step(), tmp_path)
    mine = torch.cat([ours[n] for n in fitted.names], 1)
    err = ((mine - theirs).norm(dim=1) / theirs.norm(dim=1)).max().item()
    cos = torch.nn.functional.cosine_similarity(mine, theirs, dim=1).min().item()
    sizes = [v.numel() for v in fitted.lam.values()]
    split = dict(zip(fitted.names, theirs.split(sizes, 1), strict=True))
    n = len(windows)
    s_ours = ekfac.scores(model64, ours, ekfac.window_batches(windows, 8), n, torch.float64)
    s_peer = ekfac.scores(model64, split, ekfac.window_batches(windows, 8), n, torch.float64)
    score_err = np.abs(s_ours - s_peer).max() / np.abs(s_peer).max()
    rho = min(spearmanr(a, b)[0] for a, b in zip(s_ours, s_peer, strict=True))
    print(f"vectors {err:.2g} rel, cosine {cos:.16f}; scores {score_err:.2g}, Spearman {rho}")
    assert err < 1e-6 and cos > 1 - 1e-12
    assert score_err < 1e-6 and rho > 0.9999


# --------------------------------------------------------------------------- the step


def test_the_ekfac_step_refines_only_when_the_method_is_enabled(
    smoke_cfg,
    model64,  # noqa: F811
    fitted,
    windows,
    queries,
):
    """The ``ekfac`` step's ASTRA: none unless ``ekfac_astra`` is enabled; then the seeded
    sample of ``methods.astra.windows`` pool windows, and its scores from the same scoring pass
    as EK-FAC's, which stay what EK-FAC alone gives."""
    from plantbench.attribution.ekfac import stage

    assert stage._astra(smoke_cfg, "A", model64, fitted, windows) is None
    methods = {
        **smoke_cfg["methods"],
        "enabled": ["ekfac_astra"],
        "astra": {"steps": 2, "windows": 16},
    }
    cfg = {**smoke_cfg, "methods": methods}
    run = stage._astra(cfg, "A", model64, fitted, windows)
    assert run is not None and run.steps == 2 and run.gn.n_windows == 16
    rows = astra.sample_rows(cfg["seed"], "A", len(windows), 16)
    assert len(set(rows)) == 16 and not np.array_equal(
        rows, astra.sample_rows(cfg["seed"], "B", 24, 16)
    )
    out, refined = stage._scores(cfg, "A", model64, fitted, run, queries, windows)
    b = int(cfg["features"]["batch_windows"])
    alone = ekfac.chunked_scores(model64, fitted, queries, windows, b)
    np.testing.assert_allclose(out, alone, rtol=1e-6, atol=1e-9 * np.abs(alone).max())
    assert refined is not None and refined.shape == out.shape
    assert np.abs(refined - out).max() > 0.1 * np.abs(out).max()
    assert np.diff(run.info()["residual_before_step"])[0] < 0


# --------------------------------------------------------------------------- the method


def test_the_method_reads_the_ekfac_artifacts_astra_scores(smoke_cfg):
    """``ekfac_astra`` is registered (off by default) and reads ``astra_scores.npy`` beside
    EK-FAC's, refusing one made with other settings; ASTRA's settings enter the artifact's
    config hash only where it holds ASTRA's scores."""
    assert "ekfac_astra" in config.builtin_methods()
    assert "ekfac_astra" not in config.load([ROOT / "config.yaml"])["methods"]["enabled"]
    method = registry.get("ekfac_astra")
    assert method.needs == ("ekfac",)
    cfg = {**smoke_cfg, "methods": {**smoke_cfg["methods"], "enabled": ["ekfac_astra"]}}
    paths, st = Paths(cfg), layout.astra_settings(cfg)
    g = np.random.default_rng(0)
    ek_scores, astra_scores = g.standard_normal((2, 5, 7))
    info = {"astra": {"settings": st}}
    store.write_scores(paths.ekfac("A"), ek_scores, "h", {}, info, astra_scores)
    ctx = type("Ctx", (), {})()
    ctx.cfg, ctx.paths, ctx.model, ctx.cache, ctx.n_queries, ctx.n_pool = cfg, paths, "A", {}, 5, 7
    ctx.ekfac = lambda: ek_scores
    q, p = np.array([4, 1]), np.array([6, 0, 2])
    np.testing.assert_array_equal(method.score(ctx, q, p), astra_scores[q][:, p])
    other = {**cfg, "methods": {**cfg["methods"], "astra": {"steps": 7}}}
    ctx.cfg, ctx.cache = other, {}
    with pytest.raises(ArtifactError, match="rerun its ekfac step"):
        method.score(ctx, q, p)
    assert store.config_hash(cfg) != store.config_hash(cfg, st)


def test_the_plan_counts_astra_in_the_ekfac_job(smoke_cfg):
    """Enabled alone, ``ekfac_astra`` plans the ekfac job, with its products on top."""
    from plantbench.ops import plan

    def ekfac_stage(enabled):
        cfg = {**smoke_cfg, "methods": {**smoke_cfg["methods"], "enabled": enabled}}
        return {s.stage: s for s in plan.plan(cfg)}.get("ekfac")

    base, more = ekfac_stage(["ekfac"]), ekfac_stage(["bm25", "ekfac_astra"])
    assert more is not None and more.flops > base.flops and "ASTRA" in more.work
    assert more.disk_bytes == 2 * base.disk_bytes
