"""FP4 GEMM kernels (lowbit.kernels.triton.gemm_fp4: ``_fp4_mm_kernel``, ``_wo_kernel``), on the CPU
interpreter, against the exact product of the dequantized operands with the FP32-accumulation
bound (helpers from test_gemm_fp8.py).

The kernels decode NV and MX alike to one operand per K step in a slot-major K order (column
``j W + w`` holds element ``8w + j``): a permutation that differed between A and B, or between the
weight and the activations, would be off by far more than the bound. Shapes cover partial M/N
tiles, K a multiple of the K tile (EVEN_K, no masks) and not. MX needs no per-block promotion
(scales live inside the bf16 operand), so it is held to the single-chain bound ``n = 1``; its
out-of-range corner (``e2m1 * 2^k`` past fp32's range, NaN scale 0xFF, the subnormal scale 0x00)
must come out as the torch backend's fp32 dequantization gives it. The CUDA-only PTX decode is
checked in test_gemm_fp4_decode_ptx.py by executing its instructions in Python.
"""
import pytest
import torch

from lowbit.dtypes import FP4Tensor
from lowbit.kernels import scaled_mm
from lowbit.kernels.emulation import emulated_scaled_mm
from lowbit.kernels.triton import TRITON_BACKEND
from lowbit.kernels.triton.gemm_fp4 import GEMM_FP4_TUNING
from lowbit.scaling import MX, NV
from lowbit.validate.metrics import U_BF16
from test_gemm_fp8 import _sample, assert_in_bound, assert_in_bound_bias

GEMM = TRITON_BACKEND.plan.__self__.fp4_gemm
RECIPES = {"nv": NV(), "nv-1x16": NV(weight_2d=False), "mx": MX(elem="e2m1"), "mx-64": MX(block=64, elem="e2m1")}


def _fp4(name, rows, K, seed, role):
    return FP4Tensor.from_float(_sample(rows, K, seed), RECIPES[name], role)


def fp4_scaled_mm(a, b, out_dtype=torch.float32, bias=None):
    return TRITON_BACKEND.scaled_mm(a, b, out_dtype, bias)


def fp4_weight_only_mm(x, b, out_dtype=None, bias=None, config=None):
    """The weight-only GEMM: planned (the interpreter's configuration), or with ``config``."""
    if config is None:
        return TRITON_BACKEND.scaled_mm(x, b, out_dtype or x.dtype, bias)
    return GEMM._with_config(x, b, out_dtype or x.dtype, bias, dict(dict(BLOCK_N=32, BLOCK_M=16, BLOCK_K=64), **config))


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
    cfg = None if split is None else dict(SPLIT_K=split)
    out = fp4_weight_only_mm(x, b, torch.float32, config=cfg)
    assert out.shape == (20, 48)
    assert_in_bound(out, x, b, 1)
    assert_in_bound_bias(fp4_weight_only_mm(x, b, torch.float32, bias, config=cfg), x, b, bias, 1, 2.0 ** -24)


WO_SHAPES = [(1, 48, 160), (3, 80, 192), (17, 48, 256), (33, 16, 160)]  # M ragged vs BLOCK_M 16, N vs 32


@pytest.mark.parametrize("name", ["nv", "nv-1x16", "mx", "mx-64"])
@pytest.mark.parametrize("M,N,K", WO_SHAPES)
@pytest.mark.parametrize("split", [1, 3])
def test_weight_only_ragged_shapes_and_splits(name, M, N, K, split):
    """Ragged M / N, K a multiple of the K tile and not, no split or the last-arriving fixup, scales
    in the loop or prefetched by hand: all inside the FP32-accumulation bound of the exact product."""
    x = _sample(M, K, 40 + M).to(torch.bfloat16)
    b = _fp4(name, N, K, 41 + N, "weight").t()
    cfg = dict(SPLIT_K=split, PIPE_SCALES=N != 48)  # loaded in the loop (the GPU's asynchronous copies) or by hand
    out = fp4_weight_only_mm(x, b, torch.float32, config=cfg)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert_in_bound(out, x, b, 1)


