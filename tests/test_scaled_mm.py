"""scaled_mm on FP8Tensor / FP4Tensor against the exact product of the dequantized operands.

For ``C = A @ B`` with ``A = a.dequantize(float64)`` and ``B = b.dequantize(float64)`` (both exact),
``E = exact_matmul(A, B)`` (mpmath, no rounding) and the FP32-accumulation bound
``|C - E| <= gamma(K + n + 2) * |A| @ |B|`` (``gemm_bound``, n = number of K blocks) must hold for
every granularity, K with a partial block included. With a bias and a bf16 output:
``|C - (E + bias)| <= b1 + u_bf16 * (|E + bias| + b1)``, ``b1 = gamma(K + n + 3) * (|A| @ |B| + |bias|)``
(one more rounding for the bias add, then the final bf16 rounding).
A single FP4 K block is exact in fp32 (E2M1 x E2M1 x scales): only the NV global-scale products
round, so ``|C - E| <= gamma(2) * |E|``, and MX FP4 is exact.

Also: torch.mm / @ / matmul / F.linear / torch.addmm route to scaled_mm; plain @ lowbit is the
weight-only GEMM; the backend registry (unknown name, a declining backend, priorities).
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

from lowbit.dtypes import FP4Tensor, FP8Tensor
from lowbit.kernels import BACKENDS, Backend, BackendRegistry, scaled_mm
from lowbit.kernels.emulation import TORCH_BACKEND
from lowbit.scaling import MX, NV, Blockwise, Current, Rowwise
from lowbit.validate.metrics import U_BF16, bound_ratio, exact_matmul, gamma, gemm_bound

M, N = 8, 6
# name -> (tensor class, recipe, A role, B role, K, K-block of the scales)
CASES = {
    "tensor": (FP8Tensor, Current(), "input", "weight", 40, 40),
    "tensor-e5m2xe4m3": (FP8Tensor, Current(), "grad", "weight", 40, 40),
    "row": (FP8Tensor, Rowwise(), "input", "weight", 40, 40),
    "1x128x128x128": (FP8Tensor, Blockwise(), "input", "weight", 168, 128),
    "mx-fp8": (FP8Tensor, MX(), "input", "weight", 72, 32),
    "mx-fp8-rceil-e5m2": (FP8Tensor, MX(elem="e5m2", scale_rule="rceil"), "input", "weight", 72, 32),
    "mx-fp4": (FP4Tensor, MX(elem="e2m1"), "input", "weight", 72, 32),
    "nv-1x16": (FP4Tensor, NV(weight_2d=False), "input", "weight", 40, 16),
    "nv-16x16-weight": (FP4Tensor, NV(), "input", "weight", 40, 16),
}


def operands(name, seed=0, K=None, dtype=torch.float32):
    cls, recipe, ra, rb, k, _ = CASES[name]
    K = K or k
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-4, 4, (M, 1), generator=g).float())
    w = torch.randn(N, K, generator=g) * torch.exp2(torch.randint(-4, 4, (1, K), generator=g).float())
    return cls.from_float(x.to(dtype), recipe, ra), cls.from_float(w.to(dtype), recipe, rb)


def n_blocks(name, K=None):
    _, _, _, _, k, kb = CASES[name]
    return -(-(K or k) // kb)


def abs_exact(E) -> torch.Tensor:
    return torch.tensor([[float(abs(e)) for e in row] for row in E], dtype=torch.float64)


@pytest.mark.parametrize("name", list(CASES))
def test_scaled_mm_inside_fp32_bound(name):
    a, w = operands(name)
    b = w.t()
    A, B = a.dequantize(torch.float64), b.dequantize(torch.float64)
    C = scaled_mm(a, b)
    assert C.dtype == torch.float32 and C.shape == (M, N)
    ratio = bound_ratio(C, exact_matmul(A, B), gemm_bound(A, B, n_blocks(name)))
    assert ratio <= 1.0, ratio


@pytest.mark.parametrize("name", ["tensor", "1x128x128x128", "mx-fp8", "mx-fp4", "nv-16x16-weight"])
def test_scaled_mm_bias_bf16_output(name):
    a, w = operands(name, seed=1, dtype=torch.bfloat16)
    b = w.t()
    bias = torch.randn(N, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    C = scaled_mm(a, b, out_dtype=torch.bfloat16, bias=bias)
    assert C.dtype == torch.bfloat16
    A, B = a.dequantize(torch.float64), b.dequantize(torch.float64)
    E = [[e + float(bias[j]) for j, e in enumerate(row)] for row in exact_matmul(A, B)]
    K = A.shape[1]
    b1 = gamma(K + n_blocks(name) + 3) * (A.abs() @ B.abs() + bias.double().abs())
    bound = b1 + U_BF16 * (abs_exact(E) + b1)
    assert bound_ratio(C, E, bound) <= 1.0


@pytest.mark.parametrize("name,K", [("mx-fp4", 32), ("nv-1x16", 16), ("nv-16x16-weight", 16)])
def test_fp4_single_block_exact_up_to_global_scale(name, K):
    """One K block: every product and the block sum are exact in fp32, so only the NV tensor
    scales round (two products): |C - E| <= gamma(2) |E|; MX FP4 is exact."""
    for seed in range(4):
        a, w = operands(name, seed=seed, K=K)
        b = w.t()
        E = exact_matmul(a.dequantize(torch.float64), b.dequantize(torch.float64))
        C = scaled_mm(a, b).to(torch.float64)
        if name == "mx-fp4":
            assert C.tolist() == [[float(e) for e in row] for row in E]
        else:  # an exactly zero E must come out as exactly zero (bound 1e-300)
            absE = abs_exact(E)
            assert bound_ratio(C, E, torch.where(absE > 0, gamma(2) * absE, 1e-300)) <= 1.0


# ---- torch entry points route to scaled_mm ------------------------------------------------------
@pytest.mark.parametrize("name", ["tensor", "row", "1x128x128x128", "mx-fp8", "mx-fp4", "nv-16x16-weight"])
def test_torch_ops_route_to_scaled_mm(name):
    a, w = operands(name)
    b = w.t()
    bias = torch.randn(N)
    ref, ref_b = scaled_mm(a, b), scaled_mm(a, b, bias=bias)
    for out in (torch.mm(a, b), a @ b, torch.matmul(a, b), F.linear(a, w)):
        assert type(out) is torch.Tensor and torch.equal(out, ref)
    for out in (torch.addmm(bias, a, b), F.linear(a, w, bias)):
        assert torch.equal(out, ref_b)
    with pytest.raises(NotImplementedError, match="beta=1"):
        torch.addmm(bias, a, b, beta=0.5)


@pytest.mark.parametrize("name", ["tensor", "1x128x128x128", "mx-fp8", "mx-fp4", "nv-16x16-weight"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_only_plain_times_lowbit(name, dtype):
    _, w = operands(name)
    K = w.shape[1]
    x = torch.randn(M, K, generator=torch.Generator().manual_seed(3)).to(dtype)
    b = w.t()
    C = x @ b
    assert C.dtype == dtype and torch.equal(C, scaled_mm(x, b, out_dtype=dtype))
    X, B = x.to(torch.float64), b.dequantize(torch.float64)
    E = exact_matmul(X, B)
    bnd = gemm_bound(X, B, n_blocks(name))
    if dtype == torch.bfloat16:
        bnd = bnd + U_BF16 * (abs_exact(E) + bnd)
    assert bound_ratio(C, E, bnd) <= 1.0
    with pytest.raises(NotImplementedError, match="plain"):
        b.t() @ x.t()  # lowbit @ plain: no silent upcast


def test_scaled_mm_argument_errors():
    a, w = operands("tensor")
    with pytest.raises(TypeError, match="FP8Tensor or FP4Tensor"):
        scaled_mm(a, w.dequantize().t())
    with pytest.raises(ValueError, match="shapes"):
        scaled_mm(a, w)
    with pytest.raises(TypeError, match="out_dtype"):
        scaled_mm(a, w.t(), out_dtype=torch.int32)


# ---- backend registry -----------------------------------------------------------------------------
def _fake(name, why=None, priority=10, devices=("cpu",), result=None):
    def mm(a, b, out_dtype, bias):
        return torch.full((a.shape[0], b.shape[1]), result, dtype=out_dtype)
    return Backend(name, mm, supports=lambda a, b, out_dtype, bias: why, priority=priority, devices=devices)


def test_unknown_backend_is_a_clear_error():
    a, w = operands("tensor")
    with pytest.raises(ValueError, match="unknown backend 'nope'.*torch"):
        scaled_mm(a, w.t(), backend="nope")


def test_declining_backend_warns_once_and_falls_back(monkeypatch):
    a, w = operands("mx-fp8")
    ref = scaled_mm(a, w.t(), backend="torch")
    monkeypatch.setitem(BACKENDS.backends, "fake", _fake("fake", why="needs K % 64 == 0", result=7.0))
    monkeypatch.setattr(BACKENDS, "_warned", set())
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out1 = scaled_mm(a, w.t())
        out2 = scaled_mm(a, w.t())
    msgs = [str(r.message) for r in rec if "fake" in str(r.message)]
    assert len(msgs) == 1 and "needs K % 64 == 0" in msgs[0]
    assert torch.equal(out1, ref) and torch.equal(out2, ref)
    with pytest.raises(ValueError, match="'fake' cannot run.*needs K % 64 == 0"):
        scaled_mm(a, w.t(), backend="fake")


def test_registry_priority_and_devices():
    a, w = operands("tensor")
    reg = BackendRegistry()
    reg.register(TORCH_BACKEND)
    reg.register(_fake("gpu-only", devices=("cuda",), priority=100, result=1.0))
    reg.register(_fake("good", priority=5, result=2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a backend for another device is skipped silently
        be = reg.select("auto", a, w.t(), torch.float32)
    assert be.name == "good" and reg.select("torch", a, w.t(), torch.float32) is TORCH_BACKEND
    assert reg.names() == ["good", "gpu-only", "torch"]
    empty = BackendRegistry()
    with pytest.raises(RuntimeError, match="no lowbit backend"):
        empty.select("auto", a, w.t(), torch.float32)
