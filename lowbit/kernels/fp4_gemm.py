"""FP4 GEMMs on Hopper (no FP4 tensor cores): dequantize in the kernel, exactly.

Operands are ``FP4Tensor``s packed along K (A: ``(M, K)``; B: ``weight.t()``, storage ``(N, K/2)``).

* **NVFP4 x NVFP4** (``_nvfp4_mm_kernel``): ``e2m1 * ue4m3`` has at most 6 significant bits and
  lies in ``[2^-10, 2688]``, so it is exact in bf16; both tiles are dequantized to bf16, ``tl.dot``
  accumulates in fp32 and the epilogue applies the FP32 tensor scales:
  ``C = (sum_k a'_k b'_k) * (gA * gB) (+ bias)``.
* **MXFP4 x MXFP4** (``_mxfp4_mm_kernel``): an E2M1 value is exact in E4M3, so each 32-element
  block is an FP8 ``tl.dot`` (fresh accumulator) whose result is scaled by the two E8M0 scales
  (exact powers of two) and added to the fp32 sum: what a block-scaled FP4 MMA computes, up to
  accumulation order.
* **Weight-only** (``_fp4_weight_only_kernel``): bf16 (or fp16, NV only) activations ``(M, K)``
  times an NV or MX FP4 weight. Decode shapes (small M) are memory-bound on the weight (1/4 of the
  bf16 bytes): the kernel computes ``C^T = W' @ A^T`` (the dequantized weight is the MMA's register
  operand), splits K over ``SPLIT_K`` programs and ``_splitk_reduce_kernel`` adds the fp32
  partials in split order (deterministic), then applies the tensor scale and bias.

Decoding works on 32-bit words of 8 packed elements: ``W'_j`` holds element ``j`` of every word
(elements ``8w + j``), and ``sum_k a_k b_k = sum_j sum_w a_(8w+j) b_(8w+j)``: the same products in
another summation order, so no shuffle is ever needed. On CUDA (sm_90, bf16) the decode is PTX on
packed registers (``_decode_words``): the nibble ``s.eem`` placed at bf16 bits 15 / 8..6 is
``e2m1 * 2^-126``, then one ``mul.bf16x2`` by the scale (NV folds ``2^118`` into the UE4M3 scale
and ``2^8`` into the epilogue; MX multiplies by ``2^126`` first); both are exact. The portable path
(interpreter, sm_89, fp16) computes the same values as ``fp32(e2m1) * fp32(scale)``.

Error bound (fp32-accumulating machine): ``|C - C*| <= gamma_(K + n + 2) sum_k |a_k b_k|`` against
the exact product of the dequantized operands (``n`` = number of 32-blocks for MX, 1 otherwise).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .gemm import _e8m0_to_fp32, _store_dtype, _store_tile, _tile_coords
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


@triton.jit
def _e2m1_to_e4m3(c):
    """E2M1 code -> the E4M3 byte of the same value (exact: 0.5 -> 0x30, m >= 2 -> 4m + 0x30)."""
    c = c.to(tl.int32)
    m = c & 7
    byte = tl.where(m >= 2, (m << 2) + 0x30, tl.where(m == 1, 0x30, 0)) | ((c & 8) << 4)
    return byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


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
def _load_words(q_ptr, s_ptr, rows, stride_q, stride_s, k0, K, WORDS: tl.constexpr,
                SBLOCK: tl.constexpr, SROWS: tl.constexpr, MX: tl.constexpr):
    """Packed words ``(R, WORDS)`` of ``rows`` from element ``k0`` and each word's fp32 block scale
    (one load per block, broadcast over its ``SBLOCK / 8`` words)."""
    PER: tl.constexpr = SBLOCK // 8
    wi = k0 // 8 + tl.arange(0, WORDS)
    w = tl.load(q_ptr + rows[:, None] * stride_q + wi[None, :], mask=(wi < K // 8)[None, :], other=0)
    blk = k0 // SBLOCK + tl.arange(0, WORDS // PER)
    s = tl.load(s_ptr + (rows // SROWS)[:, None] * stride_s + blk[None, :],
                mask=(blk < tl.cdiv(K, SBLOCK))[None, :], other=0)
    if MX:
        s = _e8m0_to_fp32(s)
    else:  # UE4M3 bytes
        s = s.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    s = tl.reshape(tl.broadcast_to(s[:, :, None], (s.shape[0], WORDS // PER, PER)), (s.shape[0], WORDS))
    return w, s


# ---- kernels ---------------------------------------------------------------------------------------
@triton.jit
def _nvfp4_mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, sa_ptr, sb_ptr, ga_ptr, gb_ptr, M, N, K,
                     stride_a, stride_b, stride_sa, stride_sb, stride_cm, stride_cn,
                     SA_ROWS: tl.constexpr, SB_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr,
                     ASM: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """NVFP4 x NVFP4: words of both tiles decoded to bf16, 8 dots (one per element slot) into
    fp32, tensor scales last. DOT_DTYPE: bf16 (fp32 under the interpreter, whose bf16 ``tl.dot``
    is wrong in triton 3.9)."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        wa, sa = _load_words(a_ptr, sa_ptr, rows, stride_a, stride_sa, k0, K, BLOCK_K // 8, 16, SA_ROWS, False)
        wb, sb = _load_words(b_ptr, sb_ptr, cols, stride_b, stride_sb, k0, K, BLOCK_K // 8, 16, SB_ROWS, False)
        a0, a1, a2, a3, a4, a5, a6, a7 = _decode_words(wa, sa, False, ASM, DOT_DTYPE)
        b0, b1, b2, b3, b4, b5, b6, b7 = _decode_words(wb, sb, False, ASM, DOT_DTYPE)
        acc = tl.dot(a0, tl.trans(b0), acc)
        acc = tl.dot(a1, tl.trans(b1), acc)
        acc = tl.dot(a2, tl.trans(b2), acc)
        acc = tl.dot(a3, tl.trans(b3), acc)
        acc = tl.dot(a4, tl.trans(b4), acc)
        acc = tl.dot(a5, tl.trans(b5), acc)
        acc = tl.dot(a6, tl.trans(b6), acc)
        acc = tl.dot(a7, tl.trans(b7), acc)
    g = tl.load(ga_ptr) * tl.load(gb_ptr)
    if ASM:
        acc = acc * 65536.0  # both operands came out times 2^-8 (exact)
    _store_tile(c_ptr, bias_ptr, acc * g, off_m, off_n, M, N, stride_cm, stride_cn, HAS_BIAS,
                BLOCK_M, BLOCK_N)


@triton.jit
def _mxfp4_mm_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                     stride_a, stride_b, stride_sa, stride_sb, stride_cm, stride_cn,
                     SBLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """MXFP4 x MXFP4: per SBLOCK-element block, an E4M3 dot scaled by 2^(ea + eb) into fp32."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    rows = tl.minimum(off_m + tl.arange(0, BLOCK_M), M - 1)
    cols = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1)
    kb = tl.arange(0, SBLOCK // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, SBLOCK):
        kmask = (k0 // 2 + kb < K // 2)[None, :]
        pa = tl.load(a_ptr + rows[:, None] * stride_a + (k0 // 2 + kb)[None, :], mask=kmask, other=0)
        pb = tl.load(b_ptr + cols[:, None] * stride_b + (k0 // 2 + kb)[None, :], mask=kmask, other=0)
        # interleave both operands the same way: element order inside the block is irrelevant
        a = tl.reshape(tl.join(_e2m1_to_e4m3(pa & 15), _e2m1_to_e4m3(pa >> 4)), (BLOCK_M, SBLOCK))
        b = tl.reshape(tl.join(_e2m1_to_e4m3(pb & 15), _e2m1_to_e4m3(pb >> 4)), (BLOCK_N, SBLOCK))
        sa = _e8m0_to_fp32(tl.load(sa_ptr + rows * stride_sa + k0 // SBLOCK))
        sb = _e8m0_to_fp32(tl.load(sb_ptr + cols * stride_sb + k0 // SBLOCK))
        acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
    _store_tile(c_ptr, bias_ptr, acc, off_m, off_n, M, N, stride_cm, stride_cn, HAS_BIAS,
                BLOCK_M, BLOCK_N)


@triton.jit
def _x_slot(xb, j: tl.constexpr, kmask, DOT_DTYPE: tl.constexpr):
    """Activations of element slot j: ``X[m, k0 + 8w + j]`` as ``(WORDS, BLOCK_M)``."""
    return tl.load(xb + j, mask=kmask, other=0.0).to(DOT_DTYPE)


@triton.jit
def _fp4_weight_only_kernel(x_ptr, w_ptr, s_ptr, g_ptr, c_ptr, part_ptr, bias_ptr, M, N, K,
                            stride_xm, stride_w, stride_s, stride_cm, stride_cn,
                            SBLOCK: tl.constexpr, SROWS: tl.constexpr, MX: tl.constexpr,
                            SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr,
                            DOT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_K: tl.constexpr):
    """``C^T[n-tile, m-tile] = W'[n-tile, k-range] @ X[m-tile, k-range]^T`` for one K split.

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
    wi = tl.arange(0, BLOCK_K // 8)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        w, s = _load_words(w_ptr, s_ptr, cols, stride_w, stride_s, k0, K, BLOCK_K // 8, SBLOCK, SROWS, MX)
        w0, w1, w2, w3, w4, w5, w6, w7 = _decode_words(w, s, MX, ASM, DOT_DTYPE)
        xb = x_ptr + xrows[None, :] * stride_xm + (k0 + 8 * wi)[:, None]
        kmask = (k0 + 8 * wi < K)[:, None]
        acc = tl.dot(w0, _x_slot(xb, 0, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w1, _x_slot(xb, 1, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w2, _x_slot(xb, 2, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w3, _x_slot(xb, 3, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w4, _x_slot(xb, 4, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w5, _x_slot(xb, 5, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w6, _x_slot(xb, 6, kmask, DOT_DTYPE), acc)
        acc = tl.dot(w7, _x_slot(xb, 7, kmask, DOT_DTYPE), acc)
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


# BLOCK_K >= 128: each of the 8 per-slot dots then has K = BLOCK_K / 8 >= 16.
_NV_CONFIGS = [_cfg(8, 3, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8),
               _cfg(8, 3, BLOCK_M=128, BLOCK_N=128, BLOCK_K=256, GROUP_M=8),
               _cfg(4, 4, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)]
_MX_CONFIGS = [_cfg(8, 3, BLOCK_M=128, BLOCK_N=128, GROUP_M=8), _cfg(4, 4, BLOCK_M=64, BLOCK_N=128, GROUP_M=8)]
# weight-only: BLOCK_M is the MMA's N (16 covers decode); split-K fills the GPU when M is small.
# Checked with ptxas (sm_90a): BLOCK_N = 128 keeps the decode at ~4.5 instructions per weight.
_WO_CONFIGS = [_cfg(4, 3, BLOCK_N=128, BLOCK_M=16, BLOCK_K=256, SPLIT_K=4),
               _cfg(4, 4, BLOCK_N=128, BLOCK_M=16, BLOCK_K=128, SPLIT_K=4),
               _cfg(4, 3, BLOCK_N=128, BLOCK_M=16, BLOCK_K=256, SPLIT_K=8),
               _cfg(4, 4, BLOCK_N=128, BLOCK_M=16, BLOCK_K=256, SPLIT_K=2),
               _cfg(4, 4, BLOCK_N=128, BLOCK_M=64, BLOCK_K=128, SPLIT_K=2),
               _cfg(4, 4, BLOCK_N=128, BLOCK_M=64, BLOCK_K=128, SPLIT_K=1),
               _cfg(8, 3, BLOCK_N=128, BLOCK_M=128, BLOCK_K=128, SPLIT_K=1)]
_WO_MAX_SPLIT = max(c.kwargs["SPLIT_K"] for c in _WO_CONFIGS)


def _prune_mn(configs, named_args, **kw):
    """Tiles no larger than the problem (the smallest configuration always stays)."""
    M, N = named_args["M"], named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, triton.next_power_of_2(M))
            and c.kwargs["BLOCK_N"] <= max(64, triton.next_power_of_2(N))]
    return keep or configs[-1:]


def _prune_wo(configs, named_args, **kw):
    """Decode (M <= 16): BLOCK_M = 16 with split-K; M <= 64: BLOCK_M = 64; larger: 128. Each split
    keeps at least two BLOCK_K steps."""
    M, K = named_args["M"], named_args["K"]
    want = 16 if M <= 16 else 64 if M <= 64 else 128
    keep = [c for c in configs if c.kwargs["BLOCK_M"] == want
            and K >= 2 * c.kwargs["SPLIT_K"] * c.kwargs["BLOCK_K"]]
    return keep or [_cfg(4, 4, BLOCK_N=128, BLOCK_M=min(want, 64), BLOCK_K=128, SPLIT_K=1)]


_NV_TUNED = triton.autotune(_NV_CONFIGS, key=["M", "N", "K", "SA_ROWS", "SB_ROWS", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": _prune_mn})(_nvfp4_mm_kernel)
_MX_TUNED = triton.autotune(_MX_CONFIGS, key=["M", "N", "K", "SBLOCK", "HAS_BIAS"],
                            prune_configs_by={"early_config_prune": _prune_mn})(_mxfp4_mm_kernel)
_WO_TUNED = triton.autotune(_WO_CONFIGS, key=["M", "N", "K", "SBLOCK", "SROWS", "MX", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": _prune_wo})(_fp4_weight_only_kernel)


def last_config() -> dict:
    """Configurations the autotuners chose, per kernel and (M, N, K)."""
    out = {}
    for name, tuner in (("nvfp4", _NV_TUNED), ("mxfp4", _MX_TUNED), ("weight_only", _WO_TUNED)):
        for key, cfg in getattr(tuner, "cache", {}).items():
            out[f"{name}{tuple(key)}"] = str(cfg)
    return out


# ---- launchers -------------------------------------------------------------------------------------
def _storage(t, words: bool):
    """(packed data (R, K/2) bytes or (R, K/8) int32 words, block scale bytes (R/rows, K/cols),
    block rows, block cols), in storage orientation (along K)."""
    q, s = t._qdata, t._scale.view(torch.uint8)  # E8M0 / UE4M3 bytes, decoded in the kernel
    if q.stride(-1) != 1 or (words and (q.stride(0) % 4 or q.data_ptr() % 4)):
        q = q.contiguous()
    if s.stride(-1) != 1:
        s = s.contiguous()
    return (q.view(torch.int32) if words else q), s, t._block.rows, t._block.cols


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
    if t.kind == "mx" and (rows != 1 or cols % 32):
        return "MX blocks must be 1 x (a multiple of 32) along K"
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
    M, K = a.shape
    N = b.shape[1]
    if K % 32 or N % 16 or K < 32:
        return "FP4 GEMMs need K to be a multiple of 32 and N of 16"
    return None


def weight_only_support(a, b) -> Optional[str]:
    """None when ``fp4_weight_only_mm`` takes activations ``a`` and the FP4 weight ``b``."""
    why = _fp4_layout(b, "b")
    if why:
        return why
    if a.dtype not in (torch.bfloat16, torch.float16):
        return "weight-only FP4 GEMM takes bf16/fp16 activations"
    if a.dtype == torch.float16 and b.kind == "mx":
        return "MX weight-only GEMM takes bf16 activations (E8M0 scales exceed fp16's range)"
    M, K = a.shape
    N = b.shape[1]
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
    """``a @ b (+ bias)`` for FP4Tensors (NV x NV or MX x MX), ``a`` (M, K), ``b = weight.t()``.
    ``fast_dequant`` (NV): the PTX decode (default on sm_90) or the portable one."""
    why = fp4_support(a, b)
    if why:
        raise ValueError(f"fp4_scaled_mm: {why}")
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    words = a.kind == "nv"
    qa, sa, ra, _ = _storage(a, words)
    qb, sb, rb, blk = _storage(b, words)
    bias_t = bias.contiguous() if bias is not None else c
    grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    if a.kind == "nv":
        asm = _use_asm(a.device, torch.bfloat16) if fast_dequant is None else fast_dequant
        runnable(_NV_TUNED)[grid](qa, qb, c, bias_t, sa, sb, a._global_scale, b._global_scale, M, N, K,
                                  qa.stride(0), qb.stride(0), sa.stride(0), sb.stride(0), c.stride(0),
                                  c.stride(1), SA_ROWS=ra, SB_ROWS=rb, HAS_BIAS=bias is not None, ASM=asm,
                                  DOT_DTYPE=tl.float32 if interpreting() else tl.bfloat16,
                                  **_interp(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, GROUP_M=2)))
    else:
        runnable(_MX_TUNED)[grid](qa, qb, c, bias_t, sa, sb, M, N, K, qa.stride(0), qb.stride(0),
                                  sa.stride(0), sb.stride(0), c.stride(0), c.stride(1), SBLOCK=blk,
                                  HAS_BIAS=bias is not None,
                                  **_interp(dict(BLOCK_M=32, BLOCK_N=32, GROUP_M=2)))
    return c.to(out_dtype)


def fp4_weight_only_mm(a: torch.Tensor, b, out_dtype: Optional[torch.dtype] = None,
                       bias: Optional[torch.Tensor] = None, *, fast_dequant: Optional[bool] = None,
                       split_k: Optional[int] = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with bf16/fp16 activations ``a`` (M, K) and an FP4 weight ``b = w.t()``.

    ``split_k`` forces a K split (with a single configuration); by default it is autotuned.
    ``fast_dequant``: the PTX decode (default on sm_90 with bf16 activations) or the portable one."""
    why = weight_only_support(a, b)
    if why:
        raise ValueError(f"fp4_weight_only_mm: {why}")
    out_dtype = out_dtype or a.dtype
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    x = a if a.stride(1) == 1 else a.contiguous()
    qb, sb, rb, blk = _storage(b, True)
    asm = _use_asm(a.device, a.dtype) if fast_dequant is None else (fast_dequant and a.dtype == torch.bfloat16)
    bias_t = bias.contiguous() if bias is not None else c
    fixed = {}
    if interpreting():
        fixed = dict(BLOCK_N=32, BLOCK_M=16, BLOCK_K=64, SPLIT_K=split_k or 2)
    elif split_k is not None:
        fixed = dict(BLOCK_N=128, BLOCK_M=16 if M <= 16 else 64, BLOCK_K=128, SPLIT_K=split_k,
                     num_warps=4, num_stages=4)
    max_split = fixed.get("SPLIT_K", _WO_MAX_SPLIT)
    part = torch.empty((max_split, M, N), dtype=torch.float32, device=a.device) if max_split > 1 else c
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(M, meta["BLOCK_M"]))  # noqa: E731
    kernel = _fp4_weight_only_kernel if fixed and not interpreting() else runnable(_WO_TUNED)
    kernel[grid](x, qb, sb, b._global_scale, c, part, bias_t, M, N, K, x.stride(0), qb.stride(0),
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
SCAN_SPECS = (
    {"kernel": _nvfp4_mm_kernel, "num_warps": 8, "num_stages": 3,
     "signature": {"a_ptr": "*i32", "b_ptr": "*i32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "sa_ptr": "*u8",
                   "sb_ptr": "*u8", "ga_ptr": "*fp32", "gb_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                   "stride_a": "i32", "stride_b": "i32", "stride_sa": "i32", "stride_sb": "i32", **_OUT},
     "constexprs": dict(SA_ROWS=1, SB_ROWS=16, HAS_BIAS=True, ASM=True, DOT_DTYPE=tl.bfloat16, BLOCK_M=128,
                        BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
    {"kernel": _mxfp4_mm_kernel, "num_warps": 4, "num_stages": 4,
     "signature": {"a_ptr": "*u8", "b_ptr": "*u8", "c_ptr": "*bf16", "bias_ptr": "*bf16", "sa_ptr": "*u8",
                   "sb_ptr": "*u8", "M": "i32", "N": "i32", "K": "i32", "stride_a": "i32", "stride_b": "i32",
                   "stride_sa": "i32", "stride_sb": "i32", **_OUT},
     "constexprs": dict(SBLOCK=32, HAS_BIAS=True, BLOCK_M=64, BLOCK_N=128, GROUP_M=8)},
    {"kernel": _fp4_weight_only_kernel, "num_warps": 4, "num_stages": 3,
     "signature": {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "c_ptr": "*bf16",
                   "part_ptr": "*fp32", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                   "stride_xm": "i32", "stride_w": "i32", "stride_s": "i32", **_OUT},
     "constexprs": dict(SBLOCK=16, SROWS=16, MX=False, SPLIT_K=4, HAS_BIAS=True, ASM=True, DOT_DTYPE=tl.bfloat16,
                        BLOCK_N=128, BLOCK_M=16, BLOCK_K=256)},
    {"kernel": _splitk_reduce_kernel, "num_warps": 4, "num_stages": 1,
     "signature": {"part_ptr": "*fp32", "g_ptr": "*fp32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "M": "i32",
                   "N": "i32", **_OUT},
     "constexprs": dict(SPLIT_K=4, HAS_BIAS=True, BLOCK=1024)},
)
