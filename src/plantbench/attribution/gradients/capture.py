"""Per-example gradients of the block linears in one frozen forward and backward pass.

Forward hooks capture each block linear's inputs ``x``, tensor hooks its output gradients ``delta``;
parameters are frozen and the gradient flows from the input embeddings, so no weight gradient is
formed by autograd, and the output layer's loss is the fused chunked step of
:mod:`plantbench.model.headloss`. What is kept per module is the caller's choice: projected (LoGra
or the count sketch), the full gradient, or the raw ``(x, delta)`` (EK-FAC, fidelity)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from plantbench.errors import PlantbenchError
from plantbench.model.headloss import fusable, head_losses

if TYPE_CHECKING:
    from plantbench.attribution.sketch import Sketch
from plantbench.attribution.gradients.projector import Projector

Tap = Callable[[str, str, torch.Tensor], None]
"""``tap(module name, "in" | "out", tensor)``: sees each block linear's unprojected inputs and
output gradients ``[n, T, .]`` as they are captured."""


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(1) - 1).clamp(min=0)


def _attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive [n, 1, T, T] mask: causal, real keys only, and every padded query attends to
    itself (a fully masked row would be NaN in the eager kernel and poison 0 * NaN products)."""
    n, t = attention_mask.shape
    real = attention_mask.bool()
    causal = torch.ones(t, t, dtype=torch.bool, device=real.device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=real.device)
    allowed = causal & (real[:, None, None, :] | eye)
    zero = torch.zeros((), dtype=dtype, device=real.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def target_mask(loss_mask: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[n, T-1] bool: which next-token predictions carry loss (see module docstring)."""
    m = loss_mask[:, 1:].bool()
    if attention_mask is not None:
        a = attention_mask.bool()
        m = m & a[:, 1:] & a[:, :-1]
    return m


def example_losses(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    inputs_embeds: torch.Tensor | None = None,
    fused: bool = False,
) -> torch.Tensor:
    """Per-example summed next-token cross-entropy over the target positions, shape [n].

    ``fused``: the output layer and the loss in one chunked step that never forms the logits
    (:mod:`plantbench.model.headloss`; parameters must be frozen), where the model allows it; the
    same losses and gradients up to floating-point reassociation."""
    kwargs: dict[str, Any] = {"use_cache": False}
    if attention_mask is not None:
        dtype = next(model.parameters()).dtype
        kwargs["attention_mask"] = _attention_bias(attention_mask, dtype)
        kwargs["position_ids"] = _position_ids(attention_mask)
    if inputs_embeds is not None:
        kwargs["inputs_embeds"] = inputs_embeds
    else:
        kwargs["input_ids"] = input_ids
    mask = target_mask(loss_mask, attention_mask)
    if fused and fusable(model):
        hidden = model.model(**kwargs).last_hidden_state
        return head_losses(model, hidden, input_ids, mask)
    logits = model(**kwargs).logits
    n, t, v = logits.shape
    ce = F.cross_entropy(
        logits[:, :-1].reshape(-1, v), input_ids[:, 1:].reshape(-1), reduction="none"
    ).view(n, t - 1)
    return torch.where(mask, ce, torch.zeros((), dtype=ce.dtype, device=ce.device)).sum(1)


def check_inputs(model, input_ids, loss_mask, attention_mask, require_eager: bool) -> None:
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be [n, T], got {tuple(input_ids.shape)}")
    if loss_mask.shape != input_ids.shape:
        raise ValueError(
            f"loss_mask {tuple(loss_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    attn = getattr(getattr(model, "config", None), "_attn_implementation", "eager")
    if require_eager and attn != "eager":
        raise PlantbenchError(
            f"per-example gradients need the math attention kernel, but the model uses '{attn}'; "
            "load it with attn='eager' (plantbench.model.modeling.load_model(path, attn='eager'))"
        )


@contextlib.contextmanager
def frozen_eval(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        model.train(was_training)


def frozen_pass(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One forward (fused loss) and one backward of the summed per-example losses, parameters
    frozen and in eval mode: gradient flows from the input embeddings, so only activation
    gradients are formed (the hooks of :func:`_capture` see them). Returns the detached
    per-example losses ``[n]``."""
    with frozen_eval(model), torch.enable_grad():
        embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        losses = example_losses(
            model, input_ids, loss_mask, attention_mask, inputs_embeds=embeds, fused=True
        )
        if losses.requires_grad:
            torch.autograd.grad(losses.sum(), embeds)
    return losses.detach()


def _capture(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dtype: torch.dtype,
    maps: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]],
    consume: Callable[[str, torch.Tensor, torch.Tensor], None] | None = None,
    tap: Tap | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One forward and one backward of the summed per-example losses; per named module its
    input ``x`` and output gradient ``delta`` (``[n, T, .]`` in ``dtype``), each multiplied by
    ``maps[name] = (P_in, P_out)`` transposed when given. Parameters stay frozen: gradient
    flows from the input embeddings, so no weight gradient is ever formed. A module missing
    from the second dict got no gradient (e.g. an empty loss mask). With ``consume``, each
    module's pair goes to ``consume(name, x, delta)`` as soon as its output gradient is known
    and neither is kept (both dicts come back empty). With ``tap``, each module's unprojected
    ``x`` and ``delta`` (in ``dtype``) also go to ``tap(name, "in" | "out", tensor)`` as they are
    captured (e.g. EK-FAC's Kronecker factors, :mod:`plantbench.attribution.ekfac.factors`)."""
    mods = dict(model.named_modules())
    xs: dict[str, torch.Tensor] = {}
    ds: dict[str, torch.Tensor] = {}
    ran: set[str] = set()
    handles = []

    def make_hook(name: str):
        p_in, p_out = maps.get(name, (None, None))

        def grad_hook(g: torch.Tensor) -> None:
            if name in ds:
                raise PlantbenchError(f"module '{name}' ran twice in one forward; not supported")
            g = g.detach().to(dtype)
            if tap is not None:
                tap(name, "out", g)
            g = g if p_out is None else g @ p_out.T
            if consume is None:
                ds[name] = g
            else:
                consume(name, xs.pop(name), g)

        def fwd_hook(mod, inputs, output):
            if name in ran:
                raise PlantbenchError(f"module '{name}' ran twice in one forward; not supported")
            ran.add(name)
            x = inputs[0].detach().to(dtype)
            if tap is not None:
                tap(name, "in", x)
            xs[name] = x if p_in is None else x @ p_in.T
            if output.requires_grad:
                output.register_hook(grad_hook)

        return fwd_hook

    try:
        for name in module_names:
            handles.append(mods[name].register_forward_hook(make_hook(name)))
        frozen_pass(model, input_ids, loss_mask, attention_mask)
    finally:
        for h in handles:
            h.remove()
    for name in module_names:
        if name not in ran:
            raise PlantbenchError(f"module '{name}' did not run in the forward pass")
    if consume is not None:
        xs.clear()
    return xs, ds


def projected_grads(
    model: torch.nn.Module,
    projector: Projector | Sketch,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    require_eager: bool = True,
    scales: dict[str, torch.Tensor] | None = None,
    tap: Tap | None = None,
) -> torch.Tensor:
    """Projected per-example gradients, ``[n, projector.dims]`` in ``dtype``.

    ``scales`` (per module an ``[out, in]`` tensor): each example's exact weight gradient is
    multiplied by it elementwise before the projection, e.g. TrackStar's ``1 / (sqrt(v) + eps)``
    (:mod:`plantbench.attribution.trackstar`); the gradient is then formed per module (the
    count sketch forms it anyway; LoGra forms it only here). ``tap``: see :func:`_capture` (the
    same pass then also feeds EK-FAC's factors; not with ``scales``).

    One forward and one backward for the whole batch. LoGra (:class:`Projector`): hooks
    project each module's inputs and output gradients; per example ``sum_t (P_out delta_t)
    (P_in x_t)^T`` is flattened row-major (``k_out`` major). A count sketch
    (:class:`plantbench.attribution.sketch.Sketch`): each module's exact gradient is sketched as soon as
    its output gradient is known (:meth:`~plantbench.attribution.sketch.Sketch.accumulate`). The model is
    put in eval mode and its parameters frozen for the call.
    """
    check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
    device = input_ids.device
    n = input_ids.shape[0]
    if projector.kind == "sketch":
        out = torch.zeros((n, projector.dims), dtype=dtype, device=device)

        def consume(name: str, x: torch.Tensor, delta: torch.Tensor) -> None:
            projector.accumulate(out, name, x, delta, None if scales is None else scales[name])

        _capture(
            model, projector.module_names, input_ids, loss_mask, attention_mask, dtype, {},
            consume, tap,
        )  # fmt: skip
        return out
    if scales is not None:
        if tap is not None:
            raise PlantbenchError("projected_grads: a tap with scales is not supported")
        return _scaled_logra(model, projector, input_ids, loss_mask, attention_mask, dtype, scales)
    maps = {
        name: (
            projector.matrix(name, "in", dtype, device),
            projector.matrix(name, "out", dtype, device),
        )
        for name in projector.module_names
    }
    xs, ds = _capture(
        model, projector.module_names, input_ids, loss_mask, attention_mask, dtype, maps, None, tap
    )
    out = torch.zeros((n, projector.dims), dtype=dtype, device=device)
    for name in projector.module_names:
        if name not in ds:  # no gradient reached it: zero block
            continue
        g = torch.einsum("ntk,ntj->nkj", ds[name], xs[name])
        out[:, projector.slices[name]] = g.reshape(n, -1)
    return out


def _scaled_logra(
    model: torch.nn.Module,
    projector: Projector,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dtype: torch.dtype,
    scales: dict[str, torch.Tensor],
) -> torch.Tensor:
    """LoGra of elementwise-scaled exact gradients: ``P_out (G_n * S) P_in^T`` per module."""
    n, device = input_ids.shape[0], input_ids.device
    out = torch.zeros((n, projector.dims), dtype=dtype, device=device)

    def consume(name: str, x: torch.Tensor, delta: torch.Tensor) -> None:
        g = torch.einsum("nto,nti->noi", delta, x) * scales[name].to(dtype=dtype, device=device)
        p_in = projector.matrix(name, "in", dtype, device)
        p_out = projector.matrix(name, "out", dtype, device)
        block = torch.einsum("ko,noi,ji->nkj", p_out, g, p_in)
        out[:, projector.slices[name]] = block.reshape(n, -1)

    _capture(
        model, projector.module_names, input_ids, loss_mask, attention_mask, dtype, {}, consume
    )
    return out


def full_grads(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    *,
    require_eager: bool = True,
) -> torch.Tensor:
    """Every example's unprojected weight gradient of the named linears from one batched
    backward: ``G_n = sum_t delta_{n,t} x_{n,t}^T`` per module, flattened and concatenated like
    :func:`exact_grads_flat` (``[n, sum_m out_m in_m]``; what that function gives by one
    autograd pass per example, up to floating-point reassociation)."""
    mods = dict(model.named_modules())
    sizes = [mods[name].weight.numel() for name in module_names]
    xs, ds = module_io(
        model,
        module_names,
        input_ids,
        loss_mask,
        attention_mask,
        dtype,
        require_eager=require_eager,
    )
    n = input_ids.shape[0]
    out = torch.zeros((n, sum(sizes)), dtype=dtype, device=input_ids.device)
    start = 0
    for name, size in zip(module_names, sizes, strict=True):
        if name in ds:
            g = torch.einsum("nto,nti->noi", ds[name], xs[name])
            out[:, start : start + size] = g.reshape(n, -1)
        start += size
    return out


def module_io(
    model: torch.nn.Module,
    module_names: Sequence[str],
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    require_eager: bool = True,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Per named linear its inputs ``x`` ``[n, T, in]`` and output gradients ``delta``
    ``[n, T, out]`` of the summed per-example losses, from one forward and one backward (no
    weight gradient formed): ``G_n = sum_t delta_{n,t} x_{n,t}^T`` is the example's gradient."""
    check_inputs(model, input_ids, loss_mask, attention_mask, require_eager)
    return _capture(model, module_names, input_ids, loss_mask, attention_mask, dtype, {})
