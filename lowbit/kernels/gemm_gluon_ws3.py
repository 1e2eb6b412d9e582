"""Promoting FP8 GEMM on 192 x 128 tiles: three consumer warp groups with one temporary each (Gluon, sm_90a).

Math as ``gemm_gluon`` (tensorwise and rowwise): every 128-K chunk's wgmma product starts from zero
and is added to an fp32 register accumulator (``acc = sum_c P_c``), then ``C = acc * sA[m] * sB[n]
(+ bias)``; the same fp32 operations in the same order per element as ``gemm_gluon_ws``, so the
same bits when the tensor cores sum a chunk the same way.

Why. ``gemm_gluon_ws`` holds acc + two temporaries (3 x 64 registers a thread) in each of two
consumer warp groups, so its tile stops at 128 x 128, which reads 1/64 byte of L2 per FMA: on the
H200 its L2 throughput ran at 78% of peak against cuBLAS's 63% (cuBLAS: 144 x 128 tiles and 2-CTA
clusters with TMA multicast, which triton 3.6's Gluon does not offer), and its consumers waited for
TMA data ~7% of the time (Nsight Compute, benchmarks/RESULTS.md, session 12). Here each consumer
keeps acc + one temporary (2 x 64 registers, 160 a thread by ``setmaxnreg``), so three fit: a 192 x
128 tile reads (192 + 128) / (192 x 128) bytes per FMA, 17% less. With one temporary a warp group
waits for its chunk's wgmmas before promoting them; the other two warp groups' wgmmas keep the
tensor cores busy meanwhile. Per consumer and chunk: wait ``ready``; issue the chunk's wgmmas
(use_acc=False) into T; ``wait(0)``; arrive on ``empty`` (count 3); acc += T. Nothing is in flight
across the loop's back edge (ptxas C7514). The epilogue (no overlap: no registers for it) runs
while the other warp groups compute.

Shared memory: STAGES x (3 x 8 KB A + 16 KB B) = 200 KB for 5 stages (one chunk a stage).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import gemm_gluon as _g

__all__ = ["WS3_CONFIGS", "ws3_scaled_mm", "compile_ws3_for_sm90"]

gl = _g.gl
if gl is not None:
    from triton.experimental import gluon
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

    from .gemm_gluon_ws import _ws_producer

    _tile_coords = _g._tile_coords
    _promote = _g._promote
    _epilogue = _g._epilogue

    @gluon.jit
    def _ws3_consumer(a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K, stride_cm,
                      stride_cn: gl.constexpr, stride_sam, stride_sbn, WG: gl.constexpr, MODE: gl.constexpr,
                      HAS_BIAS: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                      STAGES: gl.constexpr, GROUP_M: gl.constexpr):
        """Warp group ``WG`` (0/1/2): rows WG*64 .. WG*64+63 of every 192-row tile of this program."""
        mma_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32])
        num_pid_m = gl.cdiv(M, 192)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        n_chunks = gl.cdiv(K, BLOCK_K)
        tw = 1.0
        if MODE == 0:
            tw = gl.load(sa_ptr) * gl.load(sb_ptr)
        t = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
        c = 0  # chunks consumed by this program
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = gl.zeros([64, BLOCK_N], gl.float32, mma_layout)
            for ch in range(n_chunks):
                slot = c % STAGES
                mbarrier.wait(ready.index(slot), (c // STAGES) & 1)
                t = warpgroup_mma(a_bufs.index(slot * 3 + WG), b_bufs.index(slot).permute((1, 0)), t,
                                  use_acc=False, is_async=True)
                t = warpgroup_mma_wait(0, deps=[t])
                mbarrier.arrive(empty.index(slot), count=1)
                acc = _promote(acc, t, 1.0, MODE)
                c += 1
            _epilogue(acc, c_ptr, bias_ptr, sa_ptr, sb_ptr, pid_m * 192 + WG * 64, pid_n * BLOCK_N, M, N,
                      stride_cm, stride_cn, stride_sam, stride_sbn, MODE, HAS_BIAS, mma_layout, 64, BLOCK_N, tw)

    @gluon.jit
    def _fp8_gemm_ws3_kernel(a_desc, b_desc, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K, stride_cm,
                             stride_cn: gl.constexpr, stride_sam, stride_sbn, MODE: gl.constexpr,
                             HAS_BIAS: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                             CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """Persistent warp-specialized promoting FP8 GEMM on 192 x 128 tiles (module docstring);
        MODE 0/1: tensorwise, rowwise."""
        gl.static_assert(num_warps == 4, "the default partition is consumer warp group 0")
        gl.static_assert(MODE < 2, "tensorwise / rowwise")
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = b_desc.block_type.shape[1]
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * 3] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=3)  # one arrival per consumer warp group
        gl.warp_specialize([
            (_ws3_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K, stride_cm,
                             stride_cn, stride_sam, stride_sbn, 0, MODE, HAS_BIAS, BLOCK_N, BLOCK_K, STAGES, GROUP_M)),
            (_ws3_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K, stride_cm,
                             stride_cn, stride_sam, stride_sbn, 1, MODE, HAS_BIAS, BLOCK_N, BLOCK_K, STAGES, GROUP_M)),
            (_ws3_consumer, (a_bufs, b_bufs, ready, empty, c_ptr, bias_ptr, sa_ptr, sb_ptr, M, N, K, stride_cm,
                             stride_cn, stride_sam, stride_sbn, 2, MODE, HAS_BIAS, BLOCK_N, BLOCK_K, STAGES, GROUP_M)),
            (_ws_producer, (a_desc, b_desc, a_desc, b_desc, a_bufs, b_bufs, a_bufs, b_bufs, ready, empty, M, N, K,
                            STAGES, 1, GROUP_M, MODE, False, 3)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, PRODUCER_REGS])
else:  # pragma: no cover
    _fp8_gemm_ws3_kernel = None


class WS3Config(NamedTuple):
    """Launch configuration: 16 warps (4 warp groups, the producer's one warp rounded up) share
    64K registers, so maxnreg 128 at launch; consumers raise to ``consumer_regs``, the producer
    lowers to ``producer_regs``, the default consumer keeps what is left."""
    stages: int
    group_m: int
    consumer_regs: int
    producer_regs: int
    maxnreg: int


WS3_CONFIGS = {
    "ws3_s5": WS3Config(5, 8, 160, 24, 128),
    "ws3_s5_g16": WS3Config(5, 16, 160, 24, 128),
}


def _descs(qa, qb):
    a_desc = _g._GluonDesc(qa, list(qa.shape), [qa.stride(0), 1], [64, 128], _g._smem_layout(64, 128))
    bt = qb.t()
    b_desc = _g._GluonDesc(bt, list(bt.shape), [bt.stride(0), 1], [128, 128], _g._smem_layout(128, 128))
    return a_desc, b_desc


def ws3_scaled_mm(qa, sa, qb, sb, mode: str, out: torch.Tensor, bias=None, *, config: str = "ws3_s5") -> torch.Tensor:
    """Launch on arguments ``gemm_gluon.gluon_support`` accepted, tensorwise or rowwise (``out``
    allocated, scales 2-D as ``gluon_scaled_mm`` shapes them)."""
    if mode not in ("tensorwise", "rowwise"):
        raise ValueError(f"ws3_scaled_mm: tensorwise or rowwise, got {mode!r}")
    cfg = WS3_CONFIGS[config]
    M, K = qa.shape
    N = qb.shape[1]
    a_desc, b_desc = _descs(qa, qb)
    tiles = -(-M // 192) * -(-N // 128)
    grid = (min(_g._num_sms(qa.device), tiles),)
    bias_t = bias.contiguous() if bias is not None else out
    _fp8_gemm_ws3_kernel[grid](
        a_desc, b_desc, out, bias_t, sa, sb, M, N, K, out.stride(0), out.stride(1), sa.stride(0), sb.stride(1),
        MODE=_g._MODES[mode], HAS_BIAS=bias is not None, STAGES=cfg.stages, GROUP_M=cfg.group_m,
        CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs, num_warps=4, maxnreg=cfg.maxnreg)
    return out


def compile_ws3_for_sm90(mode: str = "tensorwise", config: str = "ws3_s5", out_dtype: str = "bf16",
                         has_bias: bool = True):
    """``triton.compile`` of the kernel for sm_90a on the CPU (tests, PTX/SASS inspection)."""
    import triton
    from triton.backends.compiler import GPUTarget
    cfg = WS3_CONFIGS[config]
    la, lb = _g._smem_layout(64, 128), _g._smem_layout(128, 128)
    sig = {"a_desc": f"tensordesc<fp8e4nv[64,128],{la!r}>", "b_desc": f"tensordesc<fp8e4nv[128,128],{lb!r}>",
           "c_ptr": f"*{out_dtype}", "bias_ptr": f"*{out_dtype}", "sa_ptr": "*fp32", "sb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "constexpr",
           "stride_sam": "i32", "stride_sbn": "i32"}
    consts = dict(stride_cn=1, MODE=_g._MODES[mode], HAS_BIAS=has_bias, STAGES=cfg.stages, GROUP_M=cfg.group_m,
                  CONSUMER_REGS=cfg.consumer_regs, PRODUCER_REGS=cfg.producer_regs, num_warps=4)
    for k in consts:
        sig[k] = "constexpr"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(sig)
             if name in ("c_ptr", "bias_ptr", "sa_ptr", "sb_ptr", "stride_cm", "M", "N", "K")}
    try:
        from triton.experimental.gluon import GluonASTSource
    except ImportError:  # pragma: no cover - triton 3.6
        from triton.experimental.gluon._runtime import GluonASTSource
    src = GluonASTSource(_fp8_gemm_ws3_kernel, sig, consts, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": cfg.maxnreg, "enable_fp_fusion": True})
