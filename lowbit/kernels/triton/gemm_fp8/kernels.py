"""Scaled FP8 GEMMs in Triton: ``C = (qA * sA) @ (qB * sB) (+ bias)``, fp32 accumulation.

A is ``(M, K)``, B is ``(K, N)`` (``B = weight.t()``: its storage is the K-major ``(N, K)`` weight).
Scales are dequantization factors. Each operand's scale is constant over a block of
``rows x k`` (A) or ``k x cols`` (B) elements, which covers every FP8 recipe:

=====================  ===========================  =============================================
recipe                 A block / B block            where the scales are applied
=====================  ===========================  =============================================
tensorwise (Delayed,   whole / whole                epilogue: ``acc * sA * sB``
Current)
rowwise                1 x K / K x 1                epilogue: ``acc * sA[m] * sB[n]``
blockwise              1x128 / 128x128              per 128-K chunk: ``acc += dot_c * (sA * sB)``
MX FP8 (E8M0)          1x32 / 32x1                  per 32-K chunk, E8M0 decoded exactly
=====================  ===========================  =============================================

With K-scaled operands the contraction is cut into chunks of ``c = gcd(kA, kB)`` inside which
both scales are constant: ``C = sum_c dot(qA_c, qB_c) * (sA_c sB_c)``. Each chunk's ``tl.dot``
starts from zero and is added to the fp32 accumulator on the CUDA cores: that is the *promotion*
DeepSeek-V3 uses, because Hopper's FP8 MMA keeps only ~14 bits while it accumulates (and Triton's
default, ``max_num_imprecise_acc = 2^30`` on sm_90, never promotes). Tensorwise and rowwise
GEMMs promote every 128 K by default too (``tl.dot(..., max_num_imprecise_acc=128)``), like
cuBLAS without ``use_fast_accum``; ``fast_accum=True`` keeps one long tensor-core accumulation
(faster, ~14-bit sums: the forward-pass trade-off torchao makes). On sm_90 a promotion waits for
the MMA: compiled for sm_90a (triton 3.6 and 3.9), ``max_num_imprecise_acc`` lowers to fp32 adds
that read the wgmma registers right after the issue, so ptxas puts ``WARPGROUP.DEPBAR.LE gsb0,
0x0`` there (TTGIR still says ``pendings = 1``); ``acc += tl.dot(a, b) * s`` gets
``warp_group_dot_wait {pendings = 0}`` in TTGIR, and so does carrying the previous chunk's product
across the loop (the pipeliner makes a dot properly async only when its loop-carried result feeds
another dot's accumulator). The tensor cores idle while the CTA's warps promote, as every warp
group of a CTA runs in lockstep (CTA-wide ``bar.sync`` each iteration); 64x128 tiles let two
programs share an SM. (A kernel warp-specialized by triton 3.6's Hopper auto-WS, whose consumers
promote out of step, hung on the H200.)

Error (on an fp32-accumulating machine, e.g. the interpreter): ``|C - C*| <= gamma_(K + n + 2)
sum_k |a_k b_k|`` with ``n`` the number of chunks (``lowbit.validate.metrics.gemm_bound``).
FMA: the epilogues contract ``acc * s + bias`` and ``part * s + acc`` into single roundings; no
product is used twice, so no contracted-vs-rounded hazard (fma_guard scans ``SCAN_SPECS``).

Kernels: ``_scaled_mm_kernel`` (pointer loads, any strides, one tile per program),
``_scaled_mm_tma_kernel`` (TMA loads through host tensor descriptors, K-major A and B; persistent
or one program per tile, an autotuning choice). Each is autotuned over the short lists of
``tuning`` (checked with ptxas for sm_90a). Under ``TRITON_INTERPRET=1`` (read per call) they run
on CPU tensors with one small fixed configuration.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..jit_common import _e8m0_to_fp32, _store_tile, _tile_coords

__all__ = ["SCAN_SPECS"]


@triton.jit
def _load_scale(ptr, idx, E8M0: tl.constexpr):
    s = tl.load(ptr + idx)
    if E8M0:
        s = _e8m0_to_fp32(s)
    return s


@triton.jit
def _k_index(k0, KB: tl.constexpr, stride):
    """Offset of the scale column holding K index ``k0`` (KB: K per scale, 0 = one along K)."""
    if KB == 0:
        return 0
    else:
        return (k0 // KB) * stride


@triton.jit
def _scale_rows(ptr, off, limit, stride, k_idx, BLOCK: tl.constexpr, GROUP: tl.constexpr,
                E8M0: tl.constexpr):
    """Scales of rows ``off .. off+BLOCK`` at K-chunk offset ``k_idx`` (already times its stride).

    GROUP (rows per scale) 0 means one scale along the whole dim; a scalar comes back when the
    tile lies inside one group, else a ``(BLOCK,)`` vector (rows past ``limit`` reuse the last)."""
    if GROUP == 0:
        s = _load_scale(ptr, k_idx, E8M0)
    elif GROUP % BLOCK == 0:
        s = _load_scale(ptr, (off // GROUP) * stride + k_idx, E8M0)
    else:
        rows = tl.minimum(off + tl.arange(0, BLOCK), limit - 1) // GROUP
        s = _load_scale(ptr, rows * stride + k_idx, E8M0)
    return s


@triton.jit
def _chunk_scale(sa_ptr, sb_ptr, off_m, off_n, M, N, k_a, k_b, stride_sam, stride_sbn,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SA_ROWS: tl.constexpr,
                 SB_COLS: tl.constexpr, E8M0: tl.constexpr):
    """``sA * sB`` for one K chunk, broadcastable to ``(BLOCK_M, BLOCK_N)``."""
    sa = _scale_rows(sa_ptr, off_m, M, stride_sam, k_a, BLOCK_M, SA_ROWS, E8M0)
    sb = _scale_rows(sb_ptr, off_n, N, stride_sbn, k_b, BLOCK_N, SB_COLS, E8M0)
    return _col(sa, BLOCK_M, SA_ROWS) * _row(sb, BLOCK_N, SB_COLS)


@triton.jit
def _col(sa, BLOCK_M: tl.constexpr, SA_ROWS: tl.constexpr):
    """Row scales as a ``(BLOCK_M, 1)`` column (a scalar stays a scalar)."""
    if SA_ROWS != 0 and SA_ROWS % BLOCK_M != 0:
        sa = sa[:, None]
    return sa


@triton.jit
def _row(sb, BLOCK_N: tl.constexpr, SB_COLS: tl.constexpr):
    """Column scales as a ``(1, BLOCK_N)`` row (a scalar stays a scalar)."""
    if SB_COLS != 0 and SB_COLS % BLOCK_N != 0:
        sb = sb[None, :]
    return sb


@triton.jit
def _k_step(acc, a, b, k0, sa_ptr, sb_ptr, off_m, off_n, M, N, stride_sam, stride_sak, stride_sbk, stride_sbn,
            SA_ROWS: tl.constexpr, SA_K: tl.constexpr, SB_K: tl.constexpr, SB_COLS: tl.constexpr,
            K_SCALED: tl.constexpr, PROMOTE: tl.constexpr, E8M0: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, PROMOTE_K: tl.constexpr):
    """``acc`` plus the K chunk at ``k0``: K-scaled, the chunk's dot starts at 0 and is scaled into
    the fp32 sum; PROMOTE, the tensor cores sum at most PROMOTE_K before the fp32 add; else one long
    tensor-core accumulation."""
    if K_SCALED:
        s = _chunk_scale(sa_ptr, sb_ptr, off_m, off_n, M, N, _k_index(k0, SA_K, stride_sak),
                         _k_index(k0, SB_K, stride_sbk), stride_sam, stride_sbn,
                         BLOCK_M, BLOCK_N, SA_ROWS, SB_COLS, E8M0)
        acc += tl.dot(a, b) * s
    elif PROMOTE:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=PROMOTE_K)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _scaled_mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      stride_sam, stride_sak, stride_sbk, stride_sbn,
                      SA_ROWS: tl.constexpr, SA_K: tl.constexpr, SB_K: tl.constexpr,
                      SB_COLS: tl.constexpr, K_SCALED: tl.constexpr, PROMOTE: tl.constexpr,
                      E8M0: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) tile of C per program, operands through pointers (any strides)."""
    PROMOTE_K: tl.constexpr = 128 if BLOCK_K > 128 else BLOCK_K
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)  # clamped: edge rows load, never store
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k0, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k0, other=0.0)
        acc = _k_step(acc, a, b, k0, sa_ptr, sb_ptr, off_m, off_n, M, N, stride_sam, stride_sak, stride_sbk,
                      stride_sbn, SA_ROWS, SA_K, SB_K, SB_COLS, K_SCALED, PROMOTE, E8M0, BLOCK_M, BLOCK_N,
                      PROMOTE_K)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if not K_SCALED:
        acc = acc * _chunk_scale(sa_ptr, sb_ptr, off_m, off_n, M, N, 0, 0, stride_sam, stride_sbn,
                                 BLOCK_M, BLOCK_N, SA_ROWS, SB_COLS, E8M0)
    _store_tile(c_ptr, bias_ptr, acc, off_m, off_n, M, N, stride_cm, stride_cn, HAS_BIAS, BLOCK_M, BLOCK_N)


