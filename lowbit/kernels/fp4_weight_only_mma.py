"""Weight-only FP4 GEMM for Hopper on mma.sync (Gluon, ``mma_v2``): the 16 tokens are the MMA's M,
the weight rows its N, so an ``HMMA.16816`` does 16 x 8 x 16 useful products (the wgmma kernel of
``fp4_weight_only`` computes ``C^T`` with the weight as the m64 operand and the tokens as N = 16).

Math (``fp4_weight_only``'s). ``C = X @ W^T (+ bias)``, ``W[n, k] = e2m1[n, k] * s(n, k) * g``; a
program computes ``C[m-tile (16), n-tile]`` over one K split: the weight words are decoded to bf16
exactly in registers (``fp4_decode``'s DECODE 1 PTX: ``e2m1 * s``, NV times 2^-8, undone in the
epilogue) and are the MMA's B operand; fp32 accumulation. Bound: ``gemm_bound``, ``gamma_(K + 3)``.

Layouts. A step is 128 K: 16 int32 words (8 codes each) a weight row. The words are loaded as an
int32 ``(16, BLOCK_N)`` tensor in the MMA's B-operand layout (``DotOperandLayout(1, mma, 2)``:
a thread holds words (2q, 2q + 1) and (2q + 8, 2q + 9) of row n, 8-byte loads), so the decode of
its word pairs (``pack=2``) gives 8 bf16 tensors in that same layout: tensor x holds code x of
every word, i.e. the B operand of the 16 x BLOCK_N x 16 product whose K index w is element
``8 w + x`` of the step. The activations are staged once per program in shared memory permuted
the same way (``xs[x K_STEPS + j][m, w] = X[m, k_lo + 128 j + 8 w + x]``) and loaded per slot as
the A operand. Per step: 8 ``mma_v2`` (one a slot), the next steps' words already loading.

Split-K and the fixup are ``fp4_weight_only``'s REDUCE 2: fp32 partials, the last program of a
tile to arrive adds them in split order (deterministic), applies g and the bias, stores C and
resets its counter. ``wo_mma_mm`` returns None (declines) where this kernel does not apply: no
Gluon, not sm_90, fp16 activations, M > 16, K not a multiple of 128, a K split over 2048.
"""
from __future__ import annotations

from typing import Optional

import torch

from .fp4_decode import _asm
from .launch_math import cdiv

__all__ = ["wo_mma_mm", "wo_mma_support", "WO_MMA_CONFIGS", "DEFAULT_WO_MMA", "compile_wo_mma_for_sm90"]

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import mma_v2
    _IMPORT_ERROR = None
except Exception as e:  # pragma: no cover - depends on the installed triton
    gluon = gl = None
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

STEP_K = 128  # K elements a step: 16 words of 8 codes a row
MAX_SPLIT_K_ELEMS = 2048  # activations of a program in shared memory: 16 x 2048 bf16 = 64 KB

