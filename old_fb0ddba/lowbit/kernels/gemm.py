"""Scaled FP8 GEMMs in Triton: ``C = (qA * sA) @ (qB * sB) (+ bias)``, fp32 accumulation.

A is ``(M, K)``, B is ``(K, N)`` (``B = weight.t()``: its storage is the K-major ``(N, K)`` weight).
Scales are dequantization factors (DESIGN.md). Each operand's scale is constant over a block of
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
promote out of step, hung on the H200 and was removed.)

Error (on an fp32-accumulating machine, e.g. the interpreter): ``|C - C*| <= gamma_(K + n + 2)
sum_k |a_k b_k|`` with ``n`` the number of chunks (``lowbit.validate.metrics.gemm_bound``).
FMA: the epilogues contract ``acc * s + bias`` and ``part * s + acc`` into single roundings; no
product is used twice, so no contracted-vs-rounded hazard (fma_guard scans ``SCAN_SPECS``).

Kernels: ``_scaled_mm_kernel`` (pointer loads, any strides, one tile per program),
``_scaled_mm_tma_kernel`` (TMA loads through host tensor descriptors, K-major A and B; persistent
or one program per tile, an autotuning choice). Each is autotuned over a short list checked with
ptxas for sm_90a; ``last_config()`` names the winners. ``variant="auto"`` runs the TMA kernel on
sm_90+ for K-major operands, else the pointer kernel.
Under ``TRITON_INTERPRET=1`` (read per call) they run on CPU tensors with one small fixed
configuration.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from .cuda_device import capability, sm_count
from .interpret import interpreting, runnable
from .launch_math import cdiv

__all__ = ["fp8_scaled_mm", "fp8_support", "gemm_plan", "last_config", "SCAN_SPECS"]

try:  # host-side TMA descriptors (triton >= 3.4)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None


# ---- jit helpers -------------------------------------------------------------------------------
@triton.jit
def _e8m0_to_fp32(e):
    """E8M0 byte -> fp32 ``2^(e - 127)`` exactly (e = 0 is the subnormal 2^-127; 0xFF is NaN)."""
    e = e.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, e << 23)
    return tl.where(e == 255, float("nan"), bits.to(tl.float32, bitcast=True))


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
def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Grouped ordering: GROUP_M row-tiles share each B column-tile while it sits in L2."""
    width = GROUP_M * num_pid_n
    first_m = (tile // width) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile % width) % group_m
    pid_n = (tile % width) // group_m
    return pid_m, pid_n


@triton.jit
def _store_tile(c_ptr, bias_ptr, out, off_m, off_n, M, N, stride_cm, stride_cn,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``C[tile] = out (+ bias)`` cast to C's dtype, masked at the edges."""
    offs_m = off_m + tl.arange(0, BLOCK_M)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        out = out + tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
             out.to(c_ptr.dtype.element_ty), mask=mask)


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


# ---- kernels -----------------------------------------------------------------------------------
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


# ---- autotuning (H200) ---------------------------------------------------------------------------
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, persistent), checked with ptxas for sm_90a (no
# spills; the pointer kernel ignores `persistent`). Promoted accumulation holds two fp32 tiles (sum
# and chunk), so its tiles are 128x128 at most; a 64x128 tile with 4 warps lets two programs share an
# SM, one scaling while the other multiplies. The fast pool is persistent-only: adding
# one-program-per-tile twins made the autotuner pick slower configurations on the H200 (4096^3:
# 0.58x instead of 1.00x cuBLAS; 2048x4096x4096: 0.33x instead of 0.75x).
# M <= 128 streams B: narrow tiles put more programs on the SMs (64x32: 256 programs at N = 8192);
# 128x64 reads B once when M = 128.
_FAST = [(128, 256, 128, 8, 3, 1), (128, 256, 64, 8, 4, 1), (128, 128, 128, 8, 4, 1)]
_PRECISE = [(128, 128, 128, 8, 4, 1), (64, 128, 128, 4, 4, 0), (128, 128, 128, 8, 3, 0)]
_SMALL = [(64, 128, 128, 4, 4, 0), (64, 64, 128, 4, 6, 0), (64, 32, 128, 4, 8, 0), (128, 64, 128, 4, 6, 0)]
_KEY = ["M", "N", "K", "SA_ROWS", "SA_K", "SB_K", "SB_COLS", "K_SCALED", "PROMOTE", "E8M0", "HAS_BIAS"]


def _set_blocks(nargs):
    """TMA descriptors carry the tile shape: set it from the configuration being launched."""
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b_desc"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


def _cfg(kind, bm, bn, bk, warps, stages, persistent=0):
    """A ``triton.Config`` of ``kind`` ("pointer" or "tma") from a pool row."""
    kw = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    if kind != "pointer":
        kw["PERSISTENT"] = bool(persistent)
    return triton.Config(kw, num_warps=warps, num_stages=stages,
                         pre_hook=None if kind == "pointer" else _set_blocks)


def _kind(cfg) -> str:
    return "tma" if "PERSISTENT" in cfg.kwargs else "pointer"


def _configs(kind):
    rows = _FAST + _PRECISE + _SMALL
    return [_cfg(kind, *c) for c in dict.fromkeys(r[:5] if kind == "pointer" else r for r in rows)]


def _chunk(sa_k: int, sb_k: int) -> int:
    ks = [k for k in (sa_k, sb_k) if k]
    return math.gcd(*ks) if ks else 0


def _prune(configs, named_args, **kw):
    """The list that fits this call: M <= 128 -> ``_SMALL``; else ``_PRECISE`` when promoting
    (K-scaled or PROMOTE), ``_FAST`` otherwise; K-scaled needs BLOCK_K | chunk. An odd chunk
    (MX-32) gets BLOCK_K = gcd(chunk, 128)."""
    kind = _kind(configs[0])
    chunk = _chunk(kw["SA_K"], kw["SB_K"]) if kw["K_SCALED"] else 0
    pool = _SMALL if named_args["M"] <= 128 else (_PRECISE if chunk or kw["PROMOTE"] else _FAST)
    bk = math.gcd(chunk, 128) if chunk else None
    keep = {}
    for row in pool:
        cfg = (row[0], row[1], bk if chunk and chunk % row[2] else row[2], *row[3:])  # BLOCK_K | chunk
        cfg = cfg[:5] if kind == "pointer" else cfg  # the pointer kernel has no `persistent`
        keep.setdefault(cfg, _cfg(kind, *cfg))
    return list(keep.values())


def _tuned(kernel, kind):
    return triton.autotune(configs=_configs(kind), key=_KEY,
                           prune_configs_by={"early_config_prune": _prune})(kernel)


_PTR_TUNED = _tuned(_scaled_mm_kernel, "pointer")
_TMA_TUNED = _tuned(_scaled_mm_tma_kernel, "tma")


def autotune_choices(tuners: dict) -> dict:
    """``{"<name>(<tuning key>)": config}`` for every call the named autotuners have tuned."""
    return {f"{name}{tuple(key)}": str(cfg) for name, tuner in tuners.items()
            for key, cfg in getattr(tuner, "cache", {}).items()}


def last_config() -> dict:
    """Configurations the autotuners chose, per kernel and tuning key (for benchmark reports)."""
    return autotune_choices({"pointer": _PTR_TUNED, "tma": _TMA_TUNED})


# ---- launcher ------------------------------------------------------------------------------------
def _extent(v: int, full: int) -> int:
    """Block extent for the kernel: 0 when one scale spans the whole dim."""
    return 0 if v == -1 or v >= full else v


def gemm_plan(a, b):
    """Scale geometry of ``a @ b`` as the kernels take it, or a string saying why they can't:
    ``dict(SA_ROWS, SA_K, SB_K, SB_COLS, K_SCALED, E8M0)`` (0 = one scale along that dim)."""
    M, K = a.shape
    N = b.shape[1]
    e8 = (a._scale.dtype == torch.float8_e8m0fnu, b._scale.dtype == torch.float8_e8m0fnu)
    if e8[0] != e8[1]:
        return "one operand has E8M0 (MX) scales and the other fp32 scales"
    ra, ka = a.block.sizes(a.shape) if not a.block.is_tensorwise else (-1, -1)
    kb, cb = b.block.sizes(b.shape) if not b.block.is_tensorwise else (-1, -1)
    plan = dict(SA_ROWS=_extent(ra if a.block.rows != -1 else -1, M),
                SA_K=_extent(ka if a.block.cols != -1 else -1, K),
                SB_K=_extent(kb if b.block.rows != -1 else -1, K),
                SB_COLS=_extent(cb if b.block.cols != -1 else -1, N), E8M0=e8[0])
    chunk = _chunk(plan["SA_K"], plan["SB_K"])
    if chunk % 32:
        return "K-scale blocks whose common chunk is not a multiple of 32 elements"
    plan["K_SCALED"] = chunk != 0
    return plan


def _scale_args(t):
    s = t._scale
    if s.dtype == torch.float8_e8m0fnu:
        s = s.view(torch.uint8)
    return (s, 0, 0) if s.dim() == 0 else (s, s.stride(-2), s.stride(-1))


def _aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0


def tma_ok(a_data: torch.Tensor, b_data: torch.Tensor) -> bool:
    """TMA path: K-major A (M, K) and B (K, N) (i.e. B^T row-major), 16-byte aligned rows."""
    return (TensorDescriptor is not None and a_data.stride(1) == 1 and b_data.stride(0) == 1
            and a_data.stride(0) % 16 == 0 and b_data.stride(1) % 16 == 0
            and _aligned(a_data) and _aligned(b_data))


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 3
    return sm_count(device)


def _store_dtype(out_dtype: torch.dtype) -> torch.dtype:
    """What the kernels write: ``out_dtype``, or fp32 under the interpreter, whose fp32 -> bf16 cast
    truncates (triton 3.9); torch then rounds that fp32 result to nearest even, as the GPU does."""
    return torch.float32 if interpreting() else out_dtype


def _interpret_config(plan) -> dict:
    chunk = _chunk(plan["SA_K"], plan["SB_K"]) if plan["K_SCALED"] else 0
    return {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": math.gcd(chunk, 128) if chunk else 64, "GROUP_M": 2}


def _interpret_tma_config(plan) -> dict:
    return {**_interpret_config(plan), "PERSISTENT": True}


def _auto_variant(device, qa, qb) -> str:
    """"tma" on sm_90+ for K-major operands, else "pointer"."""
    if device.type != "cuda" or capability(device)[0] < 9 or not tma_ok(qa, qb):
        return "pointer"
    return "tma"


def _gluon_first(M: int, fast_accum: bool, variant: str, k_scaled: bool = False) -> bool:
    """Whether ``fp8_scaled_mm`` offers the call to the Gluon kernels before the Triton ones:
    "ws" always; "auto" for promoting GEMMs of M >= 128 rows (H200, CUDA-graph timing, N = K =
    8192: at M = 16 the plain-Triton small-M tiles won in every mode, 0.0278-0.0302 vs
    0.0311-0.0355 ms; at M = 128 they were within 4% of each other, Gluon ahead for blockwise).
    K-scaled GEMMs promote whatever ``fast_accum`` says, so they count as promoting (the fp8-block
    forward: 13.29 against 13.77 ms a FFN step on the H200, 2026-12-01)."""
    if variant == "ws":
        return True
    return (k_scaled or not fast_accum) and M >= 128


def fp8_scaled_mm(a, b, out_dtype: torch.dtype = torch.float32, bias: Optional[torch.Tensor] = None,
                  *, fast_accum: bool = False, variant: str = "auto") -> torch.Tensor:
    """``a @ b (+ bias)`` for FP8Tensors a ``(M, K)``, b ``(K, N)`` on the Triton kernels.

    ``fast_accum``: no promotion for tensorwise/rowwise scales (K-scaled GEMMs always promote per
    chunk). ``variant``: "auto" (the promoting warp-specialized Gluon kernel, ``gemm_gluon`` /
    ``gemm_gluon_ws``, where it takes the call: sm_90, not fast_accum, M >= 128 (``_gluon_first``),
    tensorwise / rowwise / 1x128 x 128x128 blockwise scales; else "triton"), "ws" (as "auto", and fast_accum on the
    warp-specialized 128x256 kernel, where "auto" keeps the plain-Triton one, faster there),
    "triton" (``_auto_variant`` of the two Triton kernels), "tma" or "pointer".
    """
    plan = gemm_plan(a, b)
    if isinstance(plan, str):
        raise ValueError(f"fp8_scaled_mm: {plan}")
    if plan["K_SCALED"]:
        fast_accum = False  # K-scaled GEMMs promote every chunk whatever fast_accum says (docstring)
    if variant in ("auto", "ws"):
        if _gluon_first(a.shape[0], fast_accum, variant, plan["K_SCALED"]) and a.device.type == "cuda" \
                and not interpreting():
            from .gemm_gluon import gluon_fp8_scaled_mm
            from .gemm_gluon_ws import WS_DEFAULT
            config = WS_DEFAULT["fast" if fast_accum else "promote"] if variant == "ws" else None
            out = gluon_fp8_scaled_mm(a, b, out_dtype, bias, fast_accum=fast_accum, config=config, plan=plan)
            if out is not None:
                return out
        variant = "triton"
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=_store_dtype(out_dtype), device=a.device)
    if M == 0 or N == 0:
        return c.to(out_dtype)
    qa, qb = a._data, b._data
    sa, sam, sak = _scale_args(a)
    sb, sbk, sbn = _scale_args(b)
    bias_t = bias.contiguous() if bias is not None else c
    consts = dict(plan, PROMOTE=not fast_accum, HAS_BIAS=bias is not None)
    if variant == "triton":
        variant = _auto_variant(a.device, qa, qb)
    if variant not in ("tma", "pointer"):
        raise ValueError(f"variant must be 'auto', 'ws', 'triton', 'tma' or 'pointer', got {variant!r}")
    if variant != "pointer" and not tma_ok(qa, qb):
        raise ValueError(f"variant={variant!r} needs K-major, 16-byte aligned operands")
    interp = interpreting()
    if variant == "pointer":
        cfg = _interpret_config(plan) if interp else {}
        kernel = runnable(_PTR_TUNED)
        grid = lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)  # noqa: E731
        kernel[grid](qa, qb, c, bias_t, sa, sb, M, N, K, qa.stride(0), qa.stride(1), qb.stride(0),
                     qb.stride(1), c.stride(0), c.stride(1), sam, sak, sbk, sbn, **consts, **cfg)
        return c.to(out_dtype)
    nsm = _num_sms(a.device)  # 3 under the interpreter: programs walk several tiles
    cfg = _interpret_tma_config(plan) if interp else {}
    bm, bn, bk = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) if interp else (128, 128, 128)
    a_desc = TensorDescriptor(qa, [M, K], [qa.stride(0), 1], [bm, bk])
    b_desc = TensorDescriptor(qb.t(), [N, K], [qb.stride(1), 1], [bn, bk])

    def grid(meta):
        tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
        return (min(nsm, tiles) if meta["PERSISTENT"] else tiles,)
    runnable(_TMA_TUNED)[grid](
        a_desc, b_desc, c, bias_t, sa, sb, M, N, K, c.stride(0), c.stride(1), sam, sak, sbk, sbn,
        **consts, **cfg)
    return c.to(out_dtype)


def fp8_support(a, b) -> Optional[str]:
    """None when ``fp8_scaled_mm`` takes these FP8 operands, else why not (shape/scale checks)."""
    M, K = a.shape
    N = b.shape[1]
    if K < 16 or K % 16 or N % 16:
        return "FP8 GEMMs need K and N to be multiples of 16"
    plan = gemm_plan(a, b)
    return plan if isinstance(plan, str) else None


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
