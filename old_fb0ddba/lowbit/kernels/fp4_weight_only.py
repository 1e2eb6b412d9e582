"""Weight-only FP4 GEMM: bf16 (or fp16, NV only) activations x an NV or MX FP4 weight, for decode
and small-batch shapes (M = 1 .. ~128) on Hopper, in ONE kernel launch.

Math. ``C = X @ W^T (+ bias)`` with ``W[n, k] = e2m1[n, k] * s(n, k) * g``: ``s`` the UE4M3 scale of
the 1x16 (or 16x16) block, or the E8M0 scale ``2^e`` of the 1x32 block; ``g`` the NV FP32 tensor
scale (1 for MX). Each program computes ``C^T[n-tile, m-tile]`` over one K split as
``W'[n-tile, k] @ X[m-tile, k]^T``: the weight tile is decoded to bf16 *exactly* (``e2m1 * s`` has
at most 6 significant bits, inside bf16's range; see ``fp4_gemm``), it is the wgmma register
operand (M = BLOCK_N rows of W, so the MMA is m64nBLOCK_Mk16 whatever M is: no padding of a
16-row M to 64), and X^T is the shared-memory operand. Accumulation is fp32; split-K only changes
the summation order, and the partials are added in split order (0, 1, .., S-1): deterministic,
and the same bits whichever reduction runs. Bound (``gemm_bound``, one chunk): ``|C - C*| <=
gamma_(K + 3) sum_k |x_k w_k|`` (one more rounding each for a bias and a bf16/fp16 output).

Launch (H200: 132 SMs, 4 schedulers each). At M = 16, N = K = 8192 the weight is 32 MB of codes
+ 0.25 MB (16x16) / 4 MB (1x16) of scales: ~9 us at ~4 TB/s. The grid is ``(N / BLOCK_N) x
SPLIT_K`` programs, the splits of a tile adjacent, each keeping ``num_stages - 1`` K steps in
flight as asynchronous copies (16-byte LDGSTS for the words; 16-byte, DECODE 2: 8-byte, for the
activations; 8-byte for the block scales wherever a thread's share is >= 4 bytes, see
``pipe_scales``). 256 x 128 tiles, split 8: 256 programs, 2 a SM (registers), one wave.

Static cost (sm_90 SASS of the K loop, triton 3.6, ``benchmarks/fp4_weight_only_sass.py``), per
warp and 16 bytes of codes (32 weights; the GEMM has ``N K / 32`` = 2.1M such units over 528
schedulers), 256 x 128, 8 warps, 3 stages, M = 16:

    DECODE 0 (call 2):  3.54 instr, 1.88 INT32-pipe  ->  max(3.54, 2 x 1.88) = 3.75 cycles = 8.8 us
    DECODE 1 (default): 3.29 instr, 1.41 INT32-pipe  ->  3.29 cycles = 7.7 us
    DECODE 2:           3.25 instr, 1.28 INT32-pipe  ->  3.25 cycles = 7.6 us
    + SLOT_DOTS:        3.52 / 3.47 instr, 80 registers instead of 128 (capped; 151 uncapped)

(issue 1 warp instruction a cycle, INT32 ``alu`` pipe LOP3/PRMT/SHF/LEA/IADD3 half rate, IMAD half
rate on its own pipe; cycles -> us at 1.7 GHz: 0.9 T warp instructions/s.) Of DECODE 0's 3.54:
decode 2.53 (PRMT 0.28, LOP3 1.0, LEA.HI 0.5, IMAD.SHL 0.25, HMUL2 0.5), HGMMA 0.125, block-scale
conversion 0.28, activation transpose 0.17 (LDS.128, STS.U16 x 8, its proxy fence
MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC, 7 dummy LDS), copies, waits, 2 CTA barriers and loop 0.45.
The decoded tile is the wgmma register operand directly (no shared memory, no layout
conversion); words reach registers as LDS.64 of 2 words. Measured 23.7 us is 2.7x that bound
(call 2's other configurations: 2.7-3.5x), so the decode is not the only limiter: call 2's times
at M = 16 / 64 / 128 are 70 / 212 / 401 cycles a SM per ``HGMMA.64xNx16`` (65536 of them, 496 a
SM), ~23 + 2.95 N: at N = 16 that is ~20 us if the HGMMAs do not overlap. Each K step issues two
dependent chains of 8 (one per 64-row half), then waits. ``SLOT_DOTS``: one dot per slot (K = 16):
per dot the two halves are independent HGMMAs, 8 waits a step instead of one 16-long sequence,
and the A operand is consumed slot by slot (80 registers: 3 CTAs a SM). Which one wins the
static analysis cannot say; the benchmark's probes (``BLOCK_M32 probe``: twice the MMA work, the
same decode; ``L2-resident weight``) tell the MMA, decode and HBM shares apart.

Levers against the wgmma chains (static, triton 3.6, M = 16, N = K = 8192; instr / 16 B, registers,
CTAs a SM; the benchmark's ``AB_M16_LEVERS`` rows time them):

    mma.sync (HMMA.16816; Triton's MMAv2 at 1-2 warps, BLOCK_N = 16-64 rows a warp):
      64x256 w2 s3:           3.33 instr, 172 regs, 5 CTAs   (DECODE 2: 3.24, 168, 6; 24 B stack)
      32x256 w2 s3 DECODE 2:  3.78 instr, 126 regs, 8 CTAs
      128x256 w2 s3 DECODE 2: 2.96 instr, 242-254 regs, 4 CTAs (spills with triton 3.9: bench only)
    wgmma, 4 independent m64 chains a wait: 256x64 w4 s4: 3.34 instr, 142 regs, 3 CTAs (maxnreg 128: 4)
    ACCS 2 (two accumulators, slots 0-3 / 4-7): 3.34 at 256 x 128: no more HGMMAs in flight, Triton
      waits (``WARPGROUP.DEPBAR.LE gsb0, 0``) after each dot whose A operand is in registers.

mma.sync has no warpgroup wait: each warp issues its HMMAs (0.25 a unit) between its own decode
instructions, and accumulators of different rows / token halves are independent. Its register
operand layout (kWidth 8: a thread holds 8 consecutive K columns of a 32-column block) is the
slot-major decode's own layout exactly when BLOCK_K = 256 (one slot a 32-column block, words
8q .. 8q + 7 of lane q): then no shared-memory round trip (BLOCK_K 128: the decoded tile goes
through shared memory, 5.0 instr at 64 x 128 w2). The activations pay a register transpose
(PRMT, ~8 / rows a warp per unit). Forcing MMAv2 at 4+ warps (a batch-of-one 3-D dot) splits the
rows across fewer warps and duplicates the decode (12 instr at 64 x 256 w4): not offered. The
PTX decode's pack-2 word pairs are words (2v, 2v + 1) of a row in every configuration (DECODE 2
needs it; ``benchmarks/fp4_weight_only_sass.py`` checks it in the TTGIR).

Decode (``fp4_decode``): the nibble ``s.eem`` placed at bf16 bits 15 / 8..6 is ``e2m1 *
2^-126`` (codes 0, 1: the subnormals 0, 2^-127; code 8: -0), then one ``mul.bf16x2`` by the scale
(NV: UE4M3 * 2^118, undone by 2^8 in the epilogue; MX: times 2^126 first, then 2^k). DECODE 1
places a nibble pair with ``and``, ``mul.lo`` by ``2^a + 2^b`` (two disjoint copies: the sign's
and the magnitude's, on the FMA pipe) and ``and 0x81C081C0`` (DECODE 0: and/shr/and/or). DECODE 2
takes both halves of a pair from one word (nibbles t, t + 4: no prmt) and permutes the
activations to match (``_x_slots``). All bit-exact (exhaustive PTX-emulator test).

Reduction (``REDUCE``): 0 = no split (the program stores C); 1 = fp32 partials then
``_wo_reduce_kernel`` (a second launch: ~2-4 us of GPU time in a CUDA graph, a large share of
~14 us); 2 (default) = the same partials, then the *last* program of a tile to arrive (a per-tile
counter, ``atomic_add`` acq_rel at GPU scope after a CTA barrier: ``membar.gl`` + one atomic a
program) adds them in split order, applies the tensor scale and bias, stores C and resets the
counter to 0 for the next call: one launch, no memset (the counters are zeroed once per device,
and every launch leaves them zero). Partials are tile-contiguous: ``part[tile, split, BLOCK_N,
BLOCK_M]`` (fp32, 16 KB a program at 256 x 16), read back with ``.cg`` loads (L2, never a stale
L1 line), one split at a time (an unrolled sum would load all S at once and raise the kernel's
register count: 151 instead of 128 at 256 x 128, split 8, i.e. 1 CTA a SM instead of 2).

Layout tricks (shared with ``fp4_gemm``): 32-bit words of 8 packed codes; decoded slot ``j`` of
every word is concatenated slot-major along K (column ``j WORDS + w`` = element ``8w + j``, DECODE
0 / 1), and the activation tile is loaded and permuted the same way, so no shuffle is needed.
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch
import triton
import triton.language as tl

from .interpret import interpreting, runnable
from .launch_math import cdiv

__all__ = ["fp4_weight_only_mm", "weight_only_support", "WO_CONFIGS", "prune_wo", "wo_last_config",
           "SCAN_SPECS"]


from .fp4_decode import _cat4, _decode_cat, _decode_words, _split8, _words, _x_halves, _x_slots, _x_tile
from .gemm import _e8m0_to_fp32, _store_dtype, autotune_choices


DEFAULT_DECODE = 1  # the kernel's DECODE unless a configuration says otherwise (see the docstring)


def _fp4():  # fp4_gemm imports this module: its launch helpers are imported at call time
    from . import fp4_gemm
    return fp4_gemm


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
               REDUCE: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr, EVEN_K: tl.constexpr,
               DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
               PIPE_SCALES: tl.constexpr = True, DECODE: tl.constexpr = DEFAULT_DECODE,
               SLOT_DOTS: tl.constexpr = False, ACCS: tl.constexpr = 1):
    """One (n-tile, K split, m-tile) program: ``acc = W'[n-tile, split] @ X[m-tile, split]^T``, then
    the epilogue (SPLIT_K == 1), or a partial (REDUCE 1), or a partial and the last-arriving fixup
    (REDUCE 2). Grid: (n_tiles * SPLIT_K, m_tiles), the splits of a tile adjacent."""
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
    acc1 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # ACCS 2: slots 4-7 (dead code otherwise)
    if not PIPE_SCALES:  # clamped: a split starting past K (a forced split_k) runs no step but must not read past K
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
        if SLOT_DOTS:  # one dot per slot (K = 16 a dot when BLOCK_K = 128): see the docstring
            t0, t1, t2, t3, t4, t5, t6, t7 = _decode_words(w, sw, MX, ASM, DOT_DTYPE, ASM, DECODE)
            x0, x1, x2, x3, x4, x5, x6, x7 = _split8(_x_slots(x_ptr, xrows, stride_xm, k0, K, WORDS, EVEN_K,
                                                              DOT_DTYPE, DECODE))
            acc = tl.dot(t0, tl.trans(x0), acc)
            acc = tl.dot(t1, tl.trans(x1), acc)
            acc = tl.dot(t2, tl.trans(x2), acc)
            acc = tl.dot(t3, tl.trans(x3), acc)
            acc = tl.dot(t4, tl.trans(x4), acc)
            acc = tl.dot(t5, tl.trans(x5), acc)
            acc = tl.dot(t6, tl.trans(x6), acc)
            acc = tl.dot(t7, tl.trans(x7), acc)
        elif ACCS == 2:  # two dots per K step (slots 0-3, 4-7) into two accumulators: independent chains
            t0, t1, t2, t3, t4, t5, t6, t7 = _decode_words(w, sw, MX, ASM, DOT_DTYPE, ASM, DECODE)
            xa, xb = _x_halves(x_ptr, xrows, stride_xm, k0, K, WORDS, BLOCK_M, EVEN_K, DOT_DTYPE, DECODE)
            acc = tl.dot(_cat4(t0, t1, t2, t3), tl.trans(xa), acc)
            acc1 = tl.dot(_cat4(t4, t5, t6, t7), tl.trans(xb), acc1)
        else:  # one dot per K step
            wc = _decode_cat(w, sw, MX, ASM, DOT_DTYPE, BLOCK_N, WORDS, ASM, DECODE)
            x = _x_tile(x_ptr, xrows, stride_xm, k0, K, WORDS, BLOCK_M, EVEN_K, DOT_DTYPE, DECODE)
            acc = tl.dot(wc, tl.trans(x), acc)
    if ACCS == 2:
        acc = acc + acc1  # fixed order: deterministic
    offs_n = off_n + tl.arange(0, BLOCK_N)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    if SPLIT_K > 1:
        TILE: tl.constexpr = BLOCK_N * BLOCK_M
        tile = pid_m * n_tiles + pid_n
        local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
        base = part_ptr + tile.to(tl.int64) * (SPLIT_K * TILE)
        tl.store(base + pid_k * TILE + local, acc)
        if REDUCE == 2:
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


@triton.jit
def _wo_reduce_kernel(part_ptr, g_ptr, c_ptr, bias_ptr, M, N, stride_cm, stride_cn,
                      SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, UNDO_NV: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """REDUCE 1: one program per tile adds its partials in split order, then the epilogue (the
    same bits as the last-arriving fixup of REDUCE 2)."""
    pid_n = tl.program_id(0)
    tile = tl.program_id(1) * tl.cdiv(N, BLOCK_N) + pid_n
    TILE: tl.constexpr = BLOCK_N * BLOCK_M
    local = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    base = part_ptr + tile.to(tl.int64) * (SPLIT_K * TILE)
    tot = tl.load(base + local)
    for s_i in tl.static_range(1, SPLIT_K):
        tot += tl.load(base + s_i * TILE + local)
    _wo_epilogue(tot, g_ptr, c_ptr, bias_ptr, pid_n * BLOCK_N + tl.arange(0, BLOCK_N),
                 tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M), M, N, stride_cm, stride_cn,
                 HAS_BIAS, UNDO_NV)


# ---- configurations (H200) -------------------------------------------------------------------------
_MAXNREG = "maxnreg" in inspect.signature(triton.Config).parameters


def _cfg(warps, stages, bn, bm, bk, split, reduce=2, maxnreg=None, **levers):
    extra = {"maxnreg": maxnreg} if maxnreg and _MAXNREG else {}
    return triton.Config(dict(BLOCK_N=bn, BLOCK_M=bm, BLOCK_K=bk, SPLIT_K=split, REDUCE=reduce if split > 1 else 0,
                              **levers), num_warps=warps, num_stages=stages, **extra)


# BLOCK_M is the MMA's N (16 covers M <= 16). sm_90 cubin facts (triton 3.6, NV 16x16, EVEN_K,
# DECODE 1; registers a thread / CTAs a SM by registers and shared memory / SASS instructions per
# weight in the K loop; benchmarks/fp4_weight_only_sass.py):
#   256x128 w8 s3: 128 / 2 / 3.29   128x128 w8 s4: 71 / 3 / 3.84   128x128 w4 s4: 128 / 4 / 3.47
#   64x128 w4 s4: 71 / 7 / 4.12     SLOT_DOTS: 256x128 w8 s3 80 / 3 / 3.52, 128x128 w4 s4 96 / 5 / 3.69
# Programs at N = K = 8192, M = 16 (one wave is 132 x CTAs a SM): 256-row tiles x split 8 = 256
# (2 a SM, 16 warps: exactly 128 registers, hence maxnreg), 128-row x split 4 / 6 = 256 / 384 (of 396), 64-row x split 4 = 512 (of 792).
# Levers (see the docstring): 64x256 w2 s3: 172 / 5 / 3.33 and 32x256 w2 s3 DECODE 2: 126 / 8 / 3.78,
# both mma.sync; 256x64 w4 s4: 142 / 3 / 3.34, wgmma with 4 chains a wait. 64-row tiles x split 4
# = 512 programs (of 660), x split 8 = 1024; 32-row x split 4 = 1024 (of 1056); 256 x 64 x 8 = 256.
# Wide tiles also cut the activations' L2 traffic: every n-tile reads all of X (256 KB at M = 16),
# i.e. 32 MB over 128 tiles of 64 rows (as much as the weight itself), 8 MB over 32 tiles of 256.
WO_CONFIGS = [_cfg(8, 3, 256, 16, 128, 8, maxnreg=128), _cfg(8, 4, 128, 16, 128, 4), _cfg(8, 4, 128, 16, 128, 6),
              _cfg(8, 3, 128, 16, 256, 4), _cfg(4, 4, 64, 16, 128, 4), _cfg(4, 4, 64, 16, 128, 2),
              _cfg(4, 3, 64, 16, 128, 8),
              # mma.sync (HMMA.16816, no wgmma chains): 1-2 warps, BLOCK_K 256 (see the docstring)
              _cfg(2, 3, 64, 16, 256, 4), _cfg(2, 3, 64, 16, 256, 8),
              _cfg(2, 3, 32, 16, 256, 4, DECODE=2),
              # wgmma with 4 independent m64 chains a wait (one warpgroup, 256 rows, BLOCK_K 64)
              _cfg(4, 4, 256, 16, 64, 8),  # (maxnreg 128: 4 CTAs a SM with triton 3.6, spills with 3.9)
              _cfg(8, 4, 128, 32, 128, 4), _cfg(4, 3, 64, 32, 128, 4),
              _cfg(8, 3, 128, 64, 128, 4), _cfg(4, 3, 64, 64, 128, 4), _cfg(8, 3, 128, 64, 128, 2),
              _cfg(8, 3, 128, 128, 128, 2), _cfg(4, 3, 64, 128, 128, 2), _cfg(8, 3, 128, 128, 128, 4)]


def _want_bm(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128


DECODE_TILE = dict(BLOCK_N=256, BLOCK_M=16, BLOCK_K=128, SPLIT_K=8)  # with 8 warps, 3 stages


def _decode_tile(c) -> bool:
    return all(c.kwargs[k] == v for k, v in DECODE_TILE.items()) and c.num_warps == 8 and c.num_stages == 3


def prune_wo(configs, named_args, **kw):
    """BLOCK_M: the smallest of 16 / 32 / 64 / 128 that covers M; BLOCK_K holds whole scale blocks;
    each split keeps >= 2 K steps (else the split is dropped). M <= 16: ``DECODE_TILE`` alone
    where it fits (not autotuned): on the H200 the autotuner's pick there changed between runs
    and lost up to 30% (2026-12-01, session 7, calls 1 and 3: M = 1, N = K = 8192, 128 x 256
    split 4 at 0.0318 ms against 256 x 128 split 8 at 0.0244; MX 1x32 at M = 16, 256 x 64 / 4 warps
    at 0.0317 against 0.0243), while 256 x 128 / 8 warps / 3 stages / split 8 was the fastest or
    within 3% of it at every M <= 16 shape benchmarked (NV 16x16 and 1x16, MX 1x32; 8192^2,
    14336 x 4096, 4096 x 14336)."""
    M, K = named_args["M"], named_args["K"]
    sblock = kw.get("SBLOCK", named_args.get("SBLOCK", 16))  # constexprs come as keywords
    want = _want_bm(M)
    keep = [c for c in configs if c.kwargs["BLOCK_M"] == want and c.kwargs["BLOCK_K"] % sblock == 0
            and K >= 2 * c.kwargs["SPLIT_K"] * c.kwargs["BLOCK_K"]]
    if want == 16 and any(_decode_tile(c) for c in keep):
        return [c for c in keep if _decode_tile(c)]
    return keep or [_cfg(4, 3, 64, min(want, 64), max(128, sblock), 1)]


def pipe_scales(block_n: int, block_k: int, sblock: int, num_warps: int) -> bool:
    """Block scales go through the pipeline's asynchronous copies when every thread's share of a
    K step's scale bytes is >= 4 (cp.async's smallest copy); narrower ones (MX 1x32 at 64 x 128 /
    4 warps: 2 bytes a thread) are prefetched one K step ahead by hand instead."""
    return block_n * (block_k // sblock) >= 4 * 32 * num_warps


_HEUR = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0,
                           "PIPE_SCALES": lambda args: pipe_scales(args["BLOCK_N"], args["BLOCK_K"], args["SBLOCK"],
                                                                   args.get("num_warps", 4))})
_WO_TUNED = triton.autotune(WO_CONFIGS, key=["M", "N", "K", "SBLOCK", "SROWS", "MX", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": prune_wo})(_HEUR(_wo_kernel))


def wo_last_config() -> dict:
    """Configurations the autotuner chose, per tuning key."""
    return autotune_choices({"fp4_weight_only": _WO_TUNED})


# ---- launcher --------------------------------------------------------------------------------------
class TileCounters:
    """Registry of the split-K tile counters, one int32 buffer per device, zero between launches
    (every launch leaves them zero). Allocated (zeroed) on first use outside a CUDA-graph capture;
    first used inside a capture, a buffer of that capture only (its zeroing is a memset node of the
    graph). The counters are shared by the launches on one device: two of these GEMMs running
    *concurrently* on two streams would race."""

    def __init__(self):
        self.buffers: dict = {}

    def get(self, device, n: int) -> torch.Tensor:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        buf = self.buffers.get(str(device))
        if buf is None or buf.numel() < n:
            buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
            if not capturing:
                self.buffers[str(device)] = buf
        return buf


TILE_COUNTERS = TileCounters()


def weight_only_support(a, b) -> Optional[str]:
    """None when ``fp4_weight_only_mm`` takes activations ``a`` and the FP4 weight ``b``."""
    f = _fp4()
    why = f._fp4_layout(b, "b")
    if why:
        return why
    if a.dtype not in (torch.bfloat16, torch.float16):
        return "weight-only FP4 GEMM takes bf16/fp16 activations"
    if a.dtype == torch.float16 and b.kind == "mx":
        return "MX weight-only GEMM takes bf16 activations (E8M0 scales exceed fp16's range)"
    return f._kn_reason(a, b)


_CONFIG_KEYS = ("BLOCK_N", "BLOCK_M", "BLOCK_K", "SPLIT_K", "REDUCE", "PIPE_SCALES", "DECODE", "SLOT_DOTS", "ACCS",
                "num_warps", "num_stages", "maxnreg")


def fp4_weight_only_mm(a: torch.Tensor, b, out_dtype: Optional[torch.dtype] = None,
                       bias: Optional[torch.Tensor] = None, *, fast_dequant: Optional[bool] = None,
                       split_k: Optional[int] = None, config: Optional[dict] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with bf16/fp16 activations ``a`` (M, K) and an FP4 weight ``b = w.t()``
    (``_wo_kernel``; with REDUCE 1 then ``_wo_reduce_kernel``).

    By default the configuration is autotuned (``WO_CONFIGS``, pruned by M). ``split_k`` forces a
    K split with a default tile; ``config`` forces a whole configuration (keys of ``_CONFIG_KEYS``,
    missing ones from the default; REDUCE 1 = second kernel, 2 = last-arriving program; DECODE
    0 / 1 / 2 = the PTX decode and K order; SLOT_DOTS = one dot per slot, BLOCK_K >= 128; ACCS 2 = two
    accumulators, slots 0-3 / 4-7), for A/B
    measurements. ``fast_dequant``: the PTX decode (default on sm_90 with bf16) or the portable one."""
    f = _fp4()
    why = weight_only_support(a, b)
    if why:
        raise ValueError(f"fp4_weight_only_mm: {why}")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int) or split_k < 1):
        raise ValueError(f"fp4_weight_only_mm: split_k must be a positive int, got {split_k!r}")
    if config is not None and (set(config) - set(_CONFIG_KEYS)):
        raise ValueError(f"fp4_weight_only_mm: config keys must be among {_CONFIG_KEYS}, got {sorted(config)}")
    out_dtype = out_dtype or a.dtype
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    x = a if a.stride(1) == 1 else a.contiguous()
    qb, sb, rb, blk = f._storage(b)
    asm = f._use_asm(a.device, a.dtype) if fast_dequant is None else (fast_dequant and a.dtype == torch.bfloat16)
    bias_t = bias.contiguous() if bias is not None else c
    fixed = None
    if interpreting():
        fixed = dict(BLOCK_N=32, BLOCK_M=16, BLOCK_K=max(64, blk), SPLIT_K=split_k or 2, REDUCE=2)
    elif split_k is not None or config is not None:
        fixed = dict(BLOCK_N=64, BLOCK_M=min(_want_bm(M), 128), BLOCK_K=max(128, blk), SPLIT_K=split_k or 4,
                     REDUCE=2, num_warps=4, num_stages=3)
    if fixed is not None:
        fixed.update(config or {})
        if fixed["SPLIT_K"] == 1:
            fixed["REDUCE"] = 0
        elif fixed["REDUCE"] not in (1, 2):
            raise ValueError("fp4_weight_only_mm: REDUCE must be 1 or 2 with SPLIT_K > 1")
        if fixed.get("DECODE", DEFAULT_DECODE) not in (0, 1, 2):
            raise ValueError(f"fp4_weight_only_mm: DECODE must be 0, 1 or 2, got {fixed['DECODE']!r}")
        if fixed.get("ACCS", 1) not in (1, 2) or (fixed.get("ACCS", 1) == 2 and fixed.get("SLOT_DOTS")):
            raise ValueError(f"fp4_weight_only_mm: ACCS must be 1 or 2 (not with SLOT_DOTS), got {fixed['ACCS']!r}")
        if fixed.get("SLOT_DOTS") and fixed["BLOCK_K"] < 128:
            raise ValueError("fp4_weight_only_mm: SLOT_DOTS needs BLOCK_K >= 128 (K >= 16 a dot)")
        if fixed["BLOCK_K"] % blk:
            raise ValueError(f"fp4_weight_only_mm: BLOCK_K {fixed['BLOCK_K']} must hold whole {blk}-blocks")
        fixed["EVEN_K"] = K % fixed["BLOCK_K"] == 0
        fixed.setdefault("PIPE_SCALES", pipe_scales(fixed["BLOCK_N"], fixed["BLOCK_K"], blk, fixed.get("num_warps", 4)))
        plans = [fixed]
    else:
        plans = [dict(cfg.kwargs) for cfg in prune_wo(WO_CONFIGS, {"M": M, "K": K}, SBLOCK=blk)]
    # partials and counters sized for every configuration the launch may pick
    part_n = max(cdiv(N, p["BLOCK_N"]) * p["BLOCK_N"] * cdiv(M, p["BLOCK_M"]) * p["BLOCK_M"]
                 * p["SPLIT_K"] for p in plans if p["SPLIT_K"] > 1) if any(p["SPLIT_K"] > 1 for p in plans) else 0
    part = torch.empty(max(part_n, 1), dtype=torch.float32, device=a.device)
    n_locks = max(cdiv(N, p["BLOCK_N"]) * cdiv(M, p["BLOCK_M"]) for p in plans)
    locks = TILE_COUNTERS.get(a.device, n_locks) if any(p.get("REDUCE") == 2 for p in plans) else part
    grid = lambda meta: (cdiv(N, meta["BLOCK_N"]) * meta["SPLIT_K"], cdiv(M, meta["BLOCK_M"]))  # noqa: E731
    launch = runnable(_wo_kernel) if fixed is not None else _WO_TUNED
    launch[grid](x, qb, sb, b._global_scale, c, part, locks, bias_t, M, N, K, x.stride(0), qb.stride(0),
                 sb.stride(0), c.stride(0), c.stride(1), SBLOCK=blk, SROWS=rb, MX=b.kind == "mx",
                 HAS_BIAS=bias is not None, ASM=asm, DOT_DTYPE=f._dot_dtype(a.dtype), **(fixed or {}))
    chosen = fixed if fixed is not None else _WO_TUNED.best_config.kwargs
    if chosen["SPLIT_K"] > 1 and chosen["REDUCE"] == 1:
        bn, bm = chosen["BLOCK_N"], chosen["BLOCK_M"]
        runnable(_wo_reduce_kernel)[(cdiv(N, bn), cdiv(M, bm))](
            part, b._global_scale, c, bias_t, M, N, c.stride(0), c.stride(1), SPLIT_K=chosen["SPLIT_K"],
            HAS_BIAS=bias is not None, UNDO_NV=asm and b.kind != "mx", BLOCK_N=bn, BLOCK_M=bm)
    return c.to(out_dtype)


# ---- sm_90 compile configurations for fma_guard ------------------------------------------------------
_SIG = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "c_ptr": "*bf16",
        "part_ptr": "*fp32", "lock_ptr": "*i32", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
        "stride_xm": "i32", "stride_w": "i32", "stride_s": "i32", "stride_cm": "i32", "stride_cn": "i32"}
SCAN_SPECS = (
    {"kernel": _wo_kernel, "num_warps": 4, "num_stages": 4, "signature": _SIG,
     "constexprs": dict(SBLOCK=16, SROWS=16, MX=False, SPLIT_K=4, REDUCE=2, HAS_BIAS=True, ASM=True, EVEN_K=False,
                        DOT_DTYPE=tl.bfloat16, BLOCK_N=64, BLOCK_M=16, BLOCK_K=128)},
    {"kernel": _wo_reduce_kernel, "num_warps": 4, "num_stages": 1,
     "signature": {"part_ptr": "*fp32", "g_ptr": "*fp32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "M": "i32",
                   "N": "i32", "stride_cm": "i32", "stride_cn": "i32"},
     "constexprs": dict(SPLIT_K=4, HAS_BIAS=True, UNDO_NV=True, BLOCK_N=64, BLOCK_M=16)},
)
