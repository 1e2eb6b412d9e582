"""E2M1 (FP4) encoders of the quantize kernels: round half-even to the grid 0, 0.5, 1, 1.5, 2, 3,
4, 6, saturating, sign bit 8 (``lowbit.dtypes`` E2M1 codes).

* ``_e2m1_rne`` / ``_e2m1_signed``: one fp32 element, plain Triton (every backend).
* ``_e2m1_pairs``: a word of two bf16 elements and a bf16x2 power-of-two factor (MX's ``2^-k``)
  to the code byte of the pair, in PTX (sm_90: packed bf16 and 16-bit SIMD instructions, about
  eight SASS instructions an element pair fewer than two ``_e2m1_signed``); the CPU suite runs the
  same instructions in ``tests/kernels/test_e2m1_encode_ptx.py``. ``_bf16x2_amax`` reduces such
  words to a block's finite amax and NaN flag, a pair an instruction.

The rounding, for ``0 <= a <= 6`` with biased exponent ``e``: put ``u = max(e, 127)``; the grid
spacing near a is ``2^(u - 128)`` (below 2 it is 1's, 0.5), the ulp of ``m = 2^(u - 128 + P)`` in
a format with P fraction bits; ``a < 2^(u - 126) <= m / 2^(P - 2)``, so ``t = a + m`` (one RNE
add) stays in m's binade and ``k = bits(t) - bits(m)`` is ``a / 2^(u - 128)`` rounded half-even
(ties to even k: the even mantissa). The code is ``k + 2 (u - 127)``.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["E2M1_PAIR_ASM"]

_E2M1_V0 = tl.constexpr(1522532225)  # _e2m1_rne: V0 (2 - 2^23) == -(22 2^23 + 254) (mod 2^32)
_E2M1_M0 = tl.constexpr(1249902592)  # (22 - V0) 2^23 (mod 2^32)


@triton.jit
def _e2m1_rne(a):
    """E2M1 code (no sign bit) of finite ``0 <= a <= 6`` in fp32 (P = 23: ``m = 2^(u - 105)``):
    ``k + 2 (u - 127) = bits(t) - (u + 22) 2^23 + 2 u - 254``, in int32 arithmetic (mod 2^32) with
    ``v = u + V0``: ``bits(t) + v (2 - 2^23)``, ``bits(m) = v 2^23 + M0`` (``_grid_round`` with
    EMIN 0, MBITS 1 without its multiply and float -> int conversion; equal to it for every fp32
    in [0, 6] in a one-off exhaustive numpy run; the suite checks a sample dense near the grid)."""
    v = tl.maximum((a.to(tl.int32, bitcast=True) >> 23) + _E2M1_V0, 127 + _E2M1_V0)
    t = a + ((v << 23) + _E2M1_M0).to(tl.float32, bitcast=True)
    return t.to(tl.int32, bitcast=True) + v * -8388606


@triton.jit
def _e2m1_signed(y):
    """E2M1 code with sign bit 8 of fp32 ``y`` (int32): ``_e2m1_rne(min(|y|, 6))`` (saturating;
    +-inf -> +-6) + 8 sign(y). NaN gives an unspecified code: callers mask it."""
    return _e2m1_rne(tl.minimum(tl.abs(y), 6.0)) + ((y.to(tl.int32, bitcast=True) >> 31) & 1) * 8


# $1: two bf16 elements (2i low half, 2i + 1 high half); $2: bf16x2 of 2^-k in both halves (a normal
# bf16); $3 / $4: 0x7FFF7FFF / 0x00080008, or 0 / 0 for a block holding NaN (every code 0); $0: the
# code byte (element 2i low nibble) in bits 0..7, bits 8.. unspecified. Per half, with P = 7
# (``m = 2^(u - 121)``): a = min(|x| * 2^-k, 6) (the product exact where the code is not 0: a power
# of two, normal results; inf -> 6), the exponent field in place, ``max(., 127 << 7) = u << 7``,
# ``m = (u + 6) << 7``, t = a + m (RNE), code = t - m + 2 u - 254 (no borrow between the halves:
# each stays >= 0), x's sign at bits 3 / 19, then the high half's nibble moved next to the low one.
E2M1_PAIR_ASM = tl.constexpr("""{
.reg .b32 a, u, m, t, s;
and.b32 a, $1, $3;
mul.rn.bf16x2 a, a, $2;
mov.b32 s, 0x40C040C0;
min.bf16x2 a, a, s;
and.b32 u, a, 0x7F807F80;
mov.b32 s, 0x3F803F80;
max.u16x2 u, u, s;
add.u32 m, u, 0x03000300;
add.rn.bf16x2 t, a, m;
sub.u32 t, t, m;
shr.b32 u, u, 6;
add.u32 t, t, u;
sub.u32 t, t, 0x00FE00FE;
shr.b32 s, $1, 12;
and.b32 s, s, $4;
or.b32 t, t, s;
shr.b32 s, t, 12;
or.b32 $0, t, s;
}""")


@triton.jit
def _e2m1_pairs(w, p2, has_nan):
    """Code bytes (int32, bits 0..7) of the bf16 pairs ``w`` times ``p2``, 0 where ``has_nan``
    (``E2M1_PAIR_ASM``; CUDA)."""
    abs_mask = tl.where(has_nan, 0, 0x7FFF7FFF)
    sign_mask = tl.where(has_nan, 0, 0x00080008)
    return tl.inline_asm_elementwise(E2M1_PAIR_ASM, "=r,r,r,r,r", [w, p2, abs_mask, sign_mask], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _max_abs_bf16x2(a, b):
    """Per half ``max(|a|, |b|)`` of bf16x2 words, NaN ignored (the other operand wins); the
    result's sign bits are unspecified (``.xorsign``)."""
    return tl.inline_asm_elementwise("max.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _max_abs_nan_bf16x2(a, b):
    """Per half ``max(|a|, |b|)``, NaN if either is NaN (sign bits unspecified)."""
    return tl.inline_asm_elementwise("max.NaN.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                     is_pure=True, pack=1)


@triton.jit
def _fma0_bf16x2(w):
    """Per half ``fma(x, 0, x)``: x for finite x, NaN for +-inf and NaN (bf16x2, exact)."""
    return tl.inline_asm_elementwise("{.reg .b32 z;\nmov.b32 z, 0;\nfma.rn.bf16x2 $0, $1, z, $1;\n}", "=r,r", [w],
                                     dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _bf16x2_amax(w, AXIS: tl.constexpr):
    """(finite amax as fp32, holds-NaN flag) of the bf16 pairs ``w`` along ``AXIS``: the max of
    ``|fma(x, 0, x)|`` ignoring NaN (NaN when no element is finite, which the MX scale rule reads
    as 0) and a NaN-propagating max of |x|, both a pair an instruction; then the two halves."""
    fin = tl.reduce(_fma0_bf16x2(w), AXIS, _max_abs_bf16x2) & 0x7FFF7FFF
    nan = tl.reduce(w, AXIS, _max_abs_nan_bf16x2) & 0x7FFF7FFF
    amax = tl.maximum((fin << 16).to(tl.float32, bitcast=True), (fin & -65536).to(tl.float32, bitcast=True))
    return amax, tl.maximum(nan & 0xFFFF, nan >> 16) > 0x7F80
