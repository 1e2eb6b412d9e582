"""Weight-only FP4 GEMM: bf16 (or fp16, NV only) activations x an NV or MX FP4 weight, for decode
and small-batch shapes (M = 1 .. ~128) on Hopper, in ONE kernel launch.

Math. ``C = X @ W^T (+ bias)`` with ``W[n, k] = e2m1[n, k] * s(n, k) * g``: ``s`` the UE4M3 scale of
the 1x16 (or 16x16) block, or the E8M0 scale ``2^e`` of the 1x32 block; ``g`` the NV FP32 tensor
scale (1 for MX). Each program computes ``C^T[n-tile, m-tile]`` over one K split as
``W'[n-tile, k] @ X[m-tile, k]^T``: the weight tile is decoded to bf16 *exactly* (``e2m1 * s`` has
at most 6 significant bits, inside bf16's range; see ``mm``), it is the wgmma register operand
(M = BLOCK_N rows of W, so the MMA is m64nBLOCK_Mk16 whatever M is: no padding of a 16-row M to
64), and X^T is the shared-memory operand. Accumulation is fp32; split-K only changes the
summation order, and the partials are added in split order (0, 1, .., S-1): deterministic. Bound
(``gemm_bound``, one chunk): ``|C - C*| <= gamma_(K + 3) sum_k |x_k w_k|`` (one more rounding each
for a bias and a bf16/fp16 output).

Launch. The grid is ``(N / BLOCK_N) x SPLIT_K`` programs, the splits of a tile adjacent, each
keeping ``num_stages - 1`` K steps in flight as asynchronous copies (16-byte copies for the words
and the activations; 8-byte ones for the block scales wherever a thread's share is >= 4 bytes,
``pipe_scales``; narrower scales are prefetched one K step ahead by hand). With a K split, each
program stores an fp32 partial; the *last* program of a tile to arrive (a per-tile counter,
``atomic_add`` acq_rel at GPU scope after a CTA barrier) adds them in split order, applies the
tensor scale and bias, stores C and resets the counter to 0 for the next call: one launch, no
memset (the counters are zeroed once per device, and every launch leaves them zero). Partials
are tile-contiguous, ``part[tile, split, BLOCK_N, BLOCK_M]``, read back with ``.cg`` loads (L2,
never a stale L1 line), one split at a time (an unrolled sum would load all S at once and raise
the kernel's register count).

Decode (``decode``, DECODE 1): the nibble ``s.eem`` placed at bf16 bits 15 / 8..6 is ``e2m1 *
2^-126`` (codes 0, 1: the subnormals 0, 2^-127; code 8: -0), then one ``mul.bf16x2`` by the scale
(NV: UE4M3 * 2^118, undone by 2^8 in the epilogue; MX: times 2^126 first, then 2^k); a nibble
pair is placed with ``and``, ``mul.lo`` by ``2^a + 2^b`` (two disjoint copies: the sign's and the
magnitude's, on the FMA pipe) and ``and 0x81C081C0``. Decoded slot ``j`` of every word is
concatenated slot-major along K (column ``j WORDS + w`` = element ``8w + j``), and the activation
tile is loaded and permuted the same way, so no shuffle is needed.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..jit_common import _e8m0_to_fp32
from .decode import _decode_cat, _words, _x_tile

__all__ = ["SCAN_SPECS", "pipe_scales"]


@triton.jit
def _scale_bytes(s_ptr, rows, stride_s, k0, K, WORDS: tl.constexpr, SBLOCK: tl.constexpr,
                 SROWS: tl.constexpr, EVEN_K: tl.constexpr):
    """Block-scale bytes ``(R, WORDS / (SBLOCK / 8))`` of ``rows`` for the K tile starting at ``k0``.
    EVEN_K: ``k0`` is a multiple of the K tile (said to the compiler), so a row's bytes are one
    aligned vector load (8 bytes for 1x16 blocks and BLOCK_K = 128) instead of byte loads."""
    NB: tl.constexpr = WORDS // (SBLOCK // 8)
    if EVEN_K:
        blk = tl.multiple_of(k0 // SBLOCK, NB) + tl.arange(0, NB)
        return tl.load(s_ptr + (rows // SROWS)[:, None] * stride_s + blk[None, :])
    else:
        blk = k0 // SBLOCK + tl.arange(0, NB)
        ptrs = s_ptr + (rows // SROWS)[:, None] * stride_s + blk[None, :]
        return tl.load(ptrs, mask=(blk < tl.cdiv(K, SBLOCK))[None, :], other=0)


@triton.jit
def _block_scales(s, WORDS: tl.constexpr, SBLOCK: tl.constexpr, MX: tl.constexpr, ASM: tl.constexpr,
                  DTYPE: tl.constexpr):
    """Scale bytes ``(R, WORDS / PER)`` -> the decode's scale operand ``(R, WORDS)``, converted once
    per block (then broadcast over its ``PER = SBLOCK / 8`` words). ASM: bf16, NV times 2^118
    (exact: UE4M3 in [2^-9, 448]), MX ``2^e`` (exact); portable: fp32."""
    PER: tl.constexpr = SBLOCK // 8
    if MX:
        v = _e8m0_to_fp32(s)
    else:
        v = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if ASM:
        if MX:
            v = v.to(tl.bfloat16)
        else:
            v = (v * 3.3231458909047650e35).to(tl.bfloat16)
    return tl.reshape(tl.broadcast_to(v[:, :, None], (v.shape[0], WORDS // PER, PER)), (v.shape[0], WORDS))


@triton.jit
def _wo_kernel(x_ptr, w_ptr, s_ptr, g_ptr, c_ptr, part_ptr, lock_ptr, bias_ptr, M, N, K,
               stride_xm, stride_w, stride_s, stride_cm, stride_cn,
               SBLOCK: tl.constexpr, SROWS: tl.constexpr, MX: tl.constexpr, SPLIT_K: tl.constexpr,
               HAS_BIAS: tl.constexpr, ASM: tl.constexpr, EVEN_K: tl.constexpr,
               DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               PIPE_SCALES: tl.constexpr = True):
    """One (n-tile, K split, m-tile) program: ``acc = W'[n-tile, split] @ X[m-tile, split]^T``, then
    the epilogue (SPLIT_K == 1), or a partial and the last-arriving fixup. Grid: (n_tiles * SPLIT_K,
    m_tiles), the splits of a tile adjacent."""
    pid = tl.program_id(0)
    pid_k = pid % SPLIT_K
    pid_n = pid // SPLIT_K
    pid_m = tl.program_id(1)
    n_tiles = tl.cdiv(N, BLOCK_N)
    off_n = pid_n * BLOCK_N
    off_m = pid_m * BLOCK_M
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    xrows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
    k_per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * k_per
    k_hi = tl.minimum(k_lo + k_per, K)
    WORDS: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if not PIPE_SCALES:  # clamped: a split starting past K runs no step but must not read past K
        k_first = tl.multiple_of(tl.minimum(k_lo, K - BLOCK_K), BLOCK_K) if EVEN_K else k_lo
        s_next = _scale_bytes(s_ptr, cols, stride_s, k_first, K, WORDS, SBLOCK, SROWS, EVEN_K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if PIPE_SCALES:  # loaded in the loop: the pipeliner makes them asynchronous copies (>= 4 bytes a row)
            s = _scale_bytes(s_ptr, cols, stride_s, tl.multiple_of(k0, BLOCK_K) if EVEN_K else k0, K, WORDS,
                             SBLOCK, SROWS, EVEN_K)
        else:  # prefetched one K step ahead by hand
            s = s_next
            k_next = tl.multiple_of(tl.minimum(k0 + BLOCK_K, K - BLOCK_K), BLOCK_K) if EVEN_K else k0 + BLOCK_K
            s_next = _scale_bytes(s_ptr, cols, stride_s, k_next, K, WORDS, SBLOCK, SROWS, EVEN_K)
        w = _words(w_ptr, cols, stride_w, k0, K, WORDS, EVEN_K)
        sw = _block_scales(s, WORDS, SBLOCK, MX, ASM, DOT_DTYPE)
        wc = _decode_cat(w, sw, MX, ASM, DOT_DTYPE, BLOCK_N, WORDS, ASM, 1)
        x = _x_tile(x_ptr, xrows, stride_xm, k0, K, WORDS, BLOCK_M, EVEN_K, DOT_DTYPE)
        acc = tl.dot(wc, tl.trans(x), acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    if SPLIT_K > 1:
        TILE: tl.constexpr = BLOCK_N * BLOCK_M
        tile = pid_m * n_tiles + pid_n
        local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        base = part_ptr + tile.to(tl.int64) * (SPLIT_K * TILE)
        tl.store(base + pid_k * TILE + local, acc)
        tl.debug_barrier()  # every thread's partial stored before the release below
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last split of this tile: add all, in split order
            tot = tl.load(base + local, cache_modifier=".cg")
            for s_i in range(1, SPLIT_K):  # a loop, not unrolled: all S loads at once would set
                tot += tl.load(base + s_i * TILE + local, cache_modifier=".cg")  # the kernel's registers
            _wo_epilogue(tot, g_ptr, c_ptr, bias_ptr, offs_n, offs_m, M, N, stride_cm, stride_cn,
                         HAS_BIAS, ASM and not MX)
            tl.atomic_xchg(lock_ptr + tile, 0)  # ready for the next launch
    else:
        _wo_epilogue(acc, g_ptr, c_ptr, bias_ptr, offs_n, offs_m, M, N, stride_cm, stride_cn,
                     HAS_BIAS, ASM and not MX)


@triton.jit
def _wo_epilogue(acc, g_ptr, c_ptr, bias_ptr, offs_n, offs_m, M, N, stride_cm, stride_cn,
                 HAS_BIAS: tl.constexpr, UNDO_NV: tl.constexpr):
    """``C^T[tile] = acc (* 2^8 for the NV PTX decode, exact) * g (+ bias)``, cast, masked."""
    if UNDO_NV:
        acc = acc * 256.0
    out = acc * tl.load(g_ptr)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[:, None]
    mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    tl.store(c_ptr + offs_m[None, :] * stride_cm + offs_n[:, None] * stride_cn,
             out.to(c_ptr.dtype.element_ty), mask=mask)


def pipe_scales(block_n: int, block_k: int, sblock: int, num_warps: int) -> bool:
    """Block scales go through the pipeline's asynchronous copies when every thread's share of a
    K step's scale bytes is >= 4 (cp.async's smallest copy); narrower ones (MX 1x32 at 64 x 128 /
    4 warps: 2 bytes a thread) are prefetched one K step ahead by hand instead."""
    return block_n * (block_k // sblock) >= 4 * 32 * num_warps


# ---- sm_90 compile configurations for fma_guard ------------------------------------------------------
_SIG = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "c_ptr": "*bf16",
        "part_ptr": "*fp32", "lock_ptr": "*i32", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
        "stride_xm": "i32", "stride_w": "i32", "stride_s": "i32", "stride_cm": "i32", "stride_cn": "i32"}
SCAN_SPECS = (
    {"kernel": _wo_kernel, "num_warps": 4, "num_stages": 4, "signature": _SIG,
     "constexprs": dict(SBLOCK=16, SROWS=16, MX=False, SPLIT_K=4, HAS_BIAS=True, ASM=True, EVEN_K=False,
                        DOT_DTYPE=tl.bfloat16, BLOCK_N=64, BLOCK_M=16, BLOCK_K=128)},
)
