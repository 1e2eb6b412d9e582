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
"""
from __future__ import annotations

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

    @gluon.jit
    def _ws_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                     STAGES: gl.constexpr, SUBK: gl.constexpr, GROUP_M: gl.constexpr):
        """TMA loads of every (tile, stage of SUBK 128-K chunks) of this program, each into the
        next free ring slot (A as two 64-row boxes: one per consumer warp group)."""
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        HALF_M: gl.constexpr = a_desc.block_type.shape[0]
        num_pid_m = gl.cdiv(M, 2 * HALF_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_tiles = num_pid_m * num_pid_n
        n_stages = gl.cdiv(gl.cdiv(K, BLOCK_K), SUBK)
        p = 0
        for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            for st in range(n_stages):
                slot = p % STAGES
                mbarrier.wait(empty.index(slot), ((p // STAGES) & 1) ^ 1)  # fresh barrier: passes
                bar = ready.index(slot)
                mbarrier.expect(bar, SUBK * (2 * HALF_M + BLOCK_N) * BLOCK_K)
                for h in gl.static_range(SUBK):
                    k = (st * SUBK + h) * BLOCK_K
                    for r in gl.static_range(2):
                        _tma_load(a_desc, [pid_m * 2 * HALF_M + r * HALF_M, k], bar,
                                  a_bufs.index((slot * SUBK + h) * 2 + r))
                    _tma_load(b_desc, [pid_n * BLOCK_N, k], bar, b_bufs.index(slot * SUBK + h))
                p += 1

    @gluon.jit
    def _ws_consumer(a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                     stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                     WG: gl.constexpr, MODE: gl.constexpr, HAS_BIAS: gl.constexpr, FAST: gl.constexpr,
                     BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     SUBK: gl.constexpr, GROUP_M: gl.constexpr, EPI_OVERLAP: gl.constexpr):
        """Warp group ``WG`` (0/1): rows WG*64 .. WG*64+63 of every tile of this program.
        EPI_OVERLAP (tensorwise / rowwise / blockwise): a tile's epilogue runs in the next tile's
        first stage, while its two wgmmas do (the first tile's is a masked-off no-op)."""
        HALF_M: gl.constexpr = 64
        OVERLAP: gl.constexpr = EPI_OVERLAP and not FAST and MODE != 3  # the promoting tile schedule only
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32])
        num_pid_m = gl.cdiv(M, 2 * HALF_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        n_chunks = gl.cdiv(K, BLOCK_K)
        c = 0  # stages consumed by this program
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
                acc, c, t0, t1 = _ws_tile_promote_cols(a_bufs, b_bufs, ready, empty, c, t0, t1, sa_ptr, sb_ptr,
                                                       off_m, pid_n * BLOCK_N, n_chunks, M, N, stride_sam,
                                                       stride_sak, stride_sbk, stride_sbn, WG, STAGES, mma_layout)
            else:
                acc, c, t0, t1 = _ws_tile_promote(a_bufs, b_bufs, ready, empty, c, t0, t1, sa_ptr, sb_ptr,
                                                  off_m, pid_n, n_chunks, M, stride_sam, stride_sak,
                                                  stride_sbk, stride_sbn, WG, MODE, STAGES, mma_layout,
                                                  acc_prev, prev_m, prev_n, c_ptr, bias_ptr, N, stride_cm,
                                                  stride_cn, HAS_BIAS, OVERLAP)
            if OVERLAP:
                acc_prev = acc
                prev_m = off_m
                prev_n = pid_n * BLOCK_N
            else:
                _epilogue(acc, c_ptr, bias_ptr, sa_ptr, sb_ptr, off_m, pid_n * BLOCK_N, M, N, stride_cm,
                          stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, HALF_M, BLOCK_N)
        if OVERLAP:  # the last tile's
            _epilogue(acc_prev, c_ptr, bias_ptr, sa_ptr, sb_ptr, prev_m, prev_n, M, N, stride_cm,
                      stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, HALF_M, BLOCK_N)

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
                        stride_sbn):
        """Chunk k's ``sA[rows, k]`` ((64,), the accumulator's row slice) and ``sB[k, cols]`` (one
        column a thread, coalesced), 0 past K: three registers a thread, converted at use."""
        ok = k < n_chunks
        sa = gl.load(sa_ptr + rows * stride_sam + k * stride_sak, mask=(rows < M) & ok, other=0.0)
        sb = gl.load(sb_ptr + k * stride_sbk + cols * stride_sbn, mask=(cols < N) & ok, other=0.0)
        return sa, sb

    @gluon.jit
    def _promote_cols_raw(acc, t, sa, sb, mma_layout: gl.constexpr):
        """``_promote_cols`` from ``_raw_col_scales``' registers: the row of column scales goes to
        the accumulator's column slice (32 a thread) here, where it is used."""
        return _promote_cols(acc, t, gl.expand_dims(sa, 1),
                             gl.expand_dims(gl.convert_layout(sb, gl.SliceLayout(0, mma_layout)), 0))

    @gluon.jit
    def _ws_tile_promote_cols(a_bufs, b_bufs, ready, empty, c, t0, t1, sa_ptr, sb_ptr, off_m, off_n, n_chunks, M,
                              N, stride_sam, stride_sak, stride_sbk, stride_sbn, WG: gl.constexpr,
                              STAGES: gl.constexpr, mma_layout: gl.constexpr):
        """MODE 3 with two temporaries, on ``_ws_tile_promote``'s schedule (op 0 of a stage runs
        while op 1 of the stage before is promoted, then op 1 while op 0 is): the scales wait in
        three registers a chunk and take the accumulator's layout only inside each promotion."""
        BLOCK_N: gl.constexpr = mma_layout.instr_shape[1]
        rows = off_m + gl.arange(0, 64, layout=gl.SliceLayout(1, mma_layout))
        cols = off_n + gl.arange(0, BLOCK_N, layout=gl.BlockedLayout([BLOCK_N // 128], [32], [4], [0]))
        acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        slot, t0, t1 = _first_stage(a_bufs, b_bufs, ready, c, t0, t1, WG, STAGES)
        sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 0, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn)
        sa1, sb1 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 1, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn)
        t0 = warpgroup_mma_wait(1, deps=[t0])
        acc = _promote_cols_raw(acc, t0, sa0, sb0, mma_layout)
        t1 = warpgroup_mma_wait(0, deps=[t1])
        mbarrier.arrive(empty.index(slot), count=1)
        c += 1
        sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, 2, n_chunks, M, N, stride_sam, stride_sak,
                                   stride_sbk, stride_sbn)
        # Loop invariant (as _ws_tile_promote): nothing in flight at the back edge; t1 holds the
        # previous stage's op 1, retired, not yet promoted (its scales in sa1 / sb1).
        for st in range(1, gl.cdiv(n_chunks, 2)):
            slot = c % STAGES
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            t0 = warpgroup_mma(a_bufs.index(slot * 4 + WG), b_bufs.index(slot * 2).permute((1, 0)), t0,
                               use_acc=False, is_async=True)
            acc = _promote_cols_raw(acc, t1, sa1, sb1, mma_layout)
            t1 = warpgroup_mma(a_bufs.index(slot * 4 + 2 + WG), b_bufs.index(slot * 2 + 1).permute((1, 0)),
                               t1, use_acc=False, is_async=True)
            sa1, sb1 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, st * 2 + 1, n_chunks, M, N, stride_sam,
                                       stride_sak, stride_sbk, stride_sbn)
            t0 = warpgroup_mma_wait(1, deps=[t0])
            acc = _promote_cols_raw(acc, t0, sa0, sb0, mma_layout)
            sa0, sb0 = _raw_col_scales(sa_ptr, sb_ptr, rows, cols, st * 2 + 2, n_chunks, M, N, stride_sam,
                                       stride_sak, stride_sbk, stride_sbn)
            t1 = warpgroup_mma_wait(0, deps=[t1])
            mbarrier.arrive(empty.index(slot), count=1)
            c += 1
        acc = _promote_cols_raw(acc, t1, sa1, sb1, mma_layout)
        return acc, c, t0, t1

    @gluon.jit
    def _ws_tile_promote(a_bufs, b_bufs, ready, empty, c, t0, t1, sa_ptr, sb_ptr, off_m, pid_n, n_chunks, M,
                         stride_sam, stride_sak, stride_sbk, stride_sbn, WG: gl.constexpr, MODE: gl.constexpr,
                         STAGES: gl.constexpr, mma_layout: gl.constexpr, acc_prev, prev_m, prev_n, c_ptr, bias_ptr,
                         N, stride_cm, stride_cn, HAS_BIAS: gl.constexpr, EPI_OVERLAP: gl.constexpr):
        """One tile's 64 rows, promoted every 128-K chunk; a stage = chunks 2s (op 0, into t0) and
        2s+1 (op 1, into t1). EPI_OVERLAP: the previous tile's epilogue (``acc_prev``, rows from
        ``prev_m``, columns from ``prev_n``) between the first stage's issue and its first wait.
        Returns (acc, c, t0, t1)."""
        BLOCK_N: gl.constexpr = mma_layout.instr_shape[1]
        rows: gl.constexpr = gl.SliceLayout(1, mma_layout)
        s0 = 1.0  # blockwise: the scales of the ops in t0 / t1 ((64, 1) columns from _chunk_scale)
        s1 = 1.0
        if MODE == 2:
            s0 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, 0, n_chunks, M, stride_sam, stride_sak,
                              stride_sbk, stride_sbn, rows, 64)
            s1 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, 1, n_chunks, M, stride_sam, stride_sak,
                              stride_sbk, stride_sbn, rows, 64)
        # stage 0: both ops, then drain
        slot, t0, t1 = _first_stage(a_bufs, b_bufs, ready, c, t0, t1, WG, STAGES)
        if EPI_OVERLAP:  # the tile before, while both ops run (its accumulator's last use)
            _epilogue(acc_prev, c_ptr, bias_ptr, sa_ptr, sb_ptr, prev_m, prev_n, M, N, stride_cm, stride_cn,
                      stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, 64, BLOCK_N)
        acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        s0n = s0  # blockwise: the next stage's op 0 scale, loaded a stage ahead (L2 latency)
        if MODE == 2:
            s0n = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, 2, n_chunks, M, stride_sam, stride_sak,
                               stride_sbk, stride_sbn, rows, 64)
        t0 = warpgroup_mma_wait(1, deps=[t0])
        acc = _promote(acc, t0, s0, MODE)
        t1 = warpgroup_mma_wait(0, deps=[t1])
        mbarrier.arrive(empty.index(slot), count=1)  # this warp group is done with the slot
        c += 1
        # Loop invariant: nothing in flight at the back edge (else ptxas serializes every wgmma,
        # C7514); t1 holds the previous stage's op 1, retired, not yet promoted.
        for st in range(1, gl.cdiv(n_chunks, 2)):
            slot = c % STAGES
            if MODE == 2:  # this stage's op 0 scale came a stage ahead; fetch the next one's
                s0 = s0n
                s0n = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, st * 2 + 2, n_chunks, M, stride_sam,
                                   stride_sak, stride_sbk, stride_sbn, rows, 64)
            mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
            t0 = warpgroup_mma(a_bufs.index(slot * 4 + WG), b_bufs.index(slot * 2).permute((1, 0)), t0,
                               use_acc=False, is_async=True)
            acc = _promote(acc, t1, s1, MODE)  # op 1 of the previous stage, while op 0 runs
            t1 = warpgroup_mma(a_bufs.index(slot * 4 + 2 + WG), b_bufs.index(slot * 2 + 1).permute((1, 0)),
                               t1, use_acc=False, is_async=True)
            if MODE == 2:
                s1 = _chunk_scale(sa_ptr, sb_ptr, off_m, pid_n, st * 2 + 1, n_chunks, M, stride_sam,
                                  stride_sak, stride_sbk, stride_sbn, rows, 64)
            t0 = warpgroup_mma_wait(1, deps=[t0])
            acc = _promote(acc, t0, s0, MODE)  # while op 1 runs
            t1 = warpgroup_mma_wait(0, deps=[t1])
            mbarrier.arrive(empty.index(slot), count=1)
            c += 1
        acc = _promote(acc, t1, s1, MODE)
        return acc, c, t0, t1

    @gluon.jit
    def _fp8_gemm_ws_kernel(a_desc, b_desc, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            MODE: gl.constexpr, HAS_BIAS: gl.constexpr, FAST: gl.constexpr,
                            STAGES: gl.constexpr, SUBK: gl.constexpr, GROUP_M: gl.constexpr,
                            CONSUMER_REGS: gl.constexpr,
                            PRODUCER_REGS: gl.constexpr, EPI_OVERLAP: gl.constexpr, num_warps: gl.constexpr):
        """Persistent warp-specialized promoting FP8 GEMM (module docstring); MODE 0/1/2:
        tensorwise, rowwise, blockwise; 128 x BLOCK_N tiles, stages of SUBK 128-K chunks; FAST:
        no promotion (tensorwise / rowwise)."""
        gl.static_assert(num_warps == 4, "the default partition is consumer warp group 0")
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        gl.static_assert(MODE < 2 or (BLOCK_N == 128 and BLOCK_K == 128 and not FAST),
                         "blockwise: 128x128 tiles (one sB, or a row of them, per chunk), promoted")
        gl.static_assert(FAST or SUBK == 2, "promotion: a stage's two ops are its two 128-K chunks")
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * SUBK * 2] + a_desc.block_type.shape,
                                           a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES * SUBK] + b_desc.block_type.shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warp group
        gl.warp_specialize([
            (_ws_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            0, MODE, HAS_BIAS, FAST, BLOCK_N, BLOCK_K, STAGES, SUBK, GROUP_M, EPI_OVERLAP)),
            (_ws_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_cm, stride_cn, stride_sam, stride_sak, stride_sbk, stride_sbn,
                            1, MODE, HAS_BIAS, FAST, BLOCK_N, BLOCK_K, STAGES, SUBK, GROUP_M, EPI_OVERLAP)),
            (_ws_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, STAGES, SUBK, GROUP_M)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