if gl is not None:
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):  # triton 3.9
        @gluon.jit
        def _reinterpret(smem, shape: gl.constexpr, layout: gl.constexpr):
            """``smem``'s bytes viewed with another layout."""
            return smem.reinterpret(gl.bfloat16, shape, layout)
    else:  # triton 3.6
        @gluon.jit
        def _reinterpret(smem, shape: gl.constexpr, layout: gl.constexpr):
            """``smem``'s bytes viewed with another layout."""
            return smem._reinterpret(gl.bfloat16, shape, layout)
    _ASM_NV = gl.constexpr(_asm(0x3F803F80, 1))  # scale pre-multiplied by 2^118: e2m1 * s * 2^-8
    _ASM_MX = gl.constexpr(_asm(0x7E807E80, 1))  # x 2^126, then x 2^k: e2m1 * 2^k
    _STEP_K = gl.constexpr(STEP_K)

    @gluon.jit
    def _load_step(w_ptr, s_ptr, wrow, ncol, k0, stride_w, stride_s, SBLOCK: gl.constexpr, SROWS: gl.constexpr):
        """(words, scale bytes) of a step: ``wrow`` (16, BLOCK_N) word index in the step, ``ncol`` the
        weight row (both in the B-operand layout)."""
        words = gl.load(w_ptr + ncol * stride_w + (k0 // 8 + wrow))
        sbytes = gl.load(s_ptr + (ncol // SROWS) * stride_s + (k0 + 8 * wrow) // SBLOCK)
        return words, sbytes

    @gluon.jit
    def _scale_operand(sbytes, MX: gl.constexpr):
        """Scale bytes -> the decode's bf16 scale: NV UE4M3 * 2^118, MX 2^k (both exact in bf16)."""
        if MX:
            e = sbytes.to(gl.int32)
            v = gl.where(e == 0, 0x00400000, e << 23).to(gl.float32, bitcast=True)
            v = gl.where(e == 255, float("nan"), v)
            return v.to(gl.bfloat16)
        else:
            v = sbytes.to(gl.float8e4nv, bitcast=True).to(gl.float32)
            return (v * 3.3231458909047650e35).to(gl.bfloat16)

    @gluon.jit
    def _stage_x(x_ptr, xs, k_lo, M, K, stride_xm, K_STEPS: gl.constexpr, num_warps: gl.constexpr):
        """Activations of this program's K range into ``xs[x K_STEPS + j]`` = ``X[m, k_lo + 128 j + 8 w
        + x]`` as (m, w) tiles (0 past M and K): one load of the whole range, split by slot."""
        xl: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 2, 16, 1], [1, num_warps, 1, 1], [3, 2, 1, 0])
        j = gl.arange(0, K_STEPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, xl))))
        m = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, xl))))
        w = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, xl))))
        x = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, xl))))
        j4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(j, 1), 2), 3)
        m4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(m, 0), 2), 3)
        w4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(w, 0), 1), 3)
        x4 = gl.expand_dims(gl.expand_dims(gl.expand_dims(x, 0), 1), 2)
        k = k_lo + _STEP_K * j4 + 8 * w4  # a word's 8 elements lie wholly inside K or past it (K % 128 == 0)
        v = gl.load(x_ptr + m4 * stride_xm + k + x4, mask=(m4 < M) & (k < K), other=0.0)  # (j, m, w, x)
        e, o = gl.split(gl.reshape(v, [K_STEPS, 16, 16, 4, 2]))  # x = 2a + b
        e0, e1 = gl.split(gl.reshape(e, [K_STEPS, 16, 16, 2, 2]))  # a = 2c + d
        o0, o1 = gl.split(gl.reshape(o, [K_STEPS, 16, 16, 2, 2]))
        x0, x4 = gl.split(e0)
        x2, x6 = gl.split(e1)
        x1, x5 = gl.split(o0)
        x3, x7 = gl.split(o1)
        xs.slice(0 * K_STEPS, K_STEPS).store(x0)
        xs.slice(1 * K_STEPS, K_STEPS).store(x1)
        xs.slice(2 * K_STEPS, K_STEPS).store(x2)
        xs.slice(3 * K_STEPS, K_STEPS).store(x3)
        xs.slice(4 * K_STEPS, K_STEPS).store(x4)
        xs.slice(5 * K_STEPS, K_STEPS).store(x5)
        xs.slice(6 * K_STEPS, K_STEPS).store(x6)
        xs.slice(7 * K_STEPS, K_STEPS).store(x7)

    @gluon.jit
    def _wo_mma_kernel(x_ptr, w_ptr, s_ptr, g_ptr, c_ptr, part_ptr, lock_ptr, bias_ptr, M, N, K,
                       stride_xm, stride_w, stride_s, stride_cm, stride_cn,
                       SBLOCK: gl.constexpr, SROWS: gl.constexpr, MX: gl.constexpr, SPLIT_K: gl.constexpr,
                       K_STEPS: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_N: gl.constexpr,
                       PREFETCH: gl.constexpr, num_warps: gl.constexpr):
        """One (n-tile, K split) program over the 16 tokens; see the module docstring. Grid:
        n_tiles * SPLIT_K, the splits of a tile adjacent."""
        gl.static_assert(BLOCK_N % (8 * num_warps) == 0, "whole n8 column blocks per warp")
        gl.static_assert(PREFETCH == 1 or PREFETCH == 2, "one or two steps of words in flight")
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps],
                                                      instr_shape=[16, 8])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        xs_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=3)
        xa_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)

        pid = gl.program_id(0)
        pid_k = pid % SPLIT_K
        pid_n = pid // SPLIT_K
        off_n = pid_n * BLOCK_N
        k_lo = pid_k * (K_STEPS * _STEP_K)
        n_steps = gl.minimum(K - k_lo, K_STEPS * _STEP_K) // _STEP_K

        xs = gl.allocate_shared_memory(gl.bfloat16, [8 * K_STEPS, 16, 16], xs_layout)
        wrow = gl.arange(0, 16, layout=gl.SliceLayout(1, b_layout))
        ncol = gl.minimum(off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, b_layout)), N - 1)
        wrow2, ncol2 = gl.broadcast(gl.expand_dims(wrow, 1), gl.expand_dims(ncol, 0))
        last = k_lo + (n_steps - 1) * _STEP_K  # loads past the split re-read its last step (unused)
        w0, s0 = _load_step(w_ptr, s_ptr, wrow2, ncol2, k_lo, stride_w, stride_s, SBLOCK, SROWS)
        w1, s1 = _load_step(w_ptr, s_ptr, wrow2, ncol2, gl.minimum(k_lo + _STEP_K, last), stride_w, stride_s,
                            SBLOCK, SROWS)
        _stage_x(x_ptr, xs, k_lo, M, K, stride_xm, K_STEPS, num_warps)
        _cta_barrier()  # every thread's activations stored before any thread reads them
        xa = _reinterpret(xs, [8 * K_STEPS, 16, 16], xa_layout)  # the same bytes as (m, w) tiles

        acc = gl.zeros([16, BLOCK_N], gl.float32, mma)
        for j in range(n_steps):
            wc = w0
            sc = s0
            if PREFETCH == 2:
                w0 = w1
                s0 = s1
                w1, s1 = _load_step(w_ptr, s_ptr, wrow2, ncol2, gl.minimum(k_lo + (j + 2) * _STEP_K, last),
                                    stride_w, stride_s, SBLOCK, SROWS)
            else:
                w0, s0 = _load_step(w_ptr, s_ptr, wrow2, ncol2, gl.minimum(k_lo + (j + 1) * _STEP_K, last),
                                    stride_w, stride_s, SBLOCK, SROWS)
            sv = _scale_operand(sc, MX)
            if MX:
                asm: gl.constexpr = _ASM_MX
            else:
                asm: gl.constexpr = _ASM_NV
            t0, t1, t2, t3, t4, t5, t6, t7 = gl.inline_asm_elementwise(
                asm, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r", [wc, sv], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
            acc = mma_v2(xa.index(0 * K_STEPS + j).load(a_layout), t0, acc)
            acc = mma_v2(xa.index(1 * K_STEPS + j).load(a_layout), t1, acc)
            acc = mma_v2(xa.index(2 * K_STEPS + j).load(a_layout), t2, acc)
            acc = mma_v2(xa.index(3 * K_STEPS + j).load(a_layout), t3, acc)
            acc = mma_v2(xa.index(4 * K_STEPS + j).load(a_layout), t4, acc)
            acc = mma_v2(xa.index(5 * K_STEPS + j).load(a_layout), t5, acc)
            acc = mma_v2(xa.index(6 * K_STEPS + j).load(a_layout), t6, acc)
            acc = mma_v2(xa.index(7 * K_STEPS + j).load(a_layout), t7, acc)

        offs_m = gl.arange(0, 16, layout=gl.SliceLayout(1, mma))
        offs_n = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        if SPLIT_K > 1:
            TILE: gl.constexpr = BLOCK_N * 16
            local = gl.expand_dims(gl.arange(0, 16, layout=gl.SliceLayout(1, mma)), 1) * BLOCK_N \
                + gl.expand_dims(gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma)), 0)
            base_p = part_ptr + pid_n.to(gl.int64) * (SPLIT_K * TILE)
            gl.store(base_p + pid_k * TILE + local, acc)
            _cta_barrier()  # every thread's partial stored before the release below
            arrived = gl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # the last split of this tile: add all, in split order
                tot = gl.load(base_p + local, cache_modifier=".cg")
                for s_i in range(1, SPLIT_K):
                    tot += gl.load(base_p + s_i * TILE + local, cache_modifier=".cg")
                _wo_store(tot, g_ptr, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS, not MX)
                gl.atomic_xchg(lock_ptr + pid_n, 0)  # ready for the next launch
        else:
            _wo_store(acc, g_ptr, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn, HAS_BIAS, not MX)

    @gluon.jit
    def _wo_store(acc, g_ptr, c_ptr, bias_ptr, offs_m, offs_n, M, N, stride_cm, stride_cn,
                  HAS_BIAS: gl.constexpr, UNDO_NV: gl.constexpr):
        """``C[tile] = acc (* 2^8 for the NV decode, exact) * g (+ bias)``, cast, masked."""
        if UNDO_NV:
            acc = acc * 256.0
        out = acc * gl.load(g_ptr)
        if HAS_BIAS:
            out = out + gl.expand_dims(gl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(gl.float32), 0)
        mask = gl.expand_dims(offs_m < M, 1) & gl.expand_dims(offs_n < N, 0)
        gl.store(c_ptr + gl.expand_dims(offs_m, 1) * stride_cm + gl.expand_dims(offs_n, 0) * stride_cn,
                 out.to(c_ptr.dtype.element_ty), mask=mask)