@triton.jit
def _scaled_mm_tma_kernel(a_desc, b_desc, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                          stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                          SA_ROWS: tl.constexpr, SA_K: tl.constexpr, SB_K: tl.constexpr,
                          SB_COLS: tl.constexpr, K_SCALED: tl.constexpr, PROMOTE: tl.constexpr,
                          E8M0: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          PERSISTENT: tl.constexpr):
    """A (M, K) and B^T (N, K) arrive by TMA; the programs walk the tiles with a stride of their
    count. PERSISTENT (read by the launcher): one program per SM; else one per tile (several
    programs share an SM, so one's epilogue or promotion overlaps another's MMA)."""
    PROMOTE_K: tl.constexpr = 128 if BLOCK_K > 128 else BLOCK_K
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    start = tl.program_id(0)
    step = tl.num_programs(0)
    tile_c = start - step  # the epilogue's own tile counter (keeps the pipeliner's loops apart)
    for tile in tl.range(start, num_pid_m * num_pid_n, step, flatten=True):
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            k0 = ki * BLOCK_K
            a = a_desc.load([off_m, k0])
            b = b_desc.load([off_n, k0]).T
            acc = _k_step(acc, a, b, k0, sa_ptr, sb_ptr, off_m, off_n, M, N, stride_sam, stride_sak,
                          stride_sbk, stride_sbn, SA_ROWS, SA_K, SB_K, SB_COLS, K_SCALED, PROMOTE, E8M0,
                          BLOCK_M, BLOCK_N, PROMOTE_K)
        tile_c += step
        pid_m, pid_n = _tile_coords(tile_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if not K_SCALED:
            acc = acc * _chunk_scale(sa_ptr, sb_ptr, off_m, off_n, M, N, 0, 0, stride_sam, stride_sbn,
                                     BLOCK_M, BLOCK_N, SA_ROWS, SB_COLS, E8M0)
        _store_tile(c_ptr, bias_ptr, acc, off_m, off_n, M, N, stride_cm, stride_cn, HAS_BIAS,
                    BLOCK_M, BLOCK_N)


# ---- sm_90 compile configurations for fma_guard --------------------------------------------------
_PTR_SIG = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "bias_ptr": "*bf16",
            "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
            "stride_am": "i32", "stride_ak": "i32", "stride_bk": "i32", "stride_bn": "i32",
            "stride_cm": "i32", "stride_cn": "i32", "stride_sam": "i32", "stride_sak": "i32",
            "stride_sbk": "i32", "stride_sbn": "i32"}
_TMA_SIG = {"a_desc": "tensordesc<fp8e4nv[128, 128]>", "b_desc": "tensordesc<fp8e4nv[256, 128]>",
            **{k: v for k, v in _PTR_SIG.items() if k not in ("a_ptr", "b_ptr", "stride_am", "stride_ak",
                                                               "stride_bk", "stride_bn")}}
SCAN_SPECS = (
    {"kernel": _scaled_mm_kernel, "signature": _PTR_SIG, "num_warps": 8, "num_stages": 4,
     "constexprs": dict(SA_ROWS=1, SA_K=128, SB_K=128, SB_COLS=128, K_SCALED=True, PROMOTE=True,
                        E8M0=False, HAS_BIAS=True, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
    {"kernel": _scaled_mm_tma_kernel, "signature": _TMA_SIG, "num_warps": 8, "num_stages": 3,
     "constexprs": dict(SA_ROWS=1, SA_K=0, SB_K=0, SB_COLS=1, K_SCALED=False, PROMOTE=True, E8M0=False,
                        HAS_BIAS=True, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, PERSISTENT=True)},
)
