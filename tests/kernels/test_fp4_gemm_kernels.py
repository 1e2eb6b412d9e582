"""FP4 GEMM kernels (lowbit.kernels.fp4_gemm ``_fp4_mm_kernel`` / ``_fp4_weight_only_kernel``), on
the CPU interpreter, against the exact product of the dequantized operands with the FP32-accumulation
bound (helpers from test_gemm_kernels.py).

The kernels decode NV and MX alike to one operand per K step in a slot-major K order (column
``j W + w`` holds element ``8w + j``): a permutation that differed between A and B, or between the
weight and the activations, would be off by far more than the bound. Shapes cover partial M/N
tiles, K a multiple of the K tile (EVEN_K, no masks) and not. MX needs no per-block promotion
(scales live inside the bf16 operand), so it is held to the single-chain bound ``n = 1``; its
out-of-range corner (``e2m1 * 2^k`` past fp32's range, NaN scale 0xFF, the subnormal scale 0x00)
must come out as the torch backend's fp32 dequantization gives it. Weight-only runs both K orders
of the decode (DECODE 1: slot-major; DECODE 2: pairs of words, ``_x_tile``). The CUDA-only PTX
decode is checked in test_fp4_decode_ptx.py by executing its instructions in Python.
"""
import textwrap

import pytest
import torch

from lowbit.dtypes import FP4Tensor
from lowbit.kernels import scaled_mm
from lowbit.kernels.emulation import emulated_scaled_mm
from lowbit.kernels import fp4_weight_only as wo
from lowbit.kernels.fp4_gemm import _MM_CONFIGS, _WO_CONFIGS, _prune_wo, fp4_scaled_mm, fp4_support, fp4_weight_only_mm
from lowbit.scaling import MX, NV
from lowbit.validate.metrics import U_BF16
from sm90 import run_script
from test_gemm_kernels import _sample, assert_in_bound, assert_in_bound_bias

RECIPES = {"nv": NV(), "nv-1x16": NV(weight_2d=False), "mx": MX(elem="e2m1"), "mx-64": MX(block=64, elem="e2m1")}


def _fp4(name, rows, K, seed, role):
    return FP4Tensor.from_float(_sample(rows, K, seed), RECIPES[name], role)


# ---- FP4 x FP4 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(RECIPES))
@pytest.mark.parametrize("K", [192, 160])  # interpreter K tile 64: EVEN_K, and a masked last tile
def test_fp4_mm_within_fp32_bound(name, K):
    a = _fp4(name, 40, K, 21, "input")
    b = _fp4(name, 48, K, 22, "weight").t()
    out = fp4_scaled_mm(a, b, torch.float32)
    assert out.shape == (40, 48)
    assert_in_bound(out, a, b, 1)


def test_fp4_mm_bias_bf16_output():
    a = _fp4("nv", 40, 192, 23, "input")
    b = _fp4("nv", 48, 192, 24, "weight").t()
    bias = torch.randn(48, generator=torch.Generator().manual_seed(25)).to(torch.bfloat16)
    out = fp4_scaled_mm(a, b, torch.bfloat16, bias)
    assert out.dtype == torch.bfloat16
    assert_in_bound_bias(out, a, b, bias, 1, U_BF16)


# ---- weight-only ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype,split,K", [("nv", torch.bfloat16, None, 192), ("nv-1x16", torch.float16, 3, 160),
                                                ("mx", torch.bfloat16, 1, 256), ("mx-64", torch.bfloat16, 2, 192),
                                                ("nv", torch.bfloat16, 4, 128)])  # splits 2, 3 start past K
def test_fp4_weight_only_within_fp32_bound(name, dtype, split, K):
    x = _sample(20, K, 26).to(dtype)
    b = _fp4(name, 48, K, 27, "weight").t()
    bias = torch.randn(48, generator=torch.Generator().manual_seed(28))
    out = fp4_weight_only_mm(x, b, torch.float32, split_k=split)
    assert out.shape == (20, 48)
    assert_in_bound(out, x, b, 1)
    assert_in_bound_bias(fp4_weight_only_mm(x, b, torch.float32, bias, split_k=split),
                         x, b, bias, 1, 2.0 ** -24)


WO_SHAPES = [(1, 48, 160), (3, 80, 192), (17, 48, 256), (33, 16, 160)]  # M ragged vs BLOCK_M 16, N vs 32