else:  # pragma: no cover
    _wo_mma_kernel = None


# ---- configurations: name -> (BLOCK_N, num_warps, SPLIT_K, PREFETCH) ---------------------------------
WO_MMA_CONFIGS = {
    "n128_w8_s4": (128, 8, 4, 2),
    "n128_w8_s8": (128, 8, 8, 2),
    "n256_w8_s4": (256, 8, 4, 2),
    "n256_w8_s8": (256, 8, 8, 2),
    "n64_w4_s8": (64, 4, 8, 2),
    "n128_w4_s8": (128, 4, 8, 2),
    "n128_w8_s8_p1": (128, 8, 8, 1),
}
DEFAULT_WO_MMA = "n128_w8_s8"


def wo_mma_support(a, b, config: Optional[str] = None) -> Optional[str]:
    """None when ``wo_mma_mm`` runs ``a`` (bf16 activations) x the FP4 weight ``b``, else why not."""
    if _IMPORT_ERROR is not None:
        return f"gluon unavailable ({_IMPORT_ERROR})"
    from .fp4_weight_only import weight_only_support
    why = weight_only_support(a, b)
    if why:
        return why
    if a.device.type != "cuda" or torch.cuda.get_device_capability(a.device) != (9, 0):
        return "the mma.sync weight-only kernel is tuned for sm_90"
    if a.dtype != torch.bfloat16:
        return "bf16 activations only"
    M, K = a.shape
    if M > 16:
        return "M <= 16 (one 16-token tile)"
    if K % STEP_K:
        return f"K must be a multiple of {STEP_K}"
    name = config or DEFAULT_WO_MMA
    if name not in WO_MMA_CONFIGS:
        return f"unknown config {name!r}; one of {sorted(WO_MMA_CONFIGS)}"
    split = WO_MMA_CONFIGS[name][2]
    if cdiv(cdiv(K, split), STEP_K) * STEP_K > MAX_SPLIT_K_ELEMS:
        return f"a K split of more than {MAX_SPLIT_K_ELEMS} (K {K}, split {split})"
    if a.stride(1) != 1 or a.stride(0) % 8 or a.data_ptr() % 16:
        return "activations must be row-major with 16-byte aligned rows"
    return None