else:  # pragma: no cover
    _fp8_gemm_ws_kernel = None


# name -> (FAST, BLOCK_N, STAGES, SUBK, GROUP_M, consumer-worker registers, producer registers, maxnreg,
# EPI_OVERLAP: ``_eo``, a tile's epilogue under the next tile's first two wgmmas).
# Registers: 12 warps (3 warp groups, the producer's one warp rounded up) share 64K a CTA, so
# maxnreg <= 170; the default partition gets what maxnreg leaves (232 here, as the worker).
WS_CONFIGS = {
    "ws_s3": (False, 128, 3, 2, 8, 232, 40, 168, False),
    "ws_s3_g16": (False, 128, 3, 2, 16, 232, 40, 168, False),
    "wsfast_n256_s4": (True, 256, 4, 1, 8, 240, 24, 168, False),
    "ws_s3_r240": (False, 128, 3, 2, 8, 240, 24, 168, False),
    "wsfast_n128_s6": (True, 128, 6, 1, 8, 232, 40, 168, False),
    "ws_s3_g16_eo": (False, 128, 3, 2, 16, 232, 40, 168, True),
}
WS_DEFAULT = {"promote": "ws_s3", "fast": "wsfast_n256_s4"}  # fp8_scaled_mm(variant="ws")


def promote_config(M: int, N: int, mode: str = "tensorwise") -> str:
    """The promoting configuration for an (M, N) output: GROUP_M 16 from 8192 x 8192 up, 8 below;
    there, tensorwise and rowwise (with or without a bias) with the epilogue under the next tile's
    first wgmmas (``_eo``); blockwise_cols always ``ws_s3``. H200, 2026-12-01: GROUP_M 16 won at 16384x14336x4096 in
    both runs, 1.75 / 1.77 vs 1.83 / 1.86 ms, and lost at 2048x4096x4096, 0.097 vs 0.083 ms;
    blockwise_cols at 14336x4096x8192 / 8192^3: 1.22 / 1.43 ms with 8, 1.23 / 1.48 with 16.
    ``ws_s3_g16_eo`` against ``ws_s3_g16`` (session 7, ``benchmarks/gemm_ab.py``, interleaved, ratio
    to cuBLAS in the same round; calls 3 / 4): tensorwise 8192^3 0.948 / 0.947 vs 0.913 / 0.936,
    16384x14336x4096 0.927 / 0.921 vs 0.907 / 0.898; rowwise 8192^3 0.948 / 0.966 vs 0.934 / 0.958,
    16384x14336x4096 0.907 / 0.927 vs 0.900 / 0.907 (the same bits); blockwise lost with it (0.875
    vs 0.893 at 8192^3, 0.842 vs 0.869 at 16384x14336x4096). With a bias (session 8,
    8200x8320x4160): tensorwise 0.811 vs 0.800, rowwise 0.881 vs 0.868, the same bits."""
    if mode == "blockwise_cols":
        return "ws_s3"
    if M * N < 8192 * 8192:
        return "ws_s3"
    return "ws_s3_g16_eo" if mode in ("tensorwise", "rowwise") else "ws_s3_g16"


