"""FP8 attention backward: ``attention_dkdv_kernel`` (one program per key tile and KV head: the
query tiles of every head of its group in the inner loop, dK and dV in registers, no atomics)
and ``attention_dq_kernel`` (one program per query tile and head). Both recompute the scores and
dP, so nothing of size S^2 is ever stored.

Operands (all E4M3 codes with per-block scales, from the quantize pass): Q, K in both layouts,
V natural, dO in both layouts, ``lse`` (log2 units) and ``delta = rowsum(dO O)``. Per tile pair
(query block i, key block j), ``f = (sq sk) c`` (this order in both kernels, so both compute the
same p and dS):

    p   = exp2(s f - lse)                       s = Q K^T raw (head dim summed in the tensor cores)
    dV += (E4M3(256 p)^T dO) * (sdo / 256)      (dkdv kernel)
    dP  = (dO V^T) * (sdo sv)                   the value head dim summed in the tensor cores
    dS  = p (dP - delta)
    dK += (E4M3(dS^T / t) Q) * (t sq)           t: one scale per key row of the tile (dkdv kernel)
    dQ += (E4M3(dS / u) K) * (u sk)             u: one scale per query row of the tile (dq kernel)

dS is rounded row by row (``common.quantize_rows``: ``amax / 448`` of the row's entries in the
tile, the dimension the product sums over): the row's maximum is a reduction inside the four
threads that hold the row, so the inner loops have no shared-memory reduction and no barrier.
Every product starts from zero per tile and is added in fp32: promotion every BLOCK_M queries
(dV, dK) or BLOCK_N keys (dQ). ``p`` has no max subtracted (``lse`` comes from the forward), so
there is no max-of-rounded-products to contract against. dK and dQ are scaled by ``scale / hb``
at the end; with the Hadamard option the launcher rotates them back.

Tiles: the rows a program owns (keys in dkdv, queries in dq) are the M side of every product;
with 16 rows a warp each warp group owns 64 rows, so the row reductions never cross warps.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import block_scale, fp8_codes, fp8_dot, program_coords, quantize_rows, scan_spec, tile_range, visible
from .tuning import TABLE

__all__ = ["attention_dkdv_kernel", "attention_dq_kernel", "SCAN_SPECS"]


@triton.jit
def _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, lse_desc, delta_desc, SQ, SDO, q_row, qt_row,
                dot_row, zh, start_pad, s_base, start, sk, c, sv, keys, n_k, n_q, lo_off, hi_off, masked,
                BLOCK_M: tl.constexpr, SB: tl.constexpr, INTERPRET: tl.constexpr):
    rows = start + tl.arange(0, BLOCK_M)  # queries
    sq = block_scale(SQ, s_base, start, SB)
    sdo = block_scale(SDO, s_base, start, SB)
    st = tl.dot(k, q_desc.load([q_row + start, 0]).T)  # (BLOCK_N, BLOCK_M)
    # 256 p: lse - 8 folds the P scale into the exponent (exact in the math, one rounding in the fp32 sum)
    pt = tl.exp2(st * ((sq * sk) * c) - (lse_desc.load([zh, start_pad + start]) - 8.0))  # lse: (1, BLOCK_M)
    if masked:
        pt = tl.where(visible(keys, n_k, rows, n_q, lo_off, hi_off), pt, 0.0)
    p8 = fp8_codes(pt, 448.0, INTERPRET)
    dpt = tl.dot(v, do_desc.load([q_row + start, 0]).T)
    # 256 dS: its row scales are 256 t exactly, its codes those of dS
    ds8, t = quantize_rows(pt * (dpt * (sdo * sv) - delta_desc.load([zh, start_pad + start])), INTERPRET)
    do_t = dot_desc.load([dot_row, start_pad + start])  # (DVP, BLOCK_M): dO, token-major
    dv += fp8_dot(p8, tl.trans(do_t), INTERPRET) * (sdo * 0.00390625)
    dk += fp8_dot(ds8, tl.trans(qt_desc.load([qt_row, start_pad + start])), INTERPRET) * (t[:, None] * (sq * 0.00390625))
    return dk, dv


@triton.jit
def attention_dkdv_kernel(q_desc, qt_desc, k_desc, v_desc, do_desc, dot_desc, lse_desc, delta_desc, SQ, SK, SV, SDO,
                          DK, DV,
                          CU, CU_PAD, stride_kb, stride_kh, stride_ks, stride_kd, stride_vb, stride_vh, stride_vs,
                          stride_vd, S_Q, S_K, SPQ, SPK, HQ, HKV, NBQ, NBK, D, DVD, c, c_ln, lo_off, hi_off,
                          DP: tl.constexpr, DVP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          SB: tl.constexpr, VARLEN: tl.constexpr, INTERPRET: tl.constexpr):
    """Descriptors over the padded codes, natural ``(Z*H*SP, DP)`` (blocks of BLOCK_M or BLOCK_N rows)
    and transposed ``(Z*H*DP, SP)`` (blocks (DP, BLOCK_M)), and over lse and delta ``(Z*H, SP)``
    (blocks (1, BLOCK_M): TMA tiles, not per-thread pointers, for these per-query vectors).
    ``lo_off``/``hi_off``: the query-minus-key offsets a key sees (the forward's, negated and
    swapped). Pairs a tile does not see (masked tiles only) get ``p = 0`` whatever their lse
    (rows past the sequence, rows with no visible key: ``-inf``)."""
    pid, hk, b, start, start_pad, n_q, n_k, z = program_coords(CU, CU_PAD, S_Q, S_K, VARLEN, False)
    group = HQ // HKV
    n0 = pid * BLOCK_N
    if n0 < n_k:
        keys = n0 + tl.arange(0, BLOCK_N)
        k_row = (z * HKV + hk) * SPK + start_pad + n0
        k = k_desc.load([k_row, 0])
        v = v_desc.load([k_row, 0])
        sk = block_scale(SK, (b * HKV + hk) * NBK, n0, SB)
        sv = block_scale(SV, (b * HKV + hk) * NBK, n0, SB)
        dk = tl.zeros([BLOCK_N, DP], tl.float32)
        dv = tl.zeros([BLOCK_N, DVP], tl.float32)
        lo, lo_full, hi_full, hi = tile_range(n0, BLOCK_N, n_q, lo_off, hi_off, BLOCK_M)
        if n0 + BLOCK_N > n_k:  # the ragged last key tile: mask every step (its padded keys' p must be 0)
            lo_full = hi
            hi_full = hi
        steps = (hi - lo) // BLOCK_M
        for j in range(0, group * steps):  # (head of the group, query tile): one loop, pipelined across heads
            g = j // steps
            h = hk * group + g
            start_m = lo + (j - g * steps) * BLOCK_M
            dk, dv = _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, lse_desc, delta_desc, SQ, SDO,
                                 (z * HQ + h) * SPQ + start_pad, (z * HQ + h) * DP, (z * HQ + h) * DVP, z * HQ + h,
                                 start_pad, (b * HQ + h) * NBQ, start_m, sk, c, sv, keys, n_k, n_q, lo_off, hi_off,
                                 (start_m < lo_full) | (start_m >= hi_full), BLOCK_M, SB, INTERPRET)
        d = tl.arange(0, DP)
        e = tl.arange(0, DVP)
        kmask = keys[:, None] < n_k
        tok = (start + keys[:, None]).to(tl.int64)
        tl.store(DK + b.to(tl.int64) * stride_kb + hk * stride_kh + tok * stride_ks + d[None, :] * stride_kd,
                 (dk * c_ln).to(DK.dtype.element_ty), mask=kmask & (d[None, :] < D))
        tl.store(DV + b.to(tl.int64) * stride_vb + hk * stride_vh + tok * stride_vs + e[None, :] * stride_vd,
                 dv.to(DV.dtype.element_ty), mask=kmask & (e[None, :] < DVD))


@triton.jit
def _dq_block(dq, q, do, lse, delta, k_desc, kt_desc, v_desc, SK, SV, k_row, kt_row, start_pad, s_base, start, sq,
              c, sdo, rows, n_q, n_k, lo_off, hi_off, masked, BLOCK_N: tl.constexpr, SB: tl.constexpr,
              INTERPRET: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)  # keys
    sk = block_scale(SK, s_base, start, SB)
    sv = block_scale(SV, s_base, start, SB)
    s = tl.dot(q, k_desc.load([k_row + start, 0]).T)
    dp = tl.dot(do, v_desc.load([k_row + start, 0]).T)
    p = tl.exp2(s * ((sq * sk) * c) - lse[:, None])
    if masked:
        p = tl.where(visible(rows, n_q, cols, n_k, lo_off, hi_off), p, 0.0)
    ds8, u = quantize_rows(p * (dp * (sdo * sv) - delta[:, None]), INTERPRET)
    dq += fp8_dot(ds8, tl.trans(kt_desc.load([kt_row, start_pad + start])), INTERPRET) * (u[:, None] * sk)
    return dq


@triton.jit
def attention_dq_kernel(q_desc, k_desc, kt_desc, v_desc, do_desc, SQ, SK, SV, SDO, LSE, DELTA, DQ, CU, CU_PAD,
                        stride_qb, stride_qh, stride_qs, stride_qd,
                        S_Q, S_K, SPQ, SPK, HQ, HKV, NBQ, NBK, D, c, c_ln, lo_off, hi_off,
                        DP: tl.constexpr, DVP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        SB: tl.constexpr, VARLEN: tl.constexpr, INTERPRET: tl.constexpr):
    """``lo_off``/``hi_off``: key-minus-query offsets a query sees (as the forward)."""
    pid, h, b, start, start_pad, n_q, n_k, z = program_coords(CU, CU_PAD, S_Q, S_K, VARLEN, True)
    hk = h // (HQ // HKV)
    m0 = pid * BLOCK_M
    if m0 < n_q:
        rows = m0 + tl.arange(0, BLOCK_M)
        q_row = (z * HQ + h) * SPQ + start_pad + m0
        q = q_desc.load([q_row, 0])
        do = do_desc.load([q_row, 0])
        ls_base = (z * HQ + h).to(tl.int64) * SPQ + start_pad
        lse = tl.load(LSE + ls_base + rows)
        delta = tl.load(DELTA + ls_base + rows)
        s_q = (b * HQ + h) * NBQ
        sq = block_scale(SQ, s_q, m0, SB)
        sdo = block_scale(SDO, s_q, m0, SB)
        k_row = (z * HKV + hk) * SPK + start_pad
        kt_row = (z * HKV + hk) * DP
        s_base = (b * HKV + hk) * NBK
        dq = tl.zeros([BLOCK_M, DP], tl.float32)
        lo, lo_full, hi_full, hi = tile_range(m0, BLOCK_M, n_k, lo_off, hi_off, BLOCK_N)
        for i in range(0, (hi - lo) // BLOCK_N):
            start_n = lo + i * BLOCK_N
            dq = _dq_block(dq, q, do, lse, delta, k_desc, kt_desc, v_desc, SK, SV, k_row, kt_row, start_pad, s_base,
                           start_n, sq, c, sdo, rows, n_q, n_k, lo_off, hi_off,
                           (start_n < lo_full) | (start_n >= hi_full), BLOCK_N, SB, INTERPRET)
        d = tl.arange(0, DP)
        tl.store(DQ + b.to(tl.int64) * stride_qb + h * stride_qh + (start + rows[:, None]).to(tl.int64) * stride_qs
                 + d[None, :] * stride_qd, (dq * c_ln).to(DQ.dtype.element_ty),
                 mask=(rows[:, None] < n_q) & (d[None, :] < D))


# ---- sm_90 compile configurations for fma_guard --------------------------------------------------
_I32 = ("S_Q", "S_K", "SPQ", "SPK", "HQ", "HKV", "NBQ", "NBK", "D", "lo_off", "hi_off")
_COMMON = {**{p: "*fp32" for p in ("SQ", "SK", "SV", "SDO")}, "CU": "*i32", "CU_PAD": "*i32",
           "c": "fp32", "c_ln": "fp32", **{p: "i32" for p in _I32}}


def _desc(rows, cols, dtype="fp8e4nv"):
    return f"tensordesc<{dtype}[{rows}, {cols}]>"


def _specs(dp, dvp, tune):
    """(dkdv spec, dq spec) of ``tune`` (``tuning.AttentionTuning``) at padded head dims dp, dvp."""
    cx = dict(DP=dp, DVP=dvp, SB=128, VARLEN=False, INTERPRET=False)
    km, kn, qm, qn = tune.dkdv_block_m, tune.dkdv_block_n, tune.dq_block_m, tune.dq_block_n
    dkdv = dict(_COMMON, q_desc=_desc(km, dp), qt_desc=_desc(dp, km), k_desc=_desc(kn, dp), v_desc=_desc(kn, dvp),
                do_desc=_desc(km, dvp), dot_desc=_desc(dvp, km), lse_desc=_desc(1, km, "fp32"),
                delta_desc=_desc(1, km, "fp32"), DK="*bf16", DV="*bf16", DVD="i32",
                **{f"stride_{t}{a}": "i32" for t in "kv" for a in "bhs"})
    dq = dict(_COMMON, q_desc=_desc(qm, dp), k_desc=_desc(qn, dp), kt_desc=_desc(dp, qn), v_desc=_desc(qn, dvp),
              do_desc=_desc(qm, dvp), LSE="*fp32", DELTA="*fp32", DQ="*bf16", **{f"stride_q{a}": "i32" for a in "bhs"})
    return (scan_spec(attention_dkdv_kernel, dkdv, dict(cx, BLOCK_M=km, BLOCK_N=kn, stride_kd=1, stride_vd=1),
                      tune.dkdv_warps, tune.dkdv_stages),
            scan_spec(attention_dq_kernel, dq, dict(cx, BLOCK_M=qm, BLOCK_N=qn, stride_qd=1), tune.dq_warps,
                      tune.dq_stages))


SCAN_SPECS = _specs(128, 128, TABLE[128])
