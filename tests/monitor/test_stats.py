"""The statistics of one record: the torch reduction against element-wise definitions (the flush
count is what lowbit's reference quantize rounds to 0), and the Triton kernel (interpreted on the
CPU) against the torch reduction, figure for figure, in every dtype and a permuted layout."""
import pytest
import torch

from lowbit.dtypes.formats import get_format
from lowbit.fma_guard.compile import compile_kernel  # before any interpreted kernel runs (it checks)
from lowbit.dtypes.quantize import quantize
from lowbit.monitor.stats import COL, cast_scale, reduce_into, reset_template
from lowbit.scaling import Delayed, Rowwise


def _sample(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 160, generator=g) * torch.logspace(-7, 3, 160)
    x[0, 3], x[1, 7], x[2, 9] = float("nan"), float("inf"), float("-inf")
    x[3, :20] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("fmt,s", [("e4m3", 0.37), ("e5m2", 0.01), ("e2m1", 0.37)])
def test_reference_counts_match_the_elementwise_definitions(fmt, s):
    f = get_format(fmt)
    x = _sample(torch.float32)
    scale = torch.tensor(s)
    buf = reset_template(1, "cpu")
    reduce_into(buf, 0, x, scale, f, kernel=False)
    row = buf[0]
    fin = torch.isfinite(x)
    q = quantize(torch.nan_to_num(x, nan=1.0, posinf=1.0, neginf=1.0), f, scale)
    flushed = (x != 0) & fin & ((q.float() == 0) if fmt != "e2m1" else ((q & 7) == 0))
    assert row[COL["nonfinite"]] == 3 and row[COL["numel"]] == x.numel() and row[COL["calls"]] == 1
    assert row[COL["amax"]] == x[fin].abs().max().double()
    assert row[COL["underflow"]] == flushed.sum()  # what the reference cast turns into 0
    if fmt != "e2m1":  # saturated: what the cast without saturation would send out of range (+-inf too)
        over = ~torch.isfinite(quantize(torch.nan_to_num(x, nan=0.0), f, scale, saturate=False).float())
        assert row[COL["saturated"]] == over.sum() and over.sum() > torch.isinf(x).sum()
    else:
        assert row[COL["saturated"]] == ((x.abs() / scale >= 7.0) & ~torch.isnan(x)).sum()  # 7 rounds up to 8
    assert row[COL["nonzero"]] == (x != 0).sum()
    assert row[COL["seq"]] == 0 and buf[-1, 0] == 1  # one non-finite record took ticket 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernel_matches_the_torch_reduction(dtype, monkeypatch):
    from lowbit.monitor.stats_kernel import launch
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read at launch: the kernel runs interpreted
    f = get_format("e4m3")
    x = _sample(dtype)
    scale = torch.tensor(0.02)
    ref, got = reset_template(3, "cpu"), reset_template(3, "cpu")
    reduce_into(ref, 0, x, scale, f, kernel=False)
    reduce_into(ref, 1, x[1:4])  # no cast: counts and amax only
    reduce_into(ref, 2, x)
    assert launch(got, 0, x.t(), scale, f)  # a permuted (dense, not contiguous) layout
    assert launch(got, 1, x[1:4], None, None)
    assert launch(got, 2, x, None, None)
    same = [c for n, c in COL.items() if n != "seq"]
    torch.testing.assert_close(got[:3, same], ref[:3, same], rtol=0, atol=0)
    # tickets: every record saw a non-finite value; each kernel's tickets exceed the previous one's
    assert got[0, COL["seq"]] < got[1, COL["seq"]] < got[2, COL["seq"]] < got[-1, 0]
    assert not launch(got, 0, x[:, ::2], None, None)  # strided: not dense, left to torch ops


def test_cast_scale_is_the_layers_own_scale():
    x = _sample(torch.float32)[:, :128].nan_to_num(0.0, 0.0, 0.0)
    buf = torch.full((), 0.5)
    s, f = cast_scale(x, Delayed(), "input", buf, prime=False)
    assert s is not buf and s == 0.5 and f.name == "e4m3"  # the delayed state's scale, not modified
    s, _ = cast_scale(x, Delayed(), "grad", buf, prime=True)  # cold start: the tensor's own amax
    assert s == torch.tensor(x.abs().max().item() / 57344.0) and buf == 0.5
    s, f = cast_scale(x, Rowwise(), "input", None, prime=False)  # one scale per row
    assert torch.equal(s[:, 0], x.abs().amax(1) / 448.0) and s.shape == x.shape


@pytest.mark.parametrize("has_scale", [False, True])
def test_triton_kernel_compiles_for_sm90_with_vector_loads(has_scale):
    """Built for an H100/H200 (no GPU needed): bf16 read 16 bytes a load, the quotient IEEE-rounded."""
    from lowbit.monitor.stats_kernel import BLOCK, _stats_kernel
    sig = {"x_ptr": "*bf16", "n": "i32", "row_ptr": "*fp64", "clock_ptr": "*fp64", "scale_ptr": "*fp32",
           "when_ptr": "*fp64", "limit": "fp32", "tiny": "fp32"}
    cx = dict(C_NF=COL["nonfinite"], C_AMAX=COL["amax"], C_SAT=COL["saturated"], C_UF=COL["underflow"],
              C_NZ=COL["nonzero"], C_NUMEL=COL["numel"], C_SEQ=COL["seq"], C_SCALE=COL["scale"], C_CALLS=COL["calls"],
              HAS_SCALE=has_scale, HAS_WHEN=has_scale, BLOCK=BLOCK)
    div16 = {(i,): [["tt.divisibility", 16]] for i in range(6)}  # what a launch specializes for aligned sizes
    ptx = compile_kernel(_stats_kernel, sig, cx, num_warps=8, attrs=div16).ptx
    assert "ld.global.v4.b32" in ptx and "ld.global.b16" not in ptx
    assert ("div.rn.f32" in ptx) == has_scale and ".add.f64" in ptx  # float64 atomics into the row


@pytest.mark.parametrize("has_scale,has_when", [(False, False), (False, True), (True, False)])
def test_triton_kernel_compiles_for_a_one_element_tensor(has_scale, has_when):
    """A launch on a 1-element tensor (a loss, a scalar parameter) specializes ``n`` to the
    constexpr 1: the kernel must build that way too (for sm_90, every flag combination)."""
    from lowbit.monitor.stats_kernel import BLOCK, _stats_kernel
    sig = {"x_ptr": "*fp32", "n": "constexpr", "row_ptr": "*fp64", "clock_ptr": "*fp64", "scale_ptr": "*fp32",
           "when_ptr": "*fp64", "limit": "fp32", "tiny": "fp32"}
    cx = dict(n=1, C_NF=COL["nonfinite"], C_AMAX=COL["amax"], C_SAT=COL["saturated"], C_UF=COL["underflow"],
              C_NZ=COL["nonzero"], C_NUMEL=COL["numel"], C_SEQ=COL["seq"], C_SCALE=COL["scale"], C_CALLS=COL["calls"],
              HAS_SCALE=has_scale, HAS_WHEN=has_when, BLOCK=BLOCK)
    ptx = compile_kernel(_stats_kernel, sig, cx, num_warps=8).ptx
    assert ".add.f64" in ptx