@pytest.mark.parametrize("name", ["nv", "nv-1x16", "mx", "mx-64"])
@pytest.mark.parametrize("M,N,K", WO_SHAPES)
@pytest.mark.parametrize("split,reduce,decode,slots", [(1, 0, 1, 0), (3, 2, 1, 0), (2, 1, 1, 0), (1, 0, 2, 0),
                                                      (3, 2, 2, 0), (1, 0, 1, 1), (2, 2, 2, 1)])
def test_weight_only_ragged_shapes_splits_and_reductions(name, M, N, K, split, reduce, decode, slots):
    """Ragged M / N, K a multiple of the K tile and not, no split, the last-arriving fixup (REDUCE 2)
    and the second kernel (REDUCE 1), scales in the loop or prefetched, both K orders of the
    decode, one dot per K step or one per slot (BLOCK_K 128): all inside the FP32-accumulation
    bound of the exact product."""
    x = _sample(M, K, 40 + M).to(torch.bfloat16)
    b = _fp4(name, N, K, 41 + N, "weight").t()
    cfg = dict(SPLIT_K=split) if reduce == 0 else dict(SPLIT_K=split, REDUCE=reduce)
    cfg["DECODE"] = decode
    if slots:
        cfg.update(SLOT_DOTS=True, BLOCK_K=128)
    cfg["PIPE_SCALES"] = N != 48  # scales loaded in the loop (the GPU's asynchronous copies) or prefetched by hand
    out = fp4_weight_only_mm(x, b, torch.float32, config=cfg)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert_in_bound(out, x, b, 1)


@pytest.mark.parametrize("name,extra", [("nv", {}), ("mx", {}), ("nv", dict(DECODE=2)),
                                        ("nv", dict(SLOT_DOTS=True, BLOCK_K=128, SPLIT_K=2))])
def test_weight_only_split_order_is_deterministic(name, extra):
    """Both reductions add the partials in split order: the same bits; the counters are left zero."""
    x = _sample(5, 512, 50).to(torch.bfloat16)
    b = _fp4(name, 64, 512, 51, "weight").t()
    fix = fp4_weight_only_mm(x, b, torch.float32, config={**dict(SPLIT_K=4, REDUCE=2), **extra})
    two = fp4_weight_only_mm(x, b, torch.float32, config={**dict(SPLIT_K=4, REDUCE=1), **extra})
    assert torch.equal(fix, two)
    assert torch.equal(fix, fp4_weight_only_mm(x, b, torch.float32, config={**dict(SPLIT_K=4, REDUCE=2), **extra}))
    assert all(int(buf.abs().sum()) == 0 for buf in wo.TILE_COUNTERS.buffers.values())


@pytest.mark.parametrize("out_dtype,u_out", [(torch.bfloat16, U_BF16), (torch.float16, 2.0 ** -11),
                                             (torch.float32, 2.0 ** -24)])
@pytest.mark.parametrize("split", [1, 3])
def test_weight_only_bias_and_out_dtypes(out_dtype, u_out, split):
    x = _sample(9, 192, 60).to(torch.bfloat16)
    b = _fp4("nv", 48, 192, 61, "weight").t()
    bias = torch.randn(48, generator=torch.Generator().manual_seed(62)).to(torch.bfloat16)
    out = fp4_weight_only_mm(x, b, out_dtype, bias, split_k=split)
    assert out.dtype == out_dtype and out.shape == (9, 48)
    assert_in_bound_bias(out, x, b, bias, 1, u_out)


def test_weight_only_hand_prefetched_scales_agree():
    """PIPE_SCALES=False (scales prefetched one step ahead by hand) gives the same bits as the
    pipelined scale loads (the default)."""
    from lowbit.kernels.triton.runtime import runnable
    x = _sample(4, 192, 70).to(torch.bfloat16)
    b = _fp4("nv-1x16", 32, 192, 71, "weight").t()
    outs = []
    for pipe in (True, False):
        qb, sb, rb, blk = wo._fp4()._storage(b)
        c = torch.empty(4, 32)
        part = torch.empty(2 * 32 * 16)
        runnable(wo._wo_kernel)[(2, 1)](x, qb, sb, b._global_scale, c, part, wo.TILE_COUNTERS.get(c.device, 1), c, 4, 32, 192,
                                         x.stride(0), qb.stride(0), sb.stride(0), c.stride(0), c.stride(1),
                                         SBLOCK=blk, SROWS=rb, MX=False, SPLIT_K=2, REDUCE=2, HAS_BIAS=False,
                                         ASM=False, EVEN_K=True, DOT_DTYPE=wo._fp4()._dot_dtype(x.dtype),
                                         BLOCK_N=32, BLOCK_M=16, BLOCK_K=64, PIPE_SCALES=pipe)
        outs.append(c)
    assert torch.equal(outs[0], outs[1])
    assert_in_bound(outs[0], x, b, 1)


