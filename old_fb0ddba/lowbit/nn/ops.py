"""The Linear's forward and backward GEMMs as ``torch.library`` custom ops (``torch.ops.lowbit.*``).

Why custom ops: torch.compile (Dynamo) cannot trace through the FP8Tensor/FP4Tensor subclasses
and the backend registry, but it takes an opaque op with a declared schema and a fake (shape)
implementation without a graph break, and functionalizes its in-place updates of the delayed
scaling buffers, in the forward and in the backward. Eager mode calls the same ops.

Operands (x: (M, K) activations, w: (N, K) weight, g: (M, N) output gradient), each quantized
along the contraction dim of its own GEMM:

=========  =====================  ========================  =====================
GEMM       A (M-side, along K)    B (along K)               saved from forward
=========  =====================  ========================  =====================
forward    x along K              w along K, as w^T         -
dgrad      g along N              w^T along N, as w         w^T quantized along N
wgrad      g^T along M (tokens)   x^T along M, as x         x^T quantized along M
=========  =====================  ========================  =====================

FP8 recipes use ``quantize_fp8_t`` (one cast gives both orientations; tensorwise shares one scale
and one amax, so the delayed state is updated once per tensor per step). FP4 recipes (MX e2m1,
NV) quantize the transposed operands anew from the high-precision tensors; for the wgrad operands
the token dim is zero-padded to a multiple of the block (16 for NV, 32 for MX): zero rows change
neither the product nor any scale, and they let NV apply its 16x16 random Hadamard transform to
both wgrad operands along the tokens (``recipe.hadamard_wgrad``) whatever the token count.
NV gradients use stochastic rounding (``recipe.sr_grads``) from a generator seeded with
``(seed, step)``: ``step`` is a CPU int64 counter the backward op advances, so runs replay bit for
bit and a checkpoint carries it.

The ops return plain tensors (payload and scales); ``functional.py`` holds them for backward.
The fake implementations run the same code on fake tensors with the "torch" backend.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..dtypes.fp4_tensor import FP4Tensor
from ..dtypes.fp8_tensor import FP8Tensor
from ..kernels.cast import quantize_fp4, quantize_fp8, quantize_fp8_t
from ..kernels.dispatch import scaled_mm
from ..scaling.delayed import DelayedScalingState
from ..scaling.recipes import NV, Delayed
from .spec import decode

__all__ = ["fp8_linear_fwd", "fp8_linear_bwd", "fp4_linear_fwd", "fp4_linear_bwd", "sr_generator", "EAGER"]

T = torch.Tensor


def _states(recipe, tensors: List[T], roles, prime: Tuple[bool, ...], primed_by: Tuple[T, ...],
            fake: bool) -> list:
    """DelayedScalingState views over the given (amax_history, scale) pairs, one per role; the
    roles flagged in ``prime`` (the cold start, ``LinearState.cold_start``) first take their scale
    from their tensor in ``primed_by`` (skipped in shape propagation)."""
    if not isinstance(recipe, Delayed):
        return [None] * len(roles)
    if len(tensors) != 2 * len(roles):
        raise ValueError(f"Delayed scaling needs (amax_history, scale) for {roles}, got {len(tensors)} tensors")
    out = []
    for i, (role, x) in enumerate(zip(roles, primed_by)):
        st = DelayedScalingState.over(recipe, recipe.format(role), *tensors[2 * i: 2 * i + 2])
        if prime[i] and not fake:
            st.prime(x)
        out.append(st)
    return out


def _empty(x: T, dtype=torch.float32) -> T:
    return x.new_empty((0,), dtype=dtype)


def _fake_mode(*ts) -> bool:
    """Shape propagation (torch.compile's fake tensors, or meta tensors): use the torch emulation."""
    return any(isinstance(t, FakeTensor) or (isinstance(t, T) and t.device.type == "meta") for t in ts)


# ---- FP8 -------------------------------------------------------------------------------------
def _fp8_fwd(x, w, bias, state, recipe_s, backend, need_xt, need_wt, prime_x=False, prime_w=False):
    recipe = decode(recipe_s)
    fake = _fake_mode(x, w)
    if fake:
        backend = "torch"
    st_x, st_w = _states(recipe, state, ("input", "weight"), (prime_x, prime_w), (x, w), fake)
    if need_xt:
        qx, qx_t = quantize_fp8_t(x, recipe, "input", st_x, backend)
    else:
        qx, qx_t = quantize_fp8(x, recipe, "input", st_x, backend), None
    if need_wt:
        qw, qw_t = quantize_fp8_t(w, recipe, "weight", st_w, backend)
    else:
        qw, qw_t = quantize_fp8(w, recipe, "weight", st_w, backend), None
    y = scaled_mm(qx, qw.t(), x.dtype, bias, backend, fast_accum=getattr(recipe, "fast_accum_fwd", False))
    xt = (qx_t._data, qx_t._scale.clone()) if qx_t is not None else (_empty(x, torch.float8_e4m3fn), _empty(x))
    wt = (qw_t._data, qw_t._scale.clone()) if qw_t is not None else (_empty(x, torch.float8_e4m3fn), _empty(x))
    return y, *xt, *wt


@torch.library.custom_op("lowbit::fp8_linear_fwd", mutates_args=("state",))
def fp8_linear_fwd(x: T, w: T, bias: Optional[T], state: List[T], recipe: str, backend: str,
                   need_xt: bool, need_wt: bool, prime_x: bool, prime_w: bool) -> Tuple[T, T, T, T, T]:
    """``y = x w^T + bias`` -> (y, x^T data, x^T scale, w^T data, w^T scale) (empty when not needed);
    ``prime_*``: the cold start of that role's delayed scale (from the tensor's own amax)."""
    return _fp8_fwd(x, w, bias, state, recipe, backend, need_xt, need_wt, prime_x, prime_w)


fp8_linear_fwd.register_fake(_fp8_fwd)


def _fp8_bwd(g, xt_data, xt_scale, wt_data, wt_scale, state, recipe_s, backend, x_dtype, w_dtype,
             need_dx, need_dw, prime_g=False):
    recipe = decode(recipe_s)
    fake = _fake_mode(g)
    if fake:
        backend = "torch"
    (st_g,) = _states(recipe, state, ("grad",), (prime_g,), (g,), fake)
    qg, qg_t = quantize_fp8_t(g, recipe, "grad", st_g, backend)
    dx = dw = _empty(g)
    if need_dx:
        wt = FP8Tensor(wt_data, wt_scale, recipe.granularity("weight"), w_dtype)
        dx = scaled_mm(qg, wt.t(), x_dtype, None, backend)
    if need_dw:
        xt = FP8Tensor(xt_data, xt_scale, recipe.granularity("input"), x_dtype)
        dw = scaled_mm(qg_t, xt.t(), w_dtype, None, backend)
    return dx, dw


@torch.library.custom_op("lowbit::fp8_linear_bwd", mutates_args=("state",))
def fp8_linear_bwd(g: T, xt_data: T, xt_scale: T, wt_data: T, wt_scale: T, state: List[T], recipe: str,
                   backend: str, x_dtype: torch.dtype, w_dtype: torch.dtype, need_dx: bool,
                   need_dw: bool, prime_g: bool) -> Tuple[T, T]:
    """(dgrad ``g w``, wgrad ``g^T x``) from the saved FP8 operands; empty when not needed."""
    return _fp8_bwd(g, xt_data, xt_scale, wt_data, wt_scale, state, recipe, backend, x_dtype, w_dtype,
                    need_dx, need_dw, prime_g)


fp8_linear_bwd.register_fake(_fp8_bwd)


# ---- FP4 -------------------------------------------------------------------------------------
def _pad_rows(x: T, multiple: int) -> T:
    pad = (-x.shape[0]) % multiple
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _signs(recipe, signs: Optional[T]) -> Optional[T]:
    return signs if isinstance(recipe, NV) and recipe.hadamard_wgrad and signs is not None else None


def sr_generator(device: torch.device, seed: int, step: int) -> torch.Generator:
    """The generator of stochastic rounding for one backward step of one layer."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + step) % (2 ** 63))


def _fp4_fwd(x, w, bias, signs, recipe_s, backend, need_xt, need_wt):
    recipe = decode(recipe_s)
    if _fake_mode(x, w):
        backend = "torch"
    qx = quantize_fp4(x, recipe, "input", backend=backend)
    qw = quantize_fp4(w, recipe, "weight", backend=backend)
    y = scaled_mm(qx, qw.t(), x.dtype, bias, backend)
    none = (_empty(x, torch.uint8), _empty(x, qw._scale.dtype), _empty(x))
    xt = wt = none
    if need_xt:  # wgrad's B operand: x^T (K, M_pad) along the tokens
        q = quantize_fp4(_pad_rows(x, recipe.block).t().contiguous(), recipe, "input",
                         hadamard_signs=_signs(recipe, signs), backend=backend)
        xt = (q._qdata, q._scale, q._global_scale.clone())
    if need_wt:  # dgrad's B operand: w^T (K, N) along N
        q = quantize_fp4(w.t().contiguous(), recipe, "weight", backend=backend)
        wt = (q._qdata, q._scale, q._global_scale.clone())
    return y, *xt, *wt


@torch.library.custom_op("lowbit::fp4_linear_fwd", mutates_args=())
def fp4_linear_fwd(x: T, w: T, bias: Optional[T], signs: Optional[T], recipe: str, backend: str,
                   need_xt: bool, need_wt: bool) -> Tuple[T, T, T, T, T, T, T]:
    """``y = x w^T + bias`` -> (y, x^T (codes, block scales, global scale), w^T (same three))."""
    return _fp4_fwd(x, w, bias, signs, recipe, backend, need_xt, need_wt)


fp4_linear_fwd.register_fake(_fp4_fwd)


def _fp4_operand(q, s, g, recipe, role, dtype) -> FP4Tensor:
    kind = "nv" if isinstance(recipe, NV) else "mx"
    return FP4Tensor(q, s, g, recipe.granularity(role), kind, False, dtype)


def _fp4_bwd(g, xq, xs, xg, wq, ws, wg, signs, step, seed, recipe_s, backend, x_dtype, w_dtype,
             need_dx, need_dw):
    recipe = decode(recipe_s)
    fake = _fake_mode(g)
    if fake:
        backend = "torch"
    gen = None
    if isinstance(recipe, NV) and recipe.sr_grads and not fake:
        gen = sr_generator(g.device, seed, int(step.item()))
    step.add_(1)
    dx = dw = _empty(g)
    if need_dx:
        qg = quantize_fp4(g, recipe, "grad", generator=gen, backend=backend)
        dx = scaled_mm(qg, _fp4_operand(wq, ws, wg, recipe, "weight", w_dtype).t(), x_dtype, None, backend)
    if need_dw:
        qg_t = quantize_fp4(_pad_rows(g, recipe.block).t().contiguous(), recipe, "grad", generator=gen,
                            hadamard_signs=_signs(recipe, signs), backend=backend)
        dw = scaled_mm(qg_t, _fp4_operand(xq, xs, xg, recipe, "input", x_dtype).t(), w_dtype, None, backend)
    return dx, dw


@torch.library.custom_op("lowbit::fp4_linear_bwd", mutates_args=("step",))
def fp4_linear_bwd(g: T, xq: T, xs: T, xg: T, wq: T, ws: T, wg: T, signs: Optional[T], step: T, seed: int,
                   recipe: str, backend: str, x_dtype: torch.dtype, w_dtype: torch.dtype, need_dx: bool,
                   need_dw: bool) -> Tuple[T, T]:
    """(dgrad, wgrad) from the saved FP4 operands; advances the stochastic-rounding ``step``."""
    return _fp4_bwd(g, xq, xs, xg, wq, ws, wg, signs, step, seed, recipe, backend, x_dtype, w_dtype,
                    need_dx, need_dw)


fp4_linear_bwd.register_fake(_fp4_bwd)


# The Python implementations behind the ops, for eager mode: ``functional`` calls these directly
# unless torch.compile is tracing (the custom-op dispatch costs tens of microseconds a call on the
# host, which an eager step pays for every layer); the ops themselves stay what compile sees.
EAGER = {"fp8_linear_fwd": _fp8_fwd, "fp8_linear_bwd": _fp8_bwd, "fp4_linear_fwd": _fp4_fwd,
         "fp4_linear_bwd": _fp4_bwd}