def wo_mma_mm(a: torch.Tensor, b, out_dtype: Optional[torch.dtype] = None, bias: Optional[torch.Tensor] = None,
              *, config: Optional[str] = None) -> Optional[torch.Tensor]:
    """``a @ b (+ bias)`` with bf16 activations ``a`` (M <= 16, K) and an FP4 weight ``b = w.t()``
    on the mma.sync kernel, or None where ``wo_mma_support`` declines."""
    if wo_mma_support(a, b, config) is not None:
        return None
    from . import fp4_gemm as f
    from .fp4_weight_only import TILE_COUNTERS
    from .gemm import _store_dtype
    block_n, warps, split, prefetch = WO_MMA_CONFIGS[config or DEFAULT_WO_MMA]
    out_dtype = out_dtype or a.dtype
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    qb, sb, rb, blk = f._storage(b)
    k_steps = cdiv(cdiv(K, split), STEP_K)
    split = cdiv(K, k_steps * STEP_K)  # no empty splits
    n_tiles = cdiv(N, block_n)
    part = torch.empty(n_tiles * block_n * 16 * split if split > 1 else 1, dtype=torch.float32, device=a.device)
    locks = TILE_COUNTERS.get(a.device, n_tiles) if split > 1 else part
    bias_t = bias.contiguous() if bias is not None else c
    _wo_mma_kernel[(n_tiles * split,)](
        a, qb, sb, b._global_scale, c, part, locks, bias_t, M, N, K, a.stride(0), qb.stride(0), sb.stride(0),
        c.stride(0), c.stride(1), SBLOCK=blk, SROWS=rb, MX=b.kind == "mx", SPLIT_K=split, K_STEPS=k_steps,
        HAS_BIAS=bias is not None, BLOCK_N=block_n, PREFETCH=prefetch, num_warps=warps)
    return c.to(out_dtype)