def test_weight_only_bad_config_says_why():
    x = _sample(4, 64, 3).to(torch.bfloat16)
    b = _fp4("nv", 16, 64, 2, "weight").t()
    with pytest.raises(ValueError, match="config keys"):
        fp4_weight_only_mm(x, b, config=dict(BLOCKN=64))
    with pytest.raises(ValueError, match="REDUCE"):
        fp4_weight_only_mm(x, b, config=dict(SPLIT_K=2, REDUCE=0))
    with pytest.raises(ValueError, match="DECODE"):
        fp4_weight_only_mm(x, b, config=dict(DECODE=3))
    with pytest.raises(ValueError, match="SLOT_DOTS"):
        fp4_weight_only_mm(x, b, config=dict(SLOT_DOTS=True, BLOCK_K=64))


@pytest.mark.parametrize("name", ["nv", "mx"])
def test_triton_backend_runs_the_fp4_kernels(name):
    """``scaled_mm(backend="triton")`` routes FP4 x FP4 and bf16 x FP4 to these kernels."""
    K = 160
    a = _fp4(name, 40, K, 11, "input")
    b = _fp4(name, 48, K, 12, "weight").t()
    assert_in_bound(scaled_mm(a, b, torch.float32, backend="triton"), a, b, 1)
    x = _sample(20, K, 13).to(torch.bfloat16)
    assert_in_bound(scaled_mm(x, b, torch.float32, backend="triton"), x, b, 1)


# ---- MX scales out of range ----------------------------------------------------------------------------
def _mx_corners(t: FP4Tensor) -> FP4Tensor:
    """Row 0, block 0: scale 2^127 (0xFE) over codes 6, 0, 0, ... (6 * 2^127 overflows fp32 and bf16);
    row 1, block 1: NaN scale (0xFF); row 2, block 0: scale 2^-127 (0x00, subnormal products)."""
    s = t._scale.view(torch.uint8)
    s[0, 0], s[1, 1], s[2, 0] = 0xFE, 0xFF, 0x00
    t._qdata[0, :16] = 0
    t._qdata[0, 0] = 0x07
    return t


@pytest.mark.parametrize("kernel", ["mm", "weight-only"])
def test_mx_out_of_range_scales_match_torch_backend(kernel):
    """Non-finite outputs where, and as, the torch backend has them (NaN / +-inf, order-independent
    in fp32), every finite output inside the bound of the exact product."""
    K = 128
    if kernel == "mm":
        a = _mx_corners(_fp4("mx", 24, K, 31, "input"))
        b = _fp4("mx", 48, K, 32, "weight").t()
        out = fp4_scaled_mm(a, b, torch.float32)
    else:  # corners in the weight: its rows are the output's columns
        a = _sample(24, K, 33).to(torch.bfloat16)
        b = _mx_corners(_fp4("mx", 48, K, 34, "weight")).t()
        out = fp4_weight_only_mm(a, b, torch.float32)
    ref = emulated_scaled_mm(a, b, torch.float32)
    assert bool(torch.isnan(ref).any()) and bool(torch.isinf(ref).any())  # the corners bite
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    inf = torch.isinf(ref)
    assert torch.equal(out[inf], ref[inf])
    A = a.dequantize(torch.float64) if isinstance(a, FP4Tensor) else a.double()
    B = b.dequantize(torch.float64)
    rows = torch.isfinite(A.float()).all(1)  # finite in fp32 (6 * 2^127 is finite in float64)
    cols = torch.isfinite(B.float()).all(0)
    assert bool(torch.isfinite(out[rows][:, cols]).all())
    assert_in_bound(out[rows][:, cols], A[rows], B[:, cols], 1)


