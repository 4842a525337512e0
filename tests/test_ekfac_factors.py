"""EK-FAC's Kronecker factors from the final checkpoint's gradient pass
(plantbench.attribution.ekfac.factors): bitwise those of EK-FAC's own first pass with one shard,
also after the shard was interrupted and resumed; several shards add up to the same within
float64 rounding; a fit from them is the fit from its own pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plantbench.attribution.ekfac import factors as F
from plantbench.attribution.ekfac import maths as ekfac
from plantbench.attribution.gradients import writer as W
from plantbench.attribution.gradients.projector import Projector
from plantbench.attribution.gradients.writer import extract_to_shard, shard_identity
from plantbench.attribution.sketch import Sketch
from plantbench.model.modeling import block_linear_names
from test_gradients import T, V, tiny_model

BATCH = 4


@pytest.fixture(scope="module")
def net() -> torch.nn.Module:
    return tiny_model()  # float32, like the study's


@pytest.fixture(scope="module")
def windows() -> np.ndarray:
    g = torch.Generator().manual_seed(8)
    return torch.randint(3, V, (37, T), generator=g).numpy()


def _own_pass(net: torch.nn.Module, windows: np.ndarray) -> F.FactorSums:
    names = block_linear_names(net)
    return ekfac.kronecker_factors(net, names, ekfac.window_batches(windows, BATCH))


def _shard(net, windows, folder, rows=None, proj="sketch", progress=None) -> F.FactorSums:  # noqa: ANN001
    rows = rows or range(len(windows))
    p = (
        Sketch.from_model(net, 7, 96)
        if proj == "sketch"
        else Projector.from_model(net, 7, k_in=2, k_out=2)
    )
    ident = shard_identity(p, checkpoint="c", checkpoint_step=1, manifest_hash="m", config_hash="h")
    meta = extract_to_shard(
        net,
        p,
        windows[rows.start : rows.stop],
        list(rows),
        folder,
        ident,
        batch_rows=BATCH,
        progress=progress,
        factors=F.FactorSums(block_linear_names(net)),
    )
    assert meta["factors"]["batch_rows"] == BATCH and meta["factors"]["rows"] == len(rows)
    return F.FactorSums.load(folder, meta["factors"])


def _equal(a: F.FactorSums, b: F.FactorSums) -> None:
    assert a.names == b.names and a.tokens == b.tokens and a.rows == b.rows
    for n in a.names:
        assert torch.equal(a.a[n], b.a[n]) and torch.equal(a.s[n], b.s[n]), n


@pytest.mark.parametrize("proj", ["sketch", "logra"])
def test_one_shards_factors_are_bitwise_ekfacs_own_pass(net, windows, tmp_path, proj):
    _equal(_shard(net, windows, tmp_path / "s", proj=proj), _own_pass(net, windows))


def test_an_interrupted_and_resumed_shard_gives_the_same_factors(
    net, windows, tmp_path, monkeypatch
):
    monkeypatch.setattr(W, "FACTOR_SAVE_EVERY", 2)
    seen = []

    def stop_after_five_batches(n: int) -> None:
        seen.append(n)
        if len(seen) == 5:  # sums saved after batch 4, rows of batch 5 written
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _shard(net, windows, tmp_path / "s", progress=stop_after_five_batches)
    partial = tmp_path / ".s.partial"
    saved = F.FactorSums(block_linear_names(net))
    saved.restore(partial, len(windows))
    assert saved.rows == 4 * BATCH  # the resume below reruns batch 5 for the sums alone
    _equal(_shard(net, windows, tmp_path / "s"), _own_pass(net, windows))


def test_shards_add_up_to_the_single_pass_and_fit_the_same_curvature(net, windows, tmp_path):
    parts = [
        _shard(net, windows, tmp_path / "s0", range(0, 20)),
        _shard(net, windows, tmp_path / "s1", range(20, 37)),
    ]
    merged, own = F.merge(parts), _own_pass(net, windows)
    assert merged.tokens == own.tokens and merged.rows == own.rows == len(windows)
    for n in own.names:
        torch.testing.assert_close(merged.a[n], own.a[n], rtol=1e-12, atol=0)
        torch.testing.assert_close(merged.s[n], own.s[n], rtol=1e-12, atol=0)
    one = _shard(net, windows, tmp_path / "one")
    shared = ekfac.fit(net, windows, 0.1, batch=BATCH, factors=one)
    alone = ekfac.fit(net, windows, 0.1, batch=BATCH)
    for n in alone.names:
        assert torch.equal(shared.lam[n], alone.lam[n]) and torch.equal(
            shared.q_in[n], alone.q_in[n]
        )
    with pytest.raises(Exception, match="rerun its grads_pool"):
        ekfac.fit(net, windows[:20], 0.1, batch=BATCH, factors=one)


def test_a_damaged_factor_file_is_refused_when_the_shard_is_checked(net, windows, tmp_path):
    from plantbench.attribution.gradients.store import GradientStore
    from plantbench.errors import ArtifactError

    _shard(net, windows, tmp_path / "s")
    GradientStore.open([tmp_path / "s"], verify=True)
    f = tmp_path / "s" / F.FILE
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="factors.npz' does not match its recorded hash"):
        GradientStore.open([tmp_path / "s"], verify=True)
