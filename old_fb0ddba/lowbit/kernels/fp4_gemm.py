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
* **Weight-only** (``fp4_weight_only``: ``_wo_kernel``): bf16 (or fp16, NV only) activations
  times an NV or MX FP4 weight as ``C^T = W' @ X^T`` (the decoded weight is the wgmma register
  operand), K split over ``SPLIT_K`` programs whose partials the last-arriving program of each tile
  adds in split order (deterministic, one launch). Launch reasoning there.
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

from .cuda_device import capability
from .fp4_decode import _ASM_MX, _ASM_NV, _decode_cat, _scale_bytes, _word_scales, _words  # noqa: F401
from .fp4_weight_only import (SCAN_SPECS as WO_SCAN_SPECS, WO_CONFIGS as _WO_CONFIGS, fp4_weight_only_mm,  # noqa: F401
                              prune_wo as _prune_wo, weight_only_support, wo_last_config)
from .gemm import _store_dtype, _store_tile, _tile_coords, autotune_choices
from .interpret import interpreting, runnable
from .launch_math import cdiv, next_pow2

__all__ = ["fp4_scaled_mm", "fp4_weight_only_mm", "fp4_support", "weight_only_support", "last_config",
           "SCAN_SPECS"]


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


# ---- autotuning (H200) -----------------------------------------------------------------------------
def _cfg(warps, stages, **kw):
    return triton.Config(kw, num_warps=warps, num_stages=stages)


# BLOCK_K = 128 keeps the dequantized A tile at 32-64 registers a thread (ptxas, sm_90a: 128x128
# with 8 warps 187 registers, 128x256 255, no spills); it holds whole scale blocks (16 .. 128).
_MM_CONFIGS = [_cfg(8, 3, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8),
               _cfg(8, 3, BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8),
               _cfg(8, 4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8),
               _cfg(4, 4, BLOCK_M=64, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)]


def _prune_mn(configs, named_args, **kw):
    """Tiles no larger than the problem (the smallest configuration always stays)."""
    M, N = named_args["M"], named_args["N"]
    keep = [c for c in configs if c.kwargs["BLOCK_M"] <= max(64, next_pow2(M))
            and c.kwargs["BLOCK_N"] <= max(64, next_pow2(N))]
    return keep or configs[-1:]


_EVEN_K = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
_MM_TUNED = triton.autotune(_MM_CONFIGS, key=["M", "N", "K", "SBLOCK", "SA_ROWS", "SB_ROWS", "MX", "HAS_BIAS", "ASM"],
                            prune_configs_by={"early_config_prune": _prune_mn})(_EVEN_K(_fp4_mm_kernel))


def last_config() -> dict:
    """Configurations the autotuners chose, per kernel and (M, N, K)."""
    return {**autotune_choices({"fp4_mm": _MM_TUNED}), **wo_last_config()}


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
        and capability(device) >= (9, 0)


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
    grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
    runnable(_MM_TUNED)[grid](qa, qb, c, bias_t, sa, sb, a._global_scale, b._global_scale, M, N, K,
                              qa.stride(0), qb.stride(0), sa.stride(0), sb.stride(0), c.stride(0), c.stride(1),
                              SBLOCK=blk, SA_ROWS=ra, SB_ROWS=rb, MX=a.kind == "mx", HAS_BIAS=bias is not None,
                              ASM=asm, DOT_DTYPE=_dot_dtype(torch.bfloat16),
                              **_interp(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=bk, GROUP_M=2, EVEN_K=K % bk == 0)))
    return c.to(out_dtype)


# ---- sm_90 compile configurations for fma_guard ------------------------------------------------------
_OUT = {"stride_cm": "i32", "stride_cn": "i32"}
_MM_SIG = {"a_ptr": "*i32", "b_ptr": "*i32", "c_ptr": "*bf16", "bias_ptr": "*bf16", "sa_ptr": "*u8", "sb_ptr": "*u8",
           "ga_ptr": "*fp32", "gb_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_a": "i32",
           "stride_b": "i32", "stride_sa": "i32", "stride_sb": "i32", **_OUT}
SCAN_SPECS = WO_SCAN_SPECS + (
    {"kernel": _fp4_mm_kernel, "num_warps": 8, "num_stages": 3, "signature": _MM_SIG,  # MX, streamed
     "constexprs": dict(SBLOCK=32, SA_ROWS=1, SB_ROWS=1, MX=True, HAS_BIAS=True, ASM=True, EVEN_K=True,
                        DOT_DTYPE=tl.bfloat16, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
    {"kernel": _fp4_mm_kernel, "num_warps": 8, "num_stages": 3, "signature": _MM_SIG,  # NV, masked K
     "constexprs": dict(SBLOCK=16, SA_ROWS=1, SB_ROWS=16, MX=False, HAS_BIAS=True, ASM=True, EVEN_K=False,
                        DOT_DTYPE=tl.bfloat16, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8)},
)

