"""FP8 attention forward: one program per (query tile, sequence, head), keys from last to first.

Inputs are the quantize pass's codes, read through TMA descriptors (Q quantized here instead when
its tile is one scale block or half of one, ``FUSE_Q``): Q and K natural
``(Z*H*SP, DP)``, V transposed ``(Z*HKV*DVP, SP)`` (so both products take K-major operands from
shared memory, as fp8 wgmma needs), and their per-block scales. Per key block (``BLOCK_N`` keys,
scales ``sk``, ``sv``; ``g = sq * scale * log2(e) / hb`` for this query tile):

    s = Q K^T                          raw, in the tensor cores (head dim <= 256 summed there)
    m' = max(m, rowmax(s) * sk)        running max (in units of 1 / g), from the raw scores' max
    r = max(rowmax(s), m' * (1/sk))    m' as a raw score; the max makes s - r <= 0 by construction
    p = exp2((s - r) * (sk g))         subtract first: no fma can fuse the max into the product
    alpha = exp2((m - m') g);  l = l alpha + rowsum(p)
    acc = acc alpha + (E4M3(256 p) V) * (sv / 256)    each block's product starts from zero and
                                                      is added in fp32: promotion every BLOCK_N keys

(256 p is made as ``exp2((s - r) (sk g) + 8)``, the 8 added after the product, and l and acc are
kept 256 times larger: the same numbers, one multiplication an element fewer.)

Blocks are visited from the last to the first (the diagonal first when causal): a row's P is
rounded against the running max of the keys after it, so a large score early in the sequence
(an attention sink) cannot push the later keys' P below E4M3's range. Blocks that hold masked
pairs (diagonal, window edges, the ragged end) apply the mask (a flag of the one loop); the others
do not. A row with no visible key ends with ``l = 0``: its output is 0 and its lse ``-inf``.

Writes O (the caller's layout and dtype; fp32 under the interpreter, whose bf16 cast truncates)
and ``lse = m g + log2(l)`` (log2 units, ``(Z, H, SP)``) for the backward.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import (block_scale, fp8_codes, fp8_dot, program_coords, quantize_tile, rotate, scan_spec, tile_amax,
                     tile_range, visible)
from .tuning import TABLE

__all__ = ["attention_fwd_kernel", "SCAN_SPECS"]


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_desc, vt_desc, k_row, vt_row, vt_col, SK, SV, s_base, start, g, rows, n_q, n_k,
               lo_off, hi_off, masked, BLOCK_N: tl.constexpr, SB: tl.constexpr, INTERPRET: tl.constexpr):
    cols = start + tl.arange(0, BLOCK_N)
    s = fp8_dot(q, k_desc.load([k_row + start, 0]).T, INTERPRET)
    sk = block_scale(SK, s_base, start, SB)
    sv = block_scale(SV, s_base, start, SB)
    if masked:
        s = tl.where(visible(rows, n_q, cols, n_k, lo_off, hi_off), s, float("-inf"))
    raw = tl.max(s, 1)
    m_new = tl.maximum(m_i, raw * sk)
    # a row with no visible key yet (masked tiles only): reference 0, so p = 0 and alpha = 0 (acc, l stay 0)
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
    r = tl.maximum(raw, m_ref * tl.div_rn(1.0, sk))
    alpha = tl.exp2((m_i - m_ref) * g)
    p = tl.exp2((s - r[:, None]) * (sk * g) + 8.0)  # 256 p (<= 256: s - r <= 0 is rounded before the fma)
    l_i = l_i * alpha + tl.sum(p, 1)  # 256 l
    vt = vt_desc.load([vt_row, vt_col + start])  # (DVP, BLOCK_N): V token-major
    pv = fp8_dot(fp8_codes(p, 448.0, INTERPRET), tl.trans(vt), INTERPRET)
    acc = acc * alpha[:, None] + pv * sv  # 256 acc
    return acc, l_i, m_new


@triton.jit
def _q_rows(x_desc, r_desc, b, h, start, m0, n_q, BLOCK_M: tl.constexpr, DP: tl.constexpr, X_LAYOUT: tl.constexpr,
            ROTATE: tl.constexpr, R_IEEE: tl.constexpr):
    """fp32 rows ``m0 ..`` of Q (BLOCK_M, DP) read in the caller's layout, rotated when ``ROTATE``."""
    if X_LAYOUT == 2:  # packed: rows past this sequence belong to the next one, zeroed
        x = tl.reshape(x_desc.load([start + m0, h, 0]), (BLOCK_M, DP))
        x = tl.where((m0 + tl.arange(0, BLOCK_M))[:, None] < n_q, x, 0.0)
    elif X_LAYOUT == 1:
        x = tl.reshape(x_desc.load([b, m0, h, 0]), (BLOCK_M, DP))
    else:
        x = tl.reshape(x_desc.load([b, h, m0, 0]), (BLOCK_M, DP))
    if ROTATE:
        x = rotate(x, r_desc.load([0, 0]), R_IEEE)
    return x.to(tl.float32)


