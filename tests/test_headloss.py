"""The fused, chunked output-layer loss gives the unfused loss's values and gradients."""

from __future__ import annotations

import pytest
import torch

from plantbench.attribution.gradients.capture import example_losses, frozen_eval
from plantbench.errors import PlantbenchError
from plantbench.model import headloss
from test_gradients import batch, model64, rel, tiny_model  # noqa: F401


@pytest.fixture(params=[1, 10_000], ids=["chunk-1-row", "one-chunk"])
def chunk_rows(request, monkeypatch):
    """Force one target row per chunk (every buffer slice and chunk border is exercised) or a
    single chunk."""
    vocab = 64
    monkeypatch.setattr(headloss, "MIN_ROWS", 1)
    monkeypatch.setattr(headloss, "CHUNK_BYTES", request.param * vocab * 8)
    return request.param


def _losses_and_grad(model, ids, loss_mask, attn, fused: bool):
    with frozen_eval(model), torch.enable_grad():
        embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
        losses = example_losses(model, ids, loss_mask, attn, inputs_embeds=embeds, fused=fused)
        weights = torch.linspace(0.5, 2.0, len(ids), dtype=losses.dtype)  # not just ones
        (grad,) = torch.autograd.grad((losses * weights).sum(), embeds)
    return losses.detach(), grad


def test_fused_loss_and_gradient_equal_the_unfused_in_float64(model64, batch, chunk_rows):  # noqa: F811
    ids, loss_mask, attn = batch
    assert headloss.fusable(model64)
    got, got_grad = _losses_and_grad(model64, ids, loss_mask, attn, fused=True)
    want, want_grad = _losses_and_grad(model64, ids, loss_mask, attn, fused=False)
    assert got.dtype == torch.float64
    assert rel(got, want) < 1e-13
    assert rel(got_grad, want_grad) < 1e-12
    assert (got > 0).all()


def test_an_example_without_targets_has_zero_loss_and_gradient(model64, batch):  # noqa: F811
    ids, loss_mask, attn = batch
    mask = loss_mask.clone()
    mask[2] = False
    losses, grad = _losses_and_grad(model64, ids, mask, attn, fused=True)
    assert losses[2] == 0
    assert not grad[2].any()
    assert grad[0].any()


def test_bfloat16_model_keeps_a_float32_softmax():
    model = tiny_model().to(torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 64, (3, 12), generator=g)
    mask = torch.ones_like(ids, dtype=torch.bool)
    losses, grad = _losses_and_grad(model, ids, mask, None, fused=True)
    ref, _ = _losses_and_grad(tiny_model().double(), ids, mask, None, fused=False)
    assert losses.dtype == torch.float32
    assert torch.isfinite(grad).all()
    assert rel(losses.double(), ref) < 2e-2  # bfloat16 weights and activations


def test_a_trainable_output_weight_is_refused(model64, batch):  # noqa: F811
    ids, loss_mask, attn = batch
    hidden = torch.zeros(ids.shape[0], ids.shape[1], 32, dtype=torch.float64)
    assert model64.lm_head.weight.requires_grad
    with pytest.raises(PlantbenchError, match="freeze"):
        headloss.head_losses(model64, hidden, ids, loss_mask[:, 1:])


def test_a_head_with_a_bias_is_not_fused():
    model = tiny_model()
    assert headloss.fusable(model)
    model.lm_head = torch.nn.Linear(32, 64, bias=True)
    assert not headloss.fusable(model)
