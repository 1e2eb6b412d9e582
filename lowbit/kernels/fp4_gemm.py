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
* **Weight-only** (``_fp4_weight_only_kernel``): bf16 (or fp16, NV only) activations times an NV
  or MX FP4 weight as ``C^T = W' @ X^T`` (the decoded weight is the wgmma register operand), K
  split over ``SPLIT_K`` programs; ``_splitk_reduce_kernel`` adds the fp32 partials in split order
  (deterministic), then applies the tensor scale and bias. The activation tile is one contiguous
  load per K step.
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

from typing import Optional

import torch
import triton
import triton.language as tl

from .gemm import _e8m0_to_fp32, _store_dtype, _store_tile, _tile_coords, autotune_choices
from .interpret import interpreting, runnable

__all__ = ["fp4_scaled_mm", "fp4_weight_only_mm", "fp4_support", "weight_only_support", "last_config",
           "SCAN_SPECS"]


# ---- decoding --------------------------------------------------------------------------------------
@triton.jit
def _e2m1_to_fp32(c):
    """E2M1 code (0..15) -> fp32 value, exactly (bits built from the code)."""
    c = c.to(tl.int32)
    m = c & 7
    bits = tl.where(m >= 2, (m + 252) << 22, tl.where(m == 1, 0x3F000000, 0))  # 1.0 = 254 << 22
    return (bits | ((c & 8) << 28)).to(tl.float32, bitcast=True)


def _asm_byte(b: int) -> str:
    """PTX for byte ``b`` of the words ($8, $9): elements 2b (low nibble) and 2b+1 (high nibble)
    as bf16 pairs (one lane per word), ``e2m1 * 2^-126`` times the scale pair in ``s``."""
    return (f"prmt.b32 d, $8, $9, {0x4400 + 0x1111 * b:#x};\n"  # word bytes b -> bits 8..15, 24..31
            "and.b32 x, d, 0x70007000; shr.b32 x, x, 6; and.b32 y, d, 0x80008000; or.b32 x, x, y;\n"
            f"mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 ${2 * b + 1}, x, $10;\n"
            "shl.b32 d, d, 4;\n"
            "and.b32 x, d, 0x70007000; shr.b32 x, x, 6; and.b32 y, d, 0x80008000; or.b32 x, x, y;\n"
            f"mul.rn.bf16x2 x, x, c; mul.rn.bf16x2 ${2 * b}, x, $10;\n")


def _asm(prescale: int) -> str:
    body = "".join(_asm_byte(b) for b in range(4))
    if prescale == 0x3F803F80:  # x * 1.0: drop the multiply
        body = body.replace("mul.rn.bf16x2 x, x, c; ", "")
    return "{\n.reg .b32 d, x, y, c;\n" + f"mov.b32 c, {prescale:#x};\n" + body + "}"


_ASM_NV = tl.constexpr(_asm(0x3F803F80))  # scale pre-multiplied by 2^118: result e2m1 * s * 2^-8
_ASM_MX = tl.constexpr(_asm(0x7E807E80))  # x 2^126 (exact), then x 2^k: result e2m1 * 2^k


@triton.jit
def _decode_words(w, s, MX: tl.constexpr, ASM: tl.constexpr, DTYPE: tl.constexpr):
    """Element j (0..7) of each packed word of ``w`` (int32) times the word's scale ``s`` (fp32):
    8 tensors of ``w``'s shape. ASM (bf16, CUDA): NV values come out times 2^-8."""
    if ASM:
        if MX:
            s2 = s.to(tl.bfloat16)  # 2^k: exact in bf16
            asm: tl.constexpr = _ASM_MX
        else:
            s2 = (s * 3.3231458909047650e35).to(tl.bfloat16)  # UE4M3 * 2^118: exact
            asm: tl.constexpr = _ASM_NV
        return tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [w, s2],
                                         dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)
    else:
        return ((_e2m1_to_fp32(w & 15) * s).to(DTYPE), (_e2m1_to_fp32((w >> 4) & 15) * s).to(DTYPE),
                (_e2m1_to_fp32((w >> 8) & 15) * s).to(DTYPE), (_e2m1_to_fp32((w >> 12) & 15) * s).to(DTYPE),
                (_e2m1_to_fp32((w >> 16) & 15) * s).to(DTYPE), (_e2m1_to_fp32((w >> 20) & 15) * s).to(DTYPE),
                (_e2m1_to_fp32((w >> 24) & 15) * s).to(DTYPE), (_e2m1_to_fp32((w >> 28) & 15) * s).to(DTYPE))