@triton.jit
def attention_fwd_kernel(q_desc, k_desc, vt_desc, x_desc, r_desc, SQ, SK, SV, O, LSE, CU, CU_PAD,
                         stride_ob, stride_oh, stride_os, stride_od,
                         S_Q, S_K, SPQ, SPK, HQ, HKV, NBQ, NBK, D, DV, c, lo_off, hi_off,
                         DP: tl.constexpr, DVP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         SB: tl.constexpr, VARLEN: tl.constexpr, FUSE_Q: tl.constexpr, X_LAYOUT: tl.constexpr,
                         ROTATE: tl.constexpr, R_IEEE: tl.constexpr, INTERPRET: tl.constexpr):
    """Descriptors over the padded codes: Q and K ``(Z*H*SP, DP)`` with blocks (BLOCK_M, DP) and
    (BLOCK_N, DP), V^T ``(Z*HKV*DVP, SPK)`` with blocks (DVP, BLOCK_N). ``FUSE_Q`` (the tile is one
    scale block, or half of one: ``SB == 2 BLOCK_M``, whose other half then joins the amax): Q is
    read through ``x_desc``, a descriptor over the caller's tensor in its memory
    order (``X_LAYOUT`` 0: (B, H, S, D), blocks (1, 1, BLOCK_M, DP); 1: (B, S, H, D) memory behind a
    (B, H, S, D) view, blocks (1, BLOCK_M, 1, DP); 2: packed (T, H, D), blocks (BLOCK_M, 1, DP)), and
    quantized here,
    rotated by R (``r_desc``, (DP, DP)) when ``ROTATE``, with the quantize pass's numbers (``q_desc``
    and SQ are then unused). ``c = scale * log2(e) / hb``; ``lo_off``/``hi_off``: the key-minus-query offsets a
    query sees (``common.visible``)."""
    pid, h, b, start, start_pad, n_q, n_k, z = program_coords(CU, CU_PAD, S_Q, S_K, VARLEN, True)
    hk = h // (HQ // HKV)
    m0 = pid * BLOCK_M
    if m0 < n_q:
        rows = m0 + tl.arange(0, BLOCK_M)
        if FUSE_Q:
            x = _q_rows(x_desc, r_desc, b, h, start, m0, n_q, BLOCK_M, DP, X_LAYOUT, ROTATE, R_IEEE)
            amax, bad = tile_amax(x)
            if SB == 2 * BLOCK_M:  # the scale block holds this tile and its partner: both enter the amax
                amax2, bad2 = tile_amax(_q_rows(x_desc, r_desc, b, h, start, m0 ^ BLOCK_M, n_q, BLOCK_M, DP, X_LAYOUT,
                                                ROTATE, R_IEEE))
                amax, bad = tl.maximum(amax, amax2), tl.maximum(bad, bad2)
            q, sq = quantize_tile(x, amax, bad, INTERPRET)
        else:
            q = q_desc.load([(z * HQ + h) * SPQ + start_pad + m0, 0])
            sq = block_scale(SQ, (b * HQ + h) * NBQ, m0, SB)
        g = sq * c
        k_row = (z * HKV + hk) * SPK + start_pad
        vt_row = (z * HKV + hk) * DVP
        s_base = (b * HKV + hk) * NBK
        acc = tl.zeros([BLOCK_M, DVP], tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        lo, lo_full, hi_full, hi = tile_range(m0, BLOCK_M, n_k, lo_off, hi_off, BLOCK_N)
        for i in range(0, (hi - lo) // BLOCK_N):  # last block first; masked: the diagonal, the edges, the end
            start_n = hi - (i + 1) * BLOCK_N
            acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_desc, vt_desc, k_row, vt_row, start_pad, SK, SV, s_base,
                                       start_n, g, rows, n_q, n_k, lo_off, hi_off,
                                       (start_n < lo_full) | (start_n >= hi_full), BLOCK_N, SB, INTERPRET)
        seen = l_i > 0
        l_safe = tl.where(seen, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(seen, m_i * g + (tl.log2(l_safe) - 8.0), float("-inf"))
        tl.store(LSE + (z * HQ + h).to(tl.int64) * SPQ + start_pad + rows, lse)
        dv = tl.arange(0, DVP)
        o_ptrs = (O + b.to(tl.int64) * stride_ob + h * stride_oh + (start + rows[:, None]).to(tl.int64) * stride_os
                  + dv[None, :] * stride_od)
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(rows[:, None] < n_q) & (dv[None, :] < DV))


# ---- sm_90 compile configurations for fma_guard (the shipped head dims) --------------------------
_SIG = {"SQ": "*fp32", "SK": "*fp32", "SV": "*fp32", "O": "*bf16", "LSE": "*fp32", "CU": "*i32", "CU_PAD": "*i32",
        "c": "fp32", **{p: "i32" for p in ("stride_ob", "stride_oh", "stride_os", "S_Q", "S_K", "SPQ", "SPK", "HQ",
                                           "HKV", "NBQ", "NBK", "D", "DV", "lo_off", "hi_off")}}


def _spec(dp, dvp, tune):
    """The forward's spec for ``tune`` (``tuning.AttentionTuning``) at padded head dims dp, dvp, with Q
    fused from a (B, S, H, D) input, as a Hugging Face model passes it (the default recipe's block)."""
    bm, bn = tune.fwd_block_m, tune.fwd_block_n
    sig = dict(_SIG, q_desc=f"tensordesc<fp8e4nv[{bm}, {dp}]>", k_desc=f"tensordesc<fp8e4nv[{bn}, {dp}]>",
               vt_desc=f"tensordesc<fp8e4nv[{dvp}, {bn}]>", x_desc=f"tensordesc<bf16[1, {bm}, 1, {dp}]>",
               r_desc=f"tensordesc<bf16[{dp}, {dp}]>")
    cx = dict(stride_od=1, DP=dp, DVP=dvp, BLOCK_M=bm, BLOCK_N=bn, SB=128, VARLEN=False, FUSE_Q=128 in (bm, 2 * bm),
              X_LAYOUT=1, ROTATE=False, R_IEEE=False, INTERPRET=False)
    return scan_spec(attention_fwd_kernel, sig, cx, tune.fwd_warps, tune.fwd_stages)


SCAN_SPECS = (_spec(128, 128, TABLE[128]),)
