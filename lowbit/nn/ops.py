"""The Linear's forward and backward GEMMs as ``torch.library`` custom ops (``torch.ops.lowbit.*``).

Why custom ops: torch.compile (Dynamo) cannot trace through the FP8Tensor/FP4Tensor subclasses
and the backend registry, but it takes an opaque op with a declared schema and a fake (shape)
implementation without a graph break, and functionalizes its in-place updates of the delayed
scaling buffers, in the forward and in the backward. Eager mode calls the same ops.

A weight may arrive already cast, as an ``FP8Tensor`` (tensorwise or square weight blocks: what
FSDP2 all-gathers under ``lowbit.distributed.prepare(model, fp8_all_gather=True)``): the forward
uses it as it is and dgrad its transpose; the layer's weight state is then kept by the all-gather.

Operands (x: (M, K) activations, w: (N, K) weight, g: (M, N) output gradient), each quantized
along the contraction dim of its own GEMM:

=========  =====================  ========================  =====================
GEMM       A (M-side, along K)    B (along K)               its B operand
=========  =====================  ========================  =====================
forward    x along K              w along K, as w^T         -
dgrad      g along N              w^T along N, as w         w^T quantized along N
wgrad      g^T along M (tokens)   x^T along M, as x         x^T quantized along M
=========  =====================  ========================  =====================

FP8 recipes cast x with ``quantize_fp8_t`` (one cast gives both orientations; tensorwise shares
one scale and one amax, so the delayed state is updated once per tensor per step) and keep x^T in
FP8 for the wgrad. The weight: eager mode (``fp8_forward`` / ``fp8_backward``) casts it the same way
and keeps w^T; the graph ops (``fp8_linear_fwd`` / ``fp8_linear_bwd``, what torch.compile traces)
keep the weight itself (a parameter: no memory) and cast w^T again in the backward
(``_recast_t``: the same cast, under delayed scaling with the forward's scale, so the same bits),
which keeps one byte a parameter out of the compiled graph's saved values at the cost of one more
read of the weight. Under a tensorwise input scale the graph does the same for x: the forward op
casts x only, and the backward casts x^T again with the forward's scale (``cast_t_fusible``, in
torch ops inductor fuses), so the partitioner keeps x, or recomputes it from what the other ops
keep (a GELU's input), as it does for torchao's casts. The bits are the forward cast's when the
backward's x is the forward's; a recomputed x can differ from it where inductor's fused recompute
skips a rounding to bf16 the forward made (``emulate_precision_casts`` off, its default).
FP4 recipes (MX e2m1, NV) quantize the transposed operands anew from the high-precision tensors,
keeping x^T's codes for the wgrad and the weight itself (its w^T cast in the backward: the
weight's cast is deterministic, so the same codes); for the wgrad operands
the token dim is zero-padded to a multiple of the block (16 for NV, 32 for MX): zero rows change
neither the product nor any scale, and they let NV apply its 16x16 random Hadamard transform to
both wgrad operands along the tokens (``recipe.hadamard_wgrad``) whatever the token count.
NV gradients use stochastic rounding (``recipe.sr_grads``) with counter-based draws
(``lowbit.dtypes.Philox``) keyed by the layer's ``(seed, step)``, an int64 device tensor: stream 0
for dgrad's gradient operand, 1 for wgrad's; the backward op advances the step on the device, so
runs replay bit for bit, a checkpoint carries it, and a CUDA graph captures it.

The ops return plain tensors (payload and scales); ``functional.py`` holds them for backward.
The fake implementations run the same code on fake tensors with the "torch" backend.

E8M0 scales (MX recipes) cross the op boundary as their uint8 bits (``_e8m0_as_bits``,
``_bits_as_e8m0``: free views): inductor declines every pattern on a node that reads or writes
``torch.float8_e8m0fnu`` (only views, cat, clone and ``_scaled_mm`` may touch it), so the
functionalized op node of a mutating op with an E8M0 output or input is never decomposed and
compilation stops in its post-grad passes ("auto_functionalized_v2 was not removed"). Eager mode
calls the Python implementations (``EAGER``) and sees E8M0 throughout.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor

from ..dtypes.fp4_tensor import FP4Tensor
from ..dtypes.fp8_tensor import FP8Tensor
from ..dtypes.philox import Philox
from ..kernels.api import quantize_fp4, quantize_fp8, quantize_fp8_t, scaled_mm
from ..scaling.delayed import DelayedScalingState
from ..scaling.recipes import NV, Delayed, Recipe
from .spec import decode

__all__ = ["fp8_linear_fwd", "fp8_linear_bwd", "fp4_linear_fwd", "fp4_linear_bwd", "fp8_forward", "fp8_backward",
           "cast_t_fusible", "sr_draws", "EAGER"]

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
            st.prime(x, force=True)
        out.append(st)
    return out


def _empty(x: T, dtype=torch.float32) -> T:
    return x.new_empty((0,), dtype=dtype)


def _e8m0_as_bits(ts) -> tuple:
    """What an op returns: E8M0 tensors as their uint8 bits (see the module docstring)."""
    return tuple(t.view(torch.uint8) if t.dtype == torch.float8_e8m0fnu else t for t in ts)


def _bits_as_e8m0(scale: T) -> T:
    """A scale as an op takes it: uint8 bits back to E8M0 (no scale is ever uint8 otherwise)."""
    return scale.view(torch.float8_e8m0fnu) if scale.dtype == torch.uint8 else scale


def _fake_mode(*ts) -> bool:
    """Shape propagation (torch.compile's fake tensors, or meta tensors): use the torch emulation."""
    return any(isinstance(t, FakeTensor) or (isinstance(t, T) and t.device.type == "meta") for t in ts)


def _backend(backend: str, *ts) -> str:
    """The backend of one op call: the torch emulation for shape propagation and for an empty
    operand (no tokens: nothing to compute, and no K of 0 reaches a Triton GEMM), else ``backend``."""
    return "torch" if _fake_mode(*ts) or any(t.numel() == 0 for t in ts) else backend


# ---- FP8 -------------------------------------------------------------------------------------
def _contiguous_t(q: FP8Tensor) -> FP8Tensor:
    """``q^T`` with contiguous data and scales: for a tensorwise or square-block weight (the only
    kinds that arrive cast, see ``lowbit.distributed``) exactly the cast of ``w^T``."""
    t = q.t()
    return FP8Tensor(t._data.contiguous(), t._scale.contiguous(), t.block, q._orig_dtype)


def fp8_forward(x, w, bias, st_x, st_w, recipe, backend, need_xt, need_wt):
    """(y, x^T, w^T) of the forward GEMM: FP8Tensors (None when not needed); ``st_*``: the
    delayed-scaling states of input and weight (None for the other recipes)."""
    backend = _backend(backend, x, w)
    if need_xt:
        qx, qx_t = quantize_fp8_t(x, recipe, "input", st_x, backend)
    else:
        qx, qx_t = quantize_fp8(x, recipe, "input", st_x, backend), None
    if isinstance(w, FP8Tensor):  # cast before FSDP2's all-gather (lowbit.distributed)
        qw, qw_t = w, (_contiguous_t(w) if need_wt else None)
    elif need_wt:
        qw, qw_t = quantize_fp8_t(w, recipe, "weight", st_w, backend)
    else:
        qw, qw_t = quantize_fp8(w, recipe, "weight", st_w, backend), None
    y = scaled_mm(qx, qw.t(), x.dtype, bias, backend, fast_accum=getattr(recipe, "fast_accum_fwd", False))
    return y, qx_t, qw_t


def fp8_backward(g, xt, wt, st_g, recipe, backend, x_dtype, w_dtype, need_dx, need_dw):
    """(dgrad ``g w``, wgrad ``g^T x``) from the forward's transposed operands (FP8Tensors);
    ``wt`` may instead be a function that makes w^T (the graph ops' recast). The dgrad runs first
    and its FP8 operands (the cast g, and w^T when made here) are dropped before the wgrad
    allocates its output: the op's peak holds g, its two casts and w^T with dx, or g, g^T, dx and
    dw, not all of them at once."""
    backend = _backend(backend, g)
    qg, qg_t = quantize_fp8_t(g, recipe, "grad", st_g, backend)
    dx = dw = _empty(g)
    if need_dx:
        dx = scaled_mm(qg, (wt() if callable(wt) else wt).t(), x_dtype, None, backend)
    del qg, wt
    if need_dw:
        dw = scaled_mm(qg_t, xt.t(), w_dtype, None, backend)
    return dx, dw


def _fp8_fwd(x, w, bias, state, recipe_s, backend, need_xt, prime_x=False, prime_w=False):
    recipe = decode(recipe_s)
    fake = _fake_mode(x, w)
    st_x, st_w = _states(recipe, state, ("input", "weight"), (prime_x, prime_w), (x, w), fake)
    backend = _backend(backend, x, w)
    if need_xt and recipe.granularity("input").is_tensorwise:  # x^T: ``cast_t_fusible`` in the backward
        qx = quantize_fp8(x, recipe, "input", st_x, backend)
        xt = (_empty(x, torch.float8_e4m3fn), qx._scale.clone())
    elif need_xt:
        qx, qx_t = quantize_fp8_t(x, recipe, "input", st_x, backend)
        xt = (qx_t._data, qx_t._scale.clone())
    else:
        qx, xt = quantize_fp8(x, recipe, "input", st_x, backend), (_empty(x, torch.float8_e4m3fn), _empty(x))
    qw = w if isinstance(w, FP8Tensor) else quantize_fp8(w, recipe, "weight", st_w, backend)
    y = scaled_mm(qx, qw.t(), x.dtype, bias, backend, fast_accum=getattr(recipe, "fast_accum_fwd", False))
    w_scale = qw._scale.clone() if st_w is not None else _empty(x)  # the backward recasts w with it
    return y, *xt, w_scale


@torch.library.custom_op("lowbit::fp8_linear_fwd", mutates_args=("state",))
def fp8_linear_fwd(x: T, w: T, bias: Optional[T], state: List[T], recipe: str, backend: str,
                   need_xt: bool, prime_x: bool, prime_w: bool) -> Tuple[T, T, T, T]:
    """``y = x w^T + bias`` -> (y, x^T data, x^T scale (both empty when not needed; under a
    tensorwise input scale the data is empty and the scale is x's: the graph casts x^T again in the
    backward, ``cast_t_fusible``), the delayed scale the weight's cast used (empty for the other
    recipes)); ``prime_*``: the cold start of that role's delayed scale (from the tensor's own amax)."""
    return _graph_fp8_fwd(x, w, bias, state, recipe, backend, need_xt, prime_x, prime_w)


def _graph_fp8_fwd(*args):
    return _e8m0_as_bits(_fp8_fwd(*args))


fp8_linear_fwd.register_fake(_graph_fp8_fwd)


def cast_t_fusible(x: T, scale: T, fmt) -> T:
    """``cast_fmt(fp32(x) / scale)^T`` (the contract of ``lowbit.dtypes.quantize``: RNE, saturating,
    NaN stays NaN (of either sign), the sign of zero kept), contiguous, in pointwise torch ops that
    inductor fuses into x's producer, so the min-cut partitioner may recompute x in the backward
    rather than keep it.
    The quotient is taken in float64 and rounded to float32: double rounding is innocuous for a
    division when 53 >= 2 * 24 + 2 (Figueroa), so it is the IEEE float32 quotient bit for bit
    whatever division inductor emits for float32 (Triton's ``/`` is approximate)."""
    y = (x.double() / scale.double()).float().clamp(-fmt.max, fmt.max)
    return y.to(fmt.torch_dtype).t().contiguous()


def _recast_t(t, recipe, role: str, scale: T, backend: str) -> FP8Tensor:
    """``t^T`` cast as ``quantize_fp8_t`` casts it, under delayed scaling with ``scale`` (the
    forward's) on a throwaway history: the forward's cast of ``t`` transposed, bit for bit."""
    st = None
    if isinstance(recipe, Delayed):
        st = DelayedScalingState.over(recipe, recipe.format(role), scale.new_zeros(recipe.history_len),
                                      scale.clone())
    return quantize_fp8_t(t, recipe, role, st, backend)[1]


def _fp8_bwd(g, xt_data, xt_scale, w, w_scale, state, recipe_s, backend, x_dtype, w_dtype, need_dx, need_dw,
             prime_g=False):
    recipe = decode(recipe_s)
    (st_g,) = _states(recipe, state, ("grad",), (prime_g,), (g,), _fake_mode(g))
    backend = _backend(backend, g)
    wt = xt = None
    if need_dx:  # made inside fp8_backward, after g's cast, and dropped after the dgrad
        wt = (functools.partial(_contiguous_t, w) if isinstance(w, FP8Tensor)
              else functools.partial(_recast_t, w, recipe, "weight", w_scale, backend))
    if need_dw:
        xt = FP8Tensor(xt_data, xt_scale, recipe.granularity("input"), x_dtype)
    return fp8_backward(g, xt, wt, st_g, recipe, backend, x_dtype, w_dtype, need_dx, need_dw)


@torch.library.custom_op("lowbit::fp8_linear_bwd", mutates_args=("state",))
def fp8_linear_bwd(g: T, xt_data: T, xt_scale: T, w: T, w_scale: T, state: List[T], recipe: str, backend: str,
                   x_dtype: torch.dtype, w_dtype: torch.dtype, need_dx: bool, need_dw: bool,
                   prime_g: bool) -> Tuple[T, T]:
    """(dgrad ``g w``, wgrad ``g^T x``) from the saved x^T and the weight (module docstring); empty
    when not needed."""
    return _graph_fp8_bwd(g, xt_data, xt_scale, w, w_scale, state, recipe, backend, x_dtype, w_dtype, need_dx,
                          need_dw, prime_g)


def _graph_fp8_bwd(g, xt_data, xt_scale, *rest):
    return _fp8_bwd(g, xt_data, _bits_as_e8m0(xt_scale), *rest)


fp8_linear_bwd.register_fake(_graph_fp8_bwd)


# ---- FP4 -------------------------------------------------------------------------------------
def _pad_rows(x: T, multiple: int) -> T:
    pad = (-x.shape[0]) % multiple
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _signs(recipe, signs: Optional[T]) -> Optional[T]:
    return signs if isinstance(recipe, NV) and recipe.hadamard_wgrad and signs is not None else None


def sr_draws(key: T) -> Tuple[Philox, Philox]:
    """The stochastic roundings of one backward step of one layer: dgrad's and wgrad's gradient
    operands, keyed by the layer's ``(seed, step)``."""
    return Philox(key, 0), Philox(key, 1)


def _recipe(r) -> Recipe:
    """The recipe of an op call: its string under torch.compile (the op schema), the layer's recipe
    object itself on the eager path (``functional.linear``), which then decodes nothing."""
    return decode(r) if isinstance(r, str) else r


def _fp4_fwd(x, w, bias, signs, recipe_s, backend, need_xt):
    recipe = _recipe(recipe_s)
    backend = _backend(backend, x, w)
    qx = quantize_fp4(x, recipe, "input", backend=backend)
    qw = quantize_fp4(w, recipe, "weight", backend=backend)
    y = scaled_mm(qx, qw.t(), x.dtype, bias, backend)
    xt = (_empty(x, torch.uint8), _empty(x, qw._scale.dtype), _empty(x))
    if need_xt:  # wgrad's B operand: x^T (K, M_pad) along the tokens
        q = quantize_fp4(_pad_rows(x, recipe.block).t().contiguous(), recipe, "input",
                         hadamard_signs=_signs(recipe, signs), backend=backend)
        xt = (q._qdata, q._scale, q._global_scale.clone())
    return y, *xt


@torch.library.custom_op("lowbit::fp4_linear_fwd", mutates_args=())
def fp4_linear_fwd(x: T, w: T, bias: Optional[T], signs: Optional[T], recipe: str, backend: str,
                   need_xt: bool) -> Tuple[T, T, T, T]:
    """``y = x w^T + bias`` -> (y, x^T (codes, block scales, global scale)); the backward casts
    w^T from the weight itself."""
    return _graph_fp4_fwd(x, w, bias, signs, recipe, backend, need_xt)


def _graph_fp4_fwd(*args):
    return _e8m0_as_bits(_fp4_fwd(*args))


fp4_linear_fwd.register_fake(_graph_fp4_fwd)


def _fp4_operand(q, s, g, recipe, role, dtype) -> FP4Tensor:
    kind = "nv" if isinstance(recipe, NV) else "mx"
    return FP4Tensor(q, s, g, recipe.granularity(role), kind, False, dtype)


def _fp4_bwd(g, xq, xs, xg, w, signs, sr, recipe_s, backend, x_dtype, w_dtype, need_dx, need_dw):
    recipe = _recipe(recipe_s)
    backend = _backend(backend, g)
    gen_dx, gen_dw = sr_draws(sr) if sr is not None else (None, None)  # NV's sr_grads: LinearState.sr_key
    dx = dw = _empty(g)
    if need_dx:
        qg = quantize_fp4(g, recipe, "grad", generator=gen_dx, backend=backend)
        qw_t = quantize_fp4(w.t().contiguous(), recipe, "weight", backend=backend)  # dgrad's B: w^T along N
        dx = scaled_mm(qg, qw_t.t(), x_dtype, None, backend)
        del qg, qw_t  # (before the wgrad's cast and output)
    if need_dw:
        qg_t = quantize_fp4(_pad_rows(g, recipe.block).t().contiguous(), recipe, "grad", generator=gen_dw,
                            hadamard_signs=_signs(recipe, signs), backend=backend)
        dw = scaled_mm(qg_t, _fp4_operand(xq, xs, xg, recipe, "input", x_dtype).t(), w_dtype, None, backend)
    if sr is not None:
        sr[1:].add_(1)  # after both casts have read it (stream order): the next backward draws anew
    return dx, dw


@torch.library.custom_op("lowbit::fp4_linear_bwd", mutates_args=("sr",))
def fp4_linear_bwd(g: T, xq: T, xs: T, xg: T, w: T, signs: Optional[T], sr: Optional[T], recipe: str,
                   backend: str, x_dtype: torch.dtype, w_dtype: torch.dtype, need_dx: bool,
                   need_dw: bool) -> Tuple[T, T]:
    """(dgrad, wgrad) from the saved FP4 x^T and the weight (w^T cast here, as the forward would
    have: the weight's cast is deterministic); advances the stochastic-rounding key ``sr``'s step
    (None: the recipe has no stochastic rounding)."""
    return _graph_fp4_bwd(g, xq, xs, xg, w, signs, sr, recipe, backend, x_dtype, w_dtype, need_dx, need_dw)


def _graph_fp4_bwd(g, xq, xs, xg, *rest):
    return _fp4_bwd(g, xq, _bits_as_e8m0(xs), xg, *rest)


fp4_linear_bwd.register_fake(_graph_fp4_bwd)


# The Python implementations behind the ops, for eager mode: ``functional`` calls these directly
# unless torch.compile is tracing (the custom-op dispatch costs tens of microseconds a call on the
# host, which an eager step pays for every layer); the ops themselves stay what compile sees.
EAGER = {"fp8_linear_fwd": _fp8_fwd, "fp8_linear_bwd": _fp8_bwd, "fp4_linear_fwd": _fp4_fwd,
         "fp4_linear_bwd": _fp4_bwd}
