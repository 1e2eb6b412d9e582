"""Promoting FP8 scaled GEMM for Hopper (sm_90a) in Gluon: ``C = (qA sA) @ (qB sB) (+ bias)``.

Math. ``qA`` (M, K) and ``qB`` (K, N) hold FP8 codes, E4M3 or E5M2 in any mix (``qB`` is the
K-major (N, K) weight seen transposed), scales are dequantization factors (DESIGN.md). K is cut into 128-wide chunks
``c``; each chunk's product ``P_c = qA[:, c] @ qB[c, :]`` runs on the tensor cores starting from
zero (``use_acc=False``) and is then *promoted*: added to an fp32 register accumulator on the CUDA
cores:

    tensorwise / rowwise:  acc = sum_c P_c;                 C = acc * sA[m] * sB[n] (+ bias[n])
    blockwise 1x128/128x128: acc = sum_c P_c * (sA[m, c] * sB[c, n // 128]);   C = acc (+ bias)
    blockwise_cols 1x128/128x1 (wgrad): acc = sum_c P_c * (sA[m, c] * sB[c, n])  (the
                             warp-specialized kernel only, ``gemm_gluon_ws``)

(tensorwise: sA, sB scalars.) So the tensor cores never sum more than 128 products (the promotion
interval of cuBLAS without fast accumulation and of DeepSeek-V3): Hopper's FP8 MMA keeps ~14 bits
while it accumulates; 128 terms of it stay well inside that, and the promotion is one fp32
rounding (an fma for blockwise) per chunk. Error: with ``n = ceil(K/128)`` chunks, ``|C - C*| <=
(eps_mma(128) + gamma_(n+2)) sum_k |a_k b_k|`` (``eps_mma``: the tensor core's in-chunk sum error;
exact fp32 sums would give ``gamma_(K+n+2)``, ``lowbit.validate.metrics.gemm_bound``); the
benchmark checks the Frobenius error against cuBLAS's on the same codes. K past the end (ragged K,
not a multiple of 128) and rows/columns past M/N arrive as zeros from TMA's out-of-bounds fill, so
they add exactly 0; blockwise scales past the last chunk are loaded as 0 (0 * 0).

Schedule (why it is faster than the plain-Triton kernel). 8 warps = two warp groups, each owning
64 rows of the 128-row tile; each keeps the fp32 accumulator(s) and two *temporaries* T0, T1 in
registers. A pipeline stage carries two wgmma "ops" (``SPLIT`` below); per stage ``s``:

    issue op0(s) -> T0                    (async, use_acc=False)
    acc += T1 (* s)                       # op1(s-1), on the CUDA cores while op0(s) runs
    issue op1(s) -> T1
    CTA barrier; TMA refill of stage s-1's slot (one thread)
    wait(1); acc += T0 (* s)              # op0(s) done; op1(s) runs meanwhile
    wait(0)                               # op1(s) done, promoted next stage

so every promotion overlaps a wgmma of the same warp group (``wgmma.wait_group 1`` in the loop),
and the other warp group's wgmmas too. The ``wait(0)`` at the end of each stage is what ptxas
needs: with a wgmma still in flight across the loop's back edge while the loop reads other
accumulator registers, ptxas (12.8 and 13.x) serializes every wgmma (C7514, ``WARPGROUP.DEPBAR
gsb0, 0x0`` after each one; tried first); FlashAttention-3's intra-warpgroup overlap has the
same shape. Cost: a short tensor-core bubble per stage (loop back edge, barrier wait, issue:
tens of clocks against ~1024 clocks of MMA per 256-K stage). The promotions are volatile inline
``add.rn``/``fma.rn``: as plain arithmetic LLVM sank them below the next wgmma, which reuses T as
its (ignored) accumulator operand, and so needed a 64-register copy of T (spills for blockwise).
Two op shapes (``CONFIGS``: SUBK, NSUB):

* ``k2`` (SUBK=2): a stage holds two 128-K chunks; op0/op1 = chunk 2s / 2s+1 on the whole 128x128
  tile; one accumulator; 3 x 64 fp32 registers per thread for acc/T0/T1. The default.
* ``n2`` (NSUB=2): a stage holds one 128-K chunk; op0/op1 = its left/right 64 columns (m64n64k32
  wgmmas), two accumulators, 4 x 32 registers; twice the stages (bubble per 128 K).
* ``_u2`` (UNROLL=2): stages go in pairs; the first hands its op1 to the second still in flight
  (``wait(1)`` there), so the ``wait(0)`` bubble comes once per two stages.

Blockwise needs a 128-wide tile (one sB per chunk; sA two registers per chunk), both shapes do.
Arithmetic (H200, per SM and clock): FP8 wgmma ~4096 FMA; a 128x128x128 chunk = 512 clk of
tensor time, its promotion = 64 FADD per thread = 16384 FP32 ops / 128 lanes = 128 issue clk
(~25%, which the plain-Triton kernel pays serially and this schedule hides). L2 -> SM traffic:
a 128x128 tile reads 1/64 B per FMA (~10 TB/s over the chip at 1.3 PFLOP/s); 128x256 would halve
the A share (cuBLAS's choice, with clusters) but needs 128 + 2 x 64 = 256 accumulator registers
per thread here (one warp group per 64 rows): too many without warp specialization and
``setmaxnreg`` (the next step: producer warp + two consumer warp groups ping-ponging 128x256
tiles). Block shapes of TMA must be powers of two (a 192-wide tile was tried). Shared memory:
stage = SUBK x 16 KB (A) + 2 x (BN/NSUB x 128) B = 64 KB (k2) / 32 KB (n2); 3 / 6 stages = 192 KB
<= 227 KB; no smem epilogue (stores from registers, masked). Persistent grid (one CTA per SM,
grouped tile order GROUP_M for L2 reuse); the TMA producer walks (tile, stage) flattened, so the
next tile's first stages load during this tile's tail and epilogue. A slot is refilled after a
CTA barrier that follows every warp group's ``wait(0)`` on it. Triton's shared-memory analysis
adds a CTA barrier before each TMA copy too (5 per stage; they fall while both ops run).

``gluon_scaled_mm`` returns None (declines) where this kernel doesn't apply: no Gluon, not sm_90,
CPU tensors, strides TMA can't take, other scale layouts. Nothing is read from the environment;
the only module state is the ``lru_cache`` of ``_smem_layout`` (NVMMA layouts per block shape;
the JIT cache is triton's).
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from .cuda_device import capability, sm_count
from .launch_math import cdiv

__all__ = ["gluon_scaled_mm", "gluon_fp8_scaled_mm", "gluon_available", "gluon_support", "CONFIGS",
           "DEFAULT_CONFIG", "compile_for_sm90"]

try:  # Gluon: triton >= 3.5 (API differences between 3.6 and 3.9 resolved once, below)
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                                   warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as _GluonDesc
    _IMPORT_ERROR = None
except Exception as e:  # pragma: no cover - depends on the installed triton
    gluon = gl = None
    _IMPORT_ERROR = f"{type(e).__name__}: {e}"

if gl is not None:
    # triton 3.6: tma.async_copy_global_to_shared, gl.thread_barrier;
    # triton 3.9: tma.async_load (the old name raises), gl.barrier.
    _tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
    _cta_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier

    @gluon.jit
    def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
        """Grouped order: GROUP_M row-tiles share each column-tile of B while it sits in L2."""
        width = GROUP_M * num_pid_n
        first_m = (tile // width) * GROUP_M
        group_m = gl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % width) % group_m
        pid_n = (tile % width) // group_m
        return pid_m, pid_n

    @gluon.jit
    def _produce(p, n_stages, start, step, num_tiles, num_pid_m, num_pid_n, a_desc, b_desc,
                 a_bufs, b_bufs, ready, STAGES: gl.constexpr, SUBK: gl.constexpr, NSUB: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                 GROUP_M: gl.constexpr):
        """TMA loads of this program's p-th (tile, stage) into ring slot p % STAGES (predicated
        off past the last tile). Returns p + 1."""
        t_local = p // n_stages
        st = p - t_local * n_stages
        tile = start + t_local * step
        pred = tile < num_tiles
        pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
        slot = p % STAGES
        bar = ready.index(slot)
        BN_SUB: gl.constexpr = BLOCK_N // NSUB
        mbarrier.expect(bar, SUBK * (BLOCK_M + BLOCK_N) * BLOCK_K, pred)
        for h in gl.static_range(SUBK):
            k = (st * SUBK + h) * BLOCK_K
            _tma_load(a_desc, [pid_m * BLOCK_M, k], bar, a_bufs.index(slot * SUBK + h), pred)
            for q in gl.static_range(NSUB):
                _tma_load(b_desc, [pid_n * BLOCK_N + q * BN_SUB, k], bar,
                          b_bufs.index(slot * 2 + h + q), pred)
        return p + 1

    @gluon.jit
    def _chunk_scale(sa_ptr, sb_ptr, off_m, pid_bn, chunk, n_chunks, M, stride_sam, stride_sak,
                     stride_sbk, stride_sbn, rows_layout: gl.constexpr, BLOCK_M: gl.constexpr):
        """Blockwise ``sA[m, chunk] * sB[chunk, n-block]`` as a (BLOCK_M, 1) column (0 past K)."""
        rows = off_m + gl.arange(0, BLOCK_M, layout=rows_layout)
        ok = chunk < n_chunks
        sa = gl.load(sa_ptr + rows * stride_sam + chunk * stride_sak, mask=(rows < M) & ok, other=0.0)
        sb = gl.load(sb_ptr + chunk * stride_sbk + pid_bn * stride_sbn, mask=ok, other=0.0)
        return gl.expand_dims(sa * sb, 1)

    @gluon.jit
    def _promote(acc, t, s, MODE: gl.constexpr):
        """acc + t (tensorwise/rowwise) or acc + t * s as one fma (blockwise, s a (BLOCK_M, 1) column)."""
        # Volatile inline asm: LLVM keeps it ahead of the next (volatile) wgmma, so t's registers
        # die here; plain arithmetic got sunk below the wgmma that re-uses t as its (ignored,
        # use_acc=False) accumulator operand, which then needed a copy of t (+64 registers, spills).
        if MODE == 2:
            return gl.inline_asm_elementwise("fma.rn.f32 $0, $1, $2, $3;", "=r,r,r,r",
                                             [t, gl.broadcast(s, t)[0], acc], dtype=gl.float32,
                                             is_pure=False, pack=1)
        else:
            return gl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=r,r,r", [acc, t], dtype=gl.float32,
                                             is_pure=False, pack=1)

    @gluon.jit
    def _epilogue(acc, c_ptr, bias_ptr, sa_ptr, sb_ptr, off_m, off_n, M, N, stride_cm, stride_cn,
                  stride_sam, stride_sbn, MODE: gl.constexpr, HAS_BIAS: gl.constexpr,
                  layout: gl.constexpr, BLOCK_M: gl.constexpr, BN: gl.constexpr, tw):
        """Scale (tensorwise: by ``tw = RN(sA * sB)``, loaded once by the caller; rowwise), add
        bias, cast and store one (BLOCK_M, BN) block."""
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        rmask = rows < M
        cmask = cols < N
        if MODE == 0:  # tensorwise
            out = acc * tw
        elif MODE == 1:  # rowwise
            sa = gl.load(sa_ptr + rows * stride_sam, mask=rmask, other=0.0)
            sb = gl.load(sb_ptr + cols * stride_sbn, mask=cmask, other=0.0)
            out = (acc * gl.expand_dims(sa, 1)) * gl.expand_dims(sb, 0)
        else:  # blockwise: the scales were applied per chunk
            out = acc
        if HAS_BIAS:
            bias = gl.load(bias_ptr + cols, mask=cmask, other=0.0).to(gl.float32)
            out = out + gl.expand_dims(bias, 0)
        ptrs = c_ptr + gl.expand_dims(rows, 1) * stride_cm + gl.expand_dims(cols, 0) * stride_cn
        mask = gl.expand_dims(rmask, 1) & gl.expand_dims(cmask, 0)
        gl.store(ptrs, out.to(c_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _stage(st, c, p, acc0, acc1, t0, t1, s1, n_stages, start, step, num_tiles, num_pid_m, num_pid_n,
               a_desc, b_desc, a_bufs, b_bufs, ready, sa_ptr, sb_ptr, off_m, pid_n, n_chunks, M,
               stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout: gl.constexpr,
               MODE: gl.constexpr, SUBK: gl.constexpr, NSUB: gl.constexpr, BLOCK_M: gl.constexpr,
               BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
               PREV_DRAINED: gl.constexpr, DRAIN: gl.constexpr):
        """Stage ``st`` (>= 1) of a tile, consumer index ``c``: issue op0 into t0, promote the
        previous stage's op1 (t1, retired by the previous stage's wait(0) when PREV_DRAINED, else
        waited for here), issue op1 into t1, refill the previous stage's slot, wait for op0 and
        promote it; DRAIN: end with wait(0) (nothing in flight afterwards)."""
        slot = c % STAGES
        if MODE == 2:  # this stage's op 0 scale (the load overlaps the barrier wait)
            s0 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, st * SUBK, n_chunks, M, stride_sam,
                              stride_sak, stride_sbk, stride_sbn, rows_layout, BLOCK_M)
        else:
            s0 = s1
        mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
        t0 = warpgroup_mma(a_bufs.index(slot * SUBK), b_bufs.index(slot * 2).permute((1, 0)), t0,
                           use_acc=False, is_async=True)
        if not PREV_DRAINED:
            t1 = warpgroup_mma_wait(1, deps=[t1])  # the previous op 1 is done, op 0 runs
        # op 0 runs on the tensor cores while op 1 of the previous stage is promoted
        if NSUB == 1:
            acc0 = _promote(acc0, t1, s1, MODE)
        else:
            acc1 = _promote(acc1, t1, s1, MODE)
        t1 = warpgroup_mma(a_bufs.index(slot * SUBK + SUBK - 1), b_bufs.index(slot * 2 + 1).permute((1, 0)),
                           t1, use_acc=False, is_async=True)
        # every warp group has retired the previous stage: refill its slot
        _cta_barrier()
        p = _produce(p, n_stages, start, step, num_tiles, num_pid_m, num_pid_n, a_desc, b_desc,
                     a_bufs, b_bufs, ready, STAGES, SUBK, NSUB, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        if MODE == 2:  # op 1's scale, promoted by the next stage (or the tile's drain)
            if SUBK == 2:
                s1 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, st * SUBK + 1, n_chunks, M,
                                  stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout, BLOCK_M)
            else:
                s1 = s0
        t0 = warpgroup_mma_wait(1, deps=[t0])  # op 0 done, op 1 still running
        acc0 = _promote(acc0, t0, s0, MODE)
        if DRAIN:
            t1 = warpgroup_mma_wait(0, deps=[t1])
        return c + 1, p, acc0, acc1, t0, t1, s1

    @gluon.jit
    def _fp8_gemm_promote_kernel(a_desc, b_desc, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                                 stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                                 MODE: gl.constexpr, HAS_BIAS: gl.constexpr, SUBK: gl.constexpr,
                                 NSUB: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                 BLOCK_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                                 UNROLL: gl.constexpr, num_warps: gl.constexpr):
        """Persistent promoting FP8 GEMM (see the module docstring). MODE 0/1/2: tensorwise,
        rowwise, blockwise. (SUBK, NSUB) = (2, 1): ops are 128-K halves of a 256-K stage;
        (1, 2): ops are the two column halves of a 128-K stage."""
        gl.static_assert(SUBK * NSUB == 2, "two wgmma ops per stage")
        gl.static_assert(BLOCK_M == 16 * num_warps, "one m16 row block per warp")
        gl.static_assert(MODE != 2 or (BLOCK_N == 128 and BLOCK_K == 128),
                         "blockwise: 128x128 tiles (one sB per chunk)")
        BN_SUB: gl.constexpr = BLOCK_N // NSUB
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN_SUB, 32])
        rows_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
        dtype: gl.constexpr = a_desc.dtype

        a_bufs = gl.allocate_shared_memory(dtype, [STAGES * SUBK, BLOCK_M, BLOCK_K], a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES * 2, BN_SUB, BLOCK_K], b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)

        num_pid_m = gl.cdiv(M, BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_tiles = num_pid_m * num_pid_n
        n_chunks = gl.cdiv(K, BLOCK_K)
        n_stages = gl.cdiv(n_chunks, SUBK)  # pipeline stages per tile
        start = gl.program_id(0)
        step = gl.num_programs(0)

        p = 0  # producer: (tile, stage) loads issued by this program
        for i in gl.static_range(STAGES):
            p = _produce(p, n_stages, start, step, num_tiles, num_pid_m, num_pid_n, a_desc, b_desc,
                         a_bufs, b_bufs, ready, STAGES, SUBK, NSUB, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        c = 0  # consumer: stages consumed by this program
        t0 = gl.zeros([BLOCK_M, BN_SUB], gl.float32, mma_layout)
        t1 = gl.zeros([BLOCK_M, BN_SUB], gl.float32, mma_layout)
        for tile in range(start, num_tiles, step):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc0 = gl.zeros([BLOCK_M, BN_SUB], gl.float32, mma_layout)
            if NSUB == 2:
                acc1 = gl.zeros([BLOCK_M, BN_SUB], gl.float32, mma_layout)
            else:
                acc1 = acc0  # unused: one accumulator
            # stage 0 of the tile: both ops, then drain (once per tile)
            slot = c % STAGES
            s0 = 1.0  # blockwise: scale of the op in t0 (chunk st * SUBK)
            s1 = 1.0  # blockwise: scale of the op in t1 (chunk st * SUBK + SUBK - 1)
            if MODE == 2:
                s0 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, 0, n_chunks, M, stride_sam, stride_sak,
                                  stride_sbk, stride_sbn, rows_layout, BLOCK_M)
                s1 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, SUBK - 1, n_chunks, M, stride_sam, stride_sak,
                                  stride_sbk, stride_sbn, rows_layout, BLOCK_M)
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            t0 = warpgroup_mma(a_bufs.index(slot * SUBK), b_bufs.index(slot * 2).permute((1, 0)), t0,
                               use_acc=False, is_async=True)
            t1 = warpgroup_mma(a_bufs.index(slot * SUBK + SUBK - 1),
                               b_bufs.index(slot * 2 + 1).permute((1, 0)), t1, use_acc=False, is_async=True)
            t0 = warpgroup_mma_wait(1, deps=[t0])
            acc0 = _promote(acc0, t0, s0, MODE)
            t1 = warpgroup_mma_wait(0, deps=[t1])
            c += 1
            # Loop invariant: every wgmma issued so far is retired at the back edge (ptxas
            # serializes wgmma pipelines that cross it while other accumulator registers are
            # read, C7514); t1 holds the previous stage's op 1, not yet promoted. UNROLL = 2: the
            # first stage of a pair hands its op 1 to the second still in flight (one drain per
            # two stages).
            if UNROLL == 1:
                for st in range(1, n_stages):
                    c, p, acc0, acc1, t0, t1, s1 = _stage(
                        st, c, p, acc0, acc1, t0, t1, s1, n_stages, start, step, num_tiles, num_pid_m,
                        num_pid_n, a_desc, b_desc, a_bufs, b_bufs, ready, sa_ptr, sb_ptr, off_m, pid_n,
                        n_chunks, M, stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout, MODE, SUBK,
                        NSUB, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, True, True)
            else:
                for st in range(1, n_stages - 1, 2):
                    c, p, acc0, acc1, t0, t1, s1 = _stage(
                        st, c, p, acc0, acc1, t0, t1, s1, n_stages, start, step, num_tiles, num_pid_m,
                        num_pid_n, a_desc, b_desc, a_bufs, b_bufs, ready, sa_ptr, sb_ptr, off_m, pid_n,
                        n_chunks, M, stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout, MODE, SUBK,
                        NSUB, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, True, False)
                    c, p, acc0, acc1, t0, t1, s1 = _stage(
                        st + 1, c, p, acc0, acc1, t0, t1, s1, n_stages, start, step, num_tiles, num_pid_m,
                        num_pid_n, a_desc, b_desc, a_bufs, b_bufs, ready, sa_ptr, sb_ptr, off_m, pid_n,
                        n_chunks, M, stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout, MODE, SUBK,
                        NSUB, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, False, True)
                if (n_stages - 1) % 2 == 1:  # odd count of stages after the first: one more
                    c, p, acc0, acc1, t0, t1, s1 = _stage(
                        n_stages - 1, c, p, acc0, acc1, t0, t1, s1, n_stages, start, step, num_tiles,
                        num_pid_m, num_pid_n, a_desc, b_desc, a_bufs, b_bufs, ready, sa_ptr, sb_ptr, off_m,
                        pid_n, n_chunks, M, stride_sam, stride_sak, stride_sbk, stride_sbn, rows_layout, MODE,
                        SUBK, NSUB, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, GROUP_M, True, True)
            # drain: the last op 1, then refill the last stage's slot (next tile's loads)
            if NSUB == 1:
                acc0 = _promote(acc0, t1, s1, MODE)
            else:
                acc1 = _promote(acc1, t1, s1, MODE)
            _cta_barrier()
            p = _produce(p, n_stages, start, step, num_tiles, num_pid_m, num_pid_n, a_desc, b_desc,
                         a_bufs, b_bufs, ready, STAGES, SUBK, NSUB, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
            tw = gl.load(sa_ptr) * gl.load(sb_ptr) if MODE == 0 else 1.0
            _epilogue(acc0, c_ptr, bias_ptr, sa_ptr, sb_ptr, off_m, off_n, M, N, stride_cm, stride_cn,
                      stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, BLOCK_M, BN_SUB, tw)
            if NSUB == 2:
                _epilogue(acc1, c_ptr, bias_ptr, sa_ptr, sb_ptr, off_m, off_n + BN_SUB, M, N, stride_cm,
                          stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, BLOCK_M, BN_SUB, tw)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))
else:  # pragma: no cover
    _fp8_gemm_promote_kernel = None


# ---- configurations ------------------------------------------------------------------------------
# BLOCK_M = 128, BLOCK_K = 128, 8 warps.
CONFIGS = {  # name -> (SUBK, NSUB, BLOCK_N, STAGES, GROUP_M, UNROLL)
    "k2_n128_s3": (2, 1, 128, 3, 8, 1),
    "k2_n128_s3_u2": (2, 1, 128, 3, 8, 2),
    "k2_n128_s3_g16": (2, 1, 128, 3, 16, 1),
    "n2_n128_s6": (1, 2, 128, 6, 8, 1),
    "n2_n128_s6_u2": (1, 2, 128, 6, 8, 2),
}
# u2 for blockwise k2 spills (72 B on triton 3.9), hence k2 without unrolling there. The best of this
# kernel per mode; calls without a config run the warp-specialized kernel (gemm_gluon_ws), faster
# on the H200 at every benchmarked shape (benchmarks/RESULTS.md, session 4).
DEFAULT_CONFIG = {"tensorwise": "k2_n128_s3_u2", "rowwise": "k2_n128_s3_u2", "blockwise": "k2_n128_s3"}
_MODES = {"tensorwise": 0, "rowwise": 1, "blockwise": 2, "blockwise_cols": 3}
_BM = _BK = 128
_WARPS = 8


def gluon_available() -> Optional[str]:
    """None when Gluon imported, else why not."""
    return _IMPORT_ERROR


@functools.lru_cache(maxsize=None)
def _smem_layout(rows: int, cols: int):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float8e4nv)  # any 8-bit type: same layout


def _fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _scale_ok(s, mode: str, rows: int, cols: int) -> bool:
    """mode's scale shape for an operand whose scales run (rows, cols) in its own orientation."""
    if not isinstance(s, torch.Tensor) or s.dtype != torch.float32:
        return False
    if mode == "tensorwise":
        return s.numel() == 1
    return s.dim() == 2 and tuple(s.shape) == (rows, cols)


