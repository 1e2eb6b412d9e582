"""FP4 GEMMs on Hopper (no FP4 tensor cores): FP4 decoded to bf16 in the kernel, exactly.

Operands are ``FP4Tensor``s packed along K (A: ``(M, K)``; B: ``weight.t()``, storage ``(N, K/2)``).
An element is ``a_k = e2m1_k * s_b(k)`` (``s_b``: the UE4M3 or E8M0 scale of its block), times the
fp32 tensor scale ``g`` for NV.

* **FP4 x FP4, NV or MX** (``_fp4_mm_kernel``): both tiles are decoded straight to bf16 and
  accumulated once in fp32: ``C = (sum_k a_k b_k) (* gA gB for NV) (+ bias)``. The decode is
  exact: NV ``e2m1 * ue4m3`` has at most 6 significant bits in ``[2^-10, 2688]``; MX
  ``e2m1 * 2^k`` is a 2-bit significand, exact in bf16 (subnormals included) wherever it is finite
  in fp32, so MX needs no promotion per 32-block (the scale is inside the operand). Out of range
  (E8M0 ``k = 126, 127`` with ``|e2m1| >= 4, 2``) the operand is inf, and a NaN scale (0xFF) gives
  NaN: exactly what the torch backend's fp32 dequantization gives. A K step is ONE ``tl.dot``
  (``_decode_cat``, slot-major K order, see below).
* **Weight-only** (``weight_only``: ``_wo_kernel``): bf16 (or fp16, NV only) activations
  times an NV or MX FP4 weight as ``C^T = W' @ X^T`` (the decoded weight is the wgmma register
  operand), K split over ``SPLIT_K`` programs whose partials the last-arriving program of each tile
  adds in split order (deterministic, one launch).
* All loads stream: with ``EVEN_K`` (K a multiple of the K tile) no load is masked, so the packed
  words and activations become asynchronous copies in the pipeline, and the block scales (too
  narrow for those copies) are prefetched one K step ahead by hand.

Decoding works on 32-bit words of 8 packed elements: ``W'_j`` holds element ``j`` of every word
(elements ``8w + j``), and ``sum_k a_k b_k = sum_j sum_w a_(8w+j) b_(8w+j)``: the same products in
another summation order, so no shuffle is ever needed. The 8 slots are concatenated along K
(column ``j WORDS + w`` = element ``8w + j``, for both operands alike): in the wgmma register
layout that only renames registers. On CUDA (sm_90, bf16) the decode is PTX on packed registers
(``_decode_words``): the nibble ``s.eem`` placed at bf16 bits 15 / 8..6 is ``e2m1 * 2^-126``,
then one ``mul.bf16x2`` by the scale (NV folds ``2^118`` into the UE4M3 scale and ``2^8`` into the
epilogue; MX multiplies by ``2^126`` first); both are exact (IEEE: overflow gives inf, NaN stays
NaN). The portable path (interpreter, sm_89, fp16) computes the same values as
``fp32(e2m1) * fp32(scale)``.

Error bound (fp32 accumulation, any summation order and K split): ``|C - C*| <= gamma_(K + 3)
sum_k |a_k b_k|`` against the exact product ``C*`` of the dequantized operands (``gemm_bound`` with
one chunk); with a bias or a bf16/fp16 output, one more rounding each.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..jit_common import _store_tile, _tile_coords
from .decode import _decode_cat, _scale_bytes, _word_scales, _words

__all__ = ["SCAN_SPECS"]


@triton.jit
def _fp4_mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, sa_ptr, sb_ptr, ga_ptr, gb_ptr, M, N, K,
                   stride_a, stride_b, stride_sa, stride_sb, stride_cm, stride_cn,
                   SBLOCK: tl.constexpr, SA_ROWS: tl.constexpr, SB_ROWS: tl.constexpr, MX: tl.constexpr,
                   HAS_BIAS: tl.constexpr, ASM: tl.constexpr, EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """FP4 x FP4 (NV or MX): both tiles decoded straight to bf16 (``e2m1 * s`` is exact in bf16 for
    UE4M3 and for every E8M0 ``s`` whose product is finite in fp32), one dot per K step into one
    fp32 accumulator, NV tensor scales last. MX needs no per-block promotion: the E8M0 scale is
    inside the operand. ``e2m1 * 2^k`` past fp32's range is inf, a NaN scale (0xFF) gives NaN: what the
    torch backend's fp32 dequantization gives."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    WORDS: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # scales are prefetched one K step ahead by hand: tiles of 1-2 bytes per thread are too narrow
    # for the pipeliner's asynchronous copies and would stall every step (the words are pipelined)
    sa_next = _scale_bytes(sa_ptr, rows, stride_sa, 0, K, WORDS, SBLOCK, SA_ROWS, EVEN_K)
    sb_next = _scale_bytes(sb_ptr, cols, stride_sb, 0, K, WORDS, SBLOCK, SB_ROWS, EVEN_K)
    for k0 in range(0, K, BLOCK_K):
        sa = sa_next
        sb = sb_next
        k_next = tl.minimum(k0 + BLOCK_K, K - BLOCK_K) if EVEN_K else k0 + BLOCK_K  # stays in bounds
        sa_next = _scale_bytes(sa_ptr, rows, stride_sa, k_next, K, WORDS, SBLOCK, SA_ROWS, EVEN_K)
        sb_next = _scale_bytes(sb_ptr, cols, stride_sb, k_next, K, WORDS, SBLOCK, SB_ROWS, EVEN_K)
        wa = _words(a_ptr, rows, stride_a, k0, K, WORDS, EVEN_K)
        wb = _words(b_ptr, cols, stride_b, k0, K, WORDS, EVEN_K)
        a = _decode_cat(wa, _word_scales(sa, WORDS, SBLOCK, MX), MX, ASM, DOT_DTYPE, BLOCK_M, WORDS)
        b = _decode_cat(wb, _word_scales(sb, WORDS, SBLOCK, MX), MX, ASM, DOT_DTYPE, BLOCK_N, WORDS)
        acc = tl.dot(a, tl.trans(b), acc)
    if not MX:
        g = tl.load(ga_ptr) * tl.load(gb_ptr)
        if ASM:
            acc = acc * 65536.0  # both operands came out times 2^-8 (exact)
        acc = acc * g
    _store_tile(c_ptr, bias_ptr, acc, off_m, off_n, M, N, stride_cm, stride_cn, HAS_BIAS, BLOCK_M, BLOCK_N)


# ---- sm_90 compile configurations for fma_guard ------------------------------------------------------
_OUT = {"stride_cm": "i32", "stride_cn": "i32"}
_MM_SIG = {"a_ptr": "*i32", "b_ptr": "*i32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "sa_ptr": "*u8", "sb_ptr": "*u8",
           "ga_ptr": "*fp32", "gb_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_a": "i32",
           "stride_b": "i32", "stride_sa": "i32", "stride_sb": "i32", **_OUT}
SCAN_SPECS = (
    {"kernel": _fp4_mm_kernel, "num_warps": 8, "num_stages": 3, "signature": _MM_SIG,  # MX, streamed
     "constexprs": dict(SBLOCK=32, SA_ROWS=1, SB_ROWS=1, MX=True, HAS_BIAS=True, ASM=True, EVEN_K=True,
                        DOT_DTYPE=tl.bfloat16, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
    {"kernel": _fp4_mm_kernel, "num_warps": 8, "num_stages": 3, "signature": _MM_SIG,  # NV, masked K
     "constexprs": dict(SBLOCK=16, SA_ROWS=1, SB_ROWS=16, MX=False, HAS_BIAS=True, ASM=True, EVEN_K=False,
                        DOT_DTYPE=tl.bfloat16, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
)

