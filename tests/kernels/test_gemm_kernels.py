"""Triton GEMMs (lowbit.kernels.gemm / fp4_gemm) and the "triton" backend, on the CPU interpreter.

Every GEMM is checked against the exact product ``E`` of the dequantized operands (float64
dequantization is exact) with the FP32-accumulation bound of ``lowbit.validate.metrics``:
``bound_ratio(C, E, gemm_bound(A, B, n)) <= 1``, ``n`` = number of K chunks the kernel scales
separately (ceil(K / 128) blockwise, ceil(K / 32) MX, 1 otherwise). ``E`` is computed exactly
with Python integers (``exact``; cross-checked against ``metrics.exact_matmul``), which is ~100x
faster than mpmath dot by dot. Shapes have partial tiles in M and N (interpreter tiles are 32)
and, for blocked scales, K = 2.5 scale blocks. The CUDA-only PTX decode of the FP4 kernels is
checked by executing its instructions in Python on random packed words.
"""
import dataclasses
import math
import struct
import warnings

import mpmath
import numpy as np
import pytest
import torch
from mpmath import libmp

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.kernels import BACKENDS, BackendRegistry, scaled_mm
from lowbit.kernels.emulation import TORCH_BACKEND
from lowbit.kernels.fp4_gemm import _ASM_MX, _ASM_NV, fp4_weight_only_mm
from lowbit.kernels.gemm import fp8_scaled_mm, gemm_plan
from lowbit.kernels.triton_backend import TRITON_BACKEND, make_backend, triton_supports
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
    out = fp8_scaled_mm(a, b, torch.float32, variant=variant)
    assert out.shape == (40, 48) and out.dtype == torch.float32
    assert_in_bound(out, a, b, n)


def test_blockwise_scales_applied_per_chunk():
    """K blocks whose scales differ by 2^40: a kernel scaling once (not per 128-K chunk) is off by
    far more than the bound; ours stays inside it."""
    x = _sample(40, 256, 5)
    x[:, 128:] *= 2.0 ** 40
    a = FP8Tensor.from_float(x, Blockwise(), "input")
    b = FP8Tensor.from_float(_sample(48, 256, 6), Blockwise(), "weight").t()
    assert_in_bound(fp8_scaled_mm(a, b), a, b, 2)


def test_blockwise_dgrad_and_wgrad_layouts():
    """dgrad: B is the row-major (N_out, K_in) weight itself (MN-major FP8, 128x128 blocks);
    wgrad: A = dY^T and B = X with 1x128 blocks along the token dim (B's scale per column and chunk)."""
    dy = FP8Tensor.from_float(_sample(40, 256, 7), Blockwise(), "grad")       # (tokens, N_out), 1x128
    w = FP8Tensor.from_float(_sample(256, 48, 8), Blockwise(), "weight")     # (N_out, K_in) as B
    assert_in_bound(fp8_scaled_mm(dy, w), dy, w, 2)
    dyt = FP8Tensor.from_float(_sample(48, 256, 9), Blockwise(), "grad")      # dY^T (N_out, tokens)
    xt = FP8Tensor.from_float(_sample(40, 256, 10), Blockwise(), "input").t()  # X (tokens, K_in), 128x1
    assert gemm_plan(dyt, xt)["SB_COLS"] == 1
    for variant in ("pointer", "tma"):
        assert_in_bound(fp8_scaled_mm(dyt, xt, variant=variant), dyt, xt, 2)


@pytest.mark.parametrize("out_dtype,u", [(torch.bfloat16, U_BF16), (torch.float16, 2.0 ** -11)])
def test_fp8_gemm_bias_and_low_precision_output(out_dtype, u):
    a, b = fp8_operands(Blockwise(), 40, 48, 320, seed=2)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    out = scaled_mm(a, b, out_dtype, bias=bias, backend="triton")
    assert out.dtype == out_dtype
    assert_in_bound_bias(out, a, b, bias, 3, u)


# ---- FP4 ---------------------------------------------------------------------------------------------
FP4_RECIPES = {"nv": (NV(), 1), "nv-1x16": (NV(weight_2d=False), 1), "mx": (MX(elem="e2m1"), None)}