def gluon_support(qa, sa, qb, sb, mode, out_dtype=torch.bfloat16, bias=None, config=None) -> Optional[str]:
    """None when ``gluon_scaled_mm`` runs these arguments, else why not."""
    if _IMPORT_ERROR is not None:
        return f"gluon unavailable ({_IMPORT_ERROR})"
    if mode not in _MODES:
        return f"mode must be one of {sorted(_MODES)}"
    if not (_fp8(qa) and _fp8(qb)) or qa.dim() != 2 or qb.dim() != 2:
        return "operands must be 2-D FP8 tensors (E4M3 / E5M2, mixed allowed)"
    if qa.device.type != "cuda" or qb.device != qa.device:
        return "CUDA tensors only"
    if capability(qa.device) != (9, 0):
        return "the Gluon kernel is written for sm_90a (wgmma)"
    M, K = qa.shape
    if qb.shape[0] != K:
        return "inner dimensions differ"
    N = qb.shape[1]
    if min(M, N, K) == 0:
        return "empty GEMM"
    if qa.stride(1) != 1 or qb.stride(0) != 1 or qa.stride(0) % 16 or qb.stride(1) % 16 \
            or qa.data_ptr() % 16 or qb.data_ptr() % 16:
        return "TMA needs K-major A (M, K) and B (K, N) with 16-byte aligned rows"
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return "out_dtype must be bf16, fp16 or fp32"
    kc = -(-K // 128)
    if mode == "rowwise":
        shapes = ((M, 1), (1, N))
    elif mode == "blockwise_cols":
        shapes = ((M, kc), (kc, N))
    else:
        shapes = ((M, kc), (kc, -(-N // 128)))
    if not (_scale_ok(sa, mode, *shapes[0]) and _scale_ok(sb, mode, *shapes[1])):
        return f"{mode} scales must be fp32 of shape sa {shapes[0]}, sb {shapes[1]} (one element: tensorwise)"
    if sa.device != qa.device or sb.device != qa.device:
        return "scales must be on the operands' device"
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.shape[0] != N
                             or not bias.is_floating_point() or bias.device != qa.device):
        return "bias must be a 1-D float tensor of length N on the operands' device"
    from .gemm_gluon_ws import WS_CONFIGS, promote_config
    name = config or promote_config(M, N, mode)
    if name in WS_CONFIGS:
        fast, bn = WS_CONFIGS[name][:2]
        if mode.startswith("blockwise") and (fast or bn != 128):
            return "blockwise needs a promoting 128-wide tile configuration"
        return None
    cfg = CONFIGS.get(name)
    if cfg is None:
        return f"unknown config {config!r}; one of {sorted(CONFIGS) + sorted(WS_CONFIGS)}"
    if mode == "blockwise_cols":
        return "1x128 x 128x1 scales run on the warp-specialized configurations only"
    if mode == "blockwise" and cfg[2] != 128:
        return "blockwise needs a 128-wide tile configuration"
    return None


def _num_sms(device) -> int:
    return sm_count(device)


def gluon_scaled_mm(qa, sa, qb, sb, mode: str, out_dtype=torch.bfloat16, bias=None, *,
                    config: Optional[str] = None, out: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``(qa sa) @ (qb sb) (+ bias)`` with promotion every 128 K on the Gluon kernel, or None.

    qa (M, K), qb (K, N): FP8 codes, K-major (qb = weight.t() of a row-major (N, K) weight).
    Scales (fp32, dequantization factors): tensorwise one element each; rowwise sa (M, 1), sb (1, N);
    blockwise sa (M, ceil(K/128)), sb (ceil(K/128), ceil(N/128)); blockwise_cols sa (M, ceil(K/128)),
    sb (ceil(K/128), N) (lowbit's FP8Tensor layouts).
    ``config``: a key of ``CONFIGS`` or ``gemm_gluon_ws.WS_CONFIGS`` (default: the warp-specialized
    kernel, ``gemm_gluon_ws.promote_config(M, N, mode)``); ``out``: an (M, N)
    tensor of out_dtype to write into (the benchmark's poisoned buffer)."""
    if gluon_support(qa, sa, qb, sb, mode, out_dtype, bias, config) is not None:
        return None
    M, K = qa.shape
    N = qb.shape[1]
    from .gemm_gluon_ws import WS_CONFIGS, promote_config, ws_scaled_mm
    name = config or promote_config(M, N, mode)
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=qa.device)
    elif out.shape != (M, N) or out.dtype != out_dtype or out.device != qa.device:
        return None
    sa = sa.reshape(1, 1) if sa.dim() < 2 else sa
    sb = sb.reshape(1, 1) if sb.dim() < 2 else sb
    if name in WS_CONFIGS:
        return ws_scaled_mm(qa, sa, qb, sb, mode, out, bias, config=name)
    subk, nsub, bn, stages, group_m, unroll = CONFIGS[name]
    bn_sub = bn // nsub
    a_desc = _GluonDesc(qa, [M, K], [qa.stride(0), 1], [_BM, _BK], _smem_layout(_BM, _BK))
    bt = qb.t()  # (N, K) row-major view
    b_desc = _GluonDesc(bt, [N, K], [bt.stride(0), 1], [bn_sub, _BK], _smem_layout(bn_sub, _BK))
    tiles = cdiv(M, _BM) * cdiv(N, bn)
    grid = (min(_num_sms(qa.device), tiles),)
    bias_t = bias.contiguous() if bias is not None else out
    _fp8_gemm_promote_kernel[grid](
        a_desc, b_desc, out, bias_t, sa, sb, M, N, K, out.stride(0), out.stride(1),
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        MODE=_MODES[mode], HAS_BIAS=bias is not None, SUBK=subk, NSUB=nsub, BLOCK_M=_BM, BLOCK_N=bn,
        BLOCK_K=_BK, STAGES=stages, GROUP_M=group_m, UNROLL=unroll, num_warps=_WARPS)
    return out


def _plan_mode(plan) -> Optional[str]:
    """gemm_plan -> "tensorwise" / "rowwise" / "blockwise" (1x128 x 128x128) / "blockwise_cols"
    (1x128 x 128x1: wgrad's operands, both quantized along the tokens), else None."""
    if plan["E8M0"]:
        return None
    key = (plan["SA_ROWS"], plan["SA_K"], plan["SB_K"], plan["SB_COLS"])
    if key == (0, 0, 0, 0):
        return "tensorwise"
    if key == (1, 0, 0, 1):
        return "rowwise"
    if key == (1, 128, 128, 128):
        return "blockwise"
    if key == (1, 128, 128, 1):
        return "blockwise_cols"
    return None


def gluon_fp8_scaled_mm(a, b, out_dtype=torch.float32, bias=None, *, fast_accum: bool = False,
                        config: Optional[str] = None, out: Optional[torch.Tensor] = None,
                        plan: Optional[dict] = None) -> Optional[torch.Tensor]:
    """FP8Tensor front end for the triton backend: ``a @ b (+ bias)`` or None (declined).

    Takes what ``lowbit.kernels.gemm.fp8_scaled_mm`` takes (and its ``gemm_plan(a, b)`` if
    computed already); declines MX scales, partial-dimension blocks other than the three modes,
    and fast accumulation unless ``config`` names a fast configuration of ``gemm_gluon_ws`` (and
    a fast configuration unless ``fast_accum``)."""
    if _IMPORT_ERROR is not None:
        return None
    from .gemm_gluon_ws import WS_CONFIGS
    if fast_accum != (config in WS_CONFIGS and WS_CONFIGS[config][0]):
        return None  # only the warp-specialized fast configurations skip the promotion
    if plan is None:
        from .gemm import gemm_plan  # local: gemm imports this module only at call time
        plan = gemm_plan(a, b)
    if isinstance(plan, str):
        return None
    mode = _plan_mode(plan)
    if mode is None:
        return None
    sa, sb = a._scale, b._scale
    if mode == "tensorwise":
        sa, sb = sa.reshape(1, 1), sb.reshape(1, 1)
    elif mode == "rowwise":
        M, N = a.shape[0], b.shape[1]
        if sa.numel() != M or sb.numel() != N:
            return None
        sa, sb = sa.reshape(M, 1), sb.reshape(1, N)
    return gluon_scaled_mm(a._data, sa, b._data, sb, mode, out_dtype, bias, config=config, out=out)


# ---- compile without a GPU (tests, PTX/SASS inspection) --------------------------------------------
def compile_for_sm90(mode: str = "tensorwise", config: str = "k2_n128_s3_u2", out_dtype: str = "bf16",
                     has_bias: bool = True, a_type: str = "fp8e4nv", b_type: str = "fp8e4nv"):
    """``triton.compile`` of the kernel for sm_90a on the CPU; returns the CompiledKernel
    (``.asm["ptx"]``, ``.asm["cubin"]``, ``.n_regs``, ``.n_spills``, ``.metadata.shared``)."""
    from triton.backends.compiler import GPUTarget
    subk, nsub, bn, stages, group_m, unroll = CONFIGS[config]
    bn_sub = bn // nsub
    la, lb = _smem_layout(_BM, _BK), _smem_layout(bn_sub, _BK)
    sig = {"a_desc": f"tensordesc<{a_type}[{_BM},{_BK}],{la!r}>",
           "b_desc": f"tensordesc<{b_type}[{bn_sub},{_BK}],{lb!r}>",
           "c_ptr": f"*{out_dtype}", "bias_ptr": f"*{out_dtype}", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "i32",
           "stride_sam": "i32", "stride_sak": "i32", "stride_sbk": "i32", "stride_sbn": "i32"}
    consts = dict(MODE=_MODES[mode], HAS_BIAS=has_bias, SUBK=subk, NSUB=nsub, BLOCK_M=_BM, BLOCK_N=bn,
                  BLOCK_K=_BK, STAGES=stages, GROUP_M=group_m, UNROLL=unroll, num_warps=_WARPS)
    for k, v in consts.items():
        sig[k] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
             if name in ("c_ptr", "bias_ptr", "sa_ptr", "sb_ptr", "stride_cm")}
    try:  # exported from triton.experimental.gluon in 3.9; only in its _runtime module in 3.6
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(_fp8_gemm_promote_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": _WARPS, "enable_fp_fusion": True})
