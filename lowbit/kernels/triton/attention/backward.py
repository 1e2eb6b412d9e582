"""FP8 attention backward: ``attention_dkdv_kernel`` (one program per key tile and KV head: the
query tiles of every head of its group in the inner loop, dK and dV in registers, no atomics)
and ``attention_dq_kernel`` (one program per query tile and head). Both recompute the scores.

Operands (all E4M3 codes with per-block power-of-two scales, from the quantize pass): Q, K in
both layouts, V natural, dO in both layouts, ``lse`` (log2 units) and
``delta = rowsum(dO O)``. Per tile pair (query block i, key block j), ``f = (sq sk) c`` (this
order in both kernels, so both compute the same p and dS):

    p   = exp2(s f - lse)                       s = Q K^T raw (head dim summed in the tensor cores)
    dV += (E4M3(256 p)^T dO) * (sdo / 256)      (dkdv kernel)
    dP  = (dO V^T) * (sdo sv)                   the value head dim summed in the tensor cores
    dS  = p (dP - delta)
    dK += (E4M3(dS / t)^T Q) * (t sq)           t = amax(dS tile) / 448, per tile
    dQ += (E4M3(dS / t) K) * (t sk)             (dq kernel; the same tiles, so the same t)

Every product starts from zero per tile and is added in fp32: promotion every BLOCK_M queries
(dV, dK) or BLOCK_N keys (dQ). ``p`` has no max subtracted (``lse`` comes from the forward), so
there is no max-of-rounded-products to contract against. dK and dQ are scaled by
``scale / hb`` at the end; with the Hadamard option the launcher rotates them back.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import block_scale, fp8_codes, fp8_dot, program_coords, quantize_tile, scan_spec, tile_range, visible

__all__ = ["attention_dkdv_kernel", "attention_dq_kernel", "SCAN_SPECS"]


@triton.jit
def _ds_product(ds, other_t, INTERPRET: tl.constexpr):
    """``(E4M3(ds * (1 / t)) @ other, t)``: the tile rounded with one scale ``t = amax / 448``
    (``common.quantize_tile``), times the codes ``other`` (given transposed, as loaded), fp32."""
    codes, t = quantize_tile(ds, INTERPRET)
    return fp8_dot(codes, tl.trans(other_t), INTERPRET), t


@triton.jit
def _lse_rows(LSE, base, rows, n):
    """lse of ``rows``, +inf for rows that saw no key or lie past the sequence (their p is 0)."""
    lse = tl.load(LSE + base + rows)
    return tl.where((lse == float("-inf")) | (rows >= n), float("inf"), lse)


@triton.jit
def _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, LSE, DELTA, SQ, SDO, q_row, qt_row, dot_row,
                start_pad, ls_base, s_base, start, sk, c, sv, keys, n_k, n_q, lo_off, hi_off,
                BLOCK_M: tl.constexpr, SB: tl.constexpr, MASK: tl.constexpr, INTERPRET: tl.constexpr):
    rows = start + tl.arange(0, BLOCK_M)  # queries
    sq = block_scale(SQ, s_base, start, SB)
    sdo = block_scale(SDO, s_base, start, SB)
    st = tl.dot(k, q_desc.load([q_row + start, 0]).T)  # (BLOCK_N, BLOCK_M)
    pt = tl.exp2(st * ((sq * sk) * c) - _lse_rows(LSE, ls_base, rows, n_q)[None, :])
    if MASK:
        pt = tl.where(visible(keys, n_k, rows, n_q, lo_off, hi_off), pt, 0.0)
    do_t = dot_desc.load([dot_row, start_pad + start])  # (DVP, BLOCK_M): dO, token-major
    dv += fp8_dot(fp8_codes(pt * 256.0, 448.0, INTERPRET), tl.trans(do_t), INTERPRET) * (sdo * 0.00390625)
    dpt = tl.dot(v, do_desc.load([q_row + start, 0]).T) * (sdo * sv)
    dst = pt * (dpt - tl.load(DELTA + ls_base + rows)[None, :])
    prod, t = _ds_product(dst, qt_desc.load([qt_row, start_pad + start]), INTERPRET)
    dk += prod * (t * sq)
    return dk, dv


@triton.jit
def attention_dkdv_kernel(q_desc, qt_desc, k_desc, v_desc, do_desc, dot_desc, SQ, SK, SV, SDO, LSE, DELTA, DK, DV,
                          CU, CU_PAD, stride_kb, stride_kh, stride_ks, stride_kd, stride_vb, stride_vh, stride_vs,
                          stride_vd, S_Q, S_K, SPQ, SPK, HQ, HKV, NBQ, NBK, D, DVD, c, c_ln, lo_off, hi_off,
                          DP: tl.constexpr, DVP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          SB: tl.constexpr, VARLEN: tl.constexpr, INTERPRET: tl.constexpr):
    """Descriptors over the padded codes, natural ``(Z*H*SP, DP)`` (blocks of BLOCK_M or BLOCK_N rows)
    and transposed ``(Z*H*DP, SP)`` (blocks (DP, BLOCK_M)). ``lo_off``/``hi_off``: the
    query-minus-key offsets a key sees (the forward's, negated and swapped)."""
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
        for g in range(0, group):
            h = hk * group + g
            q_row = (z * HQ + h) * SPQ + start_pad
            qt_row = (z * HQ + h) * DP
            dot_row = (z * HQ + h) * DVP
            ls_base = (z * HQ + h).to(tl.int64) * SPQ + start_pad
            s_base = (b * HQ + h) * NBQ
            for i in range(0, (lo_full - lo) // BLOCK_M):
                dk, dv = _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, LSE, DELTA, SQ, SDO, q_row,
                                     qt_row, dot_row, start_pad, ls_base, s_base, lo + i * BLOCK_M, sk, c, sv,
                                     keys, n_k, n_q, lo_off, hi_off, BLOCK_M, SB, True, INTERPRET)
            for i in range(0, (hi_full - lo_full) // BLOCK_M):
                dk, dv = _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, LSE, DELTA, SQ, SDO, q_row,
                                     qt_row, dot_row, start_pad, ls_base, s_base, lo_full + i * BLOCK_M, sk, c, sv,
                                     keys, n_k, n_q, lo_off, hi_off, BLOCK_M, SB, False, INTERPRET)
            for i in range(0, (hi - hi_full) // BLOCK_M):
                dk, dv = _dkdv_block(dk, dv, k, v, q_desc, qt_desc, do_desc, dot_desc, LSE, DELTA, SQ, SDO, q_row,
                                     qt_row, dot_row, start_pad, ls_base, s_base, hi_full + i * BLOCK_M, sk, c, sv,
                                     keys, n_k, n_q, lo_off, hi_off, BLOCK_M, SB, True, INTERPRET)
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
              c, sdo, rows, n_q, n_k, lo_off, hi_off, BLOCK_N: tl.constexpr, SB: tl.constexpr, MASK: tl.constexpr,
              INTERPRET: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)  # keys
    sk = block_scale(SK, s_base, start, SB)
    sv = block_scale(SV, s_base, start, SB)
    p = tl.exp2(tl.dot(q, k_desc.load([k_row + start, 0]).T) * ((sq * sk) * c) - lse[:, None])
    if MASK:
        p = tl.where(visible(rows, n_q, cols, n_k, lo_off, hi_off), p, 0.0)
    dp = tl.dot(do, v_desc.load([k_row + start, 0]).T) * (sdo * sv)
    ds = p * (dp - delta[:, None])
    prod, t = _ds_product(ds, kt_desc.load([kt_row, start_pad + start]), INTERPRET)
    dq += prod * (t * sk)
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
        lse = _lse_rows(LSE, ls_base, rows, n_q)
        delta = tl.load(DELTA + ls_base + rows)
        s_q = (b * HQ + h) * NBQ
        sq = block_scale(SQ, s_q, m0, SB)
        sdo = block_scale(SDO, s_q, m0, SB)
        k_row = (z * HKV + hk) * SPK + start_pad
        kt_row = (z * HKV + hk) * DP
        s_base = (b * HKV + hk) * NBK
        dq = tl.zeros([BLOCK_M, DP], tl.float32)
        lo, lo_full, hi_full, hi = tile_range(m0, BLOCK_M, n_k, lo_off, hi_off, BLOCK_N)
        for i in range(0, (lo_full - lo) // BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_desc, kt_desc, v_desc, SK, SV, k_row, kt_row, start_pad, s_base,
                           lo + i * BLOCK_N, sq, c, sdo, rows, n_q, n_k, lo_off, hi_off, BLOCK_N, SB, True, INTERPRET)
        for i in range(0, (hi_full - lo_full) // BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_desc, kt_desc, v_desc, SK, SV, k_row, kt_row, start_pad, s_base,
                           lo_full + i * BLOCK_N, sq, c, sdo, rows, n_q, n_k, lo_off, hi_off, BLOCK_N, SB, False,
                           INTERPRET)
        for i in range(0, (hi - hi_full) // BLOCK_N):
            dq = _dq_block(dq, q, do, lse, delta, k_desc, kt_desc, v_desc, SK, SV, k_row, kt_row, start_pad, s_base,
                           hi_full + i * BLOCK_N, sq, c, sdo, rows, n_q, n_k, lo_off, hi_off, BLOCK_N, SB, True,
                           INTERPRET)
        d = tl.arange(0, DP)
        tl.store(DQ + b.to(tl.int64) * stride_qb + h * stride_qh + (start + rows[:, None]).to(tl.int64) * stride_qs
                 + d[None, :] * stride_qd, (dq * c_ln).to(DQ.dtype.element_ty),
                 mask=(rows[:, None] < n_q) & (d[None, :] < D))


# ---- sm_90 compile configurations for fma_guard --------------------------------------------------
_I32 = ("S_Q", "S_K", "SPQ", "SPK", "HQ", "HKV", "NBQ", "NBK", "D", "lo_off", "hi_off")
_COMMON = {**{p: "*fp32" for p in ("SQ", "SK", "SV", "SDO", "LSE", "DELTA")}, "CU": "*i32", "CU_PAD": "*i32",
           "c": "fp32", "c_ln": "fp32", **{p: "i32" for p in _I32}}


def _desc(rows, cols):
    return f"tensordesc<fp8e4nv[{rows}, {cols}]>"


def _specs(dp, dvp, bm, bn, warps, stages):
    cx = dict(DP=dp, DVP=dvp, BLOCK_M=bm, BLOCK_N=bn, SB=128, VARLEN=False, INTERPRET=False)
    dkdv = dict(_COMMON, q_desc=_desc(bm, dp), qt_desc=_desc(dp, bm), k_desc=_desc(bn, dp), v_desc=_desc(bn, dvp),
                do_desc=_desc(bm, dvp), dot_desc=_desc(dvp, bm), DK="*bf16", DV="*bf16", DVD="i32",
                **{f"stride_{t}{a}": "i32" for t in "kv" for a in "bhs"})
    dq = dict(_COMMON, q_desc=_desc(bm, dp), k_desc=_desc(bn, dp), kt_desc=_desc(dp, bn), v_desc=_desc(bn, dvp),
              do_desc=_desc(bm, dvp), DQ="*bf16", **{f"stride_q{a}": "i32" for a in "bhs"})
    return (scan_spec(attention_dkdv_kernel, dkdv, dict(cx, stride_kd=1, stride_vd=1), warps, stages),
            scan_spec(attention_dq_kernel, dq, dict(cx, stride_qd=1), warps, stages))


SCAN_SPECS = _specs(128, 128, 64, 64, 8, 2)