# ---- bad input and GPU configurations ------------------------------------------------------------------
def test_bad_inputs_say_why():
    mx96 = MX(block=96, elem="e2m1")
    a96 = FP4Tensor.from_float(_sample(16, 192, 4), mx96, "input")
    b96 = FP4Tensor.from_float(_sample(16, 192, 5), mx96, "weight").t()
    assert "32, 64 or 128" in fp4_support(a96, b96)
    with pytest.raises(ValueError, match="32, 64 or 128"):
        fp4_scaled_mm(a96, b96)
    a, b = _fp4("nv", 16, 64, 1, "input"), _fp4("nv", 16, 64, 2, "weight").t()
    with pytest.raises(ValueError, match="packed along K"):
        fp4_scaled_mm(a, b.t())
    x = _sample(16, 64, 3).to(torch.bfloat16)
    with pytest.raises(ValueError, match="bf16/fp16"):
        fp4_weight_only_mm(x.float(), b)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="split_k"):
            fp4_weight_only_mm(x, b, split_k=bad)


@pytest.mark.parametrize("sblock", [16, 32, 64, 128])
@pytest.mark.parametrize("M", [1, 16, 64, 128, 4096])
def test_gpu_configs_hold_whole_scale_blocks(sblock, M):
    """Every GPU configuration the launchers may use has a K tile of whole scale blocks and >= 16
    words (weight-only: >= 8, the 256 x 64 wgmma tile; the interpreter runs its own configuration,
    so only this check guards the GPU ones)."""
    for c in _MM_CONFIGS:
        assert c.kwargs["BLOCK_K"] % sblock == 0 and c.kwargs["BLOCK_K"] >= 128
    kept = _prune_wo(_WO_CONFIGS, {"M": M, "K": 8192}, SBLOCK=sblock)  # as the autotuner calls it
    assert kept and all(c.kwargs["BLOCK_K"] % sblock == 0 and c.kwargs["BLOCK_K"] >= 64 for c in kept)  # 256 x 64: 8 words
    want = 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128
    assert all(c.kwargs["BLOCK_M"] == want for c in kept)
    assert all((c.kwargs["REDUCE"] == 2) == (c.kwargs["SPLIT_K"] > 1) for c in kept)  # one launch


def test_decode_shapes_run_one_configuration():
    """M <= 16 with room for it: the one decode configuration, not autotuned (its pick changed
    between runs on the H200); larger M, or K too short for 8 splits of 2 steps: the tuned list."""
    from lowbit.kernels import fp4_weight_only as wo
    for M in (1, 16):
        for sblock in (16, 32):
            kept = _prune_wo(_WO_CONFIGS, {"M": M, "K": 8192}, SBLOCK=sblock)
            assert len(kept) == 1 and wo._decode_tile(kept[0]), kept
    assert len(_prune_wo(_WO_CONFIGS, {"M": 16, "K": 1024}, SBLOCK=16)) > 1  # 8 splits of 2 steps need K >= 2048
    assert len(_prune_wo(_WO_CONFIGS, {"M": 64, "K": 8192}, SBLOCK=16)) > 1


# ---- the CUDA decode (PTX): tests/kernels/test_fp4_decode_ptx.py executes it instruction by instruction -----


# ---- the sm_90 compile of the decode-shape configurations (no GPU needed) ------------------------------
_SM90_SCRIPT = textwrap.dedent("""
    import json, sys
    from benchmarks.fp4_weight_only_sass import analyse, compile_wo
    from lowbit.kernels import fp4_weight_only as wo
    out = []
    picks = [(c, 16, 16, None) for c in wo.WO_CONFIGS if c.kwargs["BLOCK_M"] == 16][:int(sys.argv[1])]
    picks.append(([c for c in wo.WO_CONFIGS if c.kwargs["BLOCK_N"] == 64 and c.num_warps == 4][0], 32, 1, None))  # MX
    picks += [(picks[0][0], 16, 16, d) for d in (0, 2, "slots")]  # other decodes / one dot a slot, config 0
    for cfg, sblock, srows, decode in picks:
        full = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                    maxnreg=getattr(cfg, "maxnreg", None))
        if decode == "slots":
            full.update(SLOT_DOTS=True, maxnreg=None)
        elif decode is not None:
            full["DECODE"] = decode
        c, warps = compile_wo(full, sblock, srows, mx=sblock == 32)
        a = analyse(c, cfg.kwargs["BLOCK_N"] * cfg.kwargs["BLOCK_K"] // (32 * warps))
        out.append(dict(cfg=str(cfg), warps=warps, regs=a["regs"], stack=a["stack"], shared=a["shared"],
                        decode=full.get("DECODE", wo.DEFAULT_DECODE), slots=bool(full.get("SLOT_DOTS")),
                        per_unit=a["per_unit"],
                        alu=a["groups_per_unit"].get("alu", 0), stages=cfg.num_stages,
                        async_copies=c.asm["ttgir"].count("async_copy_global_to_local"),
                        wgmma="warp_group_dot" in c.asm["ttgir"],
                        pipe=wo.pipe_scales(cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], sblock, warps)))
    print(json.dumps(out))
""")