@pytest.mark.parametrize("name", ["nv", "mx"])
def test_weight_only_split_order_is_deterministic(name):
    """The last-arriving program adds the partials in split order: the same bits call after call
    (and as the scales prefetched by hand); the counters are left zero."""
    x = _sample(5, 512, 50).to(torch.bfloat16)
    b = _fp4(name, 64, 512, 51, "weight").t()
    fix = fp4_weight_only_mm(x, b, torch.float32, config=dict(SPLIT_K=4))
    assert torch.equal(fix, fp4_weight_only_mm(x, b, torch.float32, config=dict(SPLIT_K=4)))
    assert torch.equal(fix, fp4_weight_only_mm(x, b, torch.float32, config=dict(SPLIT_K=4, PIPE_SCALES=False)))
    assert all(int(buf.abs().sum()) == 0 for buf in GEMM.counters.buffers.values())
    assert_in_bound(fix, x, b, 1)


@pytest.mark.parametrize("out_dtype,u_out", [(torch.bfloat16, U_BF16), (torch.float16, 2.0 ** -11),
                                             (torch.float32, 2.0 ** -24)])
@pytest.mark.parametrize("split", [1, 3])
def test_weight_only_bias_and_out_dtypes(out_dtype, u_out, split):
    x = _sample(9, 192, 60).to(torch.bfloat16)
    b = _fp4("nv", 48, 192, 61, "weight").t()
    bias = torch.randn(48, generator=torch.Generator().manual_seed(62)).to(torch.bfloat16)
    out = fp4_weight_only_mm(x, b, out_dtype, bias, config=dict(SPLIT_K=split))
    assert out.dtype == out_dtype and out.shape == (9, 48)
    assert_in_bound_bias(out, x, b, bias, 1, u_out)


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
    assert "32, 64 or 128" in TRITON_BACKEND.supports(a96, b96)
    with pytest.raises(ValueError, match="32, 64 or 128"):
        fp4_scaled_mm(a96, b96)
    a, b = _fp4("nv", 16, 64, 1, "input"), _fp4("nv", 16, 64, 2, "weight").t()
    with pytest.raises(ValueError, match="packed along K"):
        fp4_scaled_mm(a, b.t())
    x = _sample(16, 64, 3).to(torch.bfloat16)
    with pytest.raises(ValueError, match="bf16/fp16"):
        fp4_weight_only_mm(x.float(), b, torch.float32)


@pytest.mark.parametrize("sblock", [16, 32, 64, 128])
@pytest.mark.parametrize("M", [1, 16, 64, 128, 4096])
def test_gpu_configs_hold_whole_scale_blocks(sblock, M):
    """Every GPU configuration the launchers may use has a K tile of whole scale blocks and >= 16
    words (weight-only: >= 8, the 256 x 64 wgmma tile; the interpreter runs its own configuration,
    so only this check guards the GPU ones)."""
    for c in GEMM.mm_tuned.configs:
        assert c.kwargs["BLOCK_K"] % sblock == 0 and c.kwargs["BLOCK_K"] >= 128
    kept = GEMM._prune_wo(GEMM.wo_configs, {"M": M, "K": 8192}, SBLOCK=sblock)  # as the autotuner calls it
    assert kept and all(c.kwargs["BLOCK_K"] % sblock == 0 and c.kwargs["BLOCK_K"] >= 64 for c in kept)  # 256 x 64: 8 words
    want = 16 if M <= 16 else 32 if M <= 32 else 64 if M <= 64 else 128
    assert all(c.kwargs["BLOCK_M"] == want for c in kept)


def test_decode_shapes_run_one_configuration():
    """M <= 16 with room for it: the one decode configuration, not autotuned (its pick changed
    between runs on the H200); larger M, or K too short for 8 splits of 2 steps: the tuned list."""
    w, st, bn, bm, bk, split = GEMM_FP4_TUNING.wo_decode_tile
    for M in (1, 16):
        for sblock in (16, 32):
            kept = GEMM._prune_wo(GEMM.wo_configs, {"M": M, "K": 8192}, SBLOCK=sblock)
            assert [(c.num_warps, c.num_stages, *(c.kwargs[k] for k in ("BLOCK_N", "BLOCK_M", "BLOCK_K", "SPLIT_K")))
                    for c in kept] == [(w, st, bn, bm, bk, split)], kept
    assert len(GEMM._prune_wo(GEMM.wo_configs, {"M": 16, "K": 1024}, SBLOCK=16)) > 1  # 8 splits of 2 steps: K >= 2048
    assert len(GEMM._prune_wo(GEMM.wo_configs, {"M": 64, "K": 8192}, SBLOCK=16)) > 1