# ---- compile without a GPU (tests, SASS inspection) ------------------------------------------------
def compile_wo_mma_for_sm90(config: str = DEFAULT_WO_MMA, mx: bool = False, sblock: int = 16, srows: int = 16,
                            k: int = 8192, has_bias: bool = False):
    """``triton.compile`` of the kernel for sm_90 on the CPU (``.asm["ptx"]``, ``.asm["cubin"]``,
    ``.n_regs``, ``.n_spills``, ``.metadata.shared``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    block_n, warps, split, prefetch = WO_MMA_CONFIGS[config]
    sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*u8", "g_ptr": "*fp32", "c_ptr": "*bf16",
           "part_ptr": "*fp32", "lock_ptr": "*i32", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "stride_xm": "i32", "stride_w": "i32", "stride_s": "i32", "stride_cm": "i32", "stride_cn": "i32"}
    consts = dict(SBLOCK=sblock, SROWS=srows, MX=mx, SPLIT_K=split, K_STEPS=cdiv(cdiv(k, split), STEP_K),
                  HAS_BIAS=has_bias, BLOCK_N=block_n, PREFETCH=prefetch, num_warps=warps)
    for name in consts:
        sig[name] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
             if name in ("x_ptr", "w_ptr", "s_ptr", "c_ptr", "part_ptr", "stride_xm", "stride_w", "stride_s")}
    try:  # exported from triton.experimental.gluon in 3.9; only in its _runtime module in 3.6
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(_wo_mma_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