def test_sm90_decode_configs_stay_resident_and_stream():
    """Compiled for sm_90 as an M = 16 launch would be: no spills, >= 16 resident warps a SM (4 a
    scheduler: the decode is issue-bound), wgmma, and all three operands (words, block scales,
    activations) as asynchronous copies in every pipeline stage (the scales too, where a thread's
    share is >= 4 bytes: a row's bytes are one aligned vector once the K offset is known to be a
    multiple of the K tile). The K loop's SASS (``benchmarks/fp4_weight_only_sass.py``): DECODE 1
    (the default) issues fewer instructions and far fewer INT32-pipe ones per 16 bytes of codes
    than DECODE 0, DECODE 2 no more than DECODE 1, with the same registers; one dot a slot
    (SLOT_DOTS) needs <= 80 registers at 256 x 128 (3 CTAs a SM, uncapped)."""
    kernels = run_script(_SM90_SCRIPT, "2", env_extra={"TRITON_DEFAULT_FP_FUSION": "1"})
    for k in kernels:
        regs = -(-k["regs"] // 8) * 8
        ctas = min(65536 // (regs * 32 * k["warps"]), (228 * 1024) // (k["shared"] + 1024))
        assert k["stack"] == 0, k
        assert ctas * k["warps"] >= 16, k
        assert k["wgmma"], k
        # (stages - 1) copies in the prologue + 1 in the loop, for words, activations (and scales)
        assert k["async_copies"] == (3 if k["pipe"] else 2) * k["stages"], k
    assert [k["pipe"] for k in kernels] == [True, True, False, True, True, True]  # NV 16x16 piped; MX 1x32 by hand
    d1, d0, d2, slots = kernels[0], kernels[3], kernels[4], kernels[5]
    assert slots["slots"] and slots["regs"] <= 80, slots  # (instructions: 3.52 / 16 B with triton 3.6, 3.79 with 3.9)
    assert (d0["decode"], d1["decode"], d2["decode"]) == (0, 1, 2)
    assert d1["per_unit"] < d0["per_unit"] - 0.15 and d1["alu"] < d0["alu"] - 0.3, (d0, d1)
    assert d2["per_unit"] <= d1["per_unit"] + 0.02 and d2["regs"] <= d1["regs"] == d0["regs"], (d1, d2)


# ---- levers against the wgmma chains: mma.sync tiles (BLOCK_K 256), two accumulators ------------------
@pytest.mark.parametrize("name", ["nv", "mx"])
@pytest.mark.parametrize("M,N,K", [(3, 80, 768), (17, 48, 160)])  # EVEN_K 3 steps; one masked step
@pytest.mark.parametrize("cfg", [dict(ACCS=2, SPLIT_K=1), dict(ACCS=2, SPLIT_K=3, REDUCE=2, DECODE=2),
                                 dict(BLOCK_N=64, BLOCK_K=256, SPLIT_K=2, REDUCE=2),
                                 dict(BLOCK_N=32, BLOCK_K=256, SPLIT_K=1, DECODE=2, ACCS=2)])
def test_weight_only_levers_within_bound(name, M, N, K, cfg):
    """The mma.sync tiles (BLOCK_K 256, DECODE 1 / 2) and two accumulators (ACCS 2: slots 0-3 and
    4-7 summed in a fixed order at the end; still one chain of <= K additions per output, so the
    gamma_(K+3) bound holds): ragged M / N, K a multiple of the tile and not, splits, a bias."""
    x = _sample(M, K, 80 + M).to(torch.bfloat16)
    b = _fp4(name, N, K, 81 + N, "weight").t()
    bias = torch.randn(N, generator=torch.Generator().manual_seed(82))
    assert_in_bound(fp4_weight_only_mm(x, b, torch.float32, config=cfg), x, b, 1)
    assert_in_bound_bias(fp4_weight_only_mm(x, b, torch.float32, bias, config=cfg), x, b, bias, 1, 2.0 ** -24)


def test_weight_only_two_accumulators_split_order_and_validation():
    """ACCS 2: both reductions give the same bits, the counters are left zero; ACCS takes 1 or 2."""
    x = _sample(5, 512, 83).to(torch.bfloat16)
    b = _fp4("nv", 64, 512, 84, "weight").t()
    fix = fp4_weight_only_mm(x, b, torch.float32, config=dict(SPLIT_K=4, REDUCE=2, ACCS=2))
    assert torch.equal(fix, fp4_weight_only_mm(x, b, torch.float32, config=dict(SPLIT_K=4, REDUCE=1, ACCS=2)))
    assert all(int(buf.abs().sum()) == 0 for buf in wo.TILE_COUNTERS.buffers.values())
    with pytest.raises(ValueError, match="ACCS"):
        fp4_weight_only_mm(x, b, config=dict(ACCS=4))
    with pytest.raises(ValueError, match="ACCS"):
        fp4_weight_only_mm(x, b, config=dict(ACCS=2, SLOT_DOTS=True, BLOCK_K=128))


_SM90_LEVERS = textwrap.dedent("""
    import json, re
    from benchmarks.fp4_weight_only_sass import analyse, compile_wo, residency, _sass, loop_body
    from lowbit.kernels import fp4_weight_only as wo
    out = []
    picks = [c for c in wo.WO_CONFIGS if c.kwargs["BLOCK_M"] == 16 and (c.num_warps < 4 or c.kwargs["BLOCK_K"] == 64)]
    for cfg in picks:
        full = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=getattr(cfg, "maxnreg", None))
        c, warps = compile_wo(full)
        a = analyse(c, cfg.kwargs["BLOCK_N"] * cfg.kwargs["BLOCK_K"] // (32 * warps))
        body = loop_body(_sass(c.asm["cubin"], "-sass"))
        waits = [i for i, t in enumerate(body) if t.startswith("WARPGROUP.DEPBAR")]
        chains = len({t.split()[1] for t in body[:waits[0]] if t.startswith("HGMMA")}) if waits else 0
        out.append(dict(cfg=str(cfg), warps=warps, mma=a["mma"], regs=a["regs"], stack=a["stack"],
                        per_unit=a["per_unit"], via_smem=a["decoded_via_smem"], pairs=a["pack_pairs_words"],
                        decode=cfg.kwargs.get("DECODE", wo.DEFAULT_DECODE), chains=chains,
                        ctas=residency(a["regs"], a["shared"], warps)))
    print(json.dumps(out))
""")


def test_sm90_lever_configs_compile_as_intended():
    """The autotuner's lever configurations, compiled for sm_90 as an M = 16 launch: the 1-2 warp
    tiles are mma.sync (HMMA.16816, no HGMMA) with the decoded weight passed in registers (its
    layout is MMAv2's operand layout: no shared-memory round trip), the PTX decode's word pairs
    are words (2v, 2v + 1) of one row (DECODE 2's requirement), no spills, >= 8 warps a SM and at
    most 4 instructions per 16 bytes of codes; the 256 x 64 wgmma tile issues 4 independent
    accumulator chains before its one wait (the default's 256 x 128 x 2 warpgroups: 2)."""
    kernels = run_script(_SM90_LEVERS, env_extra={"TRITON_DEFAULT_FP_FUSION": "1"})
    hmma = [k for k in kernels if k["warps"] < 4]
    wg = [k for k in kernels if k["warps"] >= 4]
    assert len(hmma) >= 3 and len(wg) >= 1 and any(k["decode"] == 2 for k in hmma), kernels
    for k in kernels:
        assert k["stack"] == 0 and k["pairs"] and k["ctas"] * k["warps"] >= 8 and k["per_unit"] <= 4.0, k
    for k in hmma:
        assert k["mma"] == ["HMMA.16816.F32.BF16"] and not k["via_smem"], k
    for k in wg:
        assert k["mma"] == ["HGMMA.64x16x16.F32.BF16"] and k["chains"] == 4, k
