"""``linear(x, weight, bias, recipe, state)``: ``y = x W^T + b`` with FP8/FP4 GEMMs in forward and backward.
(``scaled_dot_product_attention`` and its packed-sequence twin, FP8 attention: ``lowbit.nn.attention``.)

Forward: x and W are quantized by the recipe (roles "input", "weight") and multiplied by
``lowbit.kernels.scaled_mm`` with fp32 accumulation; the bias is added to the fp32 accumulator,
then ``y`` is rounded to x's dtype. Backward: the output gradient is quantized as role "grad"
(E5M2 under the HYBRID FP8 recipes, E4M3 under Blockwise and MX, E2M1 with stochastic rounding
for NVFP4) and ``dgrad = dY W``, ``wgrad = dY^T X`` go through ``scaled_mm`` as well, each operand quantized
along the contraction dim of its own GEMM (see ``lowbit.nn.ops``). ``db = sum_tokens dY`` in fp32.

Saved for backward, all in low precision but the weight: X^T quantized along the tokens (the wgrad
operand; only when W needs a gradient) and, in eager mode, W^T quantized along N (the dgrad
operand; only when X needs one), with their scales, both from the forward's casts (tensorwise
recipes: the transpose of the forward cast itself). Under torch.compile the weight itself is kept
(a parameter) and W^T cast again in the backward to the same bits (``lowbit.nn.ops``); under a
tensorwise input scale so is X^T, from X (or from what the partitioner recomputes X from), with
the forward's scale.

Under ``torch.autocast``, x is cast to the autocast dtype first and y comes out in it.
Inputs of any rank ``(..., K)`` are flattened to ``(M, K)``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from . import ops as _ops  # (also registers torch.ops.lowbit.*)
from .attention import scaled_dot_product_attention, scaled_dot_product_attention_varlen
from .spec import effective_backend

__all__ = ["linear", "scaled_dot_product_attention", "scaled_dot_product_attention_varlen"]


def _call(name: str, *args):
    """``torch.ops.lowbit.<name>(*args)`` under torch.compile (the custom op it traces), else the
    op's Python implementation directly (``ops.EAGER``: the same function, without the custom-op
    dispatch on the host)."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.lowbit, name)(*args)
    return _ops.EAGER[name](*args)


def _db(g: torch.Tensor, dtype: Optional[torch.dtype]):
    return g.sum(0, dtype=torch.float32).to(dtype) if dtype is not None else None


def _bias_grad_dtype(ctx, bias) -> Optional[torch.dtype]:
    return bias.dtype if bias is not None and ctx.needs_input_grad[2] else None


class _FP8Linear(torch.autograd.Function):
    """The graph path (torch.compile): the custom ops; the weight itself kept for the backward's
    cast of w^T (``lowbit.nn.ops``); x^T kept in FP8, or, under a tensorwise input scale, cast
    again in the backward from x by ``ops.cast_t_fusible`` (fusible torch ops: the partitioner may
    recompute x from what the other ops keep, as torchao's casts let it)."""

    @staticmethod
    def forward(ctx, x, w, bias, recipe, backend, cold, xt_format, n_state, *tensors):
        state = list(tensors[:n_state])
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        y, xt_data, xt_scale, w_scale = _call("fp8_linear_fwd", x, w, bias, state[:4], recipe, backend, need_dw,
                                              cold[0], cold[1])
        ctx.recast_fmt = xt_format if need_dw else None  # (a tensorwise input scale: the op made no x^T)
        ctx.save_for_backward(x if ctx.recast_fmt is not None else xt_data, xt_scale, w if need_dx else None,
                              w_scale)
        # the grad-scaling buffers are updated in place by the backward op: held on ctx, not
        # saved (a layer used twice per step would otherwise trip autograd's version check)
        ctx.gstate = state[4:]
        ctx.meta = (recipe, backend, x.dtype, w.dtype, need_dx, need_dw, _bias_grad_dtype(ctx, bias), cold[2])
        return y

    @staticmethod
    def backward(ctx, g):
        recipe, backend, x_dtype, w_dtype, need_dx, need_dw, db_dtype, prime_g = ctx.meta
        xt_data, xt_scale, w, w_scale = ctx.saved_tensors
        if ctx.recast_fmt is not None:  # the saved tensor is x
            xt_data = _ops.cast_t_fusible(xt_data, xt_scale, ctx.recast_fmt)
        w = g.new_empty((0,), dtype=w_dtype) if w is None else w
        dx, dw = _call("fp8_linear_bwd", g, xt_data, xt_scale, w, w_scale, ctx.gstate, recipe, backend, x_dtype,
                       w_dtype, need_dx, need_dw, prime_g)
        return (dx if need_dx else None, dw if need_dw else None, _db(g, db_dtype), None, None, None, None, None,
                *([None] * (len(ctx.needs_input_grad) - 8)))


