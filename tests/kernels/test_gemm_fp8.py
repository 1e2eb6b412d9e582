"""Triton FP8 GEMMs (lowbit.kernels.triton.gemm_fp8) and the "triton" backend, on the CPU interpreter (the FP4
GEMM kernels: test_fp4_gemm_kernels.py, which uses the exact reference below).

Every GEMM is checked against the exact product ``E`` of the dequantized operands (float64
dequantization is exact) with the FP32-accumulation bound of ``lowbit.validate.metrics``:
``bound_ratio(C, E, gemm_bound(A, B, n)) <= 1``, ``n`` = number of K chunks the kernel scales
separately (ceil(K / 128) blockwise, ceil(K / 32) MX, 1 otherwise). ``E`` is computed exactly
with Python integers (``exact``; cross-checked against ``metrics.exact_matmul``), which is ~100x
faster than mpmath dot by dot. Shapes have partial tiles in M and N (interpreter tiles are 32)
and, for blocked scales, K = 2.5 scale blocks.
"""
import dataclasses
import warnings

import mpmath
import numpy as np
import pytest
import torch
from mpmath import libmp

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.kernels import BACKENDS, BackendRegistry, scaled_mm
from lowbit.kernels.emulation import TORCH_BACKEND
from lowbit.kernels.triton import TRITON_BACKEND, make_backend
from lowbit.kernels.triton.gemm_fp8 import GEMM_FP8_TUNING, scale_geometry as gemm_plan
from lowbit.kernels.triton.gemm_fp8 import launch as gemm

triton_supports = TRITON_BACKEND.supports
_BACKENDS = {}


def fp8_scaled_mm(a, b, out_dtype=torch.float32, bias=None, kernel="auto"):
    """The Triton FP8 GEMM with ``kernel`` ("auto", "tma", "pointer") through a backend of its own."""
    if kernel not in _BACKENDS:
        _BACKENDS[kernel] = make_backend(gemm_fp8_tuning=GEMM_FP8_TUNING.override(kernel=kernel))
    return _BACKENDS[kernel].scaled_mm(a, b, out_dtype, bias)
from lowbit.scaling import MX, NV, Blockwise, Current, Rowwise
from lowbit.validate.metrics import U_BF16, bound_ratio, exact_matmul, gamma, gemm_bound


# ---- exact reference ---------------------------------------------------------------------------------
def _ints(X: torch.Tensor):
    """Integer matrix I and exponent e with X == I * 2^e exactly (X float64, finite)."""
    m, ex = torch.frexp(X.to(torch.float64))
    mi = (m * 2.0 ** 53).to(torch.int64).tolist()
    ex = ex.tolist()
    e0 = min(min(r) for r in ex)
    out = np.empty(X.shape, dtype=object)
    for i, (mr, er) in enumerate(zip(mi, ex)):
        out[i] = [int(v) << (e - e0) for v, e in zip(mr, er)]
    return out, e0 - 53


def exact(A: torch.Tensor, B: torch.Tensor) -> list:
    """Exact ``A @ B`` as mpmath numbers (the format of ``metrics.exact_matmul``), via integers."""
    ai, ea = _ints(A)
    bi, eb = _ints(B)
    return [[mpmath.mp.make_mpf(libmp.from_man_exp(int(c), ea + eb)) for c in row] for row in ai.dot(bi)]


def test_exact_reference_matches_metrics_exact_matmul():
    g = torch.Generator().manual_seed(3)
    A = (torch.randn(3, 40, generator=g) * 2.0 ** torch.randint(-30, 30, (3, 40), generator=g)).double()
    B = (torch.randn(40, 4, generator=g) * 2.0 ** torch.randint(-30, 30, (40, 4), generator=g)).double()
    assert exact(A, B) == exact_matmul(A, B)


def _deq(t):
    return t.dequantize(torch.float64) if isinstance(t, (FP8Tensor, FP4Tensor)) else t.to(torch.float64)


def assert_in_bound(out, a, b, n_chunks):
    A, B = _deq(a), _deq(b)
    r = bound_ratio(out, exact(A, B), gemm_bound(A, B, n_chunks))
    assert r <= 1.0, f"error / FP32-accumulation bound = {r:.3g}"