_BM = _BK = 128


def is_fast(config: str) -> bool:
    return WS_CONFIGS[config][0]


def _descs(qa, qb, bn: int):
    a_desc = _g._GluonDesc(qa, list(qa.shape), [qa.stride(0), 1], [_BM // 2, _BK], _g._smem_layout(_BM // 2, _BK))
    bt = qb.t()  # (N, K) row-major view
    b_desc = _g._GluonDesc(bt, list(bt.shape), [bt.stride(0), 1], [bn, _BK], _g._smem_layout(bn, _BK))
    return a_desc, b_desc


def ws_scaled_mm(qa, sa, qb, sb, mode: str, out: torch.Tensor, bias=None, *, config: str = "ws_s3") -> torch.Tensor:
    """Launch the warp-specialized kernel on arguments ``gemm_gluon.gluon_support`` accepted
    (``out`` allocated, scales 2-D as ``gluon_scaled_mm`` shapes them)."""
    fast, bn, stages, subk, group_m, c_regs, p_regs, maxnreg, epi_overlap = WS_CONFIGS[config]
    M, K = qa.shape
    N = qb.shape[1]
    if mode in ("blockwise", "blockwise_cols"):  # a chunk's scales a coalesced run (module docstring)
        sa = sa.t().contiguous().t()  # sA[m, c] at c * M + m (no copy when it already is)
        if mode == "blockwise_cols":
            sb = sb.contiguous()  # sB[c, n] at c * N + n
    a_desc, b_desc = _descs(qa, qb, bn)
    tiles = -(-M // _BM) * -(-N // bn)
    grid = (min(_g._num_sms(qa.device), tiles),)
    bias_t = bias.contiguous() if bias is not None else out
    _fp8_gemm_ws_kernel[grid](
        a_desc, b_desc, out, bias_t, sa, sb, M, N, K, out.stride(0), out.stride(1),
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        MODE=_g._MODES[mode], HAS_BIAS=bias is not None, FAST=fast, STAGES=stages, SUBK=subk,
        GROUP_M=group_m, CONSUMER_REGS=c_regs, PRODUCER_REGS=p_regs, EPI_OVERLAP=epi_overlap, num_warps=4,
        maxnreg=maxnreg)
    return out


def compile_ws_for_sm90(mode: str = "tensorwise", config: str = "ws_s3", out_dtype: str = "bf16",
                        has_bias: bool = True, a_type: str = "fp8e4nv", b_type: str = "fp8e4nv"):
    """``triton.compile`` of the kernel for sm_90a on the CPU (tests, PTX/SASS inspection)."""
    import triton
    from triton.backends.compiler import GPUTarget
    fast, bn, stages, subk, group_m, c_regs, p_regs, maxnreg, epi_overlap = WS_CONFIGS[config]
    la, lb = _g._smem_layout(_BM // 2, _BK), _g._smem_layout(bn, _BK)
    sig = {"a_desc": f"tensordesc<{a_type}[{_BM // 2},{_BK}],{la!r}>",
           "b_desc": f"tensordesc<{b_type}[{bn},{_BK}],{lb!r}>",
           "c_ptr": f"*{out_dtype}", "bias_ptr": f"*{out_dtype}", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "i32",
           "stride_sam": "i32", "stride_sak": "i32", "stride_sbk": "i32", "stride_sbn": "i32"}
    consts = dict(MODE=_g._MODES[mode], HAS_BIAS=has_bias, FAST=fast, STAGES=stages, SUBK=subk,
                  GROUP_M=group_m, CONSUMER_REGS=c_regs, PRODUCER_REGS=p_regs, EPI_OVERLAP=epi_overlap,
                  num_warps=4)
    for k in consts:
        sig[k] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
             if name in ("c_ptr", "bias_ptr", "sa_ptr", "sb_ptr", "stride_cm")}
    try:
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(_fp8_gemm_ws_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": maxnreg, "enable_fp_fusion": True})
