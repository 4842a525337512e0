"""EK-FAC influence: its curvature against the dense definitions, its scores against a dense
solve, and the unprojected limit of large damping (the exact gradient dot product)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from plantbench import layout
from plantbench.attribution.ekfac import maths as ekfac
from plantbench.attribution.gradients.reference import exact_grads_flat
from plantbench.model.modeling import block_linear_names
from test_gradients import V, batch, model64, rel  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def windows(batch):  # noqa: F811
    g = torch.Generator().manual_seed(21)
    return torch.randint(3, V, (9, batch[0].shape[1]), generator=g).numpy()


@pytest.fixture(scope="module")
def fitted(model64, windows):  # noqa: F811
    return ekfac.fit(model64, windows, 0.1, batch=4, dtype=torch.float64)


def _per_module(model, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    mods = dict(model.named_modules())
    out, start = {}, 0
    for name in block_linear_names(model):
        w = mods[name].weight
        out[name] = flat[:, start : start + w.numel()].reshape(-1, *w.shape)
        start += w.numel()
    return out


def test_corrected_eigenvalues_are_the_fisher_diagonal_in_the_kronecker_basis(
    model64,  # noqa: F811
    windows,
    fitted,
):
    ones = torch.ones(windows.shape, dtype=torch.bool)
    flat = exact_grads_flat(model64, fitted.names, torch.as_tensor(windows), ones)
    for name, g in _per_module(model64, flat).items():
        basis = torch.kron(fitted.q_out[name], fitted.q_in[name])  # vec(Q_S^T G Q_A) = B^T vec G
        fisher = g.reshape(len(g), -1).T @ g.reshape(len(g), -1) / len(g)
        want = torch.diagonal(basis.T @ fisher @ basis).reshape(fitted.lam[name].shape)
        assert rel(fitted.lam[name], want) < 1e-10, name
        assert rel(basis.T @ basis, torch.eye(len(basis), dtype=basis.dtype)) < 1e-10
        assert fitted.damping[name] == pytest.approx(0.1 * float(want.mean()), rel=1e-10)
    assert fitted.n_windows == len(windows)


def test_eigenbases_diagonalise_the_token_covariances(model64, windows):  # noqa: F811
    names = block_linear_names(model64)
    sums = ekfac.kronecker_factors(model64, names, ekfac.window_batches(windows, 4), torch.float64)
    a, s = sums.means()
    for name in names:
        for m in (a[name], s[name]):
            q = ekfac.eigenbasis(m)
            d = q.T @ m @ q
            assert rel(d, torch.diag(torch.diagonal(d))) < 1e-10, name


def test_preconditioning_is_a_solve_with_the_dense_curvature(model64, fitted):  # noqa: F811
    g = torch.Generator().manual_seed(3)
    for name in fitted.names[:3]:
        shape = fitted.lam[name].shape
        grad = torch.randn((2, *shape), generator=g, dtype=torch.float64)
        got = fitted.precondition(name, grad).reshape(2, -1)
        want = torch.linalg.solve(fitted.dense(name), grad.reshape(2, -1).T).T
        assert rel(got, want) < 1e-9, name


def test_scores_are_the_preconditioned_query_gradient_dot_the_window_gradient(
    model64,  # noqa: F811
    batch,  # noqa: F811
    windows,
    fitted,
):
    ids, loss_mask, attn = batch
    q_flat = exact_grads_flat(model64, fitted.names, ids, loss_mask, attn)
    w_flat = exact_grads_flat(
        model64,
        fitted.names,
        torch.as_tensor(windows),
        torch.ones(windows.shape, dtype=torch.bool),
    )
    qm, wm = _per_module(model64, q_flat), _per_module(model64, w_flat)
    want = sum(
        torch.linalg.solve(fitted.dense(n), qm[n].reshape(len(ids), -1).T).T
        @ wm[n].reshape(len(windows), -1).T
        for n in fitted.names
    )
    pre = ekfac.preconditioned_queries(model64, fitted, (ids, loss_mask, attn), torch.float64)
    got = ekfac.scores(model64, pre, ekfac.window_batches(windows, 4), len(windows), torch.float64)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-8, atol=1e-12)
    # damping far above every eigenvalue: the scores become the exact dot product / damping
    big = 1e9
    flat = dataclasses.replace(fitted, damping={n: big for n in fitted.names})
    pre = ekfac.preconditioned_queries(model64, flat, (ids, loss_mask, attn), torch.float64)
    got = ekfac.scores(model64, pre, ekfac.window_batches(windows, 3), len(windows), torch.float64)
    np.testing.assert_allclose(got * big, (q_flat @ w_flat.T).numpy(), rtol=1e-5)


def test_float32_scoring_ranks_like_float64(model64, batch, windows, fitted):  # noqa: F811
    ids, loss_mask, attn = batch
    pre64 = ekfac.preconditioned_queries(model64, fitted, (ids, loss_mask, attn), torch.float64)
    s64 = ekfac.scores(
        model64, pre64, ekfac.window_batches(windows, 4), len(windows), torch.float64
    )
    pre32 = {n: v.float() for n, v in pre64.items()}
    s32 = ekfac.scores(model64.float(), pre32, ekfac.window_batches(windows, 4), len(windows))
    model64.double()
    np.testing.assert_allclose(s32, s64, rtol=1e-3, atol=1e-6 * np.abs(s64).max())


class _Rows(torch.utils.data.Dataset):
    def __init__(self, **cols: torch.Tensor):
        self.cols = cols

    def __len__(self) -> int:
        return len(next(iter(self.cols.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.cols.items()}


def test_scores_agree_with_kronfluence_ekfac(model64, batch, windows, fitted, tmp_path):  # noqa: F811
    """The peer's EK-FAC (empirical Fisher, its 0.1 x mean eigenvalue damping heuristic) on the
    same model, windows and queries gives the same scores (measured: 1.5e-14 relative)."""
    pytest.importorskip("kronfluence")
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.task import Task

    from plantbench.attribution.gradients.capture import example_losses

    names = fitted.names

    class LM(Task):
        def compute_train_loss(self, batch, model, sample=False):
            return example_losses(model, batch["ids"], batch["mask"], None).sum()

        def compute_measurement(self, batch, model):
            return example_losses(model, batch["ids"], batch["mask"], batch["attn"]).sum()

        def get_influence_tracked_modules(self):
            return names

    ids, loss_mask, attn = batch
    w = torch.as_tensor(windows)
    train = _Rows(ids=w, mask=torch.ones_like(w, dtype=torch.bool))
    query = _Rows(ids=ids, mask=loss_mask, attn=attn)
    task = LM()
    net = prepare_model(copy.deepcopy(model64), task)
    an = Analyzer("ekfac", net, task, cpu=True, output_dir=str(tmp_path), disable_tqdm=True)
    f64 = torch.float64
    fargs = FactorArguments(
        strategy="ekfac",
        use_empirical_fisher=True,
        activation_covariance_dtype=f64,
        gradient_covariance_dtype=f64,
        per_sample_gradient_dtype=f64,
        lambda_dtype=f64,
    )
    an.fit_all_factors("f", train, per_device_batch_size=4, factor_args=fargs)
    sargs = ScoreArguments(
        damping_factor=None, score_dtype=f64, per_sample_gradient_dtype=f64, precondition_dtype=f64
    )
    an.compute_pairwise_scores(
        "s",
        "f",
        query,
        train,
        per_device_query_batch_size=5,
        per_device_train_batch_size=4,
        score_args=sargs,
    )
    peer = an.load_pairwise_scores("s")["all_modules"].numpy()
    pre = ekfac.preconditioned_queries(model64, fitted, batch, torch.float64)
    ours = ekfac.scores(model64, pre, ekfac.window_batches(windows, 4), len(windows), torch.float64)
    np.testing.assert_allclose(peer, ours, rtol=1e-9, atol=1e-12 * np.abs(peer).max())


def test_query_chunks_do_not_change_the_scores(model64, batch, windows, fitted):  # noqa: F811
    n_params = sum(int(v.numel()) for v in fitted.lam.values())
    assert layout.ekfac_query_chunks(5, n_params, 4 * n_params * 2) == [(0, 2), (2, 4), (4, 5)]
    one = ekfac.chunked_scores(model64, fitted, batch, windows, 4)
    many = ekfac.chunked_scores(model64, fitted, batch, windows, 3, budget=4 * n_params * 2)
    np.testing.assert_allclose(many, one, rtol=1e-5, atol=1e-6 * np.abs(one).max())


def test_each_tracin_checkpoint_has_its_own_scores_folder(smoke_cfg):
    """``tracin_ekfac`` reads the final checkpoint's ``ekfac`` artifact and one ``ekfac_tracin``
    artifact per other TracIn checkpoint; a checkpoint TracIn does not use has no step."""
    from plantbench.errors import ConfigError
    from plantbench.paths import Paths

    paths, final = Paths(smoke_cfg), layout.final_checkpoint(smoke_cfg)
    others = [c for c in layout.tracin_checkpoints(smoke_cfg) if c != final]
    assert others and layout.ekfac_folder(smoke_cfg, paths, "A", final) == paths.ekfac("A")
    for c in others:
        assert (
            layout.ekfac_folder(smoke_cfg, paths, "A", c) == paths.ekfac("A", c) != paths.ekfac("A")
        )
    with pytest.raises(ConfigError, match="only the TracIn checkpoints"):
        layout.ekfac_folder(smoke_cfg, paths, "A", "step_0000001")
    want = {str(paths.ekfac("A") / "meta.json")}
    want |= {str(paths.ekfac("A", c) / "meta.json") for c in others}
    assert set(layout.feature_files(smoke_cfg, "A", ["ekfac_tracin"])) == want