def assert_in_bound_bias(out, a, b, bias, n_chunks, u_out):
    """``|C - (E + bias)| <= b1 + u_out (|E + bias| + b1)``, ``b1 = gamma(K + n + 3)(|A||B| + |bias|)``
    (one more rounding for the bias add, then the rounding to the output dtype)."""
    A, B = _deq(a), _deq(b)
    E = torch.tensor([[float(v) for v in row] for row in exact(A, B)], dtype=torch.float64)
    ref = E + bias.double()
    b1 = gamma(A.shape[1] + n_chunks + 3) * (A.abs() @ B.abs() + bias.double().abs())
    err = (out.double() - ref).abs()
    assert bool((err <= b1 + u_out * (ref.abs() + b1)).all()), f"max err {err.max().item():.3g}"


# ---- operands ----------------------------------------------------------------------------------------
def _sample(rows, cols, seed, spread=4):
    """Normal values, rows and columns scaled by different powers of two (row/block scales differ)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    return x * torch.exp2(torch.randint(-spread, spread, (rows, 1), generator=g).float()) \
        * torch.exp2(torch.randint(-spread, spread, (1, cols), generator=g).float())


def fp8_operands(recipe, M, N, K, seed=0, a_role="input"):
    a = FP8Tensor.from_float(_sample(M, K, seed), recipe, a_role)
    b = FP8Tensor.from_float(_sample(N, K, seed + 1), recipe, "weight").t()  # B = weight.t(): K-major
    return a, b


FP8_CASES = {  # name -> (recipe, A role, K, n chunks)
    "tensor": (Current(), "input", 256, 1),
    "tensor-e5m2xe4m3": (Current(), "grad", 256, 1),
    "row": (Rowwise(), "input", 256, 1),
    "1x128x128x128": (Blockwise(), "input", 320, 3),
    "mx-fp8": (MX(), "input", 96, 3),
}


@pytest.mark.parametrize("variant", ["pointer", "tma"])
@pytest.mark.parametrize("name", list(FP8_CASES))
def test_fp8_gemm_within_fp32_bound(name, variant):
    recipe, role, K, n = FP8_CASES[name]
    a, b = fp8_operands(recipe, 40, 48, K, a_role=role)
    out = fp8_scaled_mm(a, b, torch.float32, kernel=variant)
    assert out.shape == (40, 48) and out.dtype == torch.float32
    assert_in_bound(out, a, b, n)


@pytest.mark.parametrize("variant", ["pointer", "tma"])
@pytest.mark.parametrize("name", ["tensor", "mx-fp8"])
def test_plans_keep_no_operand_alive(name, variant):
    """A GEMM's cached plan (its TMA descriptors) lets go of the call's operands: once the caller
    drops them their memory is freed (a held operand is memory a training step never frees, and
    inside a CUDA graph's pool an allocation the graph does not track)."""
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef
    recipe, role, K, _ = FP8_CASES[name]
    for seed in (0, 1):  # the second call finds the plan the first made
        a, b = fp8_operands(recipe, 40, 48, K, seed=seed, a_role=role)
        refs = [StorageWeakRef(t.untyped_storage()) for t in (a._data, b._data, a._scale, b._scale)]
        out = fp8_scaled_mm(a, b, torch.float32, kernel=variant)
        del a, b
        gc.collect()
        assert [r.expired() for r in refs] == [True] * 4 and out.shape == (40, 48)


@pytest.mark.parametrize("variant", ["pointer", "tma"])
def test_blockwise_scales_applied_per_chunk(variant):
    """K blocks whose scales differ by 2^40 (three chunks): a kernel scaling once, or with a
    neighbour chunk's scales, is off by far more than the bound; ours stays inside it."""
    x = _sample(40, 384, 5)
    x[:, 128:256] *= 2.0 ** 40
    a = FP8Tensor.from_float(x, Blockwise(), "input")
    b = FP8Tensor.from_float(_sample(48, 384, 6), Blockwise(), "weight").t()
    assert_in_bound(fp8_scaled_mm(a, b, kernel=variant), a, b, 3)


def test_blockwise_dgrad_and_wgrad_layouts():
    """dgrad: B is the row-major (N_out, K_in) weight itself (MN-major FP8, 128x128 blocks);
    wgrad: A = dY^T and B = X with 1x128 blocks along the token dim (B's scale per column and chunk)."""
    dy = FP8Tensor.from_float(_sample(40, 256, 7), Blockwise(), "grad")       # (tokens, N_out), 1x128
    w = FP8Tensor.from_float(_sample(256, 48, 8), Blockwise(), "weight")     # (N_out, K_in) as B
    assert_in_bound(fp8_scaled_mm(dy, w), dy, w, 2)
    dyt = FP8Tensor.from_float(_sample(48, 256, 9), Blockwise(), "grad")      # dY^T (N_out, tokens)
    xt = FP8Tensor.from_float(_sample(48, 256, 10), Blockwise(), "input").t()  # X (tokens, K_in), 128x1
    assert gemm_plan(dyt, xt)["SB_COLS"] == 1
    for variant in ("pointer", "tma"):
        assert_in_bound(fp8_scaled_mm(dyt, xt, kernel=variant), dyt, xt, 2)


@pytest.mark.parametrize("out_dtype,u", [(torch.bfloat16, U_BF16), (torch.float16, 2.0 ** -11)])
def test_fp8_gemm_bias_and_low_precision_output(out_dtype, u):
    a, b = fp8_operands(Blockwise(), 40, 48, 320, seed=2)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    out = scaled_mm(a, b, out_dtype, bias=bias, backend="triton")
    assert out.dtype == out_dtype
    assert_in_bound_bias(out, a, b, bias, 3, u)


# ---- the backend ---------------------------------------------------------------------------------------
def test_triton_backend_is_registered_for_cuda_above_torch():
    be = BACKENDS.get("triton")
    assert be is TRITON_BACKEND and be.devices == ("cuda",) and be.priority > TORCH_BACKEND.priority
    for hook in (be.quantize_fp8, be.quantize_fp8_t, be.quantize_fp4):
        assert callable(hook)


def test_cpu_needs_interpret_read_at_call_time(monkeypatch):
    a, b = fp8_operands(Current(), 16, 16, 32)
    assert triton_supports(a, b) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET" in triton_supports(a, b)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        scaled_mm(a, b, backend="triton")


def test_unsupported_calls_say_why():
    a, b = fp8_operands(Current(), 16, 16, 40)  # K = 40
    assert "multiples of 16" in triton_supports(a, b)
    a16, b16 = fp8_operands(Current(), 16, 16, 32)
    assert "bias" in triton_supports(a16, b16, torch.float32, torch.zeros(15))
    x = _sample(16, 64, 1)
    nv = FP4Tensor.from_float(_sample(16, 64, 2), NV(), "weight").t()
    mx = FP4Tensor.from_float(_sample(16, 64, 3), MX(elem="e2m1"), "weight").t()
    assert "bf16/fp16" in triton_supports(x, nv)
    assert "bf16 activations" in triton_supports(x.half(), mx)
    assert "different kinds" in triton_supports(FP4Tensor.from_float(x, NV(), "input"), mx)
    assert "packed along K" in triton_supports(FP4Tensor.from_float(x, NV(), "input"), nv.t())
    assert "weight-only FP8" in triton_supports(x, b16)
    e8 = FP8Tensor.from_float(_sample(16, 64, 4), MX(), "input")
    assert "E8M0" in triton_supports(e8, FP8Tensor.from_float(_sample(16, 64, 5), Current(), "weight").t())
    with pytest.raises(ValueError, match="multiples of 16"):
        scaled_mm(a, b, backend="triton")


def test_auto_falls_back_to_torch_with_one_warning():
    reg = BackendRegistry()
    reg.register(TORCH_BACKEND)
    reg.register(dataclasses.replace(make_backend(), devices=("cpu",)))  # as "auto" sees it on a GPU
    a, b = fp8_operands(Current(), 16, 16, 40)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert reg.select("auto", a, b, torch.float32).name == "torch"
        assert reg.select("auto", a, b, torch.float32).name == "torch"
    assert len([w for w in seen if "triton backend declined" in str(w.message)]) == 1
    a, b = fp8_operands(Current(), 16, 16, 32)
    assert reg.select("auto", a, b, torch.float32).name == "triton"


def test_bad_kernel_and_empty_output():
    a, b = fp8_operands(Current(), 16, 32, 32)
    with pytest.raises(ValueError, match="kernel"):
        GEMM_FP8_TUNING.override(kernel="cublas")
    w = FP8Tensor.from_float(_sample(32, 32, 6), Current(), "weight")  # (K, N) row-major: not K-major
    with pytest.raises(ValueError, match="K-major"):
        fp8_scaled_mm(a, w, kernel="tma")
    empty = FP8Tensor.from_float(torch.zeros(0, 32), Current(), "input")
    assert fp8_scaled_mm(empty, b).shape == (0, 32)


@pytest.mark.parametrize("name", ["blockwise", "mx"])
@pytest.mark.parametrize("M", [64, 4096])
def test_gpu_configs_keep_block_k_inside_a_scale_chunk(name, M):
    """Every autotune config the GPU may launch for a K-scaled GEMM has BLOCK_K dividing the scale
    chunk (the interpreter runs its own config, so only this check guards the GPU one)."""
    from lowbit.kernels.triton.gemm_fp8.tuning import chunk_of as _chunk
    g = TRITON_BACKEND.plan.__self__.fp8_gemm
    recipe = Blockwise() if name == "blockwise" else MX(elem="e4m3")
    x, w = torch.randn(M, 256), torch.randn(128, 256)
    a = FP8Tensor.from_float(x, recipe, "input")
    b = FP8Tensor.from_float(w, recipe, "weight").t()
    plan = gemm_plan(a, b)
    chunk = _chunk(plan["SA_K"], plan["SB_K"])
    assert chunk in (32, 128)
    for tuner in (g.ptr_tuned, g.tma_tuned):
        cfgs = tuner.early_config_prune(tuner.configs, {"M": M}, **plan, PROMOTE=True, HAS_BIAS=False)
        assert cfgs and all(chunk % c.kwargs["BLOCK_K"] == 0 for c in cfgs)
        assert len({str(c) for c in cfgs}) == len(cfgs)  # no configuration benchmarked twice


def test_gpu_configs_promote_every_128_k_at_most():
    """Precise GEMMs: every configuration the GPU may launch sums at most 128 K in the tensor cores
    before the fp32 add (BLOCK_K <= 128; the kernels also cap max_num_imprecise_acc at 128)."""
    g = TRITON_BACKEND.plan.__self__.fp8_gemm
    plan = dict(SA_ROWS=0, SA_K=0, SB_K=0, SB_COLS=0, K_SCALED=False, E8M0=False, HAS_BIAS=False)
    for M in (16, 4096):
        for tuner in (g.ptr_tuned, g.tma_tuned):
            cfgs = tuner.early_config_prune(tuner.configs, {"M": M}, **plan, PROMOTE=True)
            assert cfgs and all(c.kwargs["BLOCK_K"] <= 128 for c in cfgs)


def test_auto_kernel_is_tma_on_hopper_for_k_major_operands(monkeypatch):
    """kernel="auto": the TMA kernel on sm_90+ for K-major operands; otherwise (non-K-major
    operands, pre-Hopper GPUs, the CPU) the pointer kernel."""
    cap = [(9, 0)]
    monkeypatch.setattr(gemm, "capability", lambda device: cap[0])
    cuda = torch.device("cuda")

    def pick(recipe, k_major=True):
        a, b = fp8_operands(recipe, 16, 32, 256)
        if not k_major:
            b = FP8Tensor.from_float(_sample(256, 32, 6), recipe, "weight")
        return gemm.triton_kernel(cuda, a._data, b._data)

    assert pick(Current()) == "tma" and pick(Blockwise()) == "tma" and pick(MX()) == "tma"
    assert pick(Current(), k_major=False) == "pointer"
    cap[0] = (8, 9)
    assert pick(Current()) == "pointer"
    a, b = fp8_operands(Current(), 16, 32, 64)
    assert gemm.triton_kernel(a.device, a._data, b._data) == "pointer"  # CPU