class _FP8LinearEager(torch.autograd.Function):
    """The eager FP8 path: the ops' Python bodies on the layer's own recipe and state modules (no
    recipe string to decode, no state views to build, the transposed operands kept as FP8Tensors);
    the same kernels and numbers as the custom ops that torch.compile traces."""

    @staticmethod
    def forward(ctx, x, w, bias, lstate, backend, cold):
        recipe = lstate.recipe
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        st_x = st_w = None
        if lstate.delayed:
            st_x, st_w = lstate.input, lstate.weight
            if cold[0]:
                st_x.prime(x, force=True)
            if cold[1]:
                st_w.prime(w, force=True)
        y, ctx.xt, ctx.wt = _ops.fp8_forward(x, w, bias, st_x, st_w, recipe, backend, need_dw, need_dx)
        ctx.meta = (lstate, backend, x.dtype, w.dtype, need_dx, need_dw, _bias_grad_dtype(ctx, bias), cold[2])
        return y

    @staticmethod
    def backward(ctx, g):
        lstate, backend, x_dtype, w_dtype, need_dx, need_dw, db_dtype, prime_g = ctx.meta
        st_g = lstate.grad if lstate.delayed else None
        if prime_g:
            st_g.prime(g, force=True)
        dx, dw = _ops.fp8_backward(g, ctx.xt, ctx.wt, st_g, lstate.recipe, backend, x_dtype, w_dtype, need_dx,
                                   need_dw)
        return dx if need_dx else None, dw if need_dw else None, _db(g, db_dtype), None, None, None


class _FP4Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, recipe, backend, signs, sr):
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        y, *xt = _call("fp4_linear_fwd", x, w, bias, signs, recipe, backend, need_dw)
        ctx.save_for_backward(*xt, w if need_dx else None)  # the weight itself: its w^T is cast in the backward
        ctx.signs, ctx.sr = signs, sr  # the key's step is advanced in place by the backward op
        ctx.meta = (recipe, backend, x.dtype, w.dtype, need_dx, need_dw, _bias_grad_dtype(ctx, bias))
        return y

    @staticmethod
    def backward(ctx, g):
        recipe, backend, x_dtype, w_dtype, need_dx, need_dw, db_dtype = ctx.meta
        xq, xs, xg, w = ctx.saved_tensors
        w = g.new_empty((0,), dtype=w_dtype) if w is None else w
        dx, dw = _call("fp4_linear_bwd", g, xq, xs, xg, w, ctx.signs, ctx.sr, recipe, backend,
                       x_dtype, w_dtype, need_dx, need_dw)
        return dx if need_dx else None, dw if need_dw else None, _db(g, db_dtype), None, None, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], state, backend: str = "auto"):
    """``x W^T + b`` under ``state.recipe`` (``state``: a ``lowbit.nn.LinearState``)."""
    dev = x.device.type
    # (not torch.amp.is_autocast_available: Dynamo of torch 2.11 cannot trace it, a graph break
    # per layer; is_autocast_enabled of these two device types it folds to a constant)
    if dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev):
        x = x.to(torch.get_autocast_dtype(dev))
    lead, K = x.shape[:-1], x.shape[-1]
    # (M, K) with M spelled out, as F.linear's decomposition does, not -1: the same view node in
    # the traced graph, so where a high-precision Linear keeps x for its backward (q/k/v on one
    # input), the partitioner casts this layer's x^T again from that x instead of keeping it
    x2 = x.reshape(math.prod(lead), K)
    backend = effective_backend(backend, x.device.type)
    if state.kind == "fp4":
        recipe = state.recipe_key if torch.compiler.is_compiling() else state.recipe  # eager: nothing to decode
        y = _FP4Linear.apply(x2, weight, bias, recipe, backend, state.signs(), state.sr_key)
    else:
        cold = state.cold_start()
        # the grad is primed by the backward of this step, which runs only if autograd records it;
        # an empty batch primes neither the input nor the grad (it has no amax)
        records = torch.is_grad_enabled() and (x2.requires_grad or weight.requires_grad
                                               or (bias is not None and bias.requires_grad))
        tokens = x2.shape[0] > 0
        cold = (cold[0] and tokens, cold[1], cold[2] and records and tokens)
        if torch.compiler.is_compiling() or x2.device.type == "meta":
            tensors = state.tensors()
            r = state.recipe
            xt_format = r.format("input") if r.granularity("input").is_tensorwise else None
            y = _FP8Linear.apply(x2, weight, bias, state.recipe_key, backend, cold, xt_format, len(tensors), *tensors)
        else:
            y = _FP8LinearEager.apply(x2, weight, bias, state, backend, cold)
        state.mark_primed(cold)
    return y.reshape(*lead, y.shape[-1])
