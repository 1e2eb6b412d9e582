"""Warp-specialized promoting FP8 GEMM for Hopper (sm_90a) in Gluon: the same math as
``gemm_gluon`` (``C = (qA sA) @ (qB sB) (+ bias)``, every 128-K chunk's wgmma product started from
zero and promoted into fp32 registers on the CUDA cores; tensorwise, rowwise, 1x128/128x128
blockwise), with a different schedule.

Why. In ``gemm_gluon`` both warp groups of a CTA issue the TMA refills themselves after a CTA
barrier every stage, so they run in lockstep: when one warp group drains its wgmma pipeline
(``wait(0)`` once a stage, which ptxas needs, see there) the other one is draining too and the
tensor cores idle. Here the CTA is split into three partitions that share only the shared-memory
ring and its mbarriers:

* producer (1 warp): walks this program's (tile, 256-K stage) sequence; per stage waits for the
  slot's ``empty`` barrier, then TMA-loads A (two 64-row boxes per 128-K chunk) and B into it,
  completing the slot's ``ready`` barrier (transaction count);
* consumer 0 / consumer 1 (one warp group each, the default partition and a worker): rows 0-63 /
  64-127 of the 128x128 tile. Per stage: wait ``ready``; issue op0 (chunk 2s, use_acc=False) into
  T0; promote T1 (chunk 2s-1, retired); issue op1 (chunk 2s+1) into T1; ``wait(1)``; promote T0;
  ``wait(0)``; arrive on ``empty`` (count 2: the slot is free once both warp groups retired it).

The two consumers never synchronize with each other, so one's drain bubble, promotion and
epilogue overlap the other's wgmmas (an ``mbarrier.arrive`` syncs only its own partition's 128
threads, then one thread arrives). Blockwise loads the next stage's op-0 scales a stage ahead.
Registers per consumer thread: acc + T0 + T1 = 3 x 64 fp32 (m64n128), set by ``setmaxnreg``
(``WS_CONFIGS``: the consumer worker's and the producer's counts; the default partition gets what
``maxnreg`` leaves). Shared memory: STAGES x 2 x (16 KB A + 16 KB B) = 192 KB for 3 stages. Error
bound as ``gemm_gluon``: ``|C - C*| <= (eps_mma(128) + gamma_(n+2)) sum_k |a_k b_k|`` with
``n = ceil(K/128)``; the same fp32 operations in the same order per element (each chunk's wgmma
sum, then the promotion adds in chunk order), so the result equals ``gemm_gluon``'s bit for bit
when the tensor cores sum a chunk the same way. On the H200: 1303 TFLOP/s at 8192^3 tensorwise
(0.97x cuBLAS precise; ``gemm_gluon`` 978), benchmarks/RESULTS.md, session 4.

``blockwise_cols`` (MODE 3, 1x128 x 128x1 scales: wgrad, both operands quantized along the
tokens): the chunk's scale is the outer product ``sA[m, c] * sB[c, n]``, promoted as
``fma(T, RN(sA * sB), acc)`` (the rounding of the plain-Triton kernel's ``acc += dot * s``), on
the two-temporary schedule above. The row of 128 column scales (32 registers a thread in the
accumulator's layout) does not fit beside acc, T0 and T1, so a chunk's scales wait in three
registers (its two row scales and one coalesced column scale a thread) and take the
accumulator's layout (through shared memory) inside the promotion that uses them.

Blockwise scales are passed M-major (sA, both blockwise modes) and N-major (sB, blockwise_cols):
``ws_scaled_mm`` copies them so (a few microseconds; none when they already are), and a chunk's
scales are then one coalesced run instead of one 32-byte sector a row or column. H200
(2026-12-01): blockwise_cols 1.22 ms at 14336x4096x8192 (787 TFLOP/s; session 5's one-temporary
version with strided scales 1.39, the plain-Triton kernel 1.70), errors equal to the plain-Triton
kernel's on the same codes.

Scale ring (``SMEM_SCALES``, ``_ss`` configurations, the default for both blockwise modes): the
producer also TMA-loads each chunk's scales into shared memory with the stage's operands, on the
same ``ready`` barrier: sA's 128 rows of the tile (a [1, 128] box of sA seen as (chunks, M)) and,
blockwise_cols, sB's 128 columns (of (chunks, N)); rows are padded to 16 bytes by ``_chunk_rows``
(the pad is outside the descriptor, which TMA fills with zeros, as it does past M, N and the last
chunk). The ring has 2 STAGES slots of two chunks, twice the operand ring: a consumer promotes a
stage's op 1 in the next stage, after its operand slot was released, and stage ``c``'s scale
slot is refilled (for stage ``c + 2 STAGES``) only once both consumers released stage
``c + STAGES``, after their promotions of stage ``c`` (done by stage ``c + 1``). The consumers
read the scales where they use them (an LDS each, straight into the accumulator's row or column
slice): no global load waits in the K loop (the chunk's product ``sA * sB`` was formed next to
its global loads, and its multiply waited for them there, mid-stage), and blockwise_cols' column
scales need no layout conversion through shared memory and its warp-group barrier. Blockwise's one sB scalar a chunk stays a global load, a stage
ahead (its ring copy, sB repeated 64 times, measured no faster). Shared memory +6 KB (blockwise)
/ +12 KB (blockwise_cols). Same bits.

``EPI_OVERLAP`` (``ws_s3_g16_eo``, the default for tensorwise and rowwise from 8192 x 8192
outputs up): a tile's epilogue (scales, bias, cast, stores) runs after the next tile's
first stage has issued its two wgmmas, so the tensor cores work through it (the accumulator, 64
registers, is carried into the next tile, where t0 / t1 are not yet live: the same 192-register
peak); the program's last tile's epilogue follows its loop. The same bits as without it. H200
(session 7, interleaved A/B, ``benchmarks/gemm_ab.py``): +1 to +3% for tensorwise and rowwise, -2
to -3% for blockwise (not used there). ``ws_s3_eo`` (GROUP_M 8) and 240 consumer registers were no
better. With a bias (session 8, 8200x8320x4160, bf16 bias): the same bits as ``ws_s3_g16``,
0.811 / 0.881 against 0.800 / 0.868 of cuBLAS (tensorwise / rowwise).

``FAST`` configurations (``wsfast_*``): no promotion (cuBLAS ``use_fast_accum``), every chunk's
wgmma accumulates into one accumulator, so 128x256 tiles fit (128 registers); slower than the
plain-Triton fast kernel on the H200 (1215 vs 1305 TFLOP/s at 8192^3), reached by
``fp8_scaled_mm(variant="ws")`` only.

Against cuBLAS (Nsight Compute at 8192^3, session 12): cuBLAS's precise FP8 kernels run 2-CTA
clusters with TMA multicast (tensorwise on 144 x 128 tiles, blockwise on 128 x 128) and read ~28%
fewer L2 sectors; here the L2 runs at 78-80% of peak (cuBLAS 63%), the tensor pipe is busy 85% /
80% of the SM-active cycles (cuBLAS 94% / 82%) and the consumers wait ~7% for TMA data. Gluon in
triton 3.6 has no TMA multicast. Measured and not faster (benchmarks/RESULTS.md): scale loads
before the wgmma waits, per-chunk ring barriers, 192 x 128 tiles on three one-temporary consumers.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import gemm_gluon as _g

__all__ = ["WS_CONFIGS", "WS_DEFAULT", "promote_config", "is_fast", "ws_scaled_mm", "compile_ws_for_sm90"]

gl = _g.gl
if gl is not None:
    from triton.experimental import gluon
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

    _tma_load = _g._tma_load
    _tile_coords = _g._tile_coords
    _chunk_scale = _g._chunk_scale
    _promote = _g._promote
    _epilogue = _g._epilogue
    # triton 3.6: shared_memory_descriptor._reinterpret; 3.9: .reinterpret (resolved at trace time)
    _REINTERPRET_PUBLIC = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

    @gluon.jit
    def _as_rows(buf, n_slots: gl.constexpr, width: gl.constexpr):
        """The TMA ring ``buf`` ([slots, 1, width], NVMMA layout) as [slots, width] rows with a
        rank-1 unswizzled layout, to load row slices from in any register layout."""
        flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        if _REINTERPRET_PUBLIC:
            rows = buf.reinterpret(gl.float32, [n_slots, width], flat)
        else:
            rows = buf._reinterpret(gl.float32, [n_slots, width], flat)
        return rows

    @gluon.jit
    def _ws_producer(a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_bufs, sb_bufs, ready, empty, M, N, K,
                     STAGES: gl.constexpr, SUBK: gl.constexpr, GROUP_M: gl.constexpr, MODE: gl.constexpr,
                     SMEM_SCALES: gl.constexpr):
        """TMA loads of every (tile, stage of SUBK 128-K chunks) of this program, each into the
        next free ring slot (A as two 64-row boxes: one per consumer warp group). SMEM_SCALES:
        also the stage's chunk scales (sA's 128 tile rows; blockwise_cols: sB's 128 tile
        columns) into scale slot ``p % (2 STAGES)``, on the same ``ready`` barrier."""
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        HALF_M: gl.constexpr = a_desc.block_type.shape[0]
        num_pid_m = gl.cdiv(M, 2 * HALF_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_tiles = num_pid_m * num_pid_n
        n_stages = gl.cdiv(gl.cdiv(K, BLOCK_K), SUBK)
        SCALE_BYTES: gl.constexpr = (2 * HALF_M + (BLOCK_N if MODE == 3 else 0)) * 4 if SMEM_SCALES else 0
        NBYTES: gl.constexpr = SUBK * ((2 * HALF_M + BLOCK_N) * BLOCK_K + SCALE_BYTES)
        p = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            for st in range(n_stages):
                slot = p % STAGES
                mbarrier.wait(empty.index(slot), ((p // STAGES) & 1) ^ 1)  # fresh barrier: passes
                bar = ready.index(slot)
                mbarrier.expect(bar, NBYTES)
                for h in gl.static_range(SUBK):
                    k = (st * SUBK + h) * BLOCK_K
                    for r in gl.static_range(2):
                        _tma_load(a_desc, [pid_m * 2 * HALF_M + r * HALF_M, k], bar,
                                  a_bufs.index((slot * SUBK + h) * 2 + r))
                    _tma_load(b_desc, [pid_n * BLOCK_N, k], bar, b_bufs.index(slot * SUBK + h))
                    if SMEM_SCALES:
                        ss = (p % (2 * STAGES)) * SUBK + h
                        _tma_load(sa_desc, [st * SUBK + h, pid_m * 2 * HALF_M], bar, sa_bufs.index(ss))
                        if MODE == 3:
                            _tma_load(sb_desc, [st * SUBK + h, pid_n * BLOCK_N], bar, sb_bufs.index(ss))
                p += 1

    @gluon.jit
    def _ws_consumer(a_bufs, b_bufs, sa_ring, sb_ring, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                     stride_cm, stride_cn: gl.constexpr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                     WG: gl.constexpr, MODE: gl.constexpr, HAS_BIAS: gl.constexpr, FAST: gl.constexpr,
                     BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     SUBK: gl.constexpr, GROUP_M: gl.constexpr, EPI_OVERLAP: gl.constexpr,
                     SMEM_SCALES: gl.constexpr):
        """Warp group ``WG`` (0/1): rows WG*64 .. WG*64+63 of every tile of this program.
        EPI_OVERLAP (promoting): a tile's epilogue runs in the next tile's first stage, while its
        two wgmmas do (the first tile's is a masked-off no-op)."""
        HALF_M: gl.constexpr = 64
        OVERLAP: gl.constexpr = EPI_OVERLAP and not FAST  # the promoting tile schedules only
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32])
        num_pid_m = gl.cdiv(M, 2 * HALF_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        n_chunks = gl.cdiv(K, BLOCK_K)
        c = 0  # stages consumed by this program
        tw = 1.0  # tensorwise: the output scale RN(sA * sB), loaded once
        if MODE == 0:
            tw = gl.load(sa_ptr) * gl.load(sb_ptr)
        t0 = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)
        t1 = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)
        acc_prev = gl.zeros([HALF_M, BLOCK_N], gl.float32, mma_layout)  # EPI_OVERLAP: the tile before
        prev_m = M  # its rows: none before the first tile (every store masked off)
        prev_n = 0
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * 2 * HALF_M + WG * HALF_M
            if FAST:
                acc, c = _ws_tile_fast(a_bufs, b_bufs, ready, empty, c, gl.cdiv(n_chunks, SUBK), WG,
                                       STAGES, SUBK, mma_layout)
            elif MODE == 3:
                acc, c, t0, t1 = _ws_tile_promote_cols(a_bufs, b_bufs, sa_ring, sb_ring, ready, empty, c, t0, t1,
                                                       sa_ptr, sb_ptr, off_m, pid_n * BLOCK_N, n_chunks, M, N,
                                                       stride_sam, stride_sak, stride_sbk, stride_sbn, WG, STAGES,
                                                       mma_layout, SMEM_SCALES, acc_prev, prev_m, prev_n, c_ptr,
                                                       bias_ptr, stride_cm, stride_cn, HAS_BIAS, OVERLAP)
            else:
                acc, c, t0, t1 = _ws_tile_promote(a_bufs, b_bufs, sa_ring, ready, empty, c, t0, t1, sa_ptr, sb_ptr,
                                                  off_m, pid_n, n_chunks, M, stride_sam, stride_sak,
                                                  stride_sbk, stride_sbn, WG, MODE, STAGES, mma_layout,
                                                  acc_prev, prev_m, prev_n, c_ptr, bias_ptr, N, stride_cm,
                                                  stride_cn, HAS_BIAS, OVERLAP, SMEM_SCALES, tw)
            if OVERLAP:
                acc_prev = acc
                prev_m = off_m
                prev_n = pid_n * BLOCK_N
            else:
                _epilogue(acc, c_ptr, bias_ptr, sa_ptr, sb_ptr, off_m, pid_n * BLOCK_N, M, N, stride_cm,
                          stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, HALF_M, BLOCK_N, tw)
        if OVERLAP:  # the last tile's
            _epilogue(acc_prev, c_ptr, bias_ptr, sa_ptr, sb_ptr, prev_m, prev_n, M, N, stride_cm,
                      stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, HALF_M, BLOCK_N, tw)

    @gluon.jit
    def _ws_tile_fast(a_bufs, b_bufs, ready, empty, c, n_stages, WG: gl.constexpr, STAGES: gl.constexpr,
                      SUBK: gl.constexpr, mma_layout: gl.constexpr):
        """Fast accumulation (no promotion, cuBLAS ``use_fast_accum``): every chunk's wgmma adds
        into the one accumulator; a stage's slot is released once its wgmmas retired."""
        BLOCK_N: gl.constexpr = mma_layout.instr_shape[1]
        acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        for st in range(n_stages):
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            for h in gl.static_range(SUBK):
                acc = warpgroup_mma(a_bufs.index((slot * SUBK + h) * 2 + WG),
                                    b_bufs.index(slot * SUBK + h).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            mbarrier.arrive(empty.index(slot), count=1)
            c += 1
        return acc, c

    @gluon.jit
    def _promote_cols(acc, t, sa, sb):
        """acc + t * RN(sa * sb): sa a (64, 1) column, sb a (1, BLOCK_N) row, per element (volatile
        asm, as ``_promote``: no (64, BLOCK_N) scale tile is ever held)."""
        return gl.inline_asm_elementwise(
            "{ .reg .f32 s; mul.rn.f32 s, $2, $3; fma.rn.f32 $0, $1, s, $4; }", "=r,r,r,r,r",
            [t, gl.broadcast(sa, t)[0], gl.broadcast(sb, t)[0], acc], dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def _first_stage(a_bufs, b_bufs, ready, c, t0, t1, WG: gl.constexpr, STAGES: gl.constexpr):
        """A tile's first stage: wait for its slot, issue op 0 (chunk 0, into t0) and op 1 (chunk 1,
        into t1), both from zero. Returns (slot, t0, t1), both ops in flight."""
        slot = c % STAGES
        mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
        t0 = warpgroup_mma(a_bufs.index(slot * 4 + WG), b_bufs.index(slot * 2).permute((1, 0)), t0,
                           use_acc=False, is_async=True)
        t1 = warpgroup_mma(a_bufs.index(slot * 4 + 2 + WG), b_bufs.index(slot * 2 + 1).permute((1, 0)), t1,
                           use_acc=False, is_async=True)
        return slot, t0, t1

    @gluon.jit
    def _raw_col_scales(sa_ptr, sb_ptr, rows, cols, k, n_chunks, M, N, stride_sam, stride_sak, stride_sbk,
                        stride_sbn, SMEM_SCALES: gl.constexpr):
        """Chunk k's ``sA[rows, k]`` ((64,), the accumulator's row slice) and ``sB[k, cols]`` (one
        column a thread, coalesced), 0 past K: three registers a thread, converted at use.
        SMEM_SCALES: nothing (the scales are in the ring)."""
        if SMEM_SCALES:
            sa = 0.0
            sb = 0.0
        else:
            ok = k < n_chunks
            sa = gl.load(sa_ptr + rows * stride_sam + k * stride_sak, mask=(rows < M) & ok, other=0.0)
            sb = gl.load(sb_ptr + k * stride_sbk + cols * stride_sbn, mask=(cols < N) & ok, other=0.0)
        return sa, sb

    @gluon.jit
    def _promote_cols_at(acc, t, sa, sb, sa_ring, sb_ring, ss, WG: gl.constexpr, mma_layout: gl.constexpr,
                         SMEM_SCALES: gl.constexpr):
        """``_promote_cols`` of one chunk: from ``_raw_col_scales``' registers (the row of column
        scales goes to the accumulator's column slice, 32 a thread, here where it is used, through
        shared memory and a warp-group barrier) or, SMEM_SCALES, from scale slot ``ss`` of the
        ring (shared-memory loads straight into those layouts)."""
        if SMEM_SCALES:
            sa = sa_ring.index(ss).slice(WG * 64, 64).load(gl.SliceLayout(1, mma_layout))
            sb = sb_ring.index(ss).load(gl.SliceLayout(0, mma_layout))
        else:
            sb = gl.convert_layout(sb, gl.SliceLayout(0, mma_layout))
        return _promote_cols(acc, t, gl.expand_dims(sa, 1), gl.expand_dims(sb, 0))

    @gluon.jit
    def _ws_tile_promote_cols(a_bufs, b_bufs, sa_ring, sb_ring, ready, empty, c, t0, t1, sa_ptr, sb_ptr, off_m,
                              off_n, n_chunks, M, N, stride_sam, stride_sak, stride_sbk, stride_sbn,
                              WG: gl.constexpr, STAGES: gl.constexpr, mma_layout: gl.constexpr,
                              SMEM_SCALES: gl.constexpr, acc_prev, prev_m, prev_n, c_ptr, bias_ptr, stride_cm,
                              stride_cn: gl.constexpr, HAS_BIAS: gl.constexpr, EPI_OVERLAP: gl.constexpr):
        """MODE 3 with two temporaries, on ``_ws_tile_promote``'s schedule (op 0 of a stage runs
        while op 1 of the stage before is promoted, then op 1 while op 0 is), the epilogue overlap
        included; a chunk's scales wait in three registers and take the accumulator's layout only
        inside its promotion (SMEM_SCALES: read from the ring there)."""
        BLOCK_N: gl.constexpr = mma_layout.instr_shape[1]
        SS: gl.constexpr = 2 * STAGES  # scale slots of 2 chunks
        rows = off_m + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.BlockedLayout([BLOCK_N // 128], [32], [4], [0]))
        slot, t0, t1 = _first_stage(a_bufs, b_bufs, ready, c, t0, t1, WG, STAGES)
        if EPI_OVERLAP:  # the tile before, while both ops run
            _epilogue(acc_prev, c_ptr, bias_ptr, sa_ptr, sb_ptr, prev_m, prev_n, M, N, stride_cm, stride_cn,
                      stride_sam, stride_sbn, 3, HAS_BIAS, mma_layout, 64, BLOCK_N, 1.0)
        acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        ss = (c % SS) * 2
        sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 0, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn, SMEM_SCALES)
        sa1, sb1 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 1, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn, SMEM_SCALES)
        t0 = warpgroup_mma_wait(1, deps=[t0])
        acc = _promote_cols_at(acc, t0, sa0, sb0, sa_ring, sb_ring, ss, WG, mma_layout, SMEM_SCALES)
        t1 = warpgroup_mma_wait(0, deps=[t1])
        mbarrier.arrive(empty.index(slot), count=1)
        c += 1
        sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 2, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn, SMEM_SCALES)
        # Loop invariant (as _ws_tile_promote): nothing in flight at the back edge; t1 holds the
        # previous stage's op 1, retired, not yet promoted (its scales in sa1 / sb1, or slot ss + 1).
        for st in range(1, gl.cdiv(n_chunks, 2)):
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            t0 = warpgroup_mma(a_bufs.index(slot * 4 + WG), b_bufs.index(slot * 2).permute((1, 0)), t0,
                               use_acc=False, is_async=True)
            acc = _promote_cols_at(acc, t1, sa1, sb1, sa_ring, sb_ring, ss + 1, WG, mma_layout, SMEM_SCALES)
            t1 = warpgroup_mma(a_bufs.index(slot * 4 + 2 + WG), b_bufs.index(slot * 2 + 1).permute((1, 0)),
                               t1, use_acc=False, is_async=True)
            ss = (c % SS) * 2
            sa1, sb1 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, st * 2 + 1, n_chunks, M, N, stride_sam,
                                       stride_sak, stride_sbk, stride_sbn, SMEM_SCALES)
            t0 = warpgroup_mma_wait(1, deps=[t0])
            acc = _promote_cols_at(acc, t0, sa0, sb0, sa_ring, sb_ring, ss, WG, mma_layout, SMEM_SCALES)
            sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, st * 2 + 2, n_chunks, M, N, stride_sam,
                                       stride_sak, stride_sbk, stride_sbn, SMEM_SCALES)
            t1 = warpgroup_mma_wait(0, deps=[t1])
            mbarrier.arrive(empty.index(slot), count=1)
            c += 1
        acc = _promote_cols_at(acc, t1, sa1, sb1, sa_ring, sb_ring, ss + 1, WG, mma_layout, SMEM_SCALES)
        return acc, c, t0, t1

    @gluon.jit
    def _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, chunk, n_chunks, M, stride_sam, stride_sak, stride_sbk,
                   stride_sbn, rows_layout: gl.constexpr, SMEM_SCALES: gl.constexpr):
        """Blockwise: the loads a chunk's scale is formed from, issued ahead of its use (0 past K):
        the product ``sA[rows, chunk] * sB[chunk, n-block]`` ((64, 1)) or, SMEM_SCALES, ``sB`` alone
        (a scalar; sA is in the ring): (x, sb)."""
        if SMEM_SCALES:
            x = 0.0
            sb = gl.load(sb_ptr + chunk * stride_sbk + pid_n * stride_sbn, mask=chunk < n_chunks, other=0.0)
        else:
            x = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, chunk, n_chunks, M, stride_sam, stride_sak,
                             stride_sbk, stride_sbn, rows_layout, 64)
            sb = 0.0
        return x, sb

    @gluon.jit
    def _blk_scale(x, sb, sa_ring, ss, WG: gl.constexpr, rows_layout: gl.constexpr, SMEM_SCALES: gl.constexpr):
        """The (64, 1) scale column ``RN(sA * sB)`` of a chunk from ``_blk_fetch``'s (x, sb); SMEM_SCALES:
        sA from scale slot ``ss`` of the ring (a shared-memory load), the product formed here."""
        if SMEM_SCALES:
            x = gl.expand_dims(sa_ring.index(ss).slice(WG * 64, 64).load(rows_layout) * sb, 1)
        return x

    @gluon.jit
    def _ws_tile_promote(a_bufs, b_bufs, sa_ring, ready, empty, c, t0, t1, sa_ptr, sb_ptr, off_m, pid_n, n_chunks,
                         M, stride_sam, stride_sak, stride_sbk, stride_sbn, WG: gl.constexpr, MODE: gl.constexpr,
                         STAGES: gl.constexpr, mma_layout: gl.constexpr, acc_prev, prev_m, prev_n, c_ptr, bias_ptr,
                         N, stride_cm, stride_cn: gl.constexpr, HAS_BIAS: gl.constexpr, EPI_OVERLAP: gl.constexpr,
                         SMEM_SCALES: gl.constexpr, tw):
        """One tile's 64 rows, promoted every 128-K chunk; a stage = chunks 2s (op 0, into t0) and
        2s+1 (op 1, into t1). EPI_OVERLAP: the previous tile's epilogue (``acc_prev``, rows from
        ``prev_m``, columns from ``prev_n``) between the first stage's issue and its first wait.
        Blockwise scales (``_blk_fetch``): op 0's a stage ahead, op 1's during its stage.
        Returns (acc, c, t0, t1)."""
        BLOCK_N: gl.constexpr = mma_layout.instr_shape[1]
        rows: gl.constexpr = gl.SliceLayout(1, mma_layout)
        SS: gl.constexpr = 2 * STAGES  # scale slots (SMEM_SCALES) of 2 chunks
        x0 = 1.0  # blockwise: what the scales of the ops in t0 / t1 are formed from
        y0 = 1.0
        x1 = 1.0
        y1 = 1.0
        if MODE == 2:
            x0, y0 = _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, 0, n_chunks, M, stride_sam, stride_sak, stride_sbk,
                                stride_sbn, rows, SMEM_SCALES)
            x1, y1 = _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, 1, n_chunks, M, stride_sam, stride_sak, stride_sbk,
                                stride_sbn, rows, SMEM_SCALES)
        # stage 0: both ops, then drain
        slot, t0, t1 = _first_stage(a_bufs, b_bufs, ready, c, t0, t1, WG, STAGES)
        ss = (c % SS) * 2
        if EPI_OVERLAP:  # the tile before, while both ops run (its accumulator's last use)
            _epilogue(acc_prev, c_ptr, bias_ptr, sa_ptr, sb_ptr, prev_m, prev_n, M, N, stride_cm, stride_cn,
                      stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, 64, BLOCK_N, tw)
        acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        x0n = x0  # blockwise: the next stage's op 0 scale, fetched a stage ahead (L2 latency)
        y0n = y0
        if MODE == 2:
            x0n, y0n = _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, 2, n_chunks, M, stride_sam, stride_sak,
                                  stride_sbk, stride_sbn, rows, SMEM_SCALES)
        t0 = warpgroup_mma_wait(1, deps=[t0])
        acc = _promote(acc, t0, _blk_scale(x0, y0, sa_ring, ss, WG, rows, SMEM_SCALES), MODE)
        t1 = warpgroup_mma_wait(0, deps=[t1])
        mbarrier.arrive(empty.index(slot), count=1)  # this warp group is done with the slot
        c += 1
        # Loop invariant: nothing in flight at the back edge (else ptxas serializes every wgmma,
        # C7514); t1 holds the previous stage's op 1, retired, not yet promoted.
        for st in range(1, gl.cdiv(n_chunks, 2)):
            slot = c % STAGES
            if MODE == 2:  # this stage's op 0 scale came a stage ahead; fetch the next one's
                x0 = x0n
                y0 = y0n
                x0n, y0n = _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, st * 2 + 2, n_chunks, M, stride_sam,
                                      stride_sak, stride_sbk, stride_sbn, rows, SMEM_SCALES)
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            t0 = warpgroup_mma(a_bufs.index(slot * 4 + WG), b_bufs.index(slot * 2).permute((1, 0)), t0,
                               use_acc=False, is_async=True)
            # op 1 of the previous stage, while op 0 runs
            acc = _promote(acc, t1, _blk_scale(x1, y1, sa_ring, ss + 1, WG, rows, SMEM_SCALES), MODE)
            t1 = warpgroup_mma(a_bufs.index(slot * 4 + 2 + WG), b_bufs.index(slot * 2 + 1).permute((1, 0)),
                               t1, use_acc=False, is_async=True)
            ss = (c % SS) * 2
            if MODE == 2:
                x1, y1 = _blk_fetch(sa_ptr, sb_ptr, off_m, pid_n, st * 2 + 1, n_chunks, M, stride_sam,
                                    stride_sak, stride_sbk, stride_sbn, rows, SMEM_SCALES)
            t0 = warpgroup_mma_wait(1, deps=[t0])
            acc = _promote(acc, t0, _blk_scale(x0, y0, sa_ring, ss, WG, rows, SMEM_SCALES), MODE)  # while op 1 runs
            t1 = warpgroup_mma_wait(0, deps=[t1])
            mbarrier.arrive(empty.index(slot), count=1)
            c += 1
        acc = _promote(acc, t1, _blk_scale(x1, y1, sa_ring, ss + 1, WG, rows, SMEM_SCALES), MODE)
        return acc, c, t0, t1

    @gluon.jit
    def _fp8_gemm_ws_kernel(a_desc, b_desc, sa_desc, sb_desc, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn: gl.constexpr, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            MODE: gl.constexpr, HAS_BIAS: gl.constexpr, FAST: gl.constexpr,
                            STAGES: gl.constexpr, SUBK: gl.constexpr, GROUP_M: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, EPI_OVERLAP: gl.constexpr,
                            SMEM_SCALES: gl.constexpr, num_warps: gl.constexpr):
        """Persistent warp-specialized promoting FP8 GEMM (module docstring); MODE 0/1/2/3:
        tensorwise, rowwise, blockwise, blockwise_cols; 128 x BLOCK_N tiles, stages of SUBK 128-K
        chunks; FAST: no promotion (tensorwise / rowwise). SMEM_SCALES (blockwise modes): the chunk
        scales come from a ring of 2 STAGES scale slots in shared memory that the producer fills by
        TMA (``sa_desc``: sA as (chunks, M); ``sb_desc``, blockwise_cols: sB as (chunks, N); where
        unused, the operand descriptors stand in). ``stride_cn`` is a compile-time constant (1 for
        the row-major outputs the launcher allocates): the epilogue's stores are then vectors of a
        thread's two adjacent columns, not one 16-bit store an element."""
        gl.static_assert(num_warps == 4, "the default partition is consumer warp group 0")
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        gl.static_assert(MODE < 2 or (BLOCK_N == 128 and BLOCK_K == 128 and not FAST),
                         "blockwise: 128x128 tiles (one sB, or a row of them, per chunk), promoted")
        gl.static_assert(FAST or SUBK == 2, "promotion: a stage's two ops are its two 128-K chunks")
        gl.static_assert(MODE >= 2 or not SMEM_SCALES, "the scale ring holds blockwise scales")
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * SUBK * 2] + a_desc.block_type.shape,
                                           a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES * SUBK] + b_desc.block_type.shape, b_desc.layout)
        if SMEM_SCALES:  # the TMA view ([1, 128] boxes, a chunk a slot) and a row view to read from
            sa_tma = gl.allocate_shared_memory(gl.float32, [2 * STAGES * SUBK] + sa_desc.block_type.shape,
                                               sa_desc.layout)
            sa_ring = _as_rows(sa_tma, 2 * STAGES * SUBK, sa_desc.block_type.shape[1])
            if MODE == 3:
                sb_tma = gl.allocate_shared_memory(gl.float32, [2 * STAGES * SUBK] + sb_desc.block_type.shape,
                                                   sb_desc.layout)
                sb_ring = _as_rows(sb_tma, 2 * STAGES * SUBK, sb_desc.block_type.shape[1])
            else:  # blockwise: sB is one scalar a chunk, loaded from global memory a stage ahead
                sb_tma = sa_tma
                sb_ring = sa_ring
        else:
            sa_tma = a_bufs
            sb_tma = b_bufs
            sa_ring = a_bufs
            sb_ring = b_bufs
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warp group
        gl.warp_specialize([
            (_ws_consumer, (a_bufs, b_bufs, sa_ring, sb_ring, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            0, MODE, HAS_BIAS, FAST, BLOCK_N, BLOCK_K, STAGES, SUBK, GROUP_M, EPI_OVERLAP,
                            SMEM_SCALES)),
            (_ws_consumer, (a_bufs, b_bufs, sa_ring, sb_ring, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            1, MODE, HAS_BIAS, FAST, BLOCK_N, BLOCK_K, STAGES, SUBK, GROUP_M, EPI_OVERLAP,
                            SMEM_SCALES)),
            (_ws_producer, (a_desc, b_desc, sa_desc, sb_desc, a_bufs, b_bufs, sa_tma, sb_tma, ready, empty, M, N, K,
                            STAGES, SUBK, GROUP_M, MODE, SMEM_SCALES)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
else:  # pragma: no cover
    _fp8_gemm_ws_kernel = None


class WSConfig(NamedTuple):
    """A launch configuration. Registers: 12 warps (3 warp groups, the producer's one warp rounded
    up) share 64K a CTA, so maxnreg <= 170; the default partition gets what maxnreg leaves (232
    here, as the worker). ``epi_overlap``: a tile's epilogue under the next tile's first two
    wgmmas (``_eo``); ``smem_scales``: blockwise chunk scales from the shared-memory ring
    (``_ss``; tensorwise and rowwise ignore it)."""
    fast: bool
    block_n: int
    stages: int
    subk: int
    group_m: int
    consumer_regs: int
    producer_regs: int
    maxnreg: int
    epi_overlap: bool
    smem_scales: bool = False


WS_CONFIGS = {
    "ws_s3": WSConfig(False, 128, 3, 2, 8, 232, 40, 168, False),
    "ws_s3_g16": WSConfig(False, 128, 3, 2, 16, 232, 40, 168, False),
    "wsfast_n256_s4": WSConfig(True, 256, 4, 1, 8, 240, 24, 168, False),
    "ws_s3_r240": WSConfig(False, 128, 3, 2, 8, 240, 24, 168, False),
    "wsfast_n128_s6": WSConfig(True, 128, 6, 1, 8, 232, 40, 168, False),
    "ws_s3_g16_eo": WSConfig(False, 128, 3, 2, 16, 232, 40, 168, True),
    "ws_s3_ss": WSConfig(False, 128, 3, 2, 8, 232, 40, 168, False, True),
    "ws_s3_g16_ss": WSConfig(False, 128, 3, 2, 16, 232, 40, 168, False, True),
    "ws_s3_g16_ss_eo": WSConfig(False, 128, 3, 2, 16, 232, 40, 168, True, True),
}
WS_DEFAULT = {"promote": "ws_s3", "fast": "wsfast_n256_s4"}  # fp8_scaled_mm(variant="ws")


def promote_config(M: int, N: int, mode: str = "tensorwise") -> str:
    """The promoting configuration for an (M, N) output: GROUP_M 16 from 8192 x 8192 up, 8 below;
    there, the epilogue under the next tile's first wgmmas (``_eo``) for tensorwise, rowwise and
    blockwise; the blockwise modes take their chunk scales from the shared-memory ring (``_ss``)
    at every size. Every choice gives the same bits. H200 (``benchmarks/gemm_ab.py``, interleaved,
    ratio to the anchor in the same round; benchmarks/RESULTS.md): GROUP_M 16 won at
    16384x14336x4096 (session 4), lost at 2048x4096x4096; ``_eo`` +1 to +3% for tensorwise and
    rowwise (session 7). Session 11: the ring against the scale loads from global memory,
    blockwise (vs cuBLAS blockwise) 8192^3 0.981 / 0.970 vs 0.898, 8192x14336x4096 0.919 / 0.934
    vs 0.869, blockwise_cols (vs bf16) 8192^3 1.300 / 1.228 vs 1.239 / 1.178 (calls 1 / 2);
    ``_eo`` with the ring, blockwise 0.966 / 0.934 / 0.974 vs 0.949 / 0.928 / 0.949 (8192^3 /
    8192x14336x4096 / 14336x4096x8192), blockwise_cols 1.249 / 1.219 / 1.196 vs 1.272 / 1.211 /
    1.213 (call 3): kept for blockwise only."""
    if M * N < 8192 * 8192:
        return "ws_s3_ss" if mode.startswith("blockwise") else "ws_s3"
    return {"blockwise": "ws_s3_g16_ss_eo", "blockwise_cols": "ws_s3_g16_ss"}.get(mode, "ws_s3_g16_eo")


_BM = _BK = 128


def is_fast(config: str) -> bool:
    return WS_CONFIGS[config].fast


def _descs(qa, qb, bn: int):
    a_desc = _g._GluonDesc(qa, list(qa.shape), [qa.stride(0), 1], [_BM // 2, _BK], _g._smem_layout(_BM // 2, _BK))
    bt = qb.t()  # (N, K) row-major view
    b_desc = _g._GluonDesc(bt, list(bt.shape), [bt.stride(0), 1], [bn, _BK], _g._smem_layout(bn, _BK))
    return a_desc, b_desc


@functools.lru_cache(maxsize=None)
def _row_layout():
    """Shared layout of a [1, 128] fp32 scale box: unswizzled rows."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def _chunk_rows(s: torch.Tensor) -> torch.Tensor:
    """Scales (chunks, n) as TMA takes them: unit column stride, rows 16-byte aligned (row stride
    n rounded up to a multiple of 4; the pad is outside the descriptor's shape, which TMA fills
    with zeros), base 16-byte aligned; no copy when they already are."""
    n = s.shape[1]
    if s.stride(1) == 1 and s.stride(0) % 4 == 0 and s.stride(0) >= n and s.data_ptr() % 16 == 0:
        return s
    out = torch.empty((s.shape[0], -(-n // 4) * 4), dtype=s.dtype, device=s.device)[:, :n]
    return out.copy_(s)


def _scale_desc(rows: torch.Tensor):
    return _g._GluonDesc(rows, list(rows.shape), [rows.stride(0), 1], [1, 128], _row_layout())


def ws_scaled_mm(qa, sa, qb, sb, mode: str, out: torch.Tensor, bias=None, *, config: str = "ws_s3") -> torch.Tensor:
    """Launch the warp-specialized kernel on arguments ``gemm_gluon.gluon_support`` accepted
    (``out`` allocated, scales 2-D as ``gluon_scaled_mm`` shapes them)."""
    cfg = WS_CONFIGS[config]
    M, K = qa.shape
    N = qb.shape[1]
    a_desc, b_desc = _descs(qa, qb, cfg.block_n)
    sa_desc, sb_desc = a_desc, b_desc  # stand-ins, unused unless the scale ring is
    ring = cfg.smem_scales and mode in ("blockwise", "blockwise_cols")
    if mode in ("blockwise", "blockwise_cols"):  # a chunk's scales a coalesced run (module docstring)
        if ring:
            sa_rows = _chunk_rows(sa.t())  # (chunks, M): sA[m, c] at c * stride + m
            sa_desc, sa = _scale_desc(sa_rows), sa_rows.t()
        else:
            sa = sa.t().contiguous().t()  # sA[m, c] at c * M + m (no copy when it already is)
        if mode == "blockwise_cols":
            sb = _chunk_rows(sb) if ring else sb.contiguous()  # sB[c, n] at c * N + n
            if ring:
                sb_desc = _scale_desc(sb)
    tiles = -(-M // _BM) * -(-N // cfg.block_n)
    grid = (min(_g._num_sms(qa.device), tiles),)
    bias_t = bias.contiguous() if bias is not None else out
    _fp8_gemm_ws_kernel[grid](
        a_desc, b_desc, sa_desc, sb_desc, out, bias_t, sa, sb, M, N, K, out.stride(0), out.stride(1),
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        MODE=_g._MODES[mode], HAS_BIAS=bias is not None, FAST=cfg.fast, STAGES=cfg.stages, SUBK=cfg.subk,
        GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
        EPI_OVERLAP=cfg.epi_overlap, SMEM_SCALES=ring, num_warps=4, maxnreg=cfg.maxnreg)
    return out


def compile_ws_for_sm90(mode: str = "tensorwise", config: str = "ws_s3", out_dtype: str = "bf16",
                        has_bias: bool = True, a_type: str = "fp8e4nv", b_type: str = "fp8e4nv"):
    """``triton.compile`` of the kernel for sm_90a on the CPU (tests, PTX/SASS inspection)."""
    import triton
    from triton.backends.compiler import GPUTarget
    cfg = WS_CONFIGS[config]
    ring = cfg.smem_scales and mode in ("blockwise", "blockwise_cols")
    la, lb = _g._smem_layout(_BM // 2, _BK), _g._smem_layout(cfg.block_n, _BK)
    a_t = f"tensordesc<{a_type}[{_BM // 2},{_BK}],{la!r}>"
    b_t = f"tensordesc<{b_type}[{cfg.block_n},{_BK}],{lb!r}>"
    row_t = f"tensordesc<fp32[1,128],{_row_layout()!r}>"
    sig = {"a_desc": a_t, "b_desc": b_t, "sa_desc": row_t if ring else a_t,
           "sb_desc": row_t if ring and mode == "blockwise_cols" else b_t,
           "c_ptr": f"*{out_dtype}", "bias_ptr": f"*{out_dtype}", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "constexpr",
           "stride_sam": "i32", "stride_sak": "i32", "stride_sbk": "i32", "stride_sbn": "i32"}
    consts = dict(stride_cn=1, MODE=_g._MODES[mode], HAS_BIAS=has_bias, FAST=cfg.fast, STAGES=cfg.stages, SUBK=cfg.subk,
                  GROUP_M=cfg.group_m, CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs,
                  EPI_OVERLAP=cfg.epi_overlap, SMEM_SCALES=ring, num_warps=4)
    for k in consts:
        sig[k] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)  # as the JIT specializes
             if name in ("c_ptr", "bias_ptr", "sa_ptr", "sb_ptr", "stride_cm", "M", "N", "K")}  # 16 | M, N, K
    try:
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(_fp8_gemm_ws_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": cfg.maxnreg, "enable_fp_fusion": True})