@pytest.mark.parametrize("name", ["nv", "mx"])
def test_fp4_gemm_within_fp32_bound(name):
    recipe, _ = FP4_RECIPES[name]
    K = 160
    a = FP4Tensor.from_float(_sample(40, K, 11), recipe, "input")
    b = FP4Tensor.from_float(_sample(48, K, 12), recipe, "weight").t()
    out = scaled_mm(a, b, torch.float32, backend="triton")
    assert_in_bound(out, a, b, K // 32 if name == "mx" else 1)


@pytest.mark.parametrize("name,dtype,split", [("nv", torch.bfloat16, None), ("nv-1x16", torch.float16, 3),
                                              ("mx", torch.bfloat16, 1)])
def test_fp4_weight_only_within_fp32_bound(name, dtype, split):
    recipe, _ = FP4_RECIPES[name]
    x = _sample(20, 192, 13).to(dtype)
    b = FP4Tensor.from_float(_sample(48, 192, 14), recipe, "weight").t()
    bias = torch.randn(48, generator=torch.Generator().manual_seed(15))
    out = fp4_weight_only_mm(x, b, torch.float32, split_k=split)
    assert out.shape == (20, 48)
    assert_in_bound(out, x, b, 1)
    with_bias = fp4_weight_only_mm(x, b, torch.float32, bias, split_k=split)
    assert_in_bound_bias(with_bias, x, b, bias, 1, 2.0 ** -24)


# ---- the CUDA decode (PTX), executed instruction by instruction ------------------------------------------
def _bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def _to_bf16(v: float) -> int:
    t = torch.tensor([v], dtype=torch.float32).to(torch.bfloat16)
    assert float(t) == v, f"{v} is not exact in bf16: the decode would round"
    return int(t.view(torch.int16).item()) & 0xFFFF


def run_ptx(asm: str, regs: dict) -> dict:
    """Execute the straight-line PTX subset the decode uses (mov/and/or/shl/shr/prmt/mul.rn.bf16x2)."""
    env = dict(regs)
    for stmt in asm.replace("{", "").replace("}", "").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, rest = stmt.split(None, 1)
        args = [x.strip() for x in rest.split(",")]
        v = [env[x] if x in env else int(x, 0) for x in args[1:]]
        if op == "mov.b32":
            r = v[0]
        elif op == "and.b32":
            r = v[0] & v[1]
        elif op == "or.b32":
            r = v[0] | v[1]
        elif op == "shl.b32":
            r = (v[0] << v[1]) & 0xFFFFFFFF
        elif op == "shr.b32":
            r = v[0] >> v[1]
        elif op == "prmt.b32":  # default mode: byte k of d = byte sel_k of {b, a}, bit 3 = sign replicate
            src = [(v[0] >> 8 * i) & 0xFF for i in range(4)] + [(v[1] >> 8 * i) & 0xFF for i in range(4)]
            r = 0
            for k in range(4):
                s = (v[2] >> 4 * k) & 0xF
                byte = src[s & 7] if not s & 8 else (0xFF if src[s & 7] & 0x80 else 0)
                r |= byte << 8 * k
        elif op == "mul.rn.bf16x2":
            r = _to_bf16(_bf16(v[0]) * _bf16(v[1])) | _to_bf16(_bf16(v[0] >> 16) * _bf16(v[1] >> 16)) << 16
        else:
            raise AssertionError(f"unexpected PTX instruction {op}")
        env[args[0]] = r
    return env


E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


@pytest.mark.parametrize("kind", ["nv", "mx"])
def test_ptx_decode_matches_e2m1_times_scale(kind):
    """Outputs $j of the decode = element j of words $8 / $9 (low / high lane) times the lane's scale,
    exactly (NV: scale pre-multiplied by 2^118, result times 2^-8), for random words and edge scales."""
    asm = (_ASM_NV if kind == "nv" else _ASM_MX).value
    scales = [2.0 ** -9, 3 * 2.0 ** -9, 1.0, 1.75, 448.0] if kind == "nv" else [2.0 ** k for k in (-127, -40, 0, 7, 120)]
    pre, post = (2.0 ** 118, 2.0 ** 8) if kind == "nv" else (1.0, 1.0)
    rng = np.random.default_rng(0)
    words = [(0x76543210, 0xFEDCBA98)] + [tuple(int(w) for w in rng.integers(0, 2 ** 32, 2)) for _ in range(60)]
    for i, (w0, w1) in enumerate(words):
        s0, s1 = scales[i % len(scales)], scales[(3 * i + 1) % len(scales)]
        env = run_ptx(asm, {"$8": w0, "$9": w1, "$10": _to_bf16(s0 * pre) | _to_bf16(s1 * pre) << 16})
        for j in range(8):
            for lane, (w, s) in enumerate(((w0, s0), (w1, s1))):
                code = (w >> 4 * j) & 15
                want = (-1.0 if code & 8 else 1.0) * E2M1_VALUES[code & 7] * s
                got = _bf16(env[f"${j}"] >> 16 * lane) * post
                assert got == want and math.copysign(1, got) == math.copysign(1, want), (hex(w), j, got, want)


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


def test_bad_variant_and_empty_output():
    a, b = fp8_operands(Current(), 16, 32, 32)
    with pytest.raises(ValueError, match="variant"):
        fp8_scaled_mm(a, b, variant="cublas")
    w = FP8Tensor.from_float(_sample(32, 32, 6), Current(), "weight")  # (K, N) row-major: not K-major
    with pytest.raises(ValueError, match="K-major"):
        fp8_scaled_mm(a, w, variant="tma")
    empty = FP8Tensor.from_float(torch.zeros(0, 32), Current(), "input")
    assert fp8_scaled_mm(empty, b).shape == (0, 32)


@pytest.mark.parametrize("name", ["blockwise", "mx"])
@pytest.mark.parametrize("M", [64, 4096])
def test_gpu_configs_keep_block_k_inside_a_scale_chunk(name, M):
    """Every autotune config the GPU may launch for a K-scaled GEMM has BLOCK_K dividing the scale
    chunk (the interpreter runs its own config, so only this check guards the GPU one)."""
    from lowbit.kernels.gemm import _TMA_TUNED, _PTR_TUNED, _chunk, _prune
    recipe = Blockwise() if name == "blockwise" else MX(elem="e4m3")
    x, w = torch.randn(M, 256), torch.randn(128, 256)
    a = FP8Tensor.from_float(x, recipe, "input")
    b = FP8Tensor.from_float(w, recipe, "weight").t()
    plan = gemm_plan(a, b)
    chunk = _chunk(plan["SA_K"], plan["SB_K"])
    assert chunk in (32, 128)
    for tuner in (_PTR_TUNED, _TMA_TUNED):
        cfgs = _prune(tuner.configs, {"M": M}, **plan, PROMOTE=True, HAS_BIAS=False)
        assert cfgs and all(chunk % c.kwargs["BLOCK_K"] == 0 for c in cfgs)