@triton.jit
def _scale_bytes(s_ptr, rows, stride_s, k0, K, WORDS: tl.constexpr, SBLOCK: tl.constexpr,
                 SROWS: tl.constexpr, EVEN_K: tl.constexpr):
    """Block-scale bytes ``(R, WORDS / (SBLOCK / 8))`` of ``rows`` for the K tile starting at ``k0``."""
    blk = k0 // SBLOCK + tl.arange(0, WORDS // (SBLOCK // 8))
    ptrs = s_ptr + (rows // SROWS)[:, None] * stride_s + blk[None, :]
    if EVEN_K:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=(blk < tl.cdiv(K, SBLOCK))[None, :], other=0)


@triton.jit
def _word_scales(s, WORDS: tl.constexpr, SBLOCK: tl.constexpr, MX: tl.constexpr):
    """Scale bytes (E8M0 or UE4M3) -> fp32, broadcast over each block's ``SBLOCK / 8`` words."""
    PER: tl.constexpr = SBLOCK // 8
    if MX:
        s = _e8m0_to_fp32(s)
    else:  # UE4M3 bytes
        s = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], WORDS // PER, PER)), (s.shape[0], WORDS))


@triton.jit
def _words(q_ptr, rows, stride_q, k0, K, WORDS: tl.constexpr, EVEN_K: tl.constexpr):
    """Packed words ``(R, WORDS)`` of ``rows`` from element ``k0`` (EVEN_K: the tile lies inside K,
    no masks, so the load is contiguous and the pipeliner makes it an asynchronous copy)."""
    wi = k0 // 8 + tl.arange(0, WORDS)
    if EVEN_K:
        return tl.load(q_ptr + rows[:, None] * stride_q + wi[None, :])
    else:
        return tl.load(q_ptr + rows[:, None] * stride_q + wi[None, :], mask=(wi < K // 8)[None, :], other=0)


@triton.jit
def _decode_cat(w, s, MX: tl.constexpr, ASM: tl.constexpr, DTYPE: tl.constexpr, R: tl.constexpr,
                WORDS: tl.constexpr):
    """Decoded words ``(R, WORDS)`` as one ``(R, 8 WORDS)`` operand in *slot-major* K order:
    column ``j WORDS + w`` holds element ``8w + j``. In the wgmma register layout this
    concatenation only renames registers (no shuffle, no shared memory: checked in the sm_90
    TTGIR), so a K step is one ``tl.dot`` instead of 8 dots each waited for."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _decode_words(w, s, MX, ASM, DTYPE)
    t = tl.join(tl.join(tl.join(t0, t4), tl.join(t2, t6)), tl.join(tl.join(t1, t5), tl.join(t3, t7)))
    t = tl.reshape(t, (R, WORDS, 8))  # [r, w, 4a + 2b + c] = t_(4a+2b+c)[r, w]
    return tl.reshape(tl.permute(t, (0, 2, 1)), (R, 8 * WORDS))


@triton.jit
def _x_tile(x_ptr, xrows, stride_xm, k0, K, WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
            EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """``X[m-tile, k0 : k0 + 8 WORDS]`` in one contiguous load, in the slot-major K order of
    ``_decode_cat`` (column ``j WORDS + w`` = element ``k0 + 8w + j``)."""
    wi = tl.arange(0, WORDS)
    j = tl.arange(0, 8)
    ptrs = x_ptr + xrows[:, None, None] * stride_xm + (k0 + 8 * wi)[None, :, None] + j[None, None, :]
    if EVEN_K:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=(k0 + 8 * wi < K)[None, :, None], other=0.0)
    return tl.reshape(tl.permute(x.to(DOT_DTYPE), (0, 2, 1)), (BLOCK_M, 8 * WORDS))


# ---- kernels ---------------------------------------------------------------------------------------
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


@triton.jit
def _fp4_weight_only_kernel(x_ptr, w_ptr, s_ptr, g_ptr, c_ptr, part_ptr, bias_ptr, M, N, K,
                            stride_xm, stride_w, stride_s, stride_cm, stride_cn,
                            SBLOCK: tl.constexpr, SROWS: tl.constexpr, MX: tl.constexpr,
                            SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr,
                            EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """``C^T[n-tile, m-tile] = W'[n-tile, k-range] @ X[m-tile, k-range]^T`` for one K split, one dot
    per K step (the activation tile is one contiguous load; EVEN_K drops every mask, so words,
    scales and activations all stream).

    SPLIT_K == 1: epilogue (tensor scale, bias, cast) and store C. Else: fp32 partials into
    ``part[pid_k]`` (shape (SPLIT_K, M, N)) for ``_splitk_reduce_kernel``. DOT_DTYPE: X's dtype
    (fp32 under the interpreter, whose bf16 ``tl.dot`` is wrong in triton 3.9)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    off_n = pid_n * BLOCK_N
    off_m = tl.program_id(2) * BLOCK_M
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    xrows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    WORDS: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # clamped: a split starting past K (a forced split_k) runs no step but must not read past K
    k_first = tl.minimum(k_lo, K - BLOCK_K) if EVEN_K else k_lo
    s_next = _scale_bytes(s_ptr, cols, stride_s, k_first, K, WORDS, SBLOCK, SROWS, EVEN_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        s = s_next  # prefetched one K step ahead (see _fp4_mm_kernel)
        k_next = tl.minimum(k0 + BLOCK_K, K - BLOCK_K) if EVEN_K else k0 + BLOCK_K
        s_next = _scale_bytes(s_ptr, cols, stride_s, k_next, K, WORDS, SBLOCK, SROWS, EVEN_K)
        w = _words(w_ptr, cols, stride_w, k0, K, WORDS, EVEN_K)
        wc = _decode_cat(w, _word_scales(s, WORDS, SBLOCK, MX), MX, ASM, DOT_DTYPE, BLOCK_N, WORDS)
        x = _x_tile(x_ptr, xrows, stride_xm, k0, K, WORDS, BLOCK_M, EVEN_K, DOT_DTYPE)
        acc = tl.dot(wc, tl.trans(x), acc)
    if ASM and not MX:
        acc = acc * 256.0  # undo the 2^-8 of the NV decode (exact)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    if SPLIT_K == 1:
        out = acc * tl.load(g_ptr)
        if HAS_BIAS:
            out = out + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
        tl.store(c_ptr + offs_m[None, :] * stride_cm + offs_n[:, None] * stride_cn,
                 out.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(part_ptr + pid_k * M * N + offs_m[None, :] * N + offs_n[:, None], acc, mask=mask)


@triton.jit
def _splitk_reduce_kernel(part_ptr, g_ptr, c_ptr, bias_ptr, M, N, stride_cm, stride_cn,
                          SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """``C = (sum_s part[s]) * g (+ bias)``: partials added in split order (deterministic)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    out = acc * tl.load(g_ptr)
    n = offs % N
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + (offs // N) * stride_cm + n * stride_cn, out.to(c_ptr.dtype.element_ty), mask=mask)


# ---- autotuning (H200) -----------------------------------------------------------------------------
def _cfg(warps, stages, **kw):
    return triton.Config(kw, num_warps=warps, num_stages=stages)


# BLOCK_K = 128 keeps the dequantized A tile at 32-64 registers a thread (ptxas, sm_90a: 128x128
# with 8 warps 187 registers, 128x256 255, no spills); it holds whole scale blocks (16 .. 128).
_MM_CONFIGS = [_cfg(8, 3, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8),
               _cfg(8, 3, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8),
               _cfg(8, 4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8),
               _cfg(4, 4, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)]
# weight-only: BLOCK_M is the MMA's N (16 covers decode); decode shapes stream the weight and
# SPLIT_K x N / BLOCK_N programs fill the 132 SMs.
_WO_CONFIGS = [_cfg(4, 4, BLOCK_N=128, BLOCK_M=16, BLOCK_K=128, SPLIT_K=4),
               _cfg(4, 4, BLOCK_N=64, BLOCK_M=16, BLOCK_K=256, SPLIT_K=4),
               _cfg(4, 3, BLOCK_N=128, BLOCK_M=16, BLOCK_K=256, SPLIT_K=2),
               _cfg(4, 4, BLOCK_N=128, BLOCK_M=16, BLOCK_K=128, SPLIT_K=8),
               _cfg(4, 4, BLOCK_N=64, BLOCK_M=64, BLOCK_K=128, SPLIT_K=2),
               _cfg(8, 3, BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, SPLIT_K=1),
               _cfg(8, 3, BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, SPLIT_K=2),
               _cfg(4, 4, BLOCK_N=64, BLOCK_M=128, BLOCK_K=128, SPLIT_K=1)]
_WO_MAX_SPLIT = max(c.kwargs["SPLIT_K"] for c in _WO_CONFIGS)


def _prune_mn(configs, named_args, **kw):
    """Tiles no larger than the problem (the smallest configuration always stays)."""
    M, N = named_args["M"], named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, triton.next_power_of_2(M))
            and c.kwargs["BLOCK_N"] <= max(64, triton.next_power_of_2(N))]
    return keep or configs[-1:]


def _prune_wo(configs, named_args, **kw):
    """Decode (M <= 16): BLOCK_M = 16 with split-K; M <= 64: BLOCK_M = 64; larger: 128. Each split
    keeps at least two BLOCK_K steps; BLOCK_K holds whole scale blocks."""
    M, K = named_args["M"], named_args["K"]
    sblock = kw.get("SBLOCK", named_args.get("SBLOCK", 16))  # constexprs come as keywords
    want = 16 if M <= 16 else 64 if M <= 64 else 128
    keep = [c for c in configs if c.kwargs["BLOCK_M"] == want and c.kwargs["BLOCK_K"] % sblock == 0
            and K >= 2 * c.kwargs["SPLIT_K"] * c.kwargs["BLOCK_K"]]
    return keep or [_cfg(4, 4, BLOCK_N=128, BLOCK_M=min(want, 64), BLOCK_K=128, SPLIT_K=1)]


_EVEN_K = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
_MM_TUNED = triton.autotune(_MM_CONFIGS, key=["M", "N", "K", "SBLOCK", "SA_ROWS", "SB_ROWS", "MX", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": _prune_mn})(_EVEN_K(_fp4_mm_kernel))
_WO_TUNED = triton.autotune(_WO_CONFIGS, key=["M", "N", "K", "SBLOCK", "SROWS", "MX", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": _prune_wo})(_EVEN_K(_fp4_weight_only_kernel))


def last_config() -> dict:
    """Configurations the autotuners chose, per kernel and (M, N, K)."""
    return autotune_choices({"fp4_mm": _MM_TUNED, "fp4_weight_only": _WO_TUNED})


# ---- launchers -------------------------------------------------------------------------------------
def _storage(t):
    """(packed words (R, K/8) int32, block scale bytes (R/rows, K/cols), block rows, block cols),
    in storage orientation (along K)."""
    q, s = t._qdata, t._scale.view(torch.uint8)  # E8M0 / UE4M3 bytes, decoded in the kernel
    if q.stride(-1) != 1 or q.stride(0) % 4 or q.data_ptr() % 4:
        q = q.contiguous()
    if s.stride(-1) != 1:
        s = s.contiguous()
    return q.view(torch.int32), s, t._block.rows, t._block.cols


def _fp4_layout(t, name: str) -> Optional[str]:
    from ..dtypes.fp4_tensor import FP4Tensor
    if not isinstance(t, FP4Tensor):
        return f"{name} is a {type(t).__name__}, not an FP4Tensor"
    if t.dim() != 2:
        return f"{name} must be 2-D"
    want_t = name == "b"
    if t._transposed != want_t:
        return (f"FP4 operand {name} must be packed along K ({'weight.t()' if want_t else 'activations'})")
    rows, cols = t._block.rows, t._block.cols
    if t.kind == "nv" and (cols != 16 or rows not in (1, 16)):
        return "NV blocks must be 1x16 or 16x16 along K"
    if t.kind == "mx" and (rows != 1 or cols not in (32, 64, 128)):
        return "MX blocks must be 1 x 32, 64 or 128 along K"
    return None


def _use_asm(device, dtype) -> bool:
    return (not interpreting()) and device.type == "cuda" and dtype == torch.bfloat16 \
        and torch.cuda.get_device_capability(device) >= (9, 0)


def fp4_support(a, b) -> Optional[str]:
    """None when ``fp4_scaled_mm`` takes these operands, else why not."""
    for t, name in ((a, "a"), (b, "b")):
        why = _fp4_layout(t, name)
        if why:
            return why
    if a.kind != b.kind:
        return "FP4 operands of different kinds (NV x MX)"
    if a.kind == "mx" and a._block.cols != b._block.cols:
        return "MX operands with different block sizes"
    return _kn_reason(a, b)


def weight_only_support(a, b) -> Optional[str]:
    """None when ``fp4_weight_only_mm`` takes activations ``a`` and the FP4 weight ``b``."""
    why = _fp4_layout(b, "b")
    if why:
        return why
    if a.dtype not in (torch.bfloat16, torch.float16):
        return "weight-only FP4 GEMM takes bf16/fp16 activations"
    if a.dtype == torch.float16 and b.kind == "mx":
        return "MX weight-only GEMM takes bf16 activations (E8M0 scales exceed fp16's range)"
    return _kn_reason(a, b)


def _kn_reason(a, b) -> Optional[str]:
    K, N = a.shape[1], b.shape[1]
    if K % 32 or N % 16 or K < 32:
        return "FP4 GEMMs need K to be a multiple of 32 and N of 16"
    return None


def _dot_dtype(dtype):
    if interpreting():
        return tl.float32
    return tl.bfloat16 if dtype == torch.bfloat16 else tl.float16


def _interp(cfg: dict):
    return {} if not interpreting() else cfg


def fp4_scaled_mm(a, b, out_dtype: torch.dtype = torch.float32, bias: Optional[torch.Tensor] = None,
                  *, fast_dequant: Optional[bool] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` for FP4Tensors (NV x NV or MX x MX), ``a`` (M, K), ``b = weight.t()``
    (``_fp4_mm_kernel``). ``fast_dequant``: the PTX decode (default on sm_90) or the portable one."""
    why = fp4_support(a, b)
    if why:
        raise ValueError(f"fp4_scaled_mm: {why}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    qa, sa, ra, _ = _storage(a)
    qb, sb, rb, blk = _storage(b)
    bias_t = bias.contiguous() if bias is not None else c
    asm = _use_asm(a.device, torch.bfloat16) if fast_dequant is None else fast_dequant
    bk = max(64, blk)  # the interpreter's K tile
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    runnable(_MM_TUNED)[grid](qa, qb, c, bias_t, sa, sb, a._global_scale, b._global_scale, M, N, K,
                              qa.stride(0), qb.stride(0), sa.stride(0), sb.stride(0), c.stride(0), c.stride(1),
                              SBLOCK=blk, SA_ROWS=ra, SB_ROWS=rb, MX=a.kind == "mx", HAS_BIAS=bias is not None,
                              ASM=asm, DOT_DTYPE=_dot_dtype(torch.bfloat16),
                              **_interp(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=bk, GROUP_M=2, EVEN_K=K % bk == 0)))
    return c.to(out_dtype)


def fp4_weight_only_mm(a: torch.Tensor, b, out_dtype: Optional[torch.dtype] = None,
                       bias: Optional[torch.Tensor] = None, *, fast_dequant: Optional[bool] = None,
                       split_k: Optional[int] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with bf16/fp16 activations ``a`` (M, K) and an FP4 weight ``b = w.t()``
    (``_fp4_weight_only_kernel``, then ``_splitk_reduce_kernel`` when K is split).

    ``split_k`` forces a K split (with a single configuration); by default it is autotuned.
    ``fast_dequant``: the PTX decode (default on sm_90 with bf16 activations) or the portable one."""
    why = weight_only_support(a, b)
    if why:
        raise ValueError(f"fp4_weight_only_mm: {why}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"fp4_weight_only_mm: split_k must be a positive int, got {split_k!r}")
    out_dtype = out_dtype or a.dtype
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    x = a if a.stride(1) == 1 else a.contiguous()
    qb, sb, rb, blk = _storage(b)
    asm = _use_asm(a.device, a.dtype) if fast_dequant is None else (fast_dequant and a.dtype == torch.bfloat16)
    bias_t = bias.contiguous() if bias is not None else c
    fixed = {}
    if interpreting():
        fixed = dict(BLOCK_N=32, BLOCK_M=16, BLOCK_K=max(64, blk), SPLIT_K=split_k or 2)
    elif split_k is not None:
        fixed = dict(BLOCK_N=128, BLOCK_M=16 if M <= 16 else 64, BLOCK_K=max(128, blk), SPLIT_K=split_k,
                     num_warps=4, num_stages=4)
    if fixed:
        fixed["EVEN_K"] = K % fixed["BLOCK_K"] == 0
    max_split = fixed.get("SPLIT_K", _WO_MAX_SPLIT)
    part = torch.empty((max_split, M, N), dtype=torch.float32, device=a.device) if max_split > 1 else c
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(M, meta["BLOCK_M"]))  # noqa: E731
    launch = _fp4_weight_only_kernel if fixed and not interpreting() else runnable(_WO_TUNED)
    launch[grid](x, qb, sb, b._global_scale, c, part, bias_t, M, N, K, x.stride(0), qb.stride(0),
                 sb.stride(0), c.stride(0), c.stride(1), SBLOCK=blk, SROWS=rb, MX=b.kind == "mx",
                 HAS_BIAS=bias is not None, ASM=asm, DOT_DTYPE=_dot_dtype(a.dtype), **fixed)
    split = fixed["SPLIT_K"] if fixed else _WO_TUNED.best_config.kwargs["SPLIT_K"]
    if split > 1:  # the kernel left fp32 partials: add them in split order, then the epilogue
        BLOCK = 1024
        runnable(_splitk_reduce_kernel)[(triton.cdiv(M * N, BLOCK),)](
            part, b._global_scale, c, bias_t, M, N, c.stride(0), c.stride(1), SPLIT_K=split,
            HAS_BIAS=bias is not None, BLOCK=BLOCK)
    return c.to(out_dtype)


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
    {"kernel": _fp4_weight_only_kernel, "num_warps": 4, "num_stages": 4,
     "signature": {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "c_ptr": "*bf16",
                   "part_ptr": "*fp32", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                   "stride_xm": "i32", "stride_w": "i32", "stride_s": "i32", **_OUT},
     "constexprs": dict(SBLOCK=16, SROWS=16, MX=False, SPLIT_K=4, HAS_BIAS=True, ASM=True, EVEN_K=False,
                        DOT_DTYPE=tl.bfloat16, BLOCK_N=128, BLOCK_M=16, BLOCK_K=128)},
    {"kernel": _splitk_reduce_kernel, "num_warps": 4, "num_stages": 1,
     "signature": {"part_ptr": "*fp32", "g_ptr": "*fp32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "M": "i32",
                   "N": "i32", **_OUT},
     "constexprs": dict(SPLIT_K=4, HAS_BIAS=True, BLOCK=1024)},
)
